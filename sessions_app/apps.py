"""The app's two entries in INSTALLED_APPS: the sessions app itself and django.contrib.admin
with Respawn's admin site (sessions_app/admin/site.py) as the default `admin.site`. Both import
nothing of the app at module level: INSTALLED_APPS imports this before any model can be."""

import logging
from importlib import import_module

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class SessionsAppConfig(AppConfig):
    default = True
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401 - registers the agent check
        from .redaction import scrub_admin_history
        from .services.teams import sync_declared_teams_after_migrate
        from .web import auth

        # The log-in throttle (sessions_app/web/auth.py) counts failures and forgives them.
        user_login_failed.connect(auth.record_failure, dispatch_uid="respawn-login-failed")
        user_logged_in.connect(auth.clear_failures, dispatch_uid="respawn-logged-in")
        scrub_admin_history()
        # The teams settings declare are written by every migrate (as by sync_teams).
        post_migrate.connect(
            sync_declared_teams_after_migrate, sender=self, dispatch_uid="respawn-sync-teams"
        )
        # Python's warnings become log records (logger "py.warnings"), so they go through
        # the root's redacting handler as every other line (config/settings.py LOGGING).
        logging.captureWarnings(True)


class RespawnAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with Respawn's site; listed in INSTALLED_APPS in place of
    "django.contrib.admin"."""

    default = False  # "sessions_app" in INSTALLED_APPS means SessionsAppConfig
    default_site = "sessions_app.admin.site.RespawnAdminSite"

    def ready(self) -> None:
        super().ready()
        # The registrations: sessions_app.admin is a package whose __init__ imports nothing
        # (autodiscover imports it before the models are needed elsewhere).
        import_module("sessions_app.admin.registry")
