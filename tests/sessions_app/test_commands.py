import re
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from sessions_app.models import AgentSession, AuditEvent, Status, Step

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "nope", "--input", "hi"], "unknown agent 'nope'"),
        (["--agent", "demo", "--input", ""], "input must not be empty"),
    ],
)
def test_start_session_bad_input_is_one_line_error_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message) as exc:
        call_command("start_session", *args, stdout=StringIO())
    assert "\n" not in str(exc.value)
    assert AgentSession.objects.count() == Step.objects.count() == AuditEvent.objects.count() == 0


def test_start_session_prints_the_id():
    out = StringIO()
    call_command("start_session", "--agent", "echo", "--input", "hi", stdout=out)
    session_id = out.getvalue().strip()
    assert AgentSession.objects.get(id=session_id).status == Status.QUEUED


@pytest.mark.parametrize(
    ("raw", "message"),
    [("not-a-uuid", "not a session id"), (str(uuid.UUID(int=7)), "no session with id")],
)
def test_resume_session_bad_id(raw, message):
    with pytest.raises(CommandError, match=message):
        call_command("resume_session", raw, stdout=StringIO())


def test_start_session_exits_non_zero_from_the_shell():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "manage.py", "start_session", "--agent", "nope", "--input", "x"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "config.settings_test"},
    )
    assert out.returncode != 0
    assert (
        out.stderr.strip()
        == "CommandError: unknown agent 'nope' (known: approval, demo, echo, flaky, migrate, notify, poison, research, slow)"
    )


def test_seed_demo_creates_users_and_every_status():
    call_command("seed_demo", stdout=StringIO())
    statuses = set(AgentSession.objects.values_list("status", flat=True))
    assert {
        "completed",
        "waiting_input",
        "failed",
        "paused",
        "cancelled",
        "running",
        "queued",
    } <= statuses
    stuck = AgentSession.objects.get(title="worker crashed mid-tool-call")
    assert stuck.is_stuck()
    from django.contrib.auth.models import User

    assert User.objects.get(username="operator").groups.filter(name="operator").exists()
    assert User.objects.get(username="viewer").groups.filter(name="viewer").exists()
    assert User.objects.get(username="admin").is_superuser
    # Running it again adds nothing.
    count = AgentSession.objects.count()
    call_command("seed_demo", stdout=StringIO())
    assert AgentSession.objects.count() == count


def test_seed_demo_refuses_in_production_mode_unless_forced(settings):
    from django.contrib.auth.models import User

    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="refusing to create demo accounts in production"):
        call_command("seed_demo", stdout=StringIO())
    assert not User.objects.exists() and not AgentSession.objects.exists()
    out = StringIO()
    call_command("seed_demo", "--force", stdout=out)
    text = out.getvalue()
    assert "changepassword" in text
    for username in ("admin", "operator", "viewer"):
        password = re.search(rf"{username}\s+password (\S+)", text)[1]
        user = User.objects.get(username=username)
        assert password != username and len(password) >= 16
        assert user.check_password(password) and not user.check_password(username)
    assert AgentSession.objects.exists()


def test_seed_demo_prints_the_demo_passwords_outside_production():
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert re.search(r"viewer\s+password viewer\s", out.getvalue())
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert "viewer    exists already, password unchanged" in out.getvalue()


def test_seed_demo_refuses_in_a_production_deployment():
    """As a deployment runs it: DATABASE_URL set, DEBUG off, a real SECRET_KEY."""
    import os
    import secrets
    import subprocess
    import sys

    dropped = ("DEBUG", "RESPAWN_PRODUCTION", "SECRET_KEY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", SECRET_KEY=secrets.token_urlsafe(64))
    out = subprocess.run(
        [sys.executable, "manage.py", "seed_demo"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "refusing to create demo accounts in production mode" in out.stderr
