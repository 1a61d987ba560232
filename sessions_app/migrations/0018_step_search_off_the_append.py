"""Full-text search off the append path: steps are indexed in batches into StepSearch
(one stripped tsvector per chunk of a session's steps, sessions_app.upkeep.search), and the
per-step GIN index of 0004_step_search goes. On PostgreSQL only; the index rows are built
by the workers' indexer after this migration (the session list says while it catches up),
or at once by `manage.py index_search`. Reversible: the old index is built again.
"""

import django.contrib.postgres.search
import django.db.models.deletion
from django.db import migrations, models

OLD_INDEX = "step_payload_search"
NEW_INDEX = "stepsearch_tsv"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        # fastupdate off: the index is written in batches off the append, so it needs no
        # pending list (which would hold every new entry uncompressed until a vacuum).
        f"CREATE INDEX IF NOT EXISTS {NEW_INDEX} ON sessions_app_stepsearch USING gin (tsv)"
        " WITH (fastupdate = off)"
    )
    schema_editor.execute(f"DROP INDEX IF EXISTS {OLD_INDEX}")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {OLD_INDEX} ON sessions_app_step USING gin "
        "(to_tsvector('simple'::regconfig, COALESCE((payload)::text, ''::text)))"
    )
    schema_editor.execute(f"DROP INDEX IF EXISTS {NEW_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0017_langgraph_threads"),
    ]

    operations = [
        migrations.CreateModel(
            name="SearchCursor",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("step_id", models.BigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.CreateModel(
            name="StepSearch",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("chunk", models.PositiveIntegerField()),
                ("first_seq", models.PositiveIntegerField()),
                ("last_seq", models.PositiveIntegerField()),
                ("tsv", django.contrib.postgres.search.SearchVectorField()),
                (
                    "session",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="sessions_app.agentsession",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("session", "chunk"), name="stepsearch_chunk_unique"
                    )
                ],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
