"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit with
OpenID Connect, PKCE required, RP-initiated logout, and a `groups` claim. It runs in a
process of its own (provider/serve.py) on loopback, with a SQLite file of its own."""

import os

from jwcrypto import jwk

SECRET_KEY = "provider-" + "x" * 50
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.sso.provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["PROVIDER_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
# Its own cookies: the relying party runs on another host name of the same machine.
SESSION_COOKIE_NAME = "provider_session"
CSRF_COOKIE_NAME = "provider_csrf"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a test's speed

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": jwk.JWK.generate(kty="RSA", size=2048)
    .export_to_pem(private_key=True, password=None)
    .decode(),
    "PKCE_REQUIRED": True,
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http"],
    "OAUTH2_VALIDATOR_CLASS": "tests.sso.provider.validator.GroupsValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "E-mail", "profile": "Profile"},
}
