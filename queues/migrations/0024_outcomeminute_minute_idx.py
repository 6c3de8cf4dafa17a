from django.db import migrations, models

from queues.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("queues", "0023_installation_history"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="outcomeminute",
            index=models.Index(fields=["minute"], name="outcomeminute_minute_idx"),
        ),
    ]
