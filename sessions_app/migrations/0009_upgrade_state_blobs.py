"""Rewrite stored checkpoint states and step payloads to the current schema version.

Runs outside one big transaction (`atomic = False`): each batch of rows commits on its own,
so a table of millions of rows never sits in one transaction, an interrupted run keeps what
it committed, and running `migrate` again carries on. Workers may keep running meanwhile:
old versions load through agent_runtime.upgraders whether or not they were rewritten yet.
`manage.py upgrade_state` does the same on demand (with a progress bar and a summary).

Reversible: the reverse rewrites version 2 blobs back to version 1 (losing only the plan
item ids, which version 1 has no place for). Stop the workers first, or v2 code keeps
writing v2 rows while it runs.
"""

import sys

from django.db import migrations

from sessions_app.upkeep.state_upgrade import downgrade_blobs, upgrade_blobs

BATCH_SIZE = 500  # rows per transaction


def _models(apps):
    return apps.get_model("sessions_app", "Checkpoint"), apps.get_model("sessions_app", "Step")


def forward(apps, schema_editor):
    # To version 2, as released: later versions have their own data migrations (0015).
    summary = upgrade_blobs(
        *_models(apps), batch_size=BATCH_SIZE, using=schema_editor.connection.alias, target=2
    )
    if summary.refused:
        # Not fatal: those rows stay as they are and their sessions are refused by workers
        # (and listed by check_state_compat) instead of being half-read.
        sys.stdout.write(
            f"\n  {summary.refused} blob(s) could not be upgraded and were left untouched; "
            "run `manage.py check_state_compat` to see them\n"
        )


def backward(apps, schema_editor):
    summary = downgrade_blobs(
        *_models(apps),
        from_version=2,
        batch_size=BATCH_SIZE,
        using=schema_editor.connection.alias,
    )
    if summary.refused:
        raise RuntimeError(
            f"{summary.refused} blob(s) are newer than version 2 and cannot be rewritten to "
            "version 1; reverse the later data migration first (the rest is done: run again)"
        )


class Migration(migrations.Migration):
    atomic = False  # one transaction per batch, never one for the whole table

    dependencies = [("sessions_app", "0008_session_incompatible")]

    operations = [migrations.RunPython(forward, backward)]
