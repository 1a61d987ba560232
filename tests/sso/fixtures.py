"""A real OpenID Connect provider on loopback (tests/sso/provider: django-oauth-toolkit,
PKCE required) for the single sign-on tests, and Respawn's settings pointing at it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from ..servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "respawn-dashboard"
CLIENT_SECRET = "provider-client-secret-" + "s" * 20
ROLE_MAP = {
    "acme-support": "operator",
    "acme-readers": "viewer",
    "acme-platform": "admin",
    # Roles in a team (declared by the test that uses them).
    "acme-billing-ops": "billing/operator",
    "acme-billing-leads": "billing/team_admin",
    "acme-research": "research/viewer",
}


@dataclass
class Provider:
    url: str
    log: Path

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def configure(self, *, relying_party: str, users: list[dict] = ()) -> None:
        """The client's redirect URIs (at `relying_party`, Respawn's origin) and people
        (username, password, groups) at the provider."""
        spec = {
            "client": {
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uri": f"{relying_party}/sso/callback/",
                "post_logout_redirect_uri": f"{relying_party}/login/",
            },
            "users": list(users),
        }
        response = requests.post(f"{self.url}/test/setup", json=spec, timeout=10)
        assert response.status_code == 200, response.text

    def person(self, username: str, groups: list[str], password: str = "provider-pw-1") -> None:
        spec = {
            "users": [
                {
                    "username": username,
                    "password": password,
                    "groups": groups,
                    "email": f"{username}@example.com",
                }
            ]
        }
        response = requests.post(f"{self.url}/test/setup", json=spec, timeout=10)
        assert response.status_code == 200, response.text


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory) -> Provider:
    directory = tmp_path_factory.mktemp("oidc-provider")
    port = free_port()
    log = directory / "provider.log"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.sso.provider.serve", str(port), str(directory / "db")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{url}/o/.well-known/openid-configuration", timeout=2).ok:
                break
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the OpenID Connect provider did not start:\n{log.read_text()}")
        time.sleep(0.2)
    yield Provider(url, log)
    process.terminate()
    process.wait(timeout=10)


def point_at(settings, provider: Provider) -> None:
    """Respawn's settings (pytest-django's `settings`) for single sign-on through
    `provider`, as docs/DEPLOY.md sets them from the environment."""
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{provider.issuer}/authorize/"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{provider.issuer}/token/"
    settings.OIDC_OP_USER_ENDPOINT = f"{provider.issuer}/userinfo/"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{provider.issuer}/.well-known/jwks.json"
    settings.RESPAWN_OIDC_END_SESSION_ENDPOINT = f"{provider.issuer}/logout/"
    settings.RESPAWN_OIDC_ISSUER = provider.issuer
    settings.RESPAWN_OIDC_PROVIDER_NAME = "Acme ID"
    settings.RESPAWN_OIDC_ROLE_MAP = dict(ROLE_MAP)
