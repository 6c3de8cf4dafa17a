from django.db import migrations

# PostgreSQL compiles a query to machine code when its estimated cost passes jit_above_cost.
# The dashboard's reads over 10M items pass it and spend 5 to 10 ms compiling queries that run
# in tens of milliseconds (the overview of 100 busy queues: p50 63 to 67 ms with it, 55 ms
# without). The setting is the database's, so it reaches every process and holds behind
# PgBouncer; new sessions take it. A role that may not change it (not the database's owner)
# leaves it, and is told so.
OWNER_OR_SUPERUSER = (
    "SELECT d.datname, pg_has_role(current_user, d.datdba, 'MEMBER') OR r.rolsuper "
    "FROM pg_database d, pg_roles r "
    "WHERE d.datname = current_database() AND r.rolname = current_user"
)


def _set_jit(schema_editor, clause: str):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(OWNER_OR_SUPERUSER)
        database, may = cursor.fetchone()
        if not may:
            print("\n  JIT left as it is: only the database's owner may turn it off "
                  "(ALTER DATABASE ... SET jit = off; docs/deploy.md)")
            return
        cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(database)} {clause}")


def jit_off(apps, schema_editor):
    _set_jit(schema_editor, "SET jit = off")


def jit_default(apps, schema_editor):
    _set_jit(schema_editor, "RESET jit")


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0031_item_payload_at_rest_gin"),
    ]

    operations = [migrations.RunPython(jit_off, jit_default)]
