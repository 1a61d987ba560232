"""Secrets never reach storage: values that look like credentials are replaced with a
marker before a step or checkpoint is written (and before a log line is emitted).

The patterns are deliberately specific (a key's known prefix and length) so that ordinary
text is left alone; configured secrets (the provider API keys) are matched literally, and
deployments add their own patterns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MARKER = "[REDACTED:{kind}]"

PATTERNS: list[tuple[str, str]] = [
    (
        "private-key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
    ),
    ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}"),
    ("openai-key", r"\bsk-(?:proj-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_\-]{20,}"),
    ("stripe-key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("aws-access-key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("google-api-key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    ("respawn-token", r"\brsp_[A-Za-z0-9_\-]{30,}"),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    ("bearer-token", r"(?i)(?<=bearer )[A-Za-z0-9._~+/=\-]{16,}"),
]
# user:password@ in any URL: only the password is replaced.
URL_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.\-]*://[^/\s:@]+:)(?P<password>[^/\s@]+)(?=@)", re.I
)
# Keys whose values are secrets whatever they look like.
SECRET_KEYS = re.compile(
    r"(?i)^(password|passwd|secret|client_secret|api[_-]?key|access[_-]?token|authorization)$"
)


class Redactor:
    def __init__(self, *, extra_patterns: Iterable[str] = (), secrets: Iterable[str] = ()) -> None:
        compiled = [(kind, re.compile(pattern)) for kind, pattern in PATTERNS]
        for index, pattern in enumerate(extra_patterns):
            try:
                compiled.append((f"custom-{index + 1}", re.compile(pattern)))
            except re.error as exc:
                raise ValueError(
                    f"redaction pattern {pattern!r} is not a valid regex: {exc}"
                ) from None
        self._patterns = compiled
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MARKER.format(kind="configured-secret"))
        value = URL_PASSWORD.sub(lambda m: m.group("head") + MARKER.format(kind="password"), value)
        for kind, pattern in self._patterns:
            value = pattern.sub(MARKER.format(kind=kind), value)
        return value

    def redact(self, value: Any) -> Any:
        """A copy of a JSON-like value with every secret-looking string replaced."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if (
                    isinstance(key, str)
                    and SECRET_KEYS.match(key)
                    and isinstance(item, str)
                    and item
                ):
                    out[key] = MARKER.format(kind=key.lower())
                else:
                    out[key] = self.redact(item)
            return out
        if isinstance(value, list | tuple):
            return [self.redact(item) for item in value]
        return value


NO_REDACTION = Redactor()
