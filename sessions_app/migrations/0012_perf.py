"""The step hot path: two redundant indexes fewer, room for HOT updates of session rows.

- Step.session and Checkpoint.session lose their own single-column indexes: the unique
  constraints (session, seq) and (session, seq, reason) start with session_id and serve
  every lookup by session. Each step now updates one index fewer.
- The session row is updated by every step (last_seq, counters). Those columns are in no
  index, so PostgreSQL can make the update HOT (no new index entries) when the row's page
  has room for the new version; fillfactor 85 leaves that room on PostgreSQL.
"""

import django.db.models.deletion
from django.db import migrations, models


def set_fillfactor(value):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        table = schema_editor.quote_name(
            apps.get_model("sessions_app", "AgentSession")._meta.db_table
        )
        if value is None:
            schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
        else:
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0011_admin_indexes"),
    ]

    # The index names are the ones Django gave the foreign keys' indexes (0001_initial). Only the
    # index is dropped: AlterField would also drop and re-add the foreign key, which
    # validates every step row under a lock that blocks writes on a large table.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="checkpoint",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="checkpoints",
                        to="sessions_app.agentsession",
                    ),
                ),
                migrations.AlterField(
                    model_name="step",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="sessions_app.agentsession",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "sessions_app_checkpoint_session_id_dd84c42b"',
                    'CREATE INDEX IF NOT EXISTS "sessions_app_checkpoint_session_id_dd84c42b" '
                    'ON "sessions_app_checkpoint" ("session_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "sessions_app_step_session_id_7805be21"',
                    'CREATE INDEX IF NOT EXISTS "sessions_app_step_session_id_7805be21" '
                    'ON "sessions_app_step" ("session_id")',
                ),
            ],
        ),
        migrations.RunPython(set_fillfactor(85), set_fillfactor(None)),
    ]
