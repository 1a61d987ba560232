"""The admin's edit forms. A JSON blob an admin edits (a step payload, a checkpoint state)
is accepted only if it parses and agent_runtime loads it at the schema version the row is
stored at: anything else is a field error and nothing is saved."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from agent_runtime.state import StateError
from agent_runtime.upgraders import IncompatibleSchemaError, load_state, load_step_payload

from .models import AgentSession, ApiToken, Checkpoint, Step
from .validation import MAX_JSON_DEPTH, InvalidInput, check_json_value, json_depth

# What a broken blob can raise on its way through the upgraders and the state's from_dict.
LOAD_ERRORS = (IncompatibleSchemaError, StateError, KeyError, TypeError, ValueError, AttributeError)

RUNNING = (
    "The session is running (a worker holds its lease): its history cannot be edited until "
    "it stops. Cancel it or wait, then save again."
)


def validate_step_payload_json(kind: str, payload: Any, schema_version: int) -> None:
    """Refuse a payload that agent_runtime cannot load as a `kind` step stored at
    `schema_version`. The one place the admin calls the engine's step loader."""
    try:
        load_step_payload(kind, payload, schema_version)
    except LOAD_ERRORS as exc:
        raise ValidationError(
            "This %(kind)s payload does not load at schema version %(version)s: %(error)s",
            code="schema",
            params={"kind": kind, "version": schema_version, "error": exc},
        ) from exc


def validate_checkpoint_state_json(state: Any, schema_version: int) -> None:
    """Refuse a state that agent_runtime cannot load, or whose own schema_version is not
    the one the checkpoint is stored at (the version is history: not editable)."""
    if not isinstance(state, dict):
        raise ValidationError("A checkpoint state must be a JSON object.", code="schema")
    if state.get("schema_version") != schema_version:
        raise ValidationError(
            "The state's schema_version must stay %(version)s (found %(found)r).",
            code="schema_version",
            params={"version": schema_version, "found": state.get("schema_version")},
        )
    try:
        load_state(state)
    except LOAD_ERRORS as exc:
        raise ValidationError(
            "This state does not load at schema version %(version)s: %(error)s",
            code="schema",
            params={"version": schema_version, "error": exc},
        ) from exc


class PrettyJSONField(forms.JSONField):
    """A JSON textarea, indented so a person can edit it. What is typed is checked for depth
    before it is parsed, and for what storage cannot hold (sessions_app/validation.py)."""

    widget = forms.Textarea(attrs={"rows": 24, "cols": 100, "class": "vLargeTextField"})

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and json_depth(value) > MAX_JSON_DEPTH:
            raise ValidationError(
                "The JSON nests deeper than %(max)d levels.",
                code="invalid",
                params={"max": MAX_JSON_DEPTH},
            )
        converted = super().to_python(value)
        try:
            return check_json_value(converted, "JSON")
        except InvalidInput as exc:
            raise ValidationError(str(exc), code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, str) and json_depth(data) > MAX_JSON_DEPTH:
            return forms.fields.InvalidJSONInput(data)  # redisplayed as typed
        return super().bound_data(data, initial)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value  # redisplay what was typed, as typed
        return json.dumps(value, ensure_ascii=False, indent=2, cls=self.encoder)


class SessionAdminForm(forms.ModelForm):
    class Meta:
        model = AgentSession
        fields = ["title"]


class _SessionHistoryForm(forms.ModelForm):
    """An edit of a session's history: its one JSON blob (`blob`, checked by `check`).
    Refused while a worker holds the session's lease (checked here to keep what was
    typed; admin_services checks again under the lock)."""

    blob: str

    def check(self, value: Any) -> None:
        raise NotImplementedError

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.blob in cleaned:
            try:
                self.check(cleaned[self.blob])
            except ValidationError as exc:
                self.add_error(self.blob, exc)
        if self.instance.session.lease_is_live():
            raise ValidationError(RUNNING, code="already_running")
        return cleaned


class StepAdminForm(_SessionHistoryForm):
    blob = "payload"
    payload = PrettyJSONField(
        help_text="Checked against the state schema for this kind of step before it is saved."
    )

    class Meta:
        model = Step
        fields = ["payload"]

    def check(self, value: Any) -> None:
        validate_step_payload_json(self.instance.kind, value, self.instance.schema_version)


class CheckpointAdminForm(_SessionHistoryForm):
    blob = "state"
    state = PrettyJSONField(
        help_text="Checked against the state schema (and its upgraders) before it is saved."
    )

    class Meta:
        model = Checkpoint
        fields = ["state"]

    def check(self, value: Any) -> None:
        validate_checkpoint_state_json(value, self.instance.schema_version)


class ApiTokenAddForm(forms.ModelForm):
    """Who the token is for and what to call it; the secret is generated on save."""

    class Meta:
        model = ApiToken
        fields = ["user", "name"]
