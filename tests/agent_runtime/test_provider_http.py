"""What the HTTP providers share: key scrubbing and reading servers' error bodies."""

import pytest

from agent_runtime.providers._http import Scrubber, is_permanent_status, server_detail

KEY = "my-custom-key-0000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"bad key {KEY}!", "bad key [redacted]!"),
        (
            "Incorrect API key provided: sk-proj-abcDEF123456",
            "Incorrect API key provided: [redacted]",
        ),
        ("masked: sk-test-*********c123.", "masked: [redacted]."),
        ("invalid sk-ant-api03-AbC_dEf-123", "invalid [redacted]"),
        ("header Authorization: Bearer abc.def.ghi-jkl", "header Authorization: Bearer [redacted]"),
        ('{"api_key": "zzz-123"}', '{"api_key": "[redacted]"}'),
        ("x-api-key=qwerty12", "x-api-key=[redacted]"),
        ("GET http://bob:hunter2@proxy:8080/v1", "GET http://[redacted]@proxy:8080/v1"),
        ("url https://h/v1?key=AIza123&x=1", "url https://h/v1?key=[redacted]&x=1"),
        ("a bearer token is missing; task-force risk-free", None),
    ],
)
def test_scrubber_removes_the_key_and_key_shaped_text(text, expected):
    assert Scrubber([KEY])(text) == (text if expected is None else expected)


def test_scrubber_ignores_empty_and_tiny_secrets():
    assert Scrubber(["", "a"])("a plain message") == "a plain message"


@pytest.mark.parametrize(
    ("status", "permanent"),
    [(400, True), (401, True), (402, True), (413, True), (408, False), (409, False)]
    + [(429, False), (500, False), (529, False)],
)
def test_status_classification(status, permanent):
    assert is_permanent_status(status) is permanent


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"message": "openai-style, unwrapped by the SDK"}, "openai-style, unwrapped by the SDK"),
        ({"type": "error", "error": {"message": "anthropic-style"}}, "anthropic-style"),
        ({"object": "error", "message": "vLLM", "code": 400}, "vLLM"),
        ({"detail": "Not Found"}, "Not Found"),
        ({"error": "model 'x' not found"}, "model 'x' not found"),
        ("<html>\n  <h1>502</h1>\n</html>", "<html> <h1>502</h1> </html>"),
        ({"weird": [1]}, '{"weird": [1]}'),
        (None, ""),
    ],
)
def test_server_detail_reads_the_usual_error_shapes(body, expected):
    assert server_detail(body) == expected


def test_server_detail_is_kept_short():
    assert len(server_detail("x" * 5000)) == 500
