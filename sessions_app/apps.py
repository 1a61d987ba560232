from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from . import (
            auth,
            checks,  # noqa: F401 - registers the agent check
        )
        from .redaction import scrub_admin_history

        # The log-in throttle (sessions_app/auth.py) counts failures and forgives them.
        user_login_failed.connect(auth.record_failure, dispatch_uid="respawn-login-failed")
        user_logged_in.connect(auth.clear_failures, dispatch_uid="respawn-logged-in")
        scrub_admin_history()
