"""Full-text search over step payloads on PostgreSQL (the dashboard's free-text search).

The expression is exactly what selectors.step_search_matches() generates, so the planner
uses the index. Other databases search with icontains and get no index here."""

from django.db import migrations

INDEX = "step_payload_search"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON sessions_app_step USING gin "
        "(to_tsvector('simple'::regconfig, COALESCE((payload)::text, ''::text)))"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0003_apitoken")]

    operations = [migrations.RunPython(create, drop)]
