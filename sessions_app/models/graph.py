"""Where LangGraph threads keep what Respawn's own tables do not: the thread's name, the
graph's checkpoint bodies, its channel values once per version, and its task writes.

A thread is a Respawn session (`GraphThread` names it); each LangGraph checkpoint is a
Respawn `Checkpoint` plus a `GraphCheckpoint` at the same seq; each `put_writes` is a
`system` step plus one `GraphWrite` per write. `sessions_app.langgraph.saver` reads and writes
them; nothing else needs to.
"""

from __future__ import annotations

from django.db import models


class GraphThread(models.Model):
    """The LangGraph thread id of a session (its id is derived from the thread id)."""

    session = models.OneToOneField(
        "sessions_app.AgentSession",
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="graph_thread",
    )
    thread_id = models.TextField(unique=True)

    def __str__(self) -> str:
        return self.thread_id


class GraphCheckpoint(models.Model):
    """A LangGraph checkpoint without its channel values (those are `GraphBlob`s, found
    by the versions in `body["channel_versions"]`). `seq` is the seq of the session's
    step and Respawn checkpoint it was written with: a rollback that supersedes that step
    takes the checkpoint out of the thread's latest."""

    session = models.ForeignKey(
        "sessions_app.AgentSession", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    ns = models.TextField(blank=True, default="")
    checkpoint_id = models.TextField()
    parent_id = models.TextField(null=True, blank=True)
    seq = models.PositiveIntegerField()
    body = models.JSONField()
    metadata = models.JSONField(default=dict)

    class Meta:
        constraints = [
            # get_tuple by id, the latest of a namespace (ordered by id), list(before=...).
            models.UniqueConstraint(
                fields=["session", "ns", "checkpoint_id"], name="graphcp_session_ns_id"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.ns or '-'} {self.checkpoint_id}"


class GraphBlob(models.Model):
    """One channel's value at one version, stored once however many checkpoints hold it.

    A list that grew by appending (a messages channel under its reducer) is stored as the
    items appended since `base_version`: a thread's storage grows with what its steps
    add, not with the length of the list times the number of steps."""

    session = models.ForeignKey(
        "sessions_app.AgentSession", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    ns = models.TextField(blank=True, default="")
    channel = models.TextField()
    version = models.TextField()
    type = models.TextField()
    blob = models.BinaryField(null=True)
    base_version = models.TextField(null=True, blank=True)

    class Meta:
        constraints = [
            # The value of a channel at a version (and the chain of its bases).
            models.UniqueConstraint(
                fields=["session", "ns", "channel", "version"], name="graphblob_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.channel}@{self.version}"


class GraphWrite(models.Model):
    """A task's pending write against a checkpoint; `seq` is its `system` step."""

    session = models.ForeignKey(
        "sessions_app.AgentSession", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    ns = models.TextField(blank=True, default="")
    checkpoint_id = models.TextField()
    task_id = models.TextField()
    task_path = models.TextField(blank=True, default="")
    idx = models.IntegerField()
    channel = models.TextField()
    type = models.TextField(null=True)
    blob = models.BinaryField()
    seq = models.PositiveIntegerField()

    class Meta:
        constraints = [
            # The pending writes of a checkpoint; one row per (task, index).
            models.UniqueConstraint(
                fields=["session", "ns", "checkpoint_id", "task_id", "idx"],
                name="graphwrite_task_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.checkpoint_id} {self.task_id}[{self.idx}]"
