from django.db import migrations, models

from queues.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("queues", "0028_item_autovacuum"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="item",
            index=models.Index(
                condition=models.Q(("status__in", ["complete", "failed", "cancelled"])),
                fields=["queue", "status", "finished_at", "created_at", "id", "identifier"],
                name="item_finished_status_idx",
            ),
        ),
    ]
