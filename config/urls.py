from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from sessions_app.admin import queues as queues_admin
from sessions_app.api.routes import api
from sessions_app.dashboard import views as session_views
from sessions_app.web import sso
from sessions_app.web.auth import ThrottledLoginView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="sessions:list", permanent=False)),
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", sso.logout, name="logout"),
    path("sso/login/", sso.LoginView.as_view(), name="sso-login"),
    path("sso/callback/", sso.CallbackView.as_view(), name="sso-callback"),
    path("sessions/", include("sessions_app.dashboard.urls")),
    path("audit/", session_views.audit_log, name="audit"),
    path("admin/rq/", include((queues_admin.urlpatterns(), queues_admin.APP_NAME))),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("metrics", session_views.metrics, name="metrics"),
]

# Error pages in the dashboard's own style (and as fragments for htmx requests).
handler400 = "sessions_app.dashboard.views.bad_request"
handler403 = "sessions_app.dashboard.views.permission_denied"
handler404 = "sessions_app.dashboard.views.page_not_found"
handler500 = "sessions_app.dashboard.views.server_error"
