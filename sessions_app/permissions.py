"""Who may do what. Viewers read everything; operators also act; admins (the `admin`
group) also act on the job queues and manage API tokens and accounts of other users;
superusers do everything. A user with none of these roles may do nothing, whatever else
their account says (staff status, model permissions). Every surface (dashboard, API,
admin site, queue dashboard) asks these functions."""

from __future__ import annotations

from typing import Any

VIEWER_GROUP = "viewer"
OPERATOR_GROUP = "operator"
ADMIN_GROUP = "admin"
ROLE_GROUPS = {VIEWER_GROUP, OPERATOR_GROUP, ADMIN_GROUP}


def _groups(user: Any) -> set[str]:
    cached = getattr(user, "_respawn_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._respawn_groups = cached
    return cached


def _active(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active)


def can_view(user: Any) -> bool:
    if not _active(user):
        return False
    return user.is_superuser or bool(_groups(user) & ROLE_GROUPS)


def can_operate(user: Any) -> bool:
    if not _active(user):
        return False
    return user.is_superuser or bool(_groups(user) & {OPERATOR_GROUP, ADMIN_GROUP})


def can_administer(user: Any) -> bool:
    """Act on the job queues; issue or revoke API tokens of other users; manage accounts."""
    if not _active(user):
        return False
    return user.is_superuser or ADMIN_GROUP in _groups(user)
