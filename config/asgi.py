import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_asgi_application()

# gunicorn and uvicorn run no system checks: refuse to serve with agents that cannot load.
from sessions_app.checks import refuse_to_start_on_agent_errors  # noqa: E402

refuse_to_start_on_agent_errors()
