"""The admin's edit forms. A JSON blob an admin edits (a step payload, a checkpoint state)
is accepted only if it parses and agent_runtime loads it at the schema version the row is
stored at: anything else is a field error and nothing is saved."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from ..models import AgentSession, ApiToken, Checkpoint, Step
from ..validation import (
    MAX_JSON_DEPTH,
    InvalidInput,
    check_json_value,
    json_depth,
    validate_checkpoint_state_json,
    validate_step_payload_json,
)

RUNNING = (
    "The session is running (a worker holds its lease): its history cannot be edited until "
    "it stops. Cancel it or wait, then save again."
)


class PrettyJSONField(forms.JSONField):
    """A JSON textarea, indented so a person can edit it. What is typed is checked for depth
    before it is parsed, and for what storage cannot hold (sessions_app/validation.py)."""

    widget = forms.Textarea(attrs={"rows": 24, "cols": 100, "class": "vLargeTextField"})
    # `{}` and `[]` are values the schema judges (and names what they lack), not "empty".
    empty_values = [None, ""]
    default_error_messages = {
        "required": "Give a JSON object here (an empty field or null is not one).",
    }

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
