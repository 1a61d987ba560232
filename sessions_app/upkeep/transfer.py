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
import re
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import IO, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.upgraders import (
    IncompatibleSchemaError,
    Loaded,
    load_step_payload,
    upgrade_state_blob,
)

from ..fields import READABLE_FROM, READABLE_UNTIL
from ..models import (
    RUNNABLE,
    AgentSession,
    AuditAction,
    AuditEvent,
    Checkpoint,
    ImportedAuditRecord,
    Kind,
    Reason,
    Status,
    Step,
)
from ..permissions import Scope, session_scope
from ..runtime import redactor
from ..services.core import ActionError, Actor, _actor, audit, is_person, refuse_foreign_agent
from ..store import writes

FORMAT = 1
MAGIC = "respawn-export"
# A bigger file is refused before it is read into memory (a session of ~10^5 steps).
MAX_BYTES = 512 * 1024 * 1024
# Unpacking reads this much compressed input at a time and returns at most _OUT_CHUNK per
# call, so a decompression bomb is refused after a few MB whatever it would unpack to
# (RESPAWN_IMPORT_MAX_BYTES, RESPAWN_IMPORT_MAX_RATIO); up to _RATIO_FLOOR unpacked bytes no
# ratio is refused (a small file may compress very well).
_IN_CHUNK = 16 * 1024
_OUT_CHUNK = 256 * 1024
_RATIO_FLOOR = 1024 * 1024
# How deeply a line's JSON may nest (the envelope counts: a payload starts at 3). Deeper
# structures are refused before anything (the redactor, the database, a page) recurses
# through them.
MAX_DEPTH = 100
# Times every page can show in every time zone: a day inside the years 1 to 9999 in UTC.
# PostgreSQL stores times beyond them that Python cannot read back.
EARLIEST, LATEST = READABLE_FROM, READABLE_UNTIL
# The only idempotency keys Respawn makes (agent_runtime.loop.run.call_key): "<session>:<seq>".
_CALL_KEY = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}:[1-9][0-9]{0,9}")

