"""The graph rows of LangGraph threads (models/graph.py): a thread's checkpoints, its
tasks' pending writes and its channel values. `sessions_app.langgraph.saver` decides what
to write; this module is where they are written, copied and deleted, beside the Respawn
step and checkpoint of each write (store/writes.py), in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Q

from ..models import AgentSession, Checkpoint, Step
from ..models.graph import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite

BATCH = 1000


def ensure_thread(session_id: Any, thread_id: str, *, using: str = "default") -> None:
    """The session's thread row (a graph run by the workers gets one at its first run)."""
    GraphThread.objects.using(using).get_or_create(
        session_id=session_id, defaults={"thread_id": thread_id}
    )


def new_thread(session: AgentSession, thread_id: str, *, using: str = "default") -> None:
    GraphThread.objects.using(using).create(session=session, thread_id=thread_id)


def put_checkpoint(
    *,
    using: str,
    session_id: Any,
    ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    seq: int,
    body: dict[str, Any],
    metadata: dict[str, Any],
    blobs: Sequence[tuple[str, str, str, Any, str | None]],
) -> None:
    """A LangGraph checkpoint at `seq`: its values' new versions (channel, version, type,
    data, base version: a list stored as what was appended to `base`) and its body."""
    if blobs:
        GraphBlob.objects.using(using).bulk_create(
            [
                GraphBlob(
                    session_id=session_id,
                    ns=ns,
                    channel=channel,
                    version=version,
                    type=kind,
                    blob=data,
                    base_version=base,
                )
                for channel, version, kind, data, base in blobs
            ],
            ignore_conflicts=True,
        )
    GraphCheckpoint.objects.using(using).bulk_create(
        [
            GraphCheckpoint(
                session_id=session_id,
                ns=ns,
                checkpoint_id=checkpoint_id,
                parent_id=parent_id,
                seq=seq,
                body=body,
                metadata=metadata,
            )
        ],
        update_conflicts=True,
        unique_fields=["session", "ns", "checkpoint_id"],
        update_fields=["parent_id", "seq", "body", "metadata"],
    )


def put_writes(
    *,
    using: str,
    session_id: Any,
    ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    seq: int,
    rows: Iterable[tuple[int, str, str, Any]],
    replace: bool,
) -> None:
    """A task's pending writes (index, channel, type, data) recorded at `seq`. With
    `replace` (errors, interrupts, resumes) the latest one of an index counts; else the
    first."""
    objects = [
        GraphWrite(
            session_id=session_id,
            ns=ns,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
            task_path=task_path,
            idx=idx,
            channel=channel,
            type=kind,
            blob=data,
            seq=seq,
        )
        for idx, channel, kind, data in rows
    ]
    if replace:
        GraphWrite.objects.using(using).bulk_create(
            objects,
            update_conflicts=True,
            unique_fields=["session", "ns", "checkpoint_id", "task_id", "idx"],
            update_fields=["channel", "type", "blob", "seq", "task_path"],
        )
    else:
        GraphWrite.objects.using(using).bulk_create(objects, ignore_conflicts=True)


def delete_checkpoints(session_id: Any, rows: Sequence[Any], *, using: str) -> None:
    """Delete these graph checkpoints of one session, their writes and the Respawn
    checkpoints at their seqs."""
    match = Q()
    for row in rows:
        match |= Q(ns=row.ns, checkpoint_id=row.checkpoint_id)
    GraphWrite.objects.using(using).filter(Q(session_id=session_id) & match).delete()
    Checkpoint.objects.using(using).filter(
        session_id=session_id, seq__in=[r.seq for r in rows]
    ).delete()
    GraphCheckpoint.objects.using(using).filter(id__in=[r.id for r in rows]).delete()


def delete_values_except(session_id: Any, needed: set[int], *, using: str) -> None:
    """Delete the session's channel values but `needed` (a prune's)."""
    GraphBlob.objects.using(using).filter(session_id=session_id).exclude(id__in=needed).delete()


def copy_thread_rows(source_id: Any, target_id: Any, *, using: str) -> None:
    """Every step, checkpoint and graph row of the source session, for the target (a
    thread copied whole: the same seqs)."""
    for model in (Step, Checkpoint, GraphCheckpoint, GraphBlob, GraphWrite):
        rows = model.objects.using(using).filter(session_id=source_id)
        _copy_all(model, rows, using=using, session_id=target_id)


def copy_graph_rows(*, parent: AgentSession, fork: AgentSession, seq_map: dict[int, int]) -> None:
    """The graph side of a fork at checkpoint K: the thread's checkpoints and writes whose
    steps the fork copied (renumbered by `seq_map`), and the values they need. K's own
    pending writes were made after K and stay behind: its tasks run again in the fork."""
    new_thread(fork, str(fork.id))
    for model in (GraphCheckpoint, GraphWrite):
        rows = model.objects.filter(session=parent, seq__in=list(seq_map))
        _copy_all(model, rows, using="default", session_id=fork.pk, seq_map=seq_map)
    _copy_all(
        GraphBlob, GraphBlob.objects.filter(session=parent), using="default", session_id=fork.pk
    )


def _copy_all(
    model: Any,
    rows: Any,
    *,
    using: str,
    session_id: Any,
    seq_map: dict[int, int] | None = None,
) -> None:
    """New rows of `model` with `rows`' values but their ids, for `session_id` (and seqs
    renumbered by `seq_map`), in batches."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key and f.name != "session"]
    batch = []
    for row in rows.iterator(chunk_size=BATCH):
        values = {f.attname: getattr(row, f.attname) for f in fields}
        if seq_map is not None:
            values["seq"] = seq_map[row.seq]
        batch.append(model(session_id=session_id, **values))
        if len(batch) >= BATCH:
            model.objects.using(using).bulk_create(batch)
            batch = []
    if batch:
        model.objects.using(using).bulk_create(batch)
