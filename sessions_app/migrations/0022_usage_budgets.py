"""Costs and budgets: what each session's model calls cost per day and model
(ModelUsage, written with the model step), and the wall-time budget's deadline on the
session row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0021_security_login_throttle_admin_group"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="deadline_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="ModelUsage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("session_id", models.UUIDField()),
                ("agent", models.CharField(max_length=100)),
                ("model", models.CharField(max_length=200)),
                ("calls", models.PositiveIntegerField(default=0)),
                ("tokens_in", models.BigIntegerField(default=0)),
                ("tokens_out", models.BigIntegerField(default=0)),
                ("cache_read_tokens", models.BigIntegerField(default=0)),
                ("cache_write_tokens", models.BigIntegerField(default=0)),
                ("cost", models.DecimalField(decimal_places=6, default=0, max_digits=14)),
                ("unpriced_calls", models.PositiveIntegerField(default=0)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["day"], name="usage_day"),
                    models.Index(fields=["agent", "day"], name="usage_agent_day"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("session_id", "day", "model"), name="usage_session_day_model"
                    )
                ],
            },
        ),
    ]
