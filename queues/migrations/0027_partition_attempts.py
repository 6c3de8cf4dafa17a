"""On PostgreSQL, the attempt table becomes partitioned by range of `finished_at` (see
queues/engine/partitions.py for why, and queues/migrations/_partitioning.py for how), without
rewriting it under a lock. Its foreign key to the item goes first: retention drops a partition of
attempts after the items they belong to are gone."""

import django.db.models.deletion
from django.db import migrations, models

from queues.engine.partitions import ATTEMPTS
from queues.migrations._partitioning import legacy_name, partition_by_time, unpartition

LEGACY = legacy_name(ATTEMPTS)


def forwards(apps, schema_editor):
    partition_by_time(schema_editor, ATTEMPTS)


def backwards(apps, schema_editor):
    unpartition(apps, schema_editor, ATTEMPTS, "Attempt")


class Migration(migrations.Migration):
    # VALIDATE and CREATE INDEX CONCURRENTLY run outside the swap's short transaction.
    atomic = False

    dependencies = [
        ("queues", "0026_item_in_flight_cluster_idx"),
    ]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="item",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.CASCADE,
                                    related_name="attempt_set", to="queues.item"),
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
