"""The work queue: a session's owner (who took it, or was handed it, and since when) with
an index for the lists' owner filter, and people's plain-text notes on a session, each at
the step the session had reached. Both start empty: nothing to fill."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0024_imported_audit_record"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SessionNote",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "author_label",
                    models.CharField(
                        help_text="Who wrote it, kept if the user goes.", max_length=200
                    ),
                ),
                ("text", models.TextField()),
                (
                    "seq",
                    models.PositiveIntegerField(
                        help_text="The session's last step when it was written."
                    ),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.AddField(
            model_name="agentsession",
            name="owned_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agentsession",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddIndex(
            model_name="agentsession",
            index=models.Index(
                fields=["owner", "-updated_at", "-id"], name="session_owner_updated"
            ),
        ),
        migrations.AddField(
            model_name="sessionnote",
            name="author",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="sessionnote",
            name="session",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="notes",
                to="sessions_app.agentsession",
            ),
        ),
        migrations.AddIndex(
            model_name="sessionnote",
            index=models.Index(fields=["session", "seq", "id"], name="note_session_seq"),
        ),
    ]
