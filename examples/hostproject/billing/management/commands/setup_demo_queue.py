"""Creates (or updates) the queue whose items the billing handler runs."""

from django.core.management.base import BaseCommand

from queues.models import Queue


class Command(BaseCommand):
    help = "Create the demo queue that runs billing.charge."

    def add_arguments(self, parser):
        parser.add_argument("--key", default="invoices")
        parser.add_argument("--name", default="Invoices")

    def handle(self, *args, key, name, **options):
        queue, created = Queue.objects.update_or_create(
            key=key, defaults={"name": name, "handler": "billing.charge"})
        self.stdout.write(f"{'created' if created else 'updated'} queue {queue.key}")
