"""Sessions that completed with failed tool calls: how many (counted at completion by the
store), and a partial index for "needs attention". Existing sessions start at 0; nothing
to fill (a session is counted the next time it completes)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0022_usage_budgets"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="failed_calls",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="agentsession",
            index=models.Index(
                condition=models.Q(("failed_calls__gt", 0), ("status", "completed")),
                fields=["updated_at", "id"],
                name="session_completed_failed",
            ),
        ),
    ]
