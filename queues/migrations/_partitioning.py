"""Turning a plain table into one partitioned by time on PostgreSQL without rewriting it under a
lock (migrations 0025 and 0027; see queues/engine/partitions.py for why).

The existing table, with its rows, becomes the first partition, holding everything before the
next midnight UTC (the next Monday when these migrations made weeks): a CHECK constraint proves
that range, added NOT VALID and validated apart (a scan that lets writes go on), and the unique
index on (id, time) the partitioned primary key needs is built CONCURRENTLY. Then one short
transaction swaps the tables and attaches the old one without a scan. A table without rows (a new installation) is simply replaced. Django's model is
unchanged: ids still come from one sequence, so `id` stays unique; PostgreSQL only requires the
partition key in the primary key.

Backwards copies every row into a plain table again: on a big installation that takes minutes.
"""

import time
from datetime import UTC, datetime

from django.db import OperationalError, transaction

from queues.engine import partitions
from queues.engine.partitions import PartitionedTable

SWAP_ATTEMPTS = 30
SWAP_LOCK_TIMEOUT = "2s"


def legacy_name(table: PartitionedTable) -> str:
    return f"{table.name}_legacy"


def partition_by_time(schema_editor, table: PartitionedTable):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    name, legacy = table.name, legacy_name(table)
    range_check, legacy_key = f"{legacy}_range", f"{legacy}_pkey"
    now = datetime.now(UTC)
    cutoff = partitions.day_start(now) + partitions.DAY
    with connection.cursor() as cursor:
        if partitions.is_partitioned(cursor, table):
            return
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {name})")
        has_rows = cursor.fetchone()[0]
        if has_rows:
            cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS {range_check}")
            cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {range_check} "
                           f"CHECK ({table.column} < %s) NOT VALID", [cutoff])
            cursor.execute(f"ALTER TABLE {name} VALIDATE CONSTRAINT {range_check}")
            cursor.execute(f"DROP INDEX IF EXISTS {legacy_key}")
            cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {legacy_key} ON {name} "
                           f"(id, {table.column})")
        for attempt in range(SWAP_ATTEMPTS):
            try:
                with transaction.atomic(using=connection.alias):
                    # Waiting behind a long transaction would hold every transition up
                    # behind this lock: give up quickly and try again.
                    cursor.execute(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
                    _swap(cursor, table, has_rows, now, cutoff)
                return
            except OperationalError:
                if attempt == SWAP_ATTEMPTS - 1:
                    raise
                time.sleep(1)


def _swap(cursor, table: PartitionedTable, attach: bool, now: datetime, cutoff: datetime):
    name, legacy = table.name, legacy_name(table)
    range_check, legacy_key = f"{legacy}_range", f"{legacy}_pkey"
    cursor.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT pg_get_serial_sequence('{name}', 'id')")
    old_sequence = cursor.fetchone()[0]
    cursor.execute(f"SELECT GREATEST((SELECT last_value FROM {old_sequence}), "
                   f"(SELECT COALESCE(MAX(id), 0) FROM {name}))")
    last_id = cursor.fetchone()[0]
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
        "AND tablename = %s AND indexname NOT IN (%s, %s)", [name, f"{name}_pkey", legacy_key])
    indexes = cursor.fetchall()
    cursor.execute(f"ALTER TABLE {name} RENAME TO {legacy}")
    for index, _ in indexes:
        cursor.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_legacy"')
    cursor.execute(f"CREATE SEQUENCE {name}_id_partitioned_seq")
    cursor.execute(f"SELECT setval('{name}_id_partitioned_seq', %s)", [max(last_id, 1)])
    cursor.execute(f"CREATE TABLE {name} (LIKE {legacy} INCLUDING DEFAULTS INCLUDING "
                   f"CONSTRAINTS) PARTITION BY RANGE ({table.column})")
    cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS {range_check}")
    cursor.execute(f"ALTER TABLE {name} ALTER COLUMN id SET DEFAULT "
                   f"nextval('{name}_id_partitioned_seq')")
    cursor.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {name}_pkey")
    cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_pkey PRIMARY KEY "
                   f"(id, {table.column})")
    for _, definition in indexes:  # Django's names on the new table, the old ones attach
        cursor.execute(definition)
    cursor.execute(f"ALTER TABLE {legacy} ALTER COLUMN id DROP IDENTITY IF EXISTS")
    cursor.execute(f"ALTER TABLE {legacy} ALTER COLUMN id DROP DEFAULT")
    if attach:
        cursor.execute(f"ALTER TABLE {legacy} ADD CONSTRAINT {legacy_key} PRIMARY KEY "
                       f"USING INDEX {legacy_key}")
        cursor.execute(f"ALTER TABLE {name} ATTACH PARTITION {legacy} "
                       f"FOR VALUES FROM (MINVALUE) TO (%s)", [cutoff])
        cursor.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {range_check}")
    partitions.create_days_ahead(cursor, table, now, first=cutoff if attach else None)
    cursor.execute(f"CREATE TABLE {table.default_partition} PARTITION OF {name} DEFAULT")
    if not attach:
        # Rows a process wrote since the check above (none on a new installation).
        cursor.execute(f"INSERT INTO {name} SELECT * FROM {legacy}")
        cursor.execute(f"DROP TABLE {legacy}")
    cursor.execute(f"ALTER SEQUENCE {name}_id_partitioned_seq OWNED BY {name}.id")
    if old_sequence.split(".")[-1] == f"{name}_id_seq":
        cursor.execute(f"DROP SEQUENCE IF EXISTS {old_sequence}")
    cursor.execute(f"ALTER SEQUENCE {name}_id_partitioned_seq RENAME TO {name}_id_seq")


def unpartition(apps, schema_editor, table: PartitionedTable, model_name: str):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    name = table.name
    with connection.cursor() as cursor, transaction.atomic(using=connection.alias):
        if not partitions.is_partitioned(cursor, table):
            return
        cursor.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = %s AND indexname <> %s", [name, f"{name}_pkey"])
        for (index,) in cursor.fetchall():
            cursor.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_partitioned"')
        cursor.execute(f"ALTER TABLE {name} RENAME CONSTRAINT {name}_pkey "
                       f"TO {name}_partitioned_pkey")
        cursor.execute(f"ALTER SEQUENCE {name}_id_seq RENAME TO {name}_id_partitioned_seq")
        cursor.execute(f"ALTER TABLE {name} RENAME TO {name}_partitioned")
        model = apps.get_model("queues", model_name)
        schema_editor.create_model(model)
        columns = ", ".join(f'"{f.column}"' for f in model._meta.local_concrete_fields)
        cursor.execute(f"INSERT INTO {name} ({columns}) OVERRIDING SYSTEM VALUE "
                       f"SELECT {columns} FROM {name}_partitioned ORDER BY id")
        cursor.execute(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                       f"GREATEST((SELECT last_value FROM {name}_id_partitioned_seq), 1))")
        cursor.execute(f"DROP TABLE {name}_partitioned")
