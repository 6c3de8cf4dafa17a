"""On PostgreSQL, the item event table becomes partitioned by range of `at` (see
queues/engine/partitions.py for why, and queues/migrations/_partitioning.py for how), without
rewriting it under a lock."""

from django.db import migrations

from queues.engine.partitions import EVENTS
from queues.migrations._partitioning import legacy_name, partition_by_time, unpartition

LEGACY = legacy_name(EVENTS)


def forwards(apps, schema_editor):
    partition_by_time(schema_editor, EVENTS)


def backwards(apps, schema_editor):
    unpartition(apps, schema_editor, EVENTS, "ItemEvent")


class Migration(migrations.Migration):
    # VALIDATE and CREATE INDEX CONCURRENTLY run outside the swap's short transaction.
    atomic = False

    dependencies = [
        ("queues", "0024_outcomeminute_minute_idx"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
