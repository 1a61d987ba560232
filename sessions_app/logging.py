import logging


class RedactingFilter(logging.Filter):
    """Replaces secret-looking values in a log record's message before it is emitted."""

    def filter(self, record: logging.LogRecord) -> bool:
        from .runtime import redactor

        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        clean = redactor().text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
