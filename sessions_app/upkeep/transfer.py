"""Export and import of one session: a self-describing, gzip-compressed JSON-lines file.

    {"kind": "respawn-export", "format": 1, "schema_version": 3, "session_id": ..., ...}
    {"kind": "session", "data": {...the session row...}}
    {"kind": "step", "data": {...}}           every step, superseded ones included, by seq
    {"kind": "checkpoint", "data": {...}}     every checkpoint, by seq
    {"kind": "audit", "data": {...}}          the session's audit records, oldest first
    {"kind": "end", "counts": {...}, "sha256": "..."}   over every line before it

Blobs are written as stored, each with its schema version, so a file made by an older
Respawn imports through the upgraders and a blob newer than the importing code is refused.
The last line's digest and counts make a truncated or edited file fail as a whole: an
import checks the entire file first, then writes everything in one transaction or
nothing. The demo tools' effect rows are not part of a session's export (they stand for the
world outside Respawn).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import IO, Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.upgraders import (
    IncompatibleSchemaError,
    Loaded,
    load_step_payload,
    upgrade_state_blob,
)

from ..models import (
    RUNNABLE,
    AgentSession,
    AuditAction,
    AuditEvent,
    Checkpoint,
    Kind,
    Reason,
    Status,
    Step,
)
from ..runtime import redactor
from ..services.core import ActionError, Actor, _actor, audit
from ..store import writes

FORMAT = 1
MAGIC = "respawn-export"
# A bigger file is refused before it is read into memory (a session of ~10^5 steps).
MAX_BYTES = 512 * 1024 * 1024

# Columns of the session row that describe a run in progress on the exporting side: an
# imported session never claims to be running there.
_RUN_COLUMNS = ("lease_owner", "lease_expires_at", "job_id", "dispatched_at")
_SESSION_SKIP = {"created_by", "parent"}
_DATETIME_FIELDS = {
    f.name
    for model in (AgentSession, Step, Checkpoint, AuditEvent)
    for f in model._meta.concrete_fields
    if f.get_internal_type() == "DateTimeField"
}


class TransferError(ActionError):
    """A file that cannot be imported; the message names the line and the problem."""

    def __init__(self, message: str, *, code: str = "bad_export") -> None:
        super().__init__(message, code=code)


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    return value


def _row(instance: Any, skip: set[str]) -> dict[str, Any]:
    return {
        f.attname if f.is_relation else f.name: _value(getattr(instance, f.attname))
        for f in instance._meta.concrete_fields
        if f.name not in skip
    }


def export_lines(session: AgentSession) -> Iterator[bytes]:
    """The file's lines (uncompressed, each ending in a newline), streamed from the
    database in seq order; the digest covers every line before the last."""
    digest = hashlib.sha256()
    counts = {"step": 0, "checkpoint": 0, "audit": 0}

    def line(record: dict[str, Any]) -> bytes:
        data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        digest.update(data)
        return data

    yield line(
        {
            "kind": MAGIC,
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "session_id": str(session.id),
            "exported_at": timezone.now().isoformat(),
        }
    )
    row = _row(session, _SESSION_SKIP)
    row["created_by"] = session.created_by.get_username() if session.created_by else None
    row["parent"] = str(session.parent_id) if session.parent_id else None
    yield line({"kind": "session", "data": row})
    for step in Step.objects.filter(session=session).order_by("seq").iterator(chunk_size=500):
        counts["step"] += 1
        yield line({"kind": "step", "data": _row(step, {"id", "session"})})
    for checkpoint in Checkpoint.objects.filter(session=session).order_by("seq", "id"):
        counts["checkpoint"] += 1
        yield line({"kind": "checkpoint", "data": _row(checkpoint, {"id", "session"})})
    for event in AuditEvent.objects.filter(session=session).order_by("created_at", "id"):
        counts["audit"] += 1
        yield line({"kind": "audit", "data": _row(event, {"id", "session", "actor"})})
    end = {"kind": "end", "counts": counts, "sha256": digest.hexdigest()}
    yield (json.dumps(end, sort_keys=True, separators=(",", ":")) + "\n").encode()


def export_session(
    session: AgentSession, out: IO[bytes], *, actor: Actor = None, request_meta: dict | None = None
) -> dict[str, int]:
    """Write the session's export (gzip) to `out`; audited. Returns the counts."""
    counts = {"step": 0, "checkpoint": 0, "audit": 0}
    # mtime=0: the same session exports to the same bytes (a file can be compared).
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        for data in export_lines(session):
            gz.write(data)
            kind = json.loads(data)["kind"]
            if kind in counts:
                counts[kind] += 1
    audit(
        actor=_actor(actor),
        action=AuditAction.EXPORT,
        session=session,
        after={"counts": counts, "format": FORMAT, "schema_version": SCHEMA_VERSION},
        request_meta=request_meta,
    )
    return counts


