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

# (kind, pattern, literals): a pattern can match only where one of its literals occurs
# (compared in lower case), so a string none of them is in skips the regex: most text
# holds no "sk-", "akia" or "eyj", and a regex scan costs microseconds per pattern.
PATTERNS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "private-key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
        ("-----begin ",),
    ),
    ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    ("openai-key", r"\bsk-(?:proj-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),
    ("stripe-key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}", ("_live_", "_test_")),
    ("aws-access-key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", ("akia", "asia")),
    (
        "github-token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", ("xox",)),
    ("google-api-key", r"\bAIza[0-9A-Za-z_\-]{35}", ("aiza",)),
    ("respawn-token", r"\brsp_[A-Za-z0-9_\-]{30,}", ("rsp_",)),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyj",)),
    ("bearer-token", r"(?i)(?<=bearer )[A-Za-z0-9._~+/=\-]{16,}", ("bearer ",)),
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
        compiled = [(kind, re.compile(pattern), literals) for kind, pattern, literals in PATTERNS]
        for index, pattern in enumerate(extra_patterns):
            try:
                # A deployment's own pattern has no known literal: it always runs.
                compiled.append((f"custom-{index + 1}", re.compile(pattern), ()))
            except re.error as exc:
                raise ValueError(
                    f"redaction pattern {pattern!r} is not a valid regex: {exc}"
                ) from None
        self._patterns = compiled
        self._literals = {"://", *(literal for _, _, literals in compiled for literal in literals)}
        self._always = any(not literals for _, _, literals in compiled)
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MARKER.format(kind="configured-secret"))
        lowered = value.lower()
        present = {literal for literal in self._literals if literal in lowered}
        if "://" in present:
            value = URL_PASSWORD.sub(
                lambda m: m.group("head") + MARKER.format(kind="password"), value
            )
        if present or self._always:
            for kind, pattern, literals in self._patterns:
                if not literals or not present.isdisjoint(literals):
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
