"""Retention: policies that keep storage bounded, applied in short batches.

A policy (settings.RESPAWN_RETENTION) says, for the sessions it matches by agent and
status, how long finished sessions are kept, which old checkpoints are kept (the last K
and one per day: those a rollback could still want), and when superseded steps are
compacted away. `apply_retention` carries it out:

- each session's deletions are one short transaction that re-checks the rule under the
  session row's lock (a session resumed or put on hold in the meantime is left alone), so
  a run killed at any point and run again deletes every row once;
- with an archive directory configured, the session's export file (sessions_app.upkeep.transfer)
  is written and flushed to disk before anything of it is deleted;
- a session on legal hold is never touched; the audit log is never pruned;
- every deletion is audited with its counts, never its contents.

The policy format (JSON in RESPAWN_RETENTION, or a file named by RESPAWN_RETENTION_FILE):

    {"default": {"delete_after_days": 90,
                 "checkpoints": {"after_days": 7, "keep_last": 3, "keep_daily": true},
                 "superseded_after_days": 30},
     "rules": [{"agents": ["support"], "statuses": ["failed"], "delete_after_days": 365},
               {"statuses": ["cancelled"], "delete_after_days": 7}],
     "archive_dir": "/var/backups/respawn"}

For each setting, the first rule that matches a session and names it wins, then
"default"; a setting that no rule names is off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Length
from django.utils import timezone

from ..models import FINAL, AgentSession, AuditAction, AuditEvent, Checkpoint, Status, Step
from ..runtime import redactor
from ..services.core import _actor
from ..store import writes
from . import search
from .archive import S3_URL, Archive, archive_for

SETTINGS = ("delete_after_days", "checkpoints", "superseded_after_days")
CHECKPOINT_KEYS = {"after_days", "keep_last", "keep_daily"}
DEFAULT_BATCH_SIZE = 100
# Rows one transaction deletes when thinning checkpoints or compacting steps: a session
# with 25,000 old checkpoints is thinned in short transactions, not one long one.
CHUNK_ROWS = 1000


class PolicyError(ValueError):
    """A retention policy that cannot be applied; the message names the place."""


@dataclass(frozen=True)
class CheckpointPolicy:
    after_days: float
    keep_last: int
    keep_daily: bool


@dataclass(frozen=True)
class Rule:
    agents: tuple[str, ...] = ()  # () matches every agent
    statuses: tuple[str, ...] = ()  # () matches every status
    values: dict[str, Any] = field(default_factory=dict)  # the settings it names

    def q(self) -> Q:
        q = Q()
        if self.agents:
            q &= Q(agent__in=self.agents)
        if self.statuses:
            q &= Q(status__in=self.statuses)
        return q


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]  # the rules, then the default as a rule matching everything
    # A directory, or s3://bucket/prefix (sessions_app.upkeep.archive).
    archive_dir: str | None = None

    @property
    def archive(self) -> Archive | None:
        return archive_for(self.archive_dir) if self.archive_dir else None

    @property
    def empty(self) -> bool:
        return not any(rule.values for rule in self.rules)

    def scopes(self, name: str) -> Iterator[tuple[Q, Any]]:
        """(which sessions, the value) for one setting: each rule naming it, for the
        sessions no earlier rule naming it matched."""
        taken = Q(pk__in=[])
        for rule in self.rules:
            if name in rule.values:
                yield rule.q() & ~taken, rule.values[name]
                taken |= rule.q()


def _number(value: Any, where: str, *, integer: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    if not ok or (integer and not isinstance(value, int)):
        kind = "a whole number" if integer else "a number"
        raise PolicyError(f"{where} must be {kind} >= 0, got {value!r}")
    return value


def _values(raw: dict[str, Any], where: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in SETTINGS:
        if name not in raw or raw[name] is None:
            continue
        if name == "checkpoints":
            spec = raw[name]
            if not isinstance(spec, dict) or set(spec) - CHECKPOINT_KEYS:
                raise PolicyError(
                    f"{where}.checkpoints must be an object with {sorted(CHECKPOINT_KEYS)}"
                )
            values[name] = CheckpointPolicy(
                after_days=_number(spec.get("after_days", 7), f"{where}.checkpoints.after_days"),
                keep_last=int(
                    _number(
                        spec.get("keep_last", 1), f"{where}.checkpoints.keep_last", integer=True
                    )
                ),
                keep_daily=bool(spec.get("keep_daily", True)),
            )
        else:
            values[name] = _number(raw[name], f"{where}.{name}")
    return values


def parse_policy(raw: Any) -> Policy:
    """A checked Policy from its JSON form; PolicyError names the first problem."""
    if raw in (None, {}):
        return Policy(rules=())
    if not isinstance(raw, dict):
        raise PolicyError("the retention policy must be a JSON object")
    unknown = set(raw) - {"default", "rules", "archive_dir"}
    if unknown:
        raise PolicyError(f"unknown retention keys: {', '.join(sorted(unknown))}")
    rules = []
    for index, rule in enumerate(raw.get("rules") or []):
        where = f"rules[{index}]"
        if not isinstance(rule, dict):
            raise PolicyError(f"{where} must be an object")
        extra = set(rule) - {"agents", "statuses", *SETTINGS}
        if extra:
            raise PolicyError(f"{where}: unknown keys {', '.join(sorted(extra))}")
        agents = rule.get("agents") or []
        statuses = rule.get("statuses") or []
        if not isinstance(agents, list) or not all(isinstance(a, str) for a in agents):
            raise PolicyError(f"{where}.agents must be a list of agent names")
        if not isinstance(statuses, list):
            raise PolicyError(f"{where}.statuses must be a list of statuses")
        wrong = [s for s in statuses if s not in Status.values]
        if wrong:
            raise PolicyError(f"{where}.statuses: unknown status {wrong[0]!r}")
        values = _values(rule, where)
        live = [st for st in statuses if st not in FINAL]
        if "delete_after_days" in values and live:
            raise PolicyError(
                f"{where}: delete_after_days applies to finished sessions only "
                f"(completed, failed, cancelled), not {live[0]!r}"
            )
        rules.append(Rule(tuple(agents), tuple(statuses), values))
    default = raw.get("default") or {}
    if not isinstance(default, dict) or set(default) - set(SETTINGS):
        raise PolicyError(f"default must be an object with any of {', '.join(SETTINGS)}")
    rules.append(Rule((), (), _values(default, "default")))
    archive = raw.get("archive_dir")
    if archive is not None and (not isinstance(archive, str) or not archive.strip()):
        raise PolicyError("archive_dir must be a directory path or s3://bucket/prefix")
    if archive and archive.startswith("s3://") and not S3_URL.match(archive):
        raise PolicyError(f"archive_dir {archive!r} is not s3://bucket[/prefix]")
    return Policy(rules=tuple(rules), archive_dir=archive.strip() if archive else None)


def configured_policy() -> Policy:
    return parse_policy(settings.RESPAWN_RETENTION)


# --- the run ----------------------------------------------------------------------------


@dataclass
class Part:
    """What one kind of deletion did (or, in a dry run, would do)."""

    sessions: int = 0
    rows: int = 0
    bytes: int = 0
    held: int = 0  # sessions the rule matched but a legal hold exempts


@dataclass
class Summary:
    dry_run: bool
    deleted_sessions: Part = field(default_factory=Part)  # rows: steps + checkpoints
    checkpoints: Part = field(default_factory=Part)
    superseded_steps: Part = field(default_factory=Part)
    archived: list[str] = field(default_factory=list)
    seconds: float = 0.0
    longest_transaction: float = 0.0

    @property
    def bytes(self) -> int:
        return self.deleted_sessions.bytes + self.checkpoints.bytes + self.superseded_steps.bytes


Progress = Callable[[str, int, int], None]  # (what, done, total)


def _sizes(queryset: QuerySet, blob: str) -> dict[Any, tuple[int, int]]:
    """Per session: (rows, stored bytes) of the rows, in one query. Bytes are the blobs as
    the database keeps them (compressed and out of line on PostgreSQL) plus each row's
    fixed part; indexes shrink with them but are not counted."""
    if connection.vendor == "postgresql":
        from django.db.models import Func, IntegerField

        size = Func(F(blob), function="pg_column_size", output_field=IntegerField())
    else:
        size = Length(F(blob))
    rows = queryset.order_by().values_list("session_id").annotate(n=Count("id"), b=Sum(size))
    return {sid: (n, int(b or 0) + 60 * n) for sid, n, b in rows}


def _archive(session: AgentSession, archive: Archive, what: str) -> str:
    """Write the session's export to the archive, confirmed (flushed to disk, or stored
    and checked by the object store), before anything is deleted; returns where."""
    from .transfer import export_session

    stamp = timezone.now().strftime("%Y%m%dT%H%M%S")
    return archive.write(
        f"{session.id}/{stamp}-{what}.jsonl.gz", lambda out: export_session(session, out)
    )


class _Runner:
    """Works through candidate sessions in batches of `batch_size`; each batch is one short
    transaction that locks the batch's session rows, checks the rule again for each (a
    session resumed or held since it was selected is left alone) and deletes what is
    left, with one audit record per session. Thinning and compaction delete at most
    CHUNK_ROWS rows a transaction."""

    def __init__(
        self,
        policy: Policy,
        *,
        dry_run: bool,
        batch_size: int,
        pause: float,
        now: datetime,
        progress: Progress | None,
        actor: Any,
    ) -> None:
        self.policy = policy
        self.dry_run = dry_run
        self.batch_size = batch_size
        self.pause = pause
        self.now = now
        self.progress = progress or (lambda what, done, total: None)
        self.actor = _actor(actor, None if actor else "retention")
        self.summary = Summary(dry_run=dry_run)
        # In a dry run nothing is deleted: what the first part would delete is left out
        # of the later parts' counts, as a real run would find it gone.
        self.would_delete: set[Any] = set()

    def _timed(self, work: Callable[[], Any]) -> Any:
        started = time.monotonic()
        with transaction.atomic():
            result = work()
        self.summary.longest_transaction = max(
            self.summary.longest_transaction, time.monotonic() - started
        )
        return result

    def _batches(self, queryset: QuerySet, what: str) -> Iterator[list[Any]]:
        """The candidates' ids, read once, in batches, with progress and the pause."""
        ids = [i for i in queryset.order_by("id").values_list("id", flat=True)]
        ids = [i for i in ids if i not in self.would_delete]
        for start in range(0, len(ids), self.batch_size):
            yield ids[start : start + self.batch_size]
            self.progress(what, min(start + self.batch_size, len(ids)), len(ids))
            if self.pause and not self.dry_run:
                time.sleep(self.pause)

    def _audit(self, action: AuditAction, rows: list[tuple[Any, dict[str, Any]]]) -> None:
        clean = redactor().redact
        AuditEvent.objects.bulk_create(
            AuditEvent(
                actor=self.actor.user,
                actor_label=self.actor.label,
                action=AuditAction(action).value,
                session_id=session_id,
                before={},
                after=clean(after),
                request_meta={},
            )
            for session_id, after in rows
        )

    def _archive_all(self, ids: list[Any], what: str) -> dict[Any, str]:
        archive = None if self.dry_run else self.policy.archive
        if archive is None:
            return {}
        paths = {}
        for session in AgentSession.objects.filter(id__in=ids):
            paths[session.id] = _archive(session, archive, what)
            self.summary.archived.append(paths[session.id])
        return paths

    # -- finished sessions -----------------------------------------------------------------
    def delete_sessions(self) -> None:
        part = self.summary.deleted_sessions
        for scope, days in self.policy.scopes("delete_after_days"):
            cutoff = self.now - timedelta(days=days)
            matched = AgentSession.objects.filter(scope, status__in=FINAL, updated_at__lt=cutoff)
            part.held += matched.filter(legal_hold=True).count()
            eligible = Q(scope, status__in=FINAL, updated_at__lt=cutoff, legal_hold=False)
            for ids in self._batches(matched.filter(legal_hold=False), "finished sessions"):
                if self.dry_run:
                    self._count_sessions(ids)
                    self.would_delete.update(ids)
                    continue
                archived = self._archive_all(ids, "deleted")
                self._timed(partial(self._delete_sessions, ids, eligible, days, archived))

    def _count_sessions(self, ids: list[Any]) -> None:
        part = self.summary.deleted_sessions
        part.sessions += len(ids)
        for sizes in (
            _sizes(Step.objects.filter(session_id__in=ids), "payload"),
            _sizes(Checkpoint.objects.filter(session_id__in=ids), "state"),
        ):
            part.rows += sum(n for n, _ in sizes.values())
            part.bytes += sum(b for _, b in sizes.values())

    def _delete_sessions(
        self, ids: list[Any], eligible: Q, days: float, archived: dict[Any, str]
    ) -> None:
        part = self.summary.deleted_sessions
        # Under the rows' locks, the rule once more: resumed, messaged or put on hold since
        # they were selected, they stay.
        locked = list(
            AgentSession.objects.select_for_update()
            .filter(eligible, id__in=ids)
            .values_list("id", "status", "updated_at")
        )
        keep = [row[0] for row in locked]
        if not keep:
            return
        steps = _sizes(Step.objects.filter(session_id__in=keep), "payload")
        checkpoints = _sizes(Checkpoint.objects.filter(session_id__in=keep), "state")
        self._audit(
            AuditAction.RETENTION_DELETE,
            [
                (
                    sid,
                    {
                        "status": status,
                        "updated_at": updated.isoformat(),
                        "steps": steps.get(sid, (0, 0))[0],
                        "checkpoints": checkpoints.get(sid, (0, 0))[0],
                        "bytes": steps.get(sid, (0, 0))[1] + checkpoints.get(sid, (0, 0))[1],
                        "after_days": days,
                        "archive": archived.get(sid, ""),
                    },
                )
                for sid, status, updated in locked
            ],
        )
        writes.delete_trace(keep)
        search.forget_sessions(keep)
        AgentSession.objects.filter(id__in=keep)._raw_delete(AgentSession.objects.db)
        part.sessions += len(keep)
        for sizes in (steps, checkpoints):
            part.rows += sum(n for n, _ in sizes.values())
            part.bytes += sum(b for _, b in sizes.values())

    # -- old checkpoints -------------------------------------------------------------------
    def thin_checkpoints(self) -> None:
        part = self.summary.checkpoints
        for scope, spec in self.policy.scopes("checkpoints"):
            cutoff = self.now - timedelta(days=spec.after_days)
            sessions = AgentSession.objects.filter(scope).filter(
                id__in=Checkpoint.objects.filter(created_at__lt=cutoff)
                .values("session_id")
                .annotate(n=Count("id"))
                .filter(n__gt=spec.keep_last)
                .values("session_id")
            )
            part.held += sessions.filter(legal_hold=True).count()
            for ids in self._batches(sessions.filter(legal_hold=False), "checkpoints"):
                if self.dry_run:
                    doomed = self._doomed(ids, scope, spec, cutoff, lock=False)
                    part.sessions += len(doomed)
                    flat = [cid for cids in doomed.values() for cid in cids]
                    sizes = _sizes(Checkpoint.objects.filter(id__in=flat), "state")
                    part.rows += len(flat)
                    part.bytes += sum(b for _, b in sizes.values())
                    continue
                archived = self._archive_all(
                    list(self._doomed(ids, scope, spec, cutoff, lock=False)), "checkpoints"
                )
                touched: set[Any] = set()
                thin = partial(self._thin, ids, scope, spec, cutoff, archived, touched)
                while self._timed(thin):
                    pass
                part.sessions += len(touched)

    def _doomed(
        self, ids: list[Any], scope: Q, spec: CheckpointPolicy, cutoff: datetime, *, lock: bool
    ) -> dict[Any, list[int]]:
        """Per session of the batch: the ids of the checkpoints the policy removes (older
        than the cutoff, not the head, not among the last K, not a day's last one)."""
        sessions = AgentSession.objects.filter(scope, id__in=ids, legal_hold=False)
        if lock:
            sessions = sessions.select_for_update()
        heads = dict(sessions.values_list("id", "head"))
        rows: dict[Any, list[tuple[int, int, datetime]]] = {}
        for cid, sid, seq, created in (
            Checkpoint.objects.filter(session_id__in=list(heads))
            .order_by("session_id", "-seq", "-id")
            .values_list("id", "session_id", "seq", "created_at")
        ):
            rows.setdefault(sid, []).append((cid, seq, created))
        doomed: dict[Any, list[int]] = {}
        for sid, checkpoints in rows.items():
            keep = {cid for cid, _, _ in checkpoints[: spec.keep_last]}
            keep |= {cid for cid, seq, _ in checkpoints if seq == heads[sid]}
            if spec.keep_daily:
                seen: set[Any] = set()
                for cid, _, created in checkpoints:  # newest first: the day's last one
                    if created.date() not in seen:
                        seen.add(created.date())
                        keep.add(cid)
            gone = [cid for cid, _, created in checkpoints if cid not in keep and created < cutoff]
            if gone:
                doomed[sid] = gone
        return doomed

    def _thin(
        self,
        ids: list[Any],
        scope: Q,
        spec: CheckpointPolicy,
        cutoff: datetime,
        archived: dict[Any, str],
        touched: set[Any],
    ) -> bool:
        """One transaction: up to CHUNK_ROWS doomed checkpoints of the batch. True when
        there may be more."""
        part = self.summary.checkpoints
        # The head may have moved (a run, a rollback) since the batch was chosen: the
        # doomed ones are worked out again under the rows' locks.
        doomed = self._doomed(ids, scope, spec, cutoff, lock=True)
        chunk: dict[Any, list[int]] = {}
        taken = 0
        for sid, cids in doomed.items():
            if taken >= CHUNK_ROWS:
                break
            chunk[sid] = cids[: CHUNK_ROWS - taken]
            taken += len(chunk[sid])
        if not chunk:
            return False
        flat = [cid for cids in chunk.values() for cid in cids]
        rows = Checkpoint.objects.filter(id__in=flat)
        sizes = _sizes(rows, "state")
        seqs: dict[Any, list[int]] = {}
        for sid, seq in rows.values_list("session_id", "seq"):
            seqs.setdefault(sid, []).append(seq)
        self._audit(
            AuditAction.RETENTION_CHECKPOINTS,
            [
                (
                    sid,
                    {
                        "deleted": len(cids),
                        "seqs": sorted(seqs.get(sid, [])),
                        "bytes": sizes.get(sid, (0, 0))[1],
                        "archive": archived.get(sid, ""),
                    },
                )
                for sid, cids in chunk.items()
            ],
        )
        writes.drop_rows(rows)
        touched.update(chunk)
        part.rows += len(flat)
        part.bytes += sum(b for _, b in sizes.values())
        return taken >= CHUNK_ROWS

    # -- superseded steps ------------------------------------------------------------------
    def compact_superseded(self) -> None:
        part = self.summary.superseded_steps
        for scope, days in self.policy.scopes("superseded_after_days"):
            cutoff = self.now - timedelta(days=days)
            sessions = AgentSession.objects.filter(scope).filter(
                id__in=Step.objects.filter(superseded_at__lt=cutoff).values("session_id")
            )
            part.held += sessions.filter(legal_hold=True).count()
            for ids in self._batches(sessions.filter(legal_hold=False), "superseded steps"):
                old = Step.objects.filter(session_id__in=ids, superseded_at__lt=cutoff)
                if self.dry_run:
                    sizes = _sizes(old, "payload")
                    part.sessions += len(sizes)
                    part.rows += sum(n for n, _ in sizes.values())
                    part.bytes += sum(b for _, b in sizes.values())
                    continue
                archived = self._archive_all(ids, "superseded")
                touched: set[Any] = set()
                compact = partial(self._compact, ids, scope, cutoff, days, archived, touched)
                while self._timed(compact):
                    pass
                for session_id in touched:
                    # The compacted steps' words leave the search with them.
                    search.reindex_session(session_id)
                part.sessions += len(touched)

    def _compact(
        self,
        ids: list[Any],
        scope: Q,
        cutoff: datetime,
        days: float,
        archived: dict[Any, str],
        touched: set[Any],
    ) -> bool:
        part = self.summary.superseded_steps
        locked = list(
            AgentSession.objects.select_for_update()
            .filter(scope, id__in=ids, legal_hold=False)
            .values_list("id", flat=True)
        )
        chunk = list(
            Step.objects.filter(session_id__in=locked, superseded_at__lt=cutoff)
            .order_by("session_id", "seq")
            .values_list("id", "session_id", "seq")[:CHUNK_ROWS]
        )
        if not chunk:
            return False
        rows = Step.objects.filter(id__in=[row[0] for row in chunk])
        sizes = _sizes(rows, "payload")
        seqs: dict[Any, list[int]] = {}
        for _, sid, seq in chunk:
            seqs.setdefault(sid, []).append(seq)
        self._audit(
            AuditAction.RETENTION_COMPACT,
            [
                (
                    sid,
                    {
                        "deleted": len(numbers),
                        "first_seq": numbers[0],
                        "last_seq": numbers[-1],
                        "bytes": sizes.get(sid, (0, 0))[1],
                        "after_days": days,
                        "archive": archived.get(sid, ""),
                    },
                )
                for sid, numbers in seqs.items()
            ],
        )
        writes.drop_rows(rows)
        for sid, numbers in seqs.items():
            # Their seqs stay taken: the session keeps counting them, and a reader can
            # tell a compacted gap from a lost step.
            AgentSession.objects.filter(id=sid).update(
                compacted_steps=F("compacted_steps") + len(numbers)
            )
        touched.update(seqs)
        part.rows += len(chunk)
        part.bytes += sum(b for _, b in sizes.values())
        return len(chunk) == CHUNK_ROWS


def apply_retention(
    policy: Policy | None = None,
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    now: datetime | None = None,
    progress: Progress | None = None,
    actor: Any = None,
) -> Summary:
    """Apply the policy (the configured one by default): delete finished sessions past
    their time, thin old checkpoints, compact old superseded steps."""
    started = time.monotonic()
    runner = _Runner(
        policy or configured_policy(),
        dry_run=dry_run,
        batch_size=batch_size,
        pause=pause,
        now=now or timezone.now(),
        progress=progress,
        actor=actor,
    )
    runner.delete_sessions()
    runner.thin_checkpoints()
    runner.compact_superseded()
    runner.summary.seconds = time.monotonic() - started
    return runner.summary
