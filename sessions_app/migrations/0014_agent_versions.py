"""Agent versions: the version each session started on, the version of the agent that
marked a session incompatible, and a running tool's progress note.

Sessions that exist already get the agent version their first checkpoint recorded (every
state blob names its agent's version); sessions with no checkpoint keep "" (unrecorded),
which the compatibility rule orders before every version. The fill runs in batches of
BATCH_SIZE sessions, one transaction each, and is reversible (the columns go away).
"""

from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery

BATCH_SIZE = 1000


def fill_agent_versions(apps, schema_editor):
    session_model = apps.get_model("sessions_app", "AgentSession")
    checkpoint_model = apps.get_model("sessions_app", "Checkpoint")
    db = schema_editor.connection.alias
    first_version = Subquery(
        checkpoint_model.objects.using(db)
        .filter(session_id=OuterRef("pk"))
        .order_by("seq", "id")
        .values("state__agent__version")[:1]
    )
    last_id = None
    while True:
        batch = session_model.objects.using(db).order_by("id")
        if last_id is not None:
            batch = batch.filter(id__gt=last_id)
        ids = list(batch.values_list("id", flat=True)[:BATCH_SIZE])
        if not ids:
            return
        rows = (
            session_model.objects.using(db)
            .filter(id__in=ids, agent_version="")
            .annotate(first=first_version)
            .exclude(first__isnull=True)
            .values_list("id", "first")
        )
        for session_id, version in rows:
            session_model.objects.using(db).filter(id=session_id).update(
                agent_version=str(version)[:50]
            )
        last_id = ids[-1]


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0013_fanout_batches"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="agent_version",
            field=models.CharField(blank=True, db_default="", default="", max_length=50),
        ),
        migrations.AddField(
            model_name="agentsession",
            name="incompatible_agent_version",
            field=models.CharField(blank=True, db_default="", default="", max_length=50),
        ),
        migrations.AddField(
            model_name="agentsession",
            name="progress_note",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.RunPython(fill_agent_versions, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="agentsession",
            index=models.Index(
                fields=["agent", "agent_version", "-updated_at", "-id"],
                name="session_agent_version",
            ),
        ),
    ]
