"""Secrets never reach storage: values that look like credentials are replaced with a
marker before a step or checkpoint is written (and before a log line is emitted).

The patterns are deliberately specific (a key's known prefix and length, a credential's
place in a URL or a header, a value under a key that names a secret) so that ordinary text
is left alone; configured secrets (the provider API keys) are matched literally, and
deployments add their own patterns. Redacting is idempotent: a marker is never redacted
again, so text can pass the redactor any number of times.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MARKER = "[REDACTED:{kind}]"
_NOT_A_MARKER = r"(?!\[REDACTED[:\]])"  # ours, or a provider's "[redacted]"


def marker(kind: str) -> str:
    return MARKER.format(kind=kind[:40])


@dataclass(frozen=True)
class Rule:
    """One kind of secret in text.

    `literals` (lower case): the rule can match only where one of them occurs, so a string
    none of them is in skips the regex (most text holds no "sk-", "akia" or "://", and a
    regex scan costs microseconds). A rule without literals runs on every string at least
    `min_length` long. `replace` turns a match into its replacement (default: the marker)."""

    kind: str
    pattern: re.Pattern[str]
    literals: tuple[str, ...] = ()
    min_length: int = 0
    replace: Callable[[re.Match[str]], str] | None = None
    # A cheaper test than the regex that a rule without literals must pass first.
    gate: Callable[[str], bool] | None = None

    def apply(self, value: str) -> str:
        return self.pattern.sub(self.replace or (lambda _m: marker(self.kind)), value)


# Where a key may start: a word boundary, or right after an escape sequence written out in
# text (a repr or escaped JSON: "...\\nsk-ant-..."), whose letter would hide the boundary.
_START = r"(?:\b|(?<=\\[nrtfbv])|(?<=\\u[0-9a-fA-F]{4}))"


def _shape(kind: str, pattern: str, *literals: str) -> Rule:
    """A rule for a key of a known shape; a leading \\b in `pattern` is _START."""
    if pattern.startswith(r"\b"):
        pattern = _START + pattern[2:]
    return Rule(kind, re.compile(pattern), literals)


# Words that make a key name a secret's: `db_password`, `X-Api-Key`, `authToken`.
_SECRET_WORDS = (
    r"password|passwd|pwd|passphrase|secret|token|api[_-]?key|apikey|private[_-]?key"
    r"|access[_-]?key|secret[_-]?key|signing[_-]?key|account[_-]?key|credentials?|cookie"
)


def _key_value(match: re.Match[str]) -> str:
    key, quote = match.group("key"), match.group("quote") or ""
    return f"{key}{match.group('sep')}{quote}{marker(key.lower())}{quote}"


def _url_password(match: re.Match[str]) -> str:
    return match.group("head") + marker("password") + "@"


def _basic_credentials(match: re.Match[str]) -> str:
    """`Basic <base64 of user:password>`; other words after "basic" are left alone."""
    token = match.group("token")
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    if b":" not in decoded:
        return match.group(0)
    return match.group("head") + marker("basic-credentials")


# What says a 40-character run is an AWS secret key: the text speaks of AWS or of a
# secret, or holds an access key id beside it.
AWS_CONTEXT = ("aws", "akia", "asia", "secret")


def _aws_secret(match: re.Match[str]) -> str:
    """A run of exactly 40 base64 characters (no padding) that mixes upper case, lower case
    and digits, in text that speaks of AWS or of a secret (AWS_CONTEXT): an AWS
    secret access key. Without that context such a run is a hash, an id, a signed URL's
    signature or ciphertext, and a run must read it back as it was. A 40-digit hex string
    (a git commit, a SHA-1) is left alone, and so are longer runs (base64 data)."""
    run = match.group(0)
    at = match.start()
    if len(run) == 41 and at and match.string[at - 1] == "\\" and run[0] in "nrtfbv":
        # After an escape sequence written out ("\\n" in a repr): the letter is not part
        # of the key.
        return run[0] + _aws_secret_run(run[1:], match.string)
    return _aws_secret_run(run, match.string)


def _aws_secret_run(run: str, string: str) -> str:
    if len(run) != 40 or "=" in run:
        return run
    text = string.lower()
    if not any(word in text for word in AWS_CONTEXT):
        return run
    if any(c.isupper() for c in run) and any(c.islower() for c in run):
        if any(c.isdigit() for c in run):
            return marker("aws-secret-key")
    return run


def _has_a_long_word(value: str) -> bool:
    # Prose has no 40-character words: splitting is far cheaper than a regex scan of it.
    return max(map(len, value.split()), default=0) >= 40


# In order: a later rule sees the markers of the earlier ones and leaves them alone.
RULES: list[Rule] = [
    _shape(
        "private-key",
        # PEM (RSA, EC, OpenSSH, PKCS#8) and PGP's armour ("PRIVATE KEY BLOCK").
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|$)",
        "-----begin ",
    ),
    # The whole value of an Authorization header, whatever its scheme (Basic, Bearer,
    # Token, Digest): up to the end of the line or of the quoted string.
    Rule(
        "authorization",
        re.compile(
            r"(?i)(?P<head>\b(?:proxy-)?authorization\\?[\"']?\s*[:=]\s*\\?[\"']?)"
            + _NOT_A_MARKER
            + r"[^\s\"'\\,;}][^\r\n\"'\\,;}]*"
        ),
        ("authorization",),
        replace=lambda m: m.group("head") + marker("authorization"),
    ),
    # scheme://[user]:password@host: the password may hold "@" and "/" (the last "@"
    # before the host ends it), and the user may be empty (redis://:password@host).
    Rule(
        "password",
        re.compile(
            r"(?i)(?P<head>\b[a-z][a-z0-9+.\-]*://[^\s:/@?#\"'<>`]*:)"
            + _NOT_A_MARKER
            + r"[^\s\"'<>`]+@"
        ),
        ("://",),
        replace=_url_password,
    ),
    _shape("anthropic-key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}", "sk-ant-"),
    _shape("openai-key", r"\bsk-(?:proj-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_\-]{20,}", "sk-"),
    _shape("stripe-key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}", "_live_", "_test_"),
    _shape("aws-access-key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", "akia", "asia"),
    _shape(
        "github-token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
    ),
    _shape("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "xox"),
    _shape("google-api-key", r"\bAIza[0-9A-Za-z_\-]{35}", "aiza"),
    _shape("respawn-token", r"\brsp_[A-Za-z0-9_\-]{30,}", "rsp_"),
    _shape("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", "eyj"),
    _shape("bearer-token", r"(?i)(?<=bearer )[A-Za-z0-9._~+/=\-]{16,}", "bearer "),
    # Tokens of other services, each by its documented prefix and length.
    _shape(
        "gitlab-token",
        r"\bgl(?:pat|ptt|dt|rt|oas|cbt|imt|ft|agent)-[A-Za-z0-9_\-]{20,}",
        *(f"gl{kind}-" for kind in ("pat", "ptt", "dt", "rt", "oas", "cbt", "imt", "ft", "agent")),
    ),
    _shape("npm-token", r"\bnpm_[A-Za-z0-9]{36}\b", "npm_"),
    _shape("pypi-token", r"\bpypi-AgE[A-Za-z0-9_\-]{50,}", "pypi-age"),
    _shape("huggingface-token", r"\bhf_[A-Za-z0-9]{30,}", "hf_"),
    _shape("sendgrid-key", r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", "sg."),
    _shape(
        "shopify-token",
        r"\bshp(?:at|ca|pa|ss)_[A-Fa-f0-9]{32}",
        "shpat_",
        "shpca_",
        "shppa_",
        "shpss_",
    ),
    _shape("digitalocean-token", r"\bdo[opr]_v1_[a-f0-9]{64}", "_v1_"),
    _shape("mailgun-key", r"\bkey-[0-9a-zA-Z]{32}\b", "key-"),
    _shape("square-token", r"\bsq0(?:atp|csp)-[0-9A-Za-z_\-]{22,}", "sq0"),
    _shape("databricks-token", r"\bdapi[a-f0-9]{32}(?:-\d)?\b", "dapi"),
    _shape("google-oauth-token", r"\bya29\.[0-9A-Za-z_\-]{20,}", "ya29."),
    _shape(
        "slack-webhook",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]{20,}",
        "hooks.slack.com/",
    ),
    _shape("age-secret-key", r"\bAGE-SECRET-KEY-1[0-9A-Z]{58}\b", "age-secret-key-1"),
    _shape("vault-token", r"\bhv[sb]\.[A-Za-z0-9_\-]{24,}", "hvs.", "hvb."),
    _shape("linear-key", r"\blin_(?:api|oauth)_[A-Za-z0-9]{40}", "lin_api_", "lin_oauth_"),
    _shape(
        "doppler-token",
        r"\bdp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,}",
        *(f"dp.{kind}." for kind in ("pt", "st", "sa", "ct", "scim", "audit")),
    ),
    _shape("grafana-token", r"\bglsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}", "glsa_"),
    _shape("telegram-bot-token", r"\b[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}\b", ":aa"),
    _shape("sentry-token", r"\bsntry[su]_[A-Za-z0-9_=+/\-]{30,}", "sntrys_", "sntryu_"),
    Rule(
        "basic-credentials",
        re.compile(r"(?i)(?P<head>\bbasic\s+)(?P<token>[A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"),
        ("basic",),
        replace=_basic_credentials,
    ),
    # key: value and key=value where the key names a secret, bare or quoted (also as
    # escaped JSON inside a string): `db_password=hunter2`, `"token": "abc"`.
    Rule(
        "secret-value",
        re.compile(
            r"(?i)(?P<key>(?<![\w-])[\w.-]*?(?:" + _SECRET_WORDS + r"))"
            r"(?P<sep>\\?[\"']?\s*[:=]\s*)"
            r"(?:(?P<quote>\\?[\"'])" + _NOT_A_MARKER + r"(?P<quoted>[^\r\n]*?)(?P=quote)"
            r"|" + _NOT_A_MARKER + r"(?P<bare>[^\s\"'\\,;&}\]<>]+))"
        ),
        ("pass", "pwd", "secret", "token", "key", "credential", "cookie"),
        replace=_key_value,
    ),
    Rule(
        "aws-secret-key",
        # Whole runs, measured in _aws_secret: cheaper than lookarounds at every position.
        re.compile(r"[A-Za-z0-9/+=]{40,}"),
        min_length=40,
        replace=_aws_secret,
        gate=_has_a_long_word,
    ),
]

# Key names (of a JSON object) whose values are secrets whatever they look like: one of
# these words as a part of the name, or one of the pairs (`private_key`, `apiKey`).
_KEY_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "secret",
        "secrets",
        "token",
        "apikey",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "cookie",
    }
)
_KEY_PAIRS = frozenset(
    {"api", "private", "access", "signing", "encryption", "master", "account", "license"}
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def is_secret_key(key: str) -> bool:
    """Does a key name say its value is a secret (`db_password`, `aws_secret_access_key`,
    `X-Api-Key`, `privateKey`)? Counters such as `tokens_in` or `max_tokens` do not."""
    parts = [p for p in _SEPARATORS.split(_CAMEL.sub("_", key).lower()) if p]
    if _KEY_WORDS.intersection(parts):
        return True
    return any(a in _KEY_PAIRS and b == "key" for a, b in zip(parts, parts[1:], strict=False))


CACHED_TEXT_CHARS = 2048
CACHED_TEXTS = 8192


class Redactor:
    def __init__(self, *, extra_patterns: Iterable[str] = (), secrets: Iterable[str] = ()) -> None:
        rules = list(RULES)
        for index, pattern in enumerate(extra_patterns):
            try:
                # A deployment's own pattern has no known literal: it always runs.
                rules.append(Rule(f"custom-{index + 1}", re.compile(pattern)))
            except re.error as exc:
                raise ValueError(
                    f"redaction pattern {pattern!r} is not a valid regex: {exc}"
                ) from None
        self._rules = rules
        # Which literals a string holds is a few substring searches; a rule runs only when
        # one of its own is there (a regex scan per rule costs microseconds per string).
        self._literals = tuple(sorted({lit for rule in rules for lit in rule.literals}))
        # Rules without literals run on strings at least this long.
        self._unfiltered = [rule for rule in rules if not rule.literals]
        self._shortest_unfiltered = min(
            (rule.min_length for rule in self._unfiltered), default=None
        )
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)
        # Object keys repeat ("type", "text", "tool_calls"): what each becomes is kept.
        self._keys: dict[str, tuple[str, str | None]] = {}
        # So do values, and a value is often redacted twice: by the loop, then by the store
        # that writes it (storage's own choke point). What a short string becomes is kept,
        # up to a bound; a string caches its hash, so a second look costs nanoseconds.
        self._texts: dict[str, str] = {}

    def text(self, value: str) -> str:
        if len(value) > CACHED_TEXT_CHARS:
            return self._scan(value, prefilter=True)
        clean = self._texts.get(value)
        if clean is None:
            clean = self._scan(value, prefilter=True)
            if len(self._texts) >= CACHED_TEXTS:
                self._texts.clear()
            self._texts[value] = clean
            self._texts[clean] = clean  # redacting the result changes nothing
        return clean

    def _scan(self, value: str, *, prefilter: bool) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, marker("configured-secret"))
        if not prefilter:
            for rule in self._rules:
                value = rule.apply(value)
            return value
        lowered = value.lower()
        present = {lit for lit in self._literals if lit in lowered}
        if present:
            # `present` may be stale after an earlier rule replaced something: a marker
            # holds none of the literals that matter, so a skip stays safe.
            rules = [r for r in self._rules if not r.literals or not present.isdisjoint(r.literals)]
        elif self._shortest_unfiltered is None or len(value) < self._shortest_unfiltered:
            return value
        else:
            rules = self._unfiltered
        for rule in rules:
            if len(value) < rule.min_length or (rule.gate and not rule.gate(value)):
                continue
            value = rule.apply(value)
        return value

    def _key(self, key: str) -> tuple[str, str | None]:
        """A key as stored, and the marker kind for what is under it (None: not secret)."""
        known = self._keys.get(key)
        if known is None:
            known = (self.text(key), key.lower() if is_secret_key(key) else None)
            if len(self._keys) < 10_000 and len(key) <= 100:
                self._keys[key] = known
        return known

    def redact(self, value: Any, *, under: str | None = None) -> Any:
        """A copy of a JSON-like value with every secret-looking string replaced; every
        string anywhere under a key that names a secret is replaced whole (numbers and
        booleans stay: `"token": 7` is a counter, not a credential)."""
        if isinstance(value, str):
            if under is not None and value and not value.startswith("[REDACTED:"):
                return marker(under)
            return self.text(value)
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if isinstance(key, str):
                    key, secret = self._key(key)
                    out[key] = self.redact(item, under=under or secret)
                else:
                    out[key] = self.redact(item, under=under)
            return out
        if isinstance(value, list | tuple):
            return [self.redact(item, under=under) for item in value]
        return value


BUILT_IN_REDACTION = Redactor()
