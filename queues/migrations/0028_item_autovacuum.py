from django.db import migrations

from queues.migrations._operations import SetStorageOnPostgres


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0027_partition_attempts"),
    ]

    # PostgreSQL's defaults wait for 20% of a table to change. On 10M items that is 2M changed
    # rows, and until then the visibility map is stale, so every count of the dashboard (the
    # bulk preview's above all) visits the heap page of each row instead of reading the index
    # alone. At 1% the items table is vacuumed after 100k changes or inserts.
    operations = [
        SetStorageOnPostgres("item", {
            "autovacuum_vacuum_scale_factor": 0.01,
            "autovacuum_vacuum_insert_scale_factor": 0.01,
            "autovacuum_analyze_scale_factor": 0.02,
        }),
        SetStorageOnPostgres("counterdelta", {
            # Insert-then-delete churn: vacuum by row count, whatever the table's size.
            "autovacuum_vacuum_scale_factor": 0,
            "autovacuum_vacuum_threshold": 10000,
        }),
    ]
