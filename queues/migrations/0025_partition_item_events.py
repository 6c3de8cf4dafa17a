"""On PostgreSQL, the item event table becomes partitioned by week of `at` (see
queues/engine/partitions.py for why), without rewriting it under a lock.

The existing table, with its rows, becomes the first partition, holding everything before next
Monday: a CHECK constraint proves that range, added NOT VALID and validated apart (a scan that
lets writes go on), and the unique index on (id, at) the partitioned primary key needs is built
CONCURRENTLY. Then one short transaction swaps the tables and attaches the old one without a
scan. A table without rows (a new installation) is simply replaced. Django's model is unchanged:
ids still come from one sequence, so `id` stays unique; PostgreSQL only requires the partition
key in the primary key.

Backwards copies every event into a plain table again: on a big installation that takes minutes.
"""

import time
from datetime import UTC, datetime

from django.db import OperationalError, migrations, transaction

from queues.engine import partitions

TABLE = partitions.TABLE
LEGACY = f"{TABLE}_legacy"
RANGE_CHECK = f"{LEGACY}_range"
LEGACY_KEY = f"{LEGACY}_pkey"
SWAP_ATTEMPTS = 30
SWAP_LOCK_TIMEOUT = "2s"


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    now = datetime.now(UTC)
    cutoff = partitions.week_start(now) + partitions.WEEK
    with connection.cursor() as cursor:
        if partitions.is_partitioned(cursor):
            return
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {TABLE})")
        has_rows = cursor.fetchone()[0]
        if has_rows:
            cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {RANGE_CHECK}")
            cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {RANGE_CHECK} "
                           f"CHECK (at < %s) NOT VALID", [cutoff])
            cursor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {RANGE_CHECK}")
            cursor.execute(f"DROP INDEX IF EXISTS {LEGACY_KEY}")
            cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {LEGACY_KEY} ON {TABLE} (id, at)")
        for attempt in range(SWAP_ATTEMPTS):
            try:
                with transaction.atomic(using=connection.alias):
                    # Waiting behind a long transaction would hold every transition up
                    # behind this lock: give up quickly and try again.
                    cursor.execute(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
                    _swap(cursor, has_rows, now, cutoff)
                return
            except OperationalError:
                if attempt == SWAP_ATTEMPTS - 1:
                    raise
                time.sleep(1)


def _swap(cursor, attach: bool, now: datetime, cutoff: datetime):
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT pg_get_serial_sequence('{TABLE}', 'id')")
    old_sequence = cursor.fetchone()[0]
    cursor.execute(f"SELECT GREATEST((SELECT last_value FROM {old_sequence}), "
                   f"(SELECT COALESCE(MAX(id), 0) FROM {TABLE}))")
    last_id = cursor.fetchone()[0]
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
        "AND tablename = %s AND indexname NOT IN (%s, %s)", [TABLE, f"{TABLE}_pkey", LEGACY_KEY])
    indexes = cursor.fetchall()
    cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {LEGACY}")
    for name, _ in indexes:
        cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}_legacy"')
    cursor.execute(f"CREATE SEQUENCE {TABLE}_id_partitioned_seq")
    cursor.execute(f"SELECT setval('{TABLE}_id_partitioned_seq', %s)", [max(last_id, 1)])
    cursor.execute(f"CREATE TABLE {TABLE} (LIKE {LEGACY} INCLUDING DEFAULTS INCLUDING "
                   f"CONSTRAINTS) PARTITION BY RANGE (at)")
    cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {RANGE_CHECK}")
    cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT "
                   f"nextval('{TABLE}_id_partitioned_seq')")
    cursor.execute(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {TABLE}_pkey")
    cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, at)")
    for _, definition in indexes:  # Django's names on the new table, the old ones attach
        cursor.execute(definition)
    cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id DROP IDENTITY IF EXISTS")
    cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id DROP DEFAULT")
    if attach:
        cursor.execute(f"ALTER TABLE {LEGACY} ADD CONSTRAINT {LEGACY_KEY} PRIMARY KEY "
                       f"USING INDEX {LEGACY_KEY}")
        cursor.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {LEGACY} "
                       f"FOR VALUES FROM (MINVALUE) TO (%s)", [cutoff])
        cursor.execute(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {RANGE_CHECK}")
        first_week = cutoff
    else:
        first_week = partitions.week_start(now)
    partitions.create_weeks(cursor, first_week, now + partitions.WEEKS_AHEAD * partitions.WEEK)
    cursor.execute(f"CREATE TABLE {partitions.DEFAULT_PARTITION} PARTITION OF {TABLE} DEFAULT")
    if not attach:
        # Rows a process wrote since the check above (none on a new installation).
        cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {LEGACY}")
        cursor.execute(f"DROP TABLE {LEGACY}")
    cursor.execute(f"ALTER SEQUENCE {TABLE}_id_partitioned_seq OWNED BY {TABLE}.id")
    if old_sequence.split(".")[-1] == f"{TABLE}_id_seq":
        cursor.execute(f"DROP SEQUENCE IF EXISTS {old_sequence}")
    cursor.execute(f"ALTER SEQUENCE {TABLE}_id_partitioned_seq RENAME TO {TABLE}_id_seq")


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor, transaction.atomic(using=connection.alias):
        if not partitions.is_partitioned(cursor):
            return
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = %s AND indexname <> %s", [TABLE, f"{TABLE}_pkey"])
        for (name,) in cursor.fetchall():
            cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}_partitioned"')
        cursor.execute(f"ALTER TABLE {TABLE} RENAME CONSTRAINT {TABLE}_pkey "
                       f"TO {TABLE}_partitioned_pkey")
        cursor.execute(f"ALTER SEQUENCE {TABLE}_id_seq RENAME TO {TABLE}_id_partitioned_seq")
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_partitioned")
        model = apps.get_model("queues", "ItemEvent")
        schema_editor.create_model(model)
        columns = ", ".join(f'"{f.column}"' for f in model._meta.local_concrete_fields)
        cursor.execute(f"INSERT INTO {TABLE} ({columns}) OVERRIDING SYSTEM VALUE "
                       f"SELECT {columns} FROM {TABLE}_partitioned ORDER BY id")
        cursor.execute(f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), "
                       f"GREATEST((SELECT last_value FROM {TABLE}_id_partitioned_seq), 1))")
        cursor.execute(f"DROP TABLE {TABLE}_partitioned")


class Migration(migrations.Migration):
    # VALIDATE and CREATE INDEX CONCURRENTLY run outside the swap's short transaction.
    atomic = False

    dependencies = [
        ("queues", "0024_outcomeminute_minute_idx"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
