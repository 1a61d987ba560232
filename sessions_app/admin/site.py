"""The admin site: Django's, with Respawn's roles on top of staff status and model
permissions, and the log-in throttle's message on its log-in form.

- Entering it at all takes an active staff account with a Respawn role (viewer, operator,
  admin or superuser): staff status and model permissions alone open nothing.
- Every ModelAdmin registered on it (Respawn's, Django's User and Group, any other app's)
  gets `RoleRules`: Respawn's records are read with a role and changed by operators;
  everything else (accounts, groups, the queue dashboard) is for admins.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.forms import AdminPasswordChangeForm
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.urls import reverse

from ..permissions import (
    can_administer,
    can_operate,
    can_view,
    operate_scope,
    sees_every_team,
)
from ..services import credentials
from ..validation import MAX_DATE, MIN_DATE, InvalidInput, client_address, parse_int
from ..web.auth import THROTTLED_MESSAGE, ThrottledAdminAuthenticationForm, is_locked, window

RESPAWN_APP = "sessions_app"


# The parts of a date a query string may filter on (`created_at__year=2026`, the date
# hierarchy's drill-down or a hand-made URL), and the values each can hold.
DATE_PARTS = {
    "year": (MIN_DATE.year, MAX_DATE.year),
    "iso_year": (MIN_DATE.year, MAX_DATE.year),
    "month": (1, 12),
    "day": (1, 31),
    "week": (1, 53),
    "week_day": (1, 7),
    "iso_week_day": (1, 7),
    "quarter": (1, 4),
    "hour": (0, 23),
    "minute": (0, 59),
    "second": (0, 59),
}


class CheckedChangeList(ChangeList):
    """A date's parts in the query string (the date hierarchy's year, month and day, or any
    `<date field>__<part>` a URL names) are checked before Django builds dates from them:
    a year past 9999 or before 1 is an error when the query runs (the page answered 500),
    not a bad parameter."""

    def get_filters(self, request):
        for key in request.GET:
            part = next((p for p in key.split("__")[1:] if p in DATE_PARTS), None)
            if part is None:
                continue
            low, high = DATE_PARTS[part]
            for raw in request.GET.getlist(key):
                if key.endswith("__in"):
                    values = raw.split(",")
                elif key.endswith("__isnull"):
                    continue
                else:
                    values = [raw]
                for value in values:
                    try:
                        parse_int(value, key, minimum=low, maximum=high)
                    except InvalidInput as exc:
                        raise IncorrectLookupParameters(str(exc)) from None
        return super().get_filters(request)


class RoleRules(admin.ModelAdmin):
    """What a Respawn role allows, checked before the model permissions; mixed in before
    a ModelAdmin."""

    def role_allows(self, request, *, write: bool) -> bool:
        user = request.user
        if self.opts.app_label != RESPAWN_APP:
            return can_administer(user)
        if not sees_every_team(user):
            return False  # the admin's tables span every team (see has_permission)
        if write:
            return can_operate(user) and operate_scope(user).everything
        return can_view(user)

    def get_changelist(self, request, **kwargs):
        # Every list checks the date parts in its query string (Django's User list too).
        changelist = super().get_changelist(request, **kwargs)
        return CheckedChangeList if changelist is ChangeList else changelist

    def has_module_permission(self, request) -> bool:
        return self.role_allows(request, write=False) and super().has_module_permission(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return self.role_allows(request, write=False) and super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args) -> bool:
        return self.role_allows(request, write=True) and super().has_add_permission(request, *args)

    def has_change_permission(self, request, obj=None) -> bool:
        return self.role_allows(request, write=True) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self.role_allows(request, write=True) and super().has_delete_permission(request, obj)


class ThrottledPasswordChangeForm(AdminPasswordChangeForm):
    """A password change asks for the old password: a wrong one counts as a failed log-in
    of the account and of the client's address, and a locked one is refused whatever is
    typed (sessions_app.services.credentials)."""

    request: Any = None

    def clean_old_password(self) -> str:
        username = self.user.get_username()
        if is_locked(username, client_address(self.request)):
            minutes = max(1, int(window().total_seconds() // 60))
            raise ValidationError(THROTTLED_MESSAGE, code="throttled", params={"minutes": minutes})
        try:
            return super().clean_old_password()
        except ValidationError:
            credentials.failed(self.request, credentials.PASSWORD, account=username)
            raise


class RespawnAdminSite(admin.AdminSite):
    login_form = ThrottledAdminAuthenticationForm

    def password_change(self, request, extra_context=None):
        """Django's, with the old password throttled (ThrottledPasswordChangeForm)."""
        from django.contrib.auth.views import PasswordChangeView

        form_class = type(
            "PasswordChangeForm", (ThrottledPasswordChangeForm,), {"request": request}
        )
        request.current_app = self.name
        return PasswordChangeView.as_view(
            form_class=form_class,
            success_url=reverse("admin:password_change_done", current_app=self.name),
            extra_context={**self.each_context(request), **(extra_context or {})},
            **(
                {"template_name": self.password_change_template}
                if self.password_change_template
                else {}
            ),
        )(request)

    def has_permission(self, request) -> bool:
        user = request.user
        # The admin's tables hold every team's sessions, and its pages are not narrowed to
        # a team: it is for global roles (a person with team roles only uses the dashboard).
        return user.is_active and user.is_staff and sees_every_team(user)

    def register(self, model_or_iterable, admin_class=None, **options) -> None:
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, RoleRules):
            admin_class = type(
                admin_class.__name__,
                (RoleRules, admin_class),
                {"__module__": admin_class.__module__},
            )
        super().register(model_or_iterable, admin_class, **options)
