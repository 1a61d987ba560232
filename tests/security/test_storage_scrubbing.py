"""The storage choke point (sessions_app/redaction.py): every free-text and JSON column
scrubs what is written to it, on every way Django writes, and the engine's SQL path too."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.admin.models import ADDITION, LogEntry
from django.db import connection, models

from agent_runtime.providers import ProviderError
from sessions_app.models import AgentSession, ApiToken, AuditEvent, SideEffect, Step
from sessions_app.redaction import REPLACEMENT, _Scrubbed
from sessions_app.services.core import session_start
from sessions_app.store import DjangoEffects

from ..conftest import run_inline

pytestmark = pytest.mark.django_db

SECRET = "ghp_" + "Zq7" * 12  # a GitHub token's shape
MARKER = "[REDACTED:github-token]"

# Columns that hold no free text: identifiers, enumerations, hashes, names chosen by code.
NOT_FREE_TEXT = {
    "sessions_app.AgentSession": {
        "agent",
        "agent_version",
        "status",
        "lease_owner",
        "job_id",
        "incompatible_agent_version",
    },
    "sessions_app.Step": {"kind", "idempotency_key"},
    "sessions_app.Checkpoint": {"reason"},
    "sessions_app.AuditEvent": {"action"},
    "sessions_app.SideEffect": {"key", "tool"},
    "sessions_app.DemoRecord": {"dataset", "migrated_by_key"},
    "sessions_app.DemoBatch": {"key", "dataset"},
    "sessions_app.ApiToken": {"key_hash", "key_prefix", "role"},
    # A team's slug (a URL-safe identifier), an agent's name, a role (an enumeration).
    "sessions_app.Team": {"slug"},
    "sessions_app.TeamAgent": {"agent"},
    "sessions_app.Membership": {"role"},
    # An agent's name (as the session row holds it) and a provider:model spec.
    "sessions_app.ModelUsage": {"agent", "model"},
    "sessions_app.LoginFailure": {"account"},  # a keyed hash
    # A provider's issuer URL and a person's subject there: identifiers matched exactly.
    "sessions_app.SsoIdentity": {"issuer", "subject"},
    "admin.LogEntry": {"object_id"},  # the primary key of what was edited
    # LangGraph's own tables: names and versions of threads, checkpoints and channels; and
    # the graph's checkpoint body and metadata, kept as the graph wrote them (it resumes
    # from them; README, Security). The steps and checkpoints Respawn records for a graph
    # are scrubbed like any other.
    # Alert rules: an agent's name, reason and channel names, a seal key's id; and the
    # receiver's address, read back exactly to send to it (pages show it without its query
    # string and a Slack URL's secret path).
    "sessions_app.AlertRule": {"agent", "reasons", "channel", "target", "secret_key_id"},
    "sessions_app.AlertEvent": {"agent", "reason"},
    "sessions_app.AlertDelivery": {"kind", "status"},
    "sessions_app.GraphThread": {"thread_id"},
    "sessions_app.GraphCheckpoint": {"ns", "checkpoint_id", "parent_id", "body", "metadata"},
    "sessions_app.GraphBlob": {"ns", "channel", "version", "type", "base_version"},
    "sessions_app.GraphWrite": {"ns", "checkpoint_id", "task_id", "task_path", "channel", "type"},
}


def stored(table: str, column: str, where: str, value) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}::text FROM {table} WHERE {where} = %s", [value])
        return cursor.fetchone()[0]


def test_every_free_text_column_of_respawn_and_the_admin_history_scrubs():
    unchecked = []
    for model in [*apps.get_app_config("sessions_app").get_models(), LogEntry]:
        label = model._meta.label
        for field in model._meta.concrete_fields:
            text = isinstance(field, models.CharField | models.TextField | models.JSONField)
            if not text or field.name in NOT_FREE_TEXT.get(label, set()):
                continue
            if not isinstance(field, _Scrubbed):
                unchecked.append(f"{label}.{field.name}")
    assert not unchecked, f"free-text columns that do not scrub: {unchecked}"


def test_every_way_of_writing_a_row_scrubs_it():
    session = AgentSession.objects.create(agent="echo", title=f"create {SECRET}")
    assert session.title == f"create {MARKER}"  # the instance holds what was stored
    assert stored("sessions_app_agentsession", "title", "id", session.id) == session.title
    session.title = f"save {SECRET}"
    session.save(update_fields=["title"])
    assert MARKER in stored("sessions_app_agentsession", "title", "id", session.id)
    AgentSession.objects.filter(id=session.id).update(last_error=f"update {SECRET}")
    assert stored("sessions_app_agentsession", "last_error", "id", session.id) == (
        f"update {MARKER}"
    )
    steps = Step.objects.bulk_create(
        [Step(session=session, seq=n, kind="user", payload={"text": SECRET}) for n in (1, 2)]
    )
    for step in steps:
        step.payload = {"text": f"bulk_update {SECRET}"}
    Step.objects.bulk_update(steps, ["payload"])
    texts = [stored("sessions_app_step", "payload", "id", s.pk) for s in steps]
    assert all(SECRET not in t and MARKER in t for t in texts), texts


def test_a_marker_longer_than_the_secret_still_fits_its_column(users):
    token, _ = ApiToken.issue(users["operator"], name="pwd=abc " + "x" * 92)
    assert len(token.name) == 100 and "abc" not in token.name
    assert stored("sessions_app_apitoken", "name", "id", token.pk) == token.name


def test_nul_and_lone_surrogates_are_stored_as_replacement_characters():
    """The last resort for a write no edge checked (a tool's output): PostgreSQL refuses
    NUL and lone surrogates, so they are replaced rather than failing the run."""
    DjangoEffects().record(
        "k1",
        session_id="00000000-0000-0000-0000-000000000001",
        tool="t",
        payload={"out\x00": "a\x00b\ud800c"},
    )
    effect = SideEffect.objects.get(key="k1")
    assert effect.payload == {f"out{REPLACEMENT}": f"a{REPLACEMENT}b{REPLACEMENT}c"}


def test_admin_history_is_scrubbed_one_entry_or_many(users):
    user = users["operator"]
    first = AgentSession.objects.create(agent="echo")
    second = AgentSession.objects.create(agent="echo")
    AgentSession.objects.filter(id__in=[first.id, second.id]).update(title=f"x {SECRET}")
    first.title = second.title = f"in memory {SECRET}"  # what the admin's objects hold
    LogEntry.objects.log_actions(user.pk, [first], ADDITION, f"note {SECRET}", single_object=True)
    LogEntry.objects.log_actions(user.pk, [first, second], ADDITION, [{"added": {"n": SECRET}}])
    assert LogEntry.objects.count() == 3
    for entry in LogEntry.objects.all():
        assert SECRET not in entry.object_repr + entry.change_message
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT object_repr || change_message FROM django_admin_log WHERE id = %s",
                [entry.pk],
            )
            assert SECRET not in cursor.fetchone()[0]


class _Leaky:
    def complete(self, messages, tools, settings):
        raise ProviderError(f"upstream said: bad credentials {SECRET}", permanent=True)


def test_the_error_of_a_failed_run_is_stored_redacted_on_the_session(users):
    """The error step and the session's last error are two copies of the same text."""
    session = session_start(agent="echo", input="hi", actor=users["operator"])
    run_inline(session, make_provider=lambda spec, options: (_Leaky(), "m"))
    assert session.status == "failed"
    assert SECRET not in session.last_error and MARKER in session.last_error
    assert SECRET not in stored("sessions_app_agentsession", "last_error", "id", session.id)
    error = Step.objects.get(session=session, kind="error")
    assert SECRET not in str(error.payload)


def test_audit_records_scrub_their_request_metadata(client, users):
    client.force_login(users["operator"])
    session = session_start(agent="echo", input="hi")
    AgentSession.objects.filter(id=session.id).update(status="paused")
    client.post(
        f"/sessions/{session.id}/actions/resume/",
        HTTP_USER_AGENT=f"curl/8.0 Authorization: Bearer {SECRET}",
    )
    event = AuditEvent.objects.get(session=session, action="resume")
    assert SECRET not in str(event.request_meta) and "curl/8.0" in event.request_meta["user_agent"]
