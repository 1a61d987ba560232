import json

from django.contrib.auth import views as auth_views
from django.contrib.auth.models import Group, User
from django.http import HttpResponse, JsonResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from oauth2_provider.models import get_application_model


@csrf_exempt
def setup(request):
    """What a test needs at the provider: its client (redirect URIs) and its people with
    their groups. A test fixture on loopback, not a provider feature."""
    spec = json.loads(request.body)
    if "client" in spec:
        client = spec["client"]
        Application = get_application_model()
        app, _ = Application.objects.get_or_create(
            client_id=client["client_id"],
            defaults={
                "name": "respawn",
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
            },
        )
        app.client_secret = client["client_secret"]  # hashed on save
        app.redirect_uris = client["redirect_uri"]
        app.post_logout_redirect_uris = client["post_logout_redirect_uri"]
        app.save()
    for person in spec.get("users", []):
        user, _ = User.objects.get_or_create(username=person["username"])
        user.email = person.get("email", "")
        user.set_password(person["password"])
        user.save()
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in person["groups"]])
    return JsonResponse({"ok": True})


def whoami(request):
    return HttpResponse(request.user.username if request.user.is_authenticated else "")


urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("test/setup", setup),
    path("test/whoami", whoami),
    path("favicon.ico", lambda request: HttpResponse(status=204)),
]