def export_bytes(session: AgentSession, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    export_session(session, buffer, **kwargs)
    return buffer.getvalue()


# --- import -----------------------------------------------------------------------------


@dataclass
class Parsed:
    header: dict[str, Any]
    session: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)


def _decompress(raw: bytes) -> bytes:
    if len(raw) > MAX_BYTES:
        raise TransferError(f"the file is larger than {MAX_BYTES // 2**20} MB")
    try:
        data = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise TransferError(f"not a complete gzip file: {exc}") from None
    if len(data) > 8 * MAX_BYTES:
        raise TransferError("the file unpacks to more than 4 GB")
    return data


def parse(raw: bytes) -> Parsed:
    """Read and check a whole export; raises TransferError naming the first problem."""
    lines = _decompress(raw).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) < 3:
        raise TransferError("the file is too short to be a session export")
    records = []
    for number, data in enumerate(lines, start=1):
        try:
            record = json.loads(data)
        except ValueError:
            raise TransferError(f"line {number} is not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise TransferError(f"line {number} is not a record with a kind")
        records.append(record)
    header, end = records[0], records[-1]
    if header.get("kind") != MAGIC:
        raise TransferError("the first line is not a Respawn session export header")
    if not isinstance(header.get("format"), int) or header["format"] > FORMAT:
        raise TransferError(
            f"export format {header.get('format')!r} is newer than this Respawn reads "
            f"(up to {FORMAT})"
        )
    if end.get("kind") != "end":
        raise TransferError("the file ends before its last line: it is truncated")
    digest = hashlib.sha256()
    for data in lines[:-1]:
        digest.update(data + b"\n")
    if digest.hexdigest() != end.get("sha256"):
        raise TransferError("the file's digest does not match its contents: it was changed")
    body = records[1:-1]
    sessions = [r for r in body if r["kind"] == "session"]
    if len(sessions) != 1 or body[0]["kind"] != "session":
        raise TransferError("the file must hold exactly one session, right after the header")
    parsed = Parsed(header=header, session=_object(sessions[0], 2))
    buckets = {"step": parsed.steps, "checkpoint": parsed.checkpoints, "audit": parsed.audit}
    for number, record in enumerate(body[1:], start=3):
        bucket = buckets.get(record["kind"])
        if bucket is None:
            raise TransferError(f"line {number}: unknown record kind {record['kind']!r}")
        bucket.append(_object(record, number))
    counts = {kind: len(items) for kind, items in buckets.items()}
    if end.get("counts") != counts:
        raise TransferError(f"the file's counts {end.get('counts')} do not match {counts}")
    return parsed


def _object(record: dict[str, Any], number: int) -> dict[str, Any]:
    data = record.get("data")
    if not isinstance(data, dict):
        raise TransferError(f"line {number}: its data is not an object")
    return data


def _time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise TransferError(f"{where}: not a date and time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _fields(model: type[Model], data: dict[str, Any], where: str, skip: set[str]) -> dict[str, Any]:
    """The model's columns from an exported row: known names only, types checked."""
    out: dict[str, Any] = {}
    for f in model._meta.concrete_fields:
        name = f.attname if f.is_relation else f.name
        if f.name in skip or name not in data:
            continue
        value = data[name]
        if f.name in _DATETIME_FIELDS:
            value = _time(value, f"{where} {f.name}")
        elif f.get_internal_type() == "DecimalField":
            try:
                value = Decimal(str(value))
            except InvalidOperation:
                raise TransferError(f"{where} {f.name}: not a number: {value!r}") from None
        elif f.get_internal_type() in ("CharField", "TextField") and value is not None:
            if not isinstance(value, str):
                raise TransferError(f"{where} {f.name}: not a string")
            if "\x00" in value:
                raise TransferError(f"{where} {f.name}: contains a NUL character")
            if f.max_length and len(value) > f.max_length:
                raise TransferError(f"{where} {f.name}: longer than {f.max_length} characters")
        elif f.get_internal_type().endswith("IntegerField") and value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise TransferError(f"{where} {f.name}: not an integer: {value!r}")
            if "Positive" in f.get_internal_type() and value < 0:
                raise TransferError(f"{where} {f.name}: negative")
        out[f.attname] = value
    return out


def _upgraded(
    row: dict[str, Any],
    column: str,
    load: Callable[[], Loaded],
    clean: Callable[[Any], Any],
    where: str,
) -> bool:
    """Bring one exported blob to the current schema through the upgraders, redacted, in
    `row` (a blob this code cannot load is refused); True if it was stored at an older one."""
    try:
        loaded = load()
    except IncompatibleSchemaError as exc:
        raise TransferError(f"{where}: {exc}") from None
    row.update({column: clean(loaded.value), "schema_version": SCHEMA_VERSION})
    return bool(loaded.applied)


@dataclass(frozen=True)
class Imported:
    session: AgentSession
    steps: int
    checkpoints: int
    audit: int
    upgraded: int  # blobs stored at an older schema version, upgraded on the way in
    remapped_from: str | None


def import_session(
    raw: bytes,
    *,
    new_ids: bool = False,
    actor: Actor = None,
    request_meta: dict | None = None,
) -> Imported:
    """Import an export: checked whole first (digest, counts, every blob through the
    upgraders), then written in one transaction. With new_ids the session gets a new id
    (and every mention of the old one in its payloads, keys and answers becomes the new
    one); without, an id that exists already is refused. A session that was queued or
    running where it came from arrives paused: nothing runs until someone resumes it."""
    parsed = parse(raw)
    old_id = str(parsed.session.get("id") or parsed.header.get("session_id") or "")
    try:
        uuid.UUID(old_id)
    except ValueError:
        raise TransferError(f"the session id {old_id!r} is not a UUID") from None
    session_id = str(uuid.uuid4()) if new_ids else old_id
    if new_ids:
        parsed = _renamed(parsed, old_id, session_id)
    elif AgentSession.objects.filter(id=session_id).exists():
        raise TransferError(
            f"a session with id {session_id} exists already; import with new ids to keep both",
            code="exists",
        )
    clean = redactor().redact
    fields = _fields(AgentSession, parsed.session, "session", {"id", "created_by", "parent"})
    fields["id"] = uuid.UUID(session_id)
    if fields.get("status") not in Status.values:
        raise TransferError(f"session status: unknown status {fields.get('status')!r}")
    if not isinstance(fields.get("agent"), str) or not fields["agent"]:
        raise TransferError("session agent: missing")
    if fields["status"] in RUNNABLE:
        fields["status"] = Status.PAUSED
    for column in _RUN_COLUMNS:
        fields[column] = None if column != "job_id" else ""
    fields["cancel_requested"] = False
    for name in ("title", "last_error", "final_answer"):
        if isinstance(fields.get(name), str):
            fields[name] = redactor().text(fields[name])
    user = get_user_model()
    username = parsed.session.get("created_by")
    parent = parsed.session.get("parent")
    upgraded = 0
    steps = []
    seqs = set()
    for index, data in enumerate(parsed.steps, start=1):
        where = f"step {index}"
        row = _fields(Step, data, where, {"id", "session"})
        seq, kind = row.get("seq"), row.get("kind")
        if not isinstance(seq, int) or seq < 1 or seq in seqs:
            raise TransferError(f"{where}: seq {seq!r} is missing, not positive or repeated")
        if kind not in Kind.values:
            raise TransferError(f"{where}: unknown kind {kind!r}")
        seqs.add(seq)
        upgraded += _upgraded(
            row,
            "payload",
            partial(load_step_payload, kind, row.get("payload"), row.get("schema_version")),
            clean,
            f"step seq {seq} ({kind})",
        )
        steps.append(row)
    checkpoints = []
    for index, data in enumerate(parsed.checkpoints, start=1):
        where = f"checkpoint {index}"
        row = _fields(Checkpoint, data, where, {"id", "session"})
        if not isinstance(row.get("seq"), int) or row["seq"] not in seqs | {0}:
            raise TransferError(f"{where}: seq {row.get('seq')!r} is not a step of the session")
        if row.get("reason") not in Reason.values:
            raise TransferError(f"{where}: unknown reason {row.get('reason')!r}")
        upgraded += _upgraded(
            row,
            "state",
            partial(upgrade_state_blob, row.get("state")),
            clean,
            f"checkpoint at seq {row['seq']}",
        )
        checkpoints.append(row)
    events = []
    for index, data in enumerate(parsed.audit, start=1):
        row = _fields(AuditEvent, data, f"audit record {index}", {"id", "session", "actor"})
        for name in ("before", "after", "request_meta"):
            if not isinstance(row.get(name, {}), dict):
                raise TransferError(f"audit record {index} {name}: not an object")
            row[name] = clean(row.get(name, {}))
        events.append(row)
    head = fields.get("head") or 0
    if head and head not in {c["seq"] for c in checkpoints}:
        raise TransferError(f"session head {head} has no checkpoint in the file")
    if fields.get("last_seq") != (max(seqs) if seqs else 0):
        raise TransferError(
            f"session last_seq {fields.get('last_seq')!r} does not match its steps "
            f"(the highest seq is {max(seqs) if seqs else 0})"
        )
    with transaction.atomic():
        session = AgentSession(**fields)
        session.created_by = user.objects.filter(username=username).first() if username else None
        if parent and AgentSession.objects.filter(id=parent).exists():
            session.parent_id = parent
        counts = writes.insert_imported(session, steps, checkpoints, events)
        result = Imported(
            session=session,
            steps=counts[0],
            checkpoints=counts[1],
            audit=counts[2],
            upgraded=upgraded,
            remapped_from=old_id if new_ids else None,
        )
        audit(
            actor=_actor(actor),
            action=AuditAction.IMPORT,
            session=session,
            after={
                "steps": result.steps,
                "checkpoints": result.checkpoints,
                "audit_records": result.audit,
                "upgraded_blobs": upgraded,
                "exported_with_schema_version": parsed.header.get("schema_version"),
                "exported_at": parsed.header.get("exported_at"),
                "remapped_from": result.remapped_from,
            },
            request_meta=request_meta,
        )
    return result


def _renamed(parsed: Parsed, old: str, new: str) -> Parsed:
    """Every mention of the old session id (payloads, keys, answers, audit) as the new."""

    def swap(value: Any) -> Any:
        return json.loads(json.dumps(value).replace(old, new))

    return Parsed(
        header=parsed.header,
        session={**swap(parsed.session), "id": new},
        steps=swap(parsed.steps),
        checkpoints=swap(parsed.checkpoints),
        audit=swap(parsed.audit),
    )
