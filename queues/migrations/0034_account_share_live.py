from django.db import migrations, models


class Migration(migrations.Migration):
    """The accounts page orders by share of service live, from the recent selector rounds, so
    the sweeper's ranking no longer keeps it: its index goes (a small table, dropped in
    milliseconds) and its column gets a default, so that this release's sweeper leaves it out
    while the previous release's sweeper, still running during a deploy, writes it."""

    dependencies = [
        ("queues", "0033_queue_setting_bounds"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="accountstat",
            name="accountstat_served_idx",
        ),
        migrations.AlterField(
            model_name="accountstat",
            name="served",
            field=models.PositiveIntegerField(db_default=0),
        ),
    ]
