"""Fixtures of the dashboard and API tests."""

from __future__ import annotations

import pytest

from sessions_app.models import ApiToken


@pytest.fixture
def tokens(users):
    """A bearer token for each role of `users`."""
    return {role: ApiToken.issue(user)[1] for role, user in users.items()}


@pytest.fixture
def call(client, tokens):
    """An API request as `role` (operator by default), with a JSON body when given."""

    def request(method, path, role="operator", body=None, token=None, **extra):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token or tokens[role]}"}
        if body is None:
            return getattr(client, method)(path, **headers, **extra)
        return getattr(client, method)(
            path, body, content_type="application/json", **headers, **extra
        )

    return request
