from django.contrib.postgres.indexes import GinIndex
from django.db import migrations

from queues.migrations._operations import SetIndexStorageOnPostgres


class Migration(migrations.Migration):
    # The index's exclusive lock, which every writer to the items table waits for, is let go
    # as soon as the change is made, not at the end of a migration's transaction.
    atomic = False

    dependencies = [
        ("queues", "0029_item_finished_status_idx"),
    ]

    # Only the index's fastupdate flag changes, in the catalogue: no rebuild. Entries already
    # in its pending list stay there until the next vacuum of the items table merges them. The
    # state records the new definition so that the model matches.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="item", name="item_payload_gin"),
                migrations.AddIndex(
                    model_name="item",
                    index=GinIndex(fields=["payload"], name="item_payload_gin",
                                   opclasses=["jsonb_path_ops"], fastupdate=False),
                ),
            ],
            database_operations=[
                SetIndexStorageOnPostgres("item_payload_gin", {"fastupdate": "off"}),
            ],
        ),
    ]
