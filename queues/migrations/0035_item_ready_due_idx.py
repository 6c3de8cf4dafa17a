from django.db import migrations, models

from queues.migrations._operations import AddIndexConcurrently


class Migration(migrations.Migration):
    """The oldest wait reads a queue's ready items by not-before time (it read queued items by
    enqueue time, so an item enqueued with a delay looked hours old the moment it came due, and
    retries were left out). On PostgreSQL CREATE INDEX CONCURRENTLY: writes go on during the build."""

    atomic = False

    dependencies = [
        ("queues", "0034_account_share_live"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="item",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "retry"])),
                fields=["queue", "run_at"],
                name="item_ready_due_idx",
            ),
        ),
    ]
