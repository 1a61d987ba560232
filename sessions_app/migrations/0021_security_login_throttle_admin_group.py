"""Log-in failures are kept by a keyed hash of the normalised username (sessions_app/web/auth.py),
never the username; and the `admin` role: acts on the queues and issues API tokens for
other users, beside superusers."""

from django.db import migrations, models

ADMIN_GROUP = "admin"


def forget_failures(apps, schema_editor):
    # Throttling data that lives for one window; the old rows name usernames as typed.
    apps.get_model("sessions_app", "LoginFailure").objects.all().delete()


def create_admin_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.get_or_create(name=ADMIN_GROUP)


def remove_admin_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=ADMIN_GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0020_dashboard_step_indexes"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunPython(forget_failures, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="loginfailure", name="loginfail_user"),
        migrations.RemoveField(model_name="loginfailure", name="username"),
        migrations.AddField(
            model_name="loginfailure",
            name="account",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddIndex(
            model_name="loginfailure",
            index=models.Index(fields=["account", "created_at"], name="loginfail_account"),
        ),
        migrations.AddIndex(
            model_name="loginfailure",
            index=models.Index(fields=["created_at"], name="loginfail_created"),
        ),
        migrations.RunPython(create_admin_group, remove_admin_group),
    ]
