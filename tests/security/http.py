"""A small HTTP client for tests against a real server (pytest-django's live_server, or a
server process): cookies, the CSRF token of a page's form, no redirects followed."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


@dataclass
class Reply:
    status: int
    body: str
    headers: dict[str, str]

    @property
    def location(self) -> str:
        return self.headers.get("Location", "")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Browser:
    def __init__(self, base_url: str, user_agent: str = "respawn-tests") -> None:
        self.base_url = base_url.rstrip("/")
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirects()
        )
        self.user_agent = user_agent

    def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        url = path if path.startswith("http") else self.base_url + path
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("User-Agent", self.user_agent)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with self.opener.open(request, timeout=30) as response:
                return Reply(
                    response.status,
                    response.read().decode(errors="replace"),
                    dict(response.headers),
                )
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read().decode(errors="replace"), dict(exc.headers))

    def get(self, path: str, **headers: str) -> Reply:
        return self.request("GET", path, headers=headers)

    def csrf_token(self, path: str) -> str:
        page = self.get(path)
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.body)
        assert found, f"no CSRF token on {path} ({page.status})"
        return found.group(1)

    def post_form(
        self, path: str, fields: dict[str, str | list[str]], form_page: str = ""
    ) -> Reply:
        """POST a form the way a browser does: with the CSRF token of the page it is on."""
        token = self.csrf_token(form_page or path)
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}, doseq=True).encode()
        return self.request(
            "POST",
            path,
            data=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Referer": self.base_url + (form_page or path),
            },
        )

    def log_in(self, username: str, password: str, *, admin: bool = False) -> Reply:
        page = "/admin/login/?next=/admin/" if admin else "/login/"
        return self.post_form(page, {"username": username, "password": password})

    @property
    def logged_in(self) -> bool:
        return any(cookie.name == "sessionid" for cookie in self.cookies)
