"""What the HTTP providers share: one turn through an official SDK, error classification,
operator-readable messages that never carry a credential, and decoding of tool-call
arguments."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from http import HTTPStatus
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Message, ModelSettings, ModelTurn, ProviderError

if TYPE_CHECKING:
    from ..tools import ToolSpec

REDACTED = "[redacted]"

# Tool-call arguments that are not a JSON object are kept under this key instead of being
# dropped or failing the turn: a name with a leading underscore is never a pydantic field
# (pydantic makes it private) and @tool's argument models forbid extra keys, so validation
# rejects the call and the model sees, in its next turn, what it sent and why it failed.
INVALID_ARGUMENTS_KEY = "_invalid_json"

# 408 timeout, 409 conflict (a lock on the server side), 425 too early and 429 rate limit
# mean "not now"; every other 4xx is the request's or the credentials' fault and would
# fail the same way again. 5xx (incl. 529 overloaded) is the server's trouble: retry.
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})

# Things that look like credentials, for messages that quote a server or an exception.
_SECRET_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=*-]{8,}"), f"Bearer {REDACTED}"),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_*-]{6,}"), REDACTED),
    (
        re.compile(
            r"(?i)\b(api[_-]?key|x-api-key|authorization|access[_-]?token)"
            r"([\"']?\s*[:=]\s*[\"']?)(?!bearer\s)[^\s\"',;}&]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    (re.compile(r"(://)[^/\s:@]+:[^/\s@]+@"), rf"\1{REDACTED}@"),  # user:password@ in URLs
    (re.compile(r"(?i)([?&](?:key|token)=)[^&\s]+"), rf"\1{REDACTED}"),  # ...?key= in URLs
]

_DETAIL_LIMIT = 500


class MalformedResponse(ValueError):
    """A 2xx response that does not have the protocol's shape; the text says what is off."""


class Scrubber:
    """Removes the configured secrets, and anything shaped like a key, from a text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a key that contains another is removed whole. Very short
        # values are not secrets worth mangling every message for.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        for pattern, replacement in _SECRET_PATTERNS:
            text = pattern.sub(replacement, text)
        return text


def is_permanent_status(status: int) -> bool:
    return 400 <= status < 500 and status not in _RETRYABLE_4XX


def shorten(text: str, limit: int = _DETAIL_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_detail(body: object) -> str:
    """The server's own explanation from an error body (OpenAI, Anthropic, vLLM shapes)."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        return shorten(body)
    if not isinstance(body, dict):
        return "" if body is None else shorten(json.dumps(body, default=str))
    error = body.get("error", body)
    message: object = None
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail")
    elif isinstance(error, str):
        message = error
    if message is None:
        message = body.get("message") or body.get("detail")
    if message is None:
        message = body
    return shorten(message if isinstance(message, str) else json.dumps(message, default=str))


