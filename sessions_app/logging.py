import logging
import re
import traceback
from urllib.parse import unquote_plus

from agent_runtime.redaction import BUILT_IN_REDACTION, Redactor

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def _redactor() -> Redactor:
    try:
        from .runtime import redactor

        return redactor()
    except Exception:  # no settings in this process (a server's master): built-ins only
        return BUILT_IN_REDACTION


def _decoded(line: str, rounds: int = 4) -> str:
    """A request line percent-decoded until nothing changes (a few rounds at most): a URL
    inside a parameter is encoded twice (the log-in page's `next=/sessions/%3Fq%3D...`),
    and a secret in it once more than that."""
    for _ in range(rounds):
        decoded = unquote_plus(line)
        if decoded == line:
            break
        line = decoded
    return line


class OneLineRefusals(logging.Filter):
    """A refused request (a 4xx: a role the user lacks, a bad request, a state that does
    not allow the action) is logged as one line saying what was refused and why, not with
    the traceback of the exception that answered it: nothing went wrong in the server.
    Django logs these with their exception (PermissionDenied, BadRequest, a suspicious
    operation); a 5xx keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500 or not record.exc_info:
            return True
        exc = record.exc_info[1]
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        reason = " ".join(str(exc).split()) if exc is not None else ""
        record.msg = f"{message}: {reason}" if reason and reason not in message else message
        record.args = None
        record.exc_info = record.exc_text = None
        return True


class RedactingFilter(logging.Filter):
    """Replaces secret-looking values in a log record before it is emitted: its message,
    the traceback of an exception it carries (an exception's text may quote a secret),
    and its stack.

    `decode_urls`: for request lines, whose query strings are percent-encoded (a password
    in `?dsn=postgres%3A%2F%2Fapp%3Apw%40db` has none of the shapes the patterns know):
    the line is decoded, then redacted."""

    def __init__(self, name: str = "", decode_urls: bool = False) -> None:
        super().__init__(name)
        self.decode_urls = decode_urls

    def filter(self, record: logging.LogRecord) -> bool:
        redact = _redactor().text
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        if self.decode_urls:
            # Decoded, a %0A would start a forged log line: control characters stay escaped.
            clean = _CONTROL.sub(_escaped, redact(_decoded(message)))
        else:
            clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # The formatter uses exc_text when it is set, so the traceback it prints is
            # this redacted one.
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
