"""The admin site: Django's, with Respawn's roles on top of staff status and model
permissions, and the log-in throttle's message on its log-in form.

- Entering it at all takes an active staff account with a Respawn role (viewer, operator,
  admin or superuser): staff status and model permissions alone open nothing.
- Every ModelAdmin registered on it (Respawn's, Django's User and Group, any other app's)
  gets `RoleRules`: Respawn's records are read with a role and changed by operators;
  everything else (accounts, groups, the queue dashboard) is for admins.
"""

from __future__ import annotations

from django.contrib import admin

from ..permissions import can_administer, can_operate, can_view
from ..web.auth import ThrottledAdminAuthenticationForm

RESPAWN_APP = "sessions_app"


class RoleRules(admin.ModelAdmin):
    """What a Respawn role allows, checked before the model permissions; mixed in before
    a ModelAdmin."""

    def role_allows(self, request, *, write: bool) -> bool:
        user = request.user
        if self.opts.app_label != RESPAWN_APP:
            return can_administer(user)
        return can_operate(user) if write else can_view(user)

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


class RespawnAdminSite(admin.AdminSite):
    login_form = ThrottledAdminAuthenticationForm

    def has_permission(self, request) -> bool:
        user = request.user
        return user.is_active and user.is_staff and can_view(user)

    def register(self, model_or_iterable, admin_class=None, **options) -> None:
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, RoleRules):
            admin_class = type(
                admin_class.__name__,
                (RoleRules, admin_class),
                {"__module__": admin_class.__module__},
            )
        super().register(model_or_iterable, admin_class, **options)