class SdkProvider:
    """A provider that makes one request per turn through an official SDK; retries and
    backoff belong to the loop. A subclass names its SDK, builds the request body and
    reads the turn from the response body."""

    name: ClassVar[str]
    sdk: ModuleType  # the SDK module, whose error classes are read
    base_error: ClassVar[type[Exception]]
    client_class: ClassVar[Callable[..., Any]]
    default_endpoint: ClassVar[str]  # named in errors when no base URL is set

    model: str
    base_url: str | None

    def __init__(self, *, model: str, options: dict[str, Any]) -> None:
        self.model = model
        # options["<name>_base_url"] (empty: the SDK's default) and options["<name>_api_key"].
        self.base_url: str | None = (options.get(f"{self.name}_base_url") or "").strip() or None
        api_key = (options.get(f"{self.name}_api_key") or "").strip()
        self._api_key = self.client_key(api_key)
        self._scrub = Scrubber([api_key])

    def client_key(self, api_key: str) -> str:
        """The key the client is built with (ProviderError, permanent, when it needs one
        and there is none)."""
        raise NotImplementedError

    def request(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> dict[str, Any]:
        """The request body for one turn."""
        raise NotImplementedError

    def resource(self, client: Any) -> Any:
        """The SDK resource whose `create` sends a turn's request."""
        raise NotImplementedError

    def parse(self, body: str) -> ModelTurn:
        """The turn in a response body (MalformedResponse when it is not one)."""
        raise NotImplementedError

    def complete(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> ModelTurn:
        request = self.request(messages, tools, settings)
        return sdk_turn(
            provider=self.name,
            sdk=self.sdk,
            base_error=self.base_error,
            open_client=lambda: self.client_class(
                api_key=self._api_key,  # explicit: the SDK then reads no credential files
                base_url=self.base_url,  # None: the SDK's default
                timeout=settings.timeout,
                max_retries=0,  # the loop retries, with its backoff, and records the attempts
            ),
            send=lambda client: self.resource(client).with_raw_response.create(
                **request, timeout=settings.timeout
            ),
            parse=self.parse,
            endpoint=self.base_url or self.default_endpoint,
            timeout=settings.timeout,
            scrub=self._scrub,
        )


def sdk_turn(
    *,
    provider: str,
    sdk: ModuleType,
    base_error: type[Exception],
    open_client: Callable[[], AbstractContextManager[Any]],
    send: Callable[[Any], Any],
    parse: Callable[[str], ModelTurn],
    endpoint: str,
    timeout: float,
    scrub: Scrubber,
) -> ModelTurn:
    """One request through an official SDK: `open_client` builds the client, `send` makes
    the request for the raw response, `parse` reads the turn from its body. Every failure
    leaves as a ProviderError with the secrets scrubbed from its message."""
    try:
        with open_client() as client:
            endpoint = str(client.base_url)
            # The raw body, not the SDK's model: the SDK accepts any JSON without
            # validating it, and a non-JSON body comes back as a str; checking the
            # shape ourselves gives one clear error for each way a body can be wrong.
            response = send(client)
            status, body = response.http_response.status_code, response.http_response.text
    except Exception as exc:  # every error leaves through the scrubber
        error = translate_sdk_error(
            exc,
            sdk=sdk,
            base_error=base_error,
            provider=provider,
            endpoint=endpoint,
            timeout=timeout,
        )
        # from None: the SDK's exception holds the request, key included; it must not
        # ride along into a logged traceback.
        raise ProviderError(
            scrub(str(error)), permanent=error.permanent, status=error.status
        ) from None
    try:
        return parse(body)
    except MalformedResponse as exc:
        # Retryable: a bad body is most often a proxy's error page or a cut-off response,
        # which the next attempt does not repeat; a server that always answers like this
        # costs only the loop's few bounded retries before the session fails.
        raise ProviderError(
            scrub(f"{provider}: malformed response (HTTP {status}) from {endpoint}: {exc}"),
            permanent=False,
            status=status,
        ) from None


def translate_sdk_error(
    exc: Exception,
    *,
    sdk: ModuleType,
    base_error: type[Exception],
    provider: str,
    endpoint: str,
    timeout: float,
) -> ProviderError:
    """Map an exception of an official SDK (both share one generated error hierarchy:
    APIStatusError, APITimeoutError, APIConnectionError under `base_error`).

    The message is not scrubbed here; the caller does that with its own secrets.
    """
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        reason = exc.response.reason_phrase or _phrase(status)
        message = f"{provider}: {status} {reason}".rstrip()
        detail = server_detail(exc.body)
        if detail:
            message += f": {detail}"
        return ProviderError(message, permanent=is_permanent_status(status), status=status)
    if isinstance(exc, sdk.APITimeoutError):  # before APIConnectionError: a subclass of it
        return ProviderError(
            f"{provider}: no response from {endpoint} within {timeout:g}s", permanent=False
        )
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        return ProviderError(f"{provider}: cannot reach {endpoint}: {detail}", permanent=False)
    # The SDK's other errors come from building the client or the request (configuration,
    # arguments), before anything was sent: the same call would fail the same way.
    # Anything else is unexpected; the loop's own rule for those is to retry.
    return ProviderError(
        f"{provider}: {type(exc).__name__}: {exc}", permanent=isinstance(exc, base_error)
    )


def _phrase(status: int) -> str:
    if status == 529:
        return "Overloaded"  # Anthropic's own status, unknown to the HTTP standard
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def decode_arguments(text: str) -> dict[str, Any]:
    """Tool-call arguments from the JSON text a model wrote (see INVALID_ARGUMENTS_KEY)."""
    if not text.strip():
        return {}  # some compatible servers send "" for a call without arguments
    try:
        value = json.loads(text)
    except ValueError:
        return {INVALID_ARGUMENTS_KEY: text}
    return value if isinstance(value, dict) else {INVALID_ARGUMENTS_KEY: text}


def canonical_json(value: Any) -> str:
    """A JSON value's text with object keys sorted.

    A payload read back from PostgreSQL's JSONB has its keys in JSONB's order, not the
    model's; sorting makes the request bytes of a resumed run equal to an uninterrupted
    one's whatever store they came from (and keeps prompt-cache prefixes stable).
    """
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def canonical(value: Any) -> Any:
    """The same JSON value with object keys sorted (see canonical_json)."""
    return json.loads(canonical_json(value))


def response_object(text: str) -> dict[str, Any]:
    """A response body's JSON object; MalformedResponse if the body is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        raise MalformedResponse(f"the body is not JSON: {snippet(text)}") from None
    if not isinstance(data, dict):
        raise MalformedResponse(f"expected a JSON object, got {kind(data)}")
    return data


def object_or_empty(value: object) -> dict[str, Any]:
    """An optional object in a response (usage figures, which compatible servers may leave
    out): the object, or {} when it is missing or not one."""
    return value if isinstance(value, dict) else {}


def snippet(text: str, limit: int = 200) -> str:
    return repr(shorten(text, limit)) if text.strip() else "an empty body"


def kind(value: object) -> str:
    """A JSON-ish name for a value's type, for malformed-response messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "?")


def token_count(value: object) -> int:
    """A usage figure, or 0 when a (compatible) server sends none or nonsense."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0
