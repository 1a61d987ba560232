"""gunicorn settings: `gunicorn -c config/gunicorn.py config.wsgi`.

gunicorn logs through its own loggers, not Django's LOGGING: its access log holds every
request line, query string included, and its error log the tracebacks it catches. Both go
through Respawn's redacting filter, as every other log line does."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

_redact = {
    "redact": {"()": "sessions_app.logging.RedactingFilter"},
    # Request lines carry percent-encoded query strings: decoded, then redacted.
    "redact_urls": {"()": "sessions_app.logging.RedactingFilter", "decode_urls": True},
}

logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": _redact,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"},
        "access": {"format": "%(message)s"},
    },
    "handlers": {
        "error_console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact"],
            "stream": "ext://sys.stderr",
        },
        "access_console": {
            "class": "logging.StreamHandler",
            "formatter": "access",
            "filters": ["redact_urls"],
            "stream": "ext://sys.stdout",
        },
    },
    "loggers": {
        "gunicorn.error": {"handlers": ["error_console"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": ["access_console"], "level": "INFO", "propagate": False},
    },
    "root": {"handlers": ["error_console"], "level": "WARNING"},
}
