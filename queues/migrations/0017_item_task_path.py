from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queues', '0016_account_stats'),
    ]

    operations = [
        # A constant database default: PostgreSQL adds the column without rewriting the table.
        migrations.AddField(
            model_name='item',
            name='task_path',
            field=models.CharField(blank=True, db_default='', default='', max_length=300),
        ),
    ]
