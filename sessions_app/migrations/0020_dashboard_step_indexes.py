"""Two small partial indexes for a session's trace:

- step_failed: the failed steps of a session (error steps and tool results with an
  error), for the trace's "first error", its "failed" filter and the header's count;
- step_run_started: the run_started steps of a session, for the trace's run numbers and
  the timeline's run marks.

Only failed steps and run starts enter them: an append of anything else costs nothing.

Built with CREATE INDEX CONCURRENTLY on PostgreSQL, as in 0011_admin_indexes: a plain build
would hold a write lock on the step table, and every worker's append would wait behind it."""

from django.db import migrations, models
from django.db.models import Q


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.add_index(
            model, self.index, **({"concurrently": True} if concurrently else {})
        )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.remove_index(
            model, self.index, **({"concurrently": True} if concurrently else {})
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sessions_app", "0019_leaner_step_indexes")]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="step",
            index=models.Index(
                condition=Q(("kind", "error"))
                | Q(("kind", "tool_result"), ("payload__status", "error")),
                fields=["session", "seq"],
                name="step_failed",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="step",
            index=models.Index(
                condition=Q(("kind", "system"), ("payload__event", "run_started")),
                fields=["session", "seq"],
                name="step_run_started",
            ),
        ),
    ]
