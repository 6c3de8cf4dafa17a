from django.db import migrations

from queues.migrations._operations import RemoveIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    """The in-flight index by cluster goes: every dispatch and every start wrote an entry to it,
    and a claim, which changes only the cluster, could not be a HOT update while the column was
    indexed. The rare rescue of a silent cluster's items reads the in-flight index instead,
    which holds only what is dispatched or running. Dropped concurrently, and only on PostgreSQL,
    where 0026 built it."""

    atomic = False

    dependencies = [
        ("queues", "0038_item_account_finish_idx"),
    ]

    operations = [
        RemoveIndexConcurrentlyOnPostgres(model_name="item", name="item_in_flight_cluster_idx"),
    ]
