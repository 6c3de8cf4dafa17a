import sys

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.db.models.signals import post_migrate, post_save
from django.urls import register_converter
from django.utils.module_loading import autodiscover_modules


class QueuesConfig(AppConfig):
    default = True  # this module declares a second AppConfig, for the admin site
    name = "queues"
    verbose_name = "Queues"

    def ready(self):
        from queues import checks  # noqa: F401  registers the system checks
        from queues.engine import heartbeat, tasks, webhook  # noqa: F401  handlers register
        from queues.engine.alerts import create_default_rules, ensure_installation_rules
        from queues.engine.schedules import ensure_schedules
        from queues.models import Queue, QueueKeyConverter
        from queues.ops.startup import freeze_what_lives_forever
        from queues.permissions import grant_admin_permissions
        from queues.web import middleware  # noqa: F401  connects the login signal

        # Before any URLconf is read: the dashboard's and the API's both name queues by it.
        register_converter(QueueKeyConverter, "queue")
        # Every installed app may register handlers in its handlers.py.
        autodiscover_modules("handlers")
        post_migrate.connect(ensure_schedules, sender=self)
        post_migrate.connect(grant_admin_permissions, sender=self)
        post_migrate.connect(ensure_installation_rules, sender=self)
        post_save.connect(create_default_rules, sender=Queue)
        if heartbeat.is_qcluster(sys.argv):
            # Only a worker cluster beats; web processes and other commands do not.
            heartbeat.start_in_cluster()
            # Its URLconf is not needed, and not safe to load while apps are still readying.
            freeze_what_lives_forever(with_views=False)


class QueueAdminSiteConfig(admin_apps.AdminConfig):
    """Django's admin site at /django-admin/, open to the Admin role (not to is_staff)."""

    default = False
    default_site = "queues.admin_site.QueueAdminSite"
