from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.module_loading import autodiscover_modules


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Queues"

    def ready(self):
        from queues import checks  # noqa: F401  (registers the system checks)
        from queues.schedules import ensure_schedules

        # Every installed app may register handlers in its handlers.py.
        autodiscover_modules("handlers")
        post_migrate.connect(ensure_schedules, sender=self)
