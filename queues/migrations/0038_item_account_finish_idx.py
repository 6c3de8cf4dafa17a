from django.db import migrations, models

from queues.migrations._operations import AddIndexConcurrently, RemoveIndexConcurrently


class Migration(migrations.Migration):
    """The account index gains the finish order (finished_at, created_at, id) after its status,
    so a bulk preview by account samples its latest finished items by walking it. The new
    index is built before the old one is dropped, both concurrently on PostgreSQL: reads by
    account always have one, and writes go on."""

    atomic = False

    dependencies = [
        ("queues", "0037_compose_stored_names"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="item",
            index=models.Index(
                fields=["queue", "account", "status", "finished_at", "created_at", "id"],
                name="item_account_finish_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="item", name="item_account_idx"),
    ]
