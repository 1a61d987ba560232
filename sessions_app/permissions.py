"""Who may do what. Viewers read everything; operators also act; superusers do both.
Every surface (dashboard, API, admin actions) asks these two functions."""

from __future__ import annotations

from typing import Any

VIEWER_GROUP = "viewer"
OPERATOR_GROUP = "operator"


def _groups(user: Any) -> set[str]:
    cached = getattr(user, "_respawn_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._respawn_groups = cached
    return cached


def can_view(user: Any) -> bool:
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or bool(_groups(user) & {VIEWER_GROUP, OPERATOR_GROUP})


def can_operate(user: Any) -> bool:
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or OPERATOR_GROUP in _groups(user)
