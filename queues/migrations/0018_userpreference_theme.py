from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queues', '0017_item_task_path'),
    ]

    operations = [
        migrations.AddField(
            model_name='userpreference',
            name='theme',
            field=models.CharField(choices=[('system', 'Follow the system'), ('light', 'Light'), ('dark', 'Dark')], default='system', max_length=6),
        ),
    ]
