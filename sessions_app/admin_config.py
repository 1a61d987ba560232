"""django.contrib.admin with Respawn's admin site (sessions_app/admin_site.py) as the
default `admin.site`; listed in INSTALLED_APPS in place of "django.contrib.admin". A
module of its own: INSTALLED_APPS imports it before any model can be."""

from django.contrib.admin.apps import AdminConfig


class RespawnAdminConfig(AdminConfig):
    default_site = "sessions_app.admin_site.RespawnAdminSite"
