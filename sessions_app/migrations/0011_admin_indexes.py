"""Indexes behind the admin's filters and search.

On PostgreSQL every index here is built with CREATE INDEX CONCURRENTLY: at 10,000,000 steps a
plain CREATE INDEX holds a write lock on the table for as long as the build takes, and every
worker's step append would wait behind it. CONCURRENTLY cannot run in a transaction, so this
migration is not atomic. Other databases get plain CREATE INDEX.

The title search index is PostgreSQL-only (a pg_trgm GIN index on the exact expression
Django's icontains generates, UPPER(title::text), so the planner uses it), like the
step_payload_search index of migration 0004_step_search."""

from django.db import migrations, models

TITLE_INDEX = "session_title_trgm"


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


def create_title_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # pg_trgm is a trusted extension (PostgreSQL 13+): the database owner may create it.
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {TITLE_INDEX} ON sessions_app_agentsession "
        "USING gin ((UPPER((title)::text)) gin_trgm_ops)"
    )


def drop_title_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # The extension stays: something else may use it by now.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {TITLE_INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sessions_app", "0010_crash_count")]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="agentsession",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running"])),
                fields=["-updated_at", "-id"],
                name="session_runnable_updated",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="auditevent",
            index=models.Index(fields=["action", "-created_at"], name="audit_action_created"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="checkpoint",
            index=models.Index(fields=["reason", "-id"], name="checkpoint_reason_id"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="checkpoint",
            index=models.Index(fields=["schema_version"], name="checkpoint_version"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="step",
            index=models.Index(fields=["kind", "-id"], name="step_kind_id"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="step",
            index=models.Index(fields=["schema_version"], name="step_version"),
        ),
        migrations.RunPython(create_title_index, drop_title_index),
    ]
