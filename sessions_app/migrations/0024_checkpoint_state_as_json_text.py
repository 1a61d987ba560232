"""A checkpoint's state kept as JSON text (`json`) instead of `jsonb` on PostgreSQL
(sessions_app.fields.JSONTextField): about a quarter fewer bytes per checkpoint, written
once a turn and read whole. Nothing indexes the column or compares it; the one query on a
key of it (the attention queue's uncertain calls) uses `->>`, which `json` has too.

PostgreSQL rewrites the checkpoint table once, under its lock (38 ms for 1,666
checkpoints on the bench machine: seconds per 100,000). Existing states keep jsonb's text
form (blanks after separators, about a fifth smaller than jsonb); new ones are written
compact. SQLite keeps text, as before.

Between this migration and the restart, the previous release's workers keep loading and
appending (their store reads the state as either form, and a jsonb value is cast to json
on insert); its dashboard cannot show a checkpoint's state until the restart (Django's
JSONField there gets the json value already decoded)."""

from django.db import migrations

import sessions_app.fields


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0023_session_failed_calls"),
    ]

    operations = [
        migrations.AlterField(
            model_name="checkpoint",
            name="state",
            field=sessions_app.fields.JSONTextField(),
        ),
    ]
