from django.db import migrations, models

from queues.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("queues", "0025_partition_item_events"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="item",
            index=models.Index(
                condition=models.Q(("status__in", ["dispatched", "running"])),
                fields=["cluster"],
                name="item_in_flight_cluster_idx",
            ),
        ),
    ]
