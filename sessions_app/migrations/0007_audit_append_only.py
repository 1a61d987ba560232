"""The audit log is append-only at the database level: UPDATE and DELETE on
sessions_app_auditevent raise, whoever asks (the ORM, the admin, a raw query by the
application's user). TRUNCATE (test-suite teardown, a deliberate wipe by the database
owner) is not a row operation and stays possible."""

from django.db import migrations

PG_CREATE = """
CREATE OR REPLACE FUNCTION respawn_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % on sessions_app_auditevent refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS respawn_audit_append_only ON sessions_app_auditevent;
CREATE TRIGGER respawn_audit_append_only BEFORE UPDATE OR DELETE ON sessions_app_auditevent
    FOR EACH ROW EXECUTE FUNCTION respawn_audit_append_only();
"""
PG_DROP = """
DROP TRIGGER IF EXISTS respawn_audit_append_only ON sessions_app_auditevent;
DROP FUNCTION IF EXISTS respawn_audit_append_only();
"""
SQLITE_CREATE = [
    """CREATE TRIGGER IF NOT EXISTS respawn_audit_no_update BEFORE UPDATE ON sessions_app_auditevent
       BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: UPDATE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS respawn_audit_no_delete BEFORE DELETE ON sessions_app_auditevent
       BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: DELETE refused'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS respawn_audit_no_update",
    "DROP TRIGGER IF EXISTS respawn_audit_no_delete",
]


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_CREATE, params=None)
    elif vendor == "sqlite":
        for sql in SQLITE_CREATE:
            schema_editor.execute(sql)


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_DROP, params=None)
    elif vendor == "sqlite":
        for sql in SQLITE_DROP:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0006_audit_fks_login_failures")]

    operations = [migrations.RunPython(create, drop)]
