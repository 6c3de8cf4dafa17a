from django.contrib.postgres.indexes import GinIndex
from django.db import migrations

from queues.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("queues", "0010_execution_on_real_work"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="item",
            index=GinIndex(fields=["payload"], name="item_payload_gin",
                           opclasses=["jsonb_path_ops"]),
        ),
    ]
