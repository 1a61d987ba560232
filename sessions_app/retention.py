"""Retention: policies that keep storage bounded, applied in short batches.

A policy (settings.RESPAWN_RETENTION) says, for the sessions it matches by agent and
status, how long finished sessions are kept, which old checkpoints are kept (the last K
and one per day: those a rollback could still want), and when superseded steps are
compacted away. `apply_retention` carries it out:

- each session's deletions are one short transaction that re-checks the rule under the
  session row's lock (a session resumed or put on hold in the meantime is left alone), so
  a run killed at any point and run again deletes every row once;
- with an archive directory configured, the session's export file (sessions_app.transfer)
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

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Length
from django.utils import timezone

from .models import FINAL, AgentSession, Checkpoint, Status, Step
from .services import _actor, audit

SETTINGS = ("delete_after_days", "checkpoints", "superseded_after_days")
CHECKPOINT_KEYS = {"after_days", "keep_last", "keep_daily"}
DEFAULT_BATCH_SIZE = 100


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
    archive_dir: Path | None = None

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
        raise PolicyError("archive_dir must be a directory path")
    return Policy(rules=tuple(rules), archive_dir=Path(archive) if archive else None)


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


def _row_bytes(queryset: QuerySet, blob: str) -> int:
    """The stored size of the rows (their blobs as the database keeps them: compressed
    and out of line on PostgreSQL); indexes shrink with them but are not counted."""
    if connection.vendor == "postgresql":
        from django.db.models import Func, IntegerField

        size = Func(F(blob), function="pg_column_size", output_field=IntegerField())
        total = queryset.aggregate(n=Sum(size))["n"]
    else:
        total = queryset.aggregate(n=Sum(Length(F(blob))))["n"]
    return int(total or 0) + 60 * queryset.count()  # and each row's fixed part


def _archive(session: AgentSession, directory: Path, what: str) -> str:
    """Write the session's export under the archive directory and flush it to disk
    before anything is deleted; returns the path."""
    from .transfer import export_session

    stamp = timezone.now().strftime("%Y%m%dT%H%M%S")
    target = directory / str(session.id) / f"{stamp}-{what}.jsonl.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
        export_session(session, tmp)
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp.name, target)
    return str(target)


class _Runner:
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

    def _timed(self, work: Callable[[], Any]) -> Any:
        started = time.monotonic()
        with transaction.atomic():
            result = work()
        self.summary.longest_transaction = max(
            self.summary.longest_transaction, time.monotonic() - started
        )
        return result

    def _batches(self, queryset: QuerySet, what: str) -> Iterator[list[Any]]:
        """Session ids in keyset batches, with progress and the pause between them."""
        total = queryset.count()
        done = 0
        last = None
        while True:
            page = queryset.order_by("id")
            if last is not None:
                page = page.filter(id__gt=last)
            ids = list(page.values_list("id", flat=True)[: self.batch_size])
            if not ids:
                break
            yield ids
            done += len(ids)
            last = ids[-1]
            self.progress(what, min(done, total), total)
            if self.pause and not self.dry_run:
                time.sleep(self.pause)

    # -- finished sessions -----------------------------------------------------------------
    def delete_sessions(self) -> None:
        part = self.summary.deleted_sessions
        for scope, days in self.policy.scopes("delete_after_days"):
            cutoff = self.now - timedelta(days=days)
            matched = AgentSession.objects.filter(scope, status__in=FINAL, updated_at__lt=cutoff)
            part.held += matched.filter(legal_hold=True).count()
            candidates = matched.filter(legal_hold=False)
            for ids in self._batches(candidates, "finished sessions"):
                for session_id in ids:
                    self._delete_session(session_id, scope, cutoff, days)

    def _delete_session(self, session_id: Any, scope: Q, cutoff: datetime, days: float) -> None:
        part = self.summary.deleted_sessions
        steps = Step.objects.filter(session_id=session_id)
        checkpoints = Checkpoint.objects.filter(session_id=session_id)
        if self.dry_run:
            part.sessions += 1
            part.rows += steps.count() + checkpoints.count()
            part.bytes += _row_bytes(steps, "payload") + _row_bytes(checkpoints, "state")
            return
        session = AgentSession.objects.filter(id=session_id).first()
        if session is None:
            return
        archived = ""
        if self.policy.archive_dir is not None:
            archived = _archive(session, self.policy.archive_dir, "deleted")
            self.summary.archived.append(archived)

        def delete() -> None:
            # Under the row's lock, the rule once more: resumed, messaged or put on hold
            # since it was selected, it stays.
            locked = (
                AgentSession.objects.select_for_update()
                .filter(scope, id=session_id, status__in=FINAL, updated_at__lt=cutoff)
                .filter(legal_hold=False)
                .first()
            )
            if locked is None:
                return
            counts = {"steps": steps.count(), "checkpoints": checkpoints.count()}
            size = _row_bytes(steps, "payload") + _row_bytes(checkpoints, "state")
            audit(
                actor=self.actor,
                action="retention_delete",
                session=locked,
                before={"status": locked.status, "updated_at": locked.updated_at.isoformat()},
                after={**counts, "bytes": size, "after_days": days, "archive": archived},
            )
            steps.delete()
            checkpoints.delete()
            AgentSession.objects.filter(id=session_id).delete()
            part.sessions += 1
            part.rows += counts["steps"] + counts["checkpoints"]
            part.bytes += size

        self._timed(delete)

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
                for session_id in ids:
                    self._thin(session_id, scope, spec, cutoff)

    def _doomed_checkpoints(self, session: AgentSession, spec: CheckpointPolicy, cutoff) -> list:
        rows = list(
            Checkpoint.objects.filter(session=session)
            .order_by("-seq", "-id")
            .values_list("id", "seq", "created_at")
        )
        keep = {row[0] for row in rows[: spec.keep_last]}
        keep |= {cid for cid, seq, _ in rows if seq == session.head}
        if spec.keep_daily:
            seen_days: set[Any] = set()
            for cid, _, created in rows:  # newest first: the day's last one is kept
                day = created.date()
                if day not in seen_days:
                    seen_days.add(day)
                    keep.add(cid)
        return [cid for cid, _, created in rows if cid not in keep and created < cutoff]

    def _thin(self, session_id: Any, scope: Q, spec: CheckpointPolicy, cutoff) -> None:
        part = self.summary.checkpoints
        session = AgentSession.objects.filter(scope, id=session_id, legal_hold=False).first()
        if session is None:
            return
        doomed = self._doomed_checkpoints(session, spec, cutoff)
        if not doomed:
            return
        if self.dry_run:
            part.sessions += 1
            part.rows += len(doomed)
            part.bytes += _row_bytes(Checkpoint.objects.filter(id__in=doomed), "state")
            return
        archived = ""
        if self.policy.archive_dir is not None:
            archived = _archive(session, self.policy.archive_dir, "checkpoints")
            self.summary.archived.append(archived)

        def delete() -> None:
            locked = (
                AgentSession.objects.select_for_update()
                .filter(scope, id=session_id, legal_hold=False)
                .first()
            )
            if locked is None:
                return
            # The head may have moved (a run, a rollback) since the list was made.
            ids = self._doomed_checkpoints(locked, spec, cutoff)
            rows = Checkpoint.objects.filter(id__in=ids)
            size = _row_bytes(rows, "state")
            seqs = sorted(rows.values_list("seq", flat=True))
            deleted = rows.delete()[0]
            audit(
                actor=self.actor,
                action="retention_checkpoints",
                session=locked,
                after={"deleted": deleted, "seqs": seqs, "bytes": size, "archive": archived},
            )
            part.sessions += 1
            part.rows += deleted
            part.bytes += size

        self._timed(delete)

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
                for session_id in ids:
                    self._compact(session_id, scope, cutoff, days)

    def _compact(self, session_id: Any, scope: Q, cutoff: datetime, days: float) -> None:
        part = self.summary.superseded_steps
        rows = Step.objects.filter(session_id=session_id, superseded_at__lt=cutoff)
        if self.dry_run:
            part.sessions += 1
            part.rows += rows.count()
            part.bytes += _row_bytes(rows, "payload")
            return
        session = AgentSession.objects.filter(scope, id=session_id, legal_hold=False).first()
        if session is None:
            return
        archived = ""
        if self.policy.archive_dir is not None:
            archived = _archive(session, self.policy.archive_dir, "superseded")
            self.summary.archived.append(archived)

        def delete() -> None:
            locked = (
                AgentSession.objects.select_for_update()
                .filter(scope, id=session_id, legal_hold=False)
                .first()
            )
            if locked is None:
                return
            size = _row_bytes(rows, "payload")
            seqs = list(rows.order_by("seq").values_list("seq", flat=True))
            deleted = rows.delete()[0]
            # Their seqs stay taken: the session keeps counting them, and a reader can
            # tell a compacted gap from a lost step.
            AgentSession.objects.filter(id=session_id).update(
                compacted_steps=F("compacted_steps") + deleted
            )
            audit(
                actor=self.actor,
                action="retention_compact",
                session=locked,
                after={
                    "deleted": deleted,
                    "first_seq": seqs[0] if seqs else None,
                    "last_seq": seqs[-1] if seqs else None,
                    "bytes": size,
                    "after_days": days,
                    "archive": archived,
                },
            )
            part.sessions += 1
            part.rows += deleted
            part.bytes += size

        self._timed(delete)


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