# Columns of the session row that describe a run in progress on the exporting side: an
# imported session never claims to be running there.
_RUN_COLUMNS = ("lease_owner", "lease_expires_at", "job_id", "dispatched_at")
# The lease's state is this deployment's own: an imported session starts it afresh (a
# token the file sets could be the largest bigint, which no worker could move on from).
_FRESH_COLUMNS = ("fencing_token", "crash_count", "crash_seq")
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
    # History imported from elsewhere first, as the file it came in had it, still marked as
    # imported (another import keeps it apart again); then this deployment's own.
    for record in ImportedAuditRecord.objects.filter(session=session).order_by("position"):
        counts["audit"] += 1
        yield line({"kind": "audit", "data": _imported_row(record)})
    for event in AuditEvent.objects.filter(session=session).order_by("created_at", "id"):
        counts["audit"] += 1
        yield line({"kind": "audit", "data": _row(event, {"id", "session", "actor"})})
    end = {"kind": "end", "counts": counts, "sha256": digest.hexdigest()}
    yield (json.dumps(end, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _imported_row(record: ImportedAuditRecord) -> dict[str, Any]:
    return {
        "action": record.action,
        "actor_label": record.actor_label,
        "after": record.after,
        "before": record.before,
        "created_at": _value(record.recorded_at),
        "imported_from": record.origin,
        "request_meta": record.request_meta,
    }


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


def _decompress(raw: bytes) -> bytearray:
    """The file unpacked (every gzip member of it), in bounded pieces: refused as soon as
    it unpacks to more than RESPAWN_IMPORT_MAX_BYTES, or to more than
    RESPAWN_IMPORT_MAX_RATIO times the compressed bytes read so far."""
    if len(raw) > MAX_BYTES:
        raise TransferError(f"the file is larger than {MAX_BYTES // 2**20} MB")
    limit = int(settings.RESPAWN_IMPORT_MAX_BYTES)
    ratio = float(settings.RESPAWN_IMPORT_MAX_RATIO)
    out = bytearray()
    read = 0  # compressed bytes handed to the inflater
    inflater = zlib.decompressobj(wbits=31)  # gzip framing, its CRC and length checked
    piece = b""
    while True:
        if not piece:
            piece = raw[read : read + _IN_CHUNK]
            read += len(piece)
        try:
            # At the end of the input (piece b"") this drains what the inflater still holds.
            chunk = inflater.decompress(piece, _OUT_CHUNK)
        except zlib.error as exc:
            raise TransferError(f"not a complete gzip file: {exc}") from None
        out += chunk
        piece = inflater.unconsumed_tail
        if not chunk and not piece and not inflater.eof and read >= len(raw):
            raise TransferError("not a complete gzip file: it ends before its last member")
        if len(out) > limit:
            raise TransferError(
                f"the file unpacks to more than {limit // 2**20} MB "
                "(RESPAWN_IMPORT_MAX_BYTES): refused"
            )
        if len(out) > max(_RATIO_FLOOR, ratio * read):
            raise TransferError(
                f"the file unpacks to more than {ratio:g} times its compressed size "
                "(RESPAWN_IMPORT_MAX_RATIO): refused as a decompression bomb"
            )
        if inflater.eof:
            # The next gzip member (if any) starts where this one's data ended.
            read -= len(inflater.unused_data)
            if read >= len(raw):
                return out
            inflater = zlib.decompressobj(wbits=31)
            piece = b""


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
            record = json.loads(data, parse_constant=_not_a_number)
        except _NotANumber as exc:
            raise TransferError(f"line {number}: {exc}") from None
        except RecursionError:
            raise TransferError(f"line {number} nests deeper than {MAX_DEPTH} levels") from None
        except ValueError:
            raise TransferError(f"line {number} is not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise TransferError(f"line {number} is not a record with a kind")
        _check_json(record, f"line {number}")
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


class _NotANumber(ValueError):
    pass


def _not_a_number(name: str) -> Any:
    raise _NotANumber(f"{name} is not a number JSON allows (nor the database)")


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise TransferError(f"{where}: contains a NUL character, which the database cannot hold")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise TransferError(f"{where}: contains a lone surrogate, which is not text") from None


def _check_json(value: Any, where: str) -> None:
    """Refuse what PostgreSQL's jsonb or a page cannot hold: nesting deeper than
    MAX_DEPTH, NUL characters and lone surrogates in strings or keys. Iterative: a
    structure of any depth is walked without recursing. An error names the field."""
    # (value, depth, the entry it is in, its key there): the path is spelled on failure only.
    stack: list[tuple[Any, int, Any, Any]] = [(value, 1, None, None)]
    while stack:
        entry = stack.pop()
        item, depth = entry[0], entry[1]
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise TransferError(f"{where} nests deeper than {MAX_DEPTH} levels")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, inner in pairs:
                if isinstance(key, str):
                    _check_text(key, f"{where} ({_path(entry)})")
                stack.append((inner, depth + 1, entry, key))
        elif isinstance(item, str):
            _check_text(item, f"{where} ({_path(entry)})")


def _path(entry: tuple[Any, int, Any, Any]) -> str:
    keys = []
    while entry[2] is not None:
        keys.append(str(entry[3]))
        entry = entry[2]
    return ".".join(reversed(keys)) or "the record"


def _object(record: dict[str, Any], number: int) -> dict[str, Any]:
    data = record.get("data")
    if not isinstance(data, dict):
        raise TransferError(f"line {number}: its data is not an object")
    return data


def _time(value: Any, where: str) -> datetime | None:
    """A time in UTC that every page can show (EARLIEST to LATEST)."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise TransferError(f"{where}: not a date and time: {value!r}") from None
    try:
        utc = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise TransferError(
            f"{where}: {value!r} is outside {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} in UTC, "
            "the times this Respawn can store and show"
        )
    return utc


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
            value = _amount(value, f, f"{where} {f.name}")
        elif f.get_internal_type() in ("CharField", "TextField") and value is not None:
            if not isinstance(value, str):
                raise TransferError(f"{where} {f.name}: not a string")
            _check_text(value, f"{where} {f.name}")
            if f.max_length and len(value) > f.max_length:
                raise TransferError(f"{where} {f.name}: longer than {f.max_length} characters")
        elif f.get_internal_type().endswith("IntegerField") and value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise TransferError(f"{where} {f.name}: not an integer: {value!r}")
            low, high = _integer_range(f.get_internal_type())
            if not low <= value <= high:
                raise TransferError(
                    f"{where} {f.name}: {value} is outside {low} to {high} (half of what its "
                    "column holds: room for the session to go on)"
                )
        elif f.get_internal_type() == "BooleanField" and not isinstance(value, bool):
            raise TransferError(f"{where} {f.name}: not true or false: {value!r}")
        out[f.attname] = value
    return out


def _integer_range(internal_type: str) -> tuple[int, int]:
    """Half the range of the column: a counter or a seq at its column's limit would make
    the session's next step, token count or message overflow it (a 500 then)."""
    low, high = connection.ops.integer_field_range(internal_type)
    return (-((-low) // 2) if low else 0), (high // 2 if high is not None else 2**62)


def _amount(value: Any, f: Any, where: str) -> Decimal:
    """A finite amount from 0 to what the column holds (a cost of 999,999.999999 USD at
    most for a session): NaN, infinities, 1e30 and negative costs are refused."""
    bound = Decimal(10) ** (f.max_digits - f.decimal_places)
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise TransferError(f"{where}: not a number: {value!r}") from None
    # Checked again once rounded to the column's places: 999999.9999999 rounds up past it.
    if not amount.is_finite() or not 0 <= amount < bound or not 0 <= _rounded(amount, f) < bound:
        raise TransferError(f"{where}: {value!r} is not an amount from 0 to under {bound:,}")
    return _rounded(amount, f)


def _rounded(amount: Decimal, f: Any) -> Decimal:
    return amount.quantize(Decimal(1).scaleb(-f.decimal_places))


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


def _may_read(actor: Actor) -> Scope | None:
    """The sessions a person importing may read; None for the system (a command)."""
    return session_scope(actor) if is_person(actor) else None


def _importable_agent(actor: Actor, agent: Any) -> str:
    """The file's agent, when `actor` may start its sessions (a team's agent: its
    operators); TransferError otherwise."""
    if not isinstance(agent, str) or not agent:
        raise TransferError("session agent: missing")
    try:
        refuse_foreign_agent(actor, agent)
    except ActionError as exc:
        raise TransferError(str(exc), code=exc.code) from None
    return agent


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
    # Whose agent first: someone who may not import it learns nothing more of this
    # deployment (not whether the file's session id is taken).
    agent = _importable_agent(actor, parsed.session.get("agent"))
    session_id = str(uuid.uuid4()) if new_ids else old_id
    if new_ids:
        parsed = _renamed(parsed, old_id, session_id)
    elif AgentSession.objects.filter(id=session_id).exists():
        raise TransferError(
            f"a session with id {session_id} exists already; import with new ids to keep both",
            code="exists",
        )
    clean = redactor().redact
    # The file's lease state is not read at all: whatever it says, the session's is fresh.
    skip = {"id", "created_by", "parent", *_FRESH_COLUMNS}
    fields = _fields(AgentSession, parsed.session, "session", skip)
    fields["id"] = uuid.UUID(session_id)
    if fields.get("status") not in Status.values:
        raise TransferError(f"session status: unknown status {fields.get('status')!r}")
    if fields.get("agent") != agent:  # a name that held the old id, renamed with it
        _importable_agent(actor, fields.get("agent"))
    if fields["status"] in RUNNABLE:
        fields["status"] = Status.PAUSED
    for column in _RUN_COLUMNS:
        fields[column] = None if column != "job_id" else ""
    fresh = AgentSession()
    for column in _FRESH_COLUMNS:
        fields[column] = getattr(fresh, column)
    fields["cancel_requested"] = False
    for name in ("title", "last_error", "final_answer"):
        if isinstance(fields.get(name), str):
            fields[name] = redactor().text(fields[name])
    user = get_user_model()
    username = parsed.session.get("created_by")
    parent = parsed.session.get("parent")
    if username is not None and not isinstance(username, str):
        raise TransferError(f"session created_by: not a username: {username!r}")
    if parent is not None:
        try:
            parent = str(uuid.UUID(str(parent)))
        except ValueError:
            raise TransferError(f"session parent: not a session id: {parent!r}") from None
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
        key = row.get("idempotency_key")
        if key is not None and not _CALL_KEY.fullmatch(key):
            # The store keeps only the keys the engine derives (call_key); any other text
            # here (a secret, say) would be stored raw in a column that is not scrubbed.
            raise TransferError(
                f"{where} idempotency_key: not a key Respawn makes (<session id>:<seq>)"
            )
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
    # The file's audit records are another deployment's account (or the file author's):
    # kept apart as imported history with their origin, never as this one's audit trail.
    here = f"a file exported at {str(parsed.header.get('exported_at'))[:40]} as session {old_id}"
    events = []
    for index, data in enumerate(parsed.audit, start=1):
        where = f"audit record {index}"
        row = _fields(AuditEvent, data, where, {"id", "session", "actor"})
        for name in ("before", "after", "request_meta"):
            if not isinstance(row.get(name, {}), dict):
                raise TransferError(f"{where} {name}: not an object")
            row[name] = clean(row.get(name, {}))
        origin = data.get("imported_from", here)
        if not isinstance(origin, str):
            raise TransferError(f"{where} imported_from: not a string")
        _check_text(origin, f"{where} imported_from")
        row["recorded_at"] = row.pop("created_at", None)
        events.append({**row, "origin": origin[:300], "position": index})
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
        # The fork's parent is linked only when the importer may read it: a file that names
        # another team's session would otherwise show its title on this one's page.
        if parent:
            parents = AgentSession.objects.filter(id=parent)
            scope = _may_read(actor)
            if scope is not None:
                parents = parents.filter(scope.q())
            if parents.exists():
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
