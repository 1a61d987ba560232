"""Checkpoint states as compact JSON text (`json`) on PostgreSQL, converted in batches
with no long lock (sessions_app/upkeep/state_text.py). Not atomic: each batch commits on
its own, and an interrupted run goes on from where it stopped when run again.

The release before this one reads and writes states on either column type (its loader,
sessions_app/fields.py), so its processes keep working between this migration and their
restart."""

from django.db import migrations

import sessions_app.fields


def forwards(apps, schema_editor):
    from sessions_app.upkeep import state_text

    # Progress only where there is something to convert (not in a new database).
    busy = apps.get_model("sessions_app", "Checkpoint").objects.exists()
    state_text.convert(
        using=schema_editor.connection.alias, progress=print_progress if busy else None
    )


def backwards(apps, schema_editor):
    from sessions_app.upkeep import state_text

    state_text.back_to_jsonb(using=schema_editor.connection.alias)


def print_progress(text: str) -> None:
    print(f"\n  checkpoint states: {text}", end="", flush=True)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sessions_app", "0027_sso"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(
                    model_name="checkpoint",
                    name="state",
                    field=sessions_app.fields.JSONTextField(),
                ),
            ],
        ),
    ]
