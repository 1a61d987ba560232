"""Rewrite stored checkpoint states and step payloads to schema version 3 (the agent's own
state), in batches, as 0009_upgrade_state_blobs did for version 2: `atomic = False`, one
transaction per batch, safe to interrupt and to run again; workers may keep running.

Reversible: the reverse rewrites version 3 blobs back to version 2, losing the agents' own
state. Stop the workers first.
"""

import sys

from django.db import migrations

from sessions_app.upkeep.state_upgrade import downgrade_blobs, upgrade_blobs

BATCH_SIZE = 500  # rows per transaction


def _models(apps):
    return apps.get_model("sessions_app", "Checkpoint"), apps.get_model("sessions_app", "Step")


def forward(apps, schema_editor):
    summary = upgrade_blobs(
        *_models(apps), batch_size=BATCH_SIZE, using=schema_editor.connection.alias, target=3
    )
    if summary.refused:
        sys.stdout.write(
            f"\n  {summary.refused} blob(s) could not be upgraded and were left untouched; "
            "run `manage.py check_state_compat` to see them\n"
        )


def backward(apps, schema_editor):
    summary = downgrade_blobs(
        *_models(apps),
        from_version=3,
        batch_size=BATCH_SIZE,
        using=schema_editor.connection.alias,
    )
    if summary.refused:
        raise RuntimeError(
            f"{summary.refused} blob(s) are newer than version 3 and cannot be rewritten to "
            "version 2; reverse the later data migration first (the rest is done: run again)"
        )


class Migration(migrations.Migration):
    atomic = False  # one transaction per batch, never one for the whole table

    dependencies = [("sessions_app", "0014_agent_versions")]

    operations = [migrations.RunPython(forward, backward)]
