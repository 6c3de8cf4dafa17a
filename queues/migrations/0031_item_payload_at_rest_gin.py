from django.contrib.postgres.indexes import GinIndex
from django.db import migrations, models

from queues.migrations._operations import (
    AddIndexConcurrentlyOnPostgres,
    RemoveIndexConcurrentlyOnPostgres,
)


class Migration(migrations.Migration):
    # CREATE and DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("queues", "0030_item_payload_gin_fastupdate_off"),
    ]

    # The new index first, so that a payload search always has one to read.
    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="item",
            index=GinIndex(
                condition=models.Q(("status__in", ["queued", "retry", "complete", "failed",
                                                   "cancelled"])),
                fastupdate=False,
                fields=["payload"],
                name="item_payload_at_rest_gin",
                opclasses=["jsonb_path_ops"],
            ),
        ),
        RemoveIndexConcurrentlyOnPostgres(model_name="item", name="item_payload_gin"),
    ]
