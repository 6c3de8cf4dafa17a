from django.core.management.base import BaseCommand, CommandError

import queues
from queues.engine.lifecycle import EnqueueError
from queues.management.arguments import aware_datetime, json_document, text


class Command(BaseCommand):
    help = "Put one item on a queue from the shell."

    def add_arguments(self, parser):
        parser.add_argument("queue", type=text)
        parser.add_argument("--account", required=True)
        parser.add_argument("--identifier", required=True)
        parser.add_argument("--payload", type=json_document, default={}, help="JSON object")
        parser.add_argument("--run-at", type=aware_datetime,
                            help="ISO 8601 with a time zone, e.g. 2026-01-01T09:00Z")
        parser.add_argument("--priority", type=int, default=0)

    def handle(self, *args, **options):
        try:
            item = queues.enqueue(options["queue"], account=options["account"],
                                  identifier=options["identifier"], payload=options["payload"],
                                  run_at=options["run_at"], priority=options["priority"])
        except EnqueueError as exc:
            raise CommandError(exc.message) from None
        verb = "enqueued" if item.created else "already live"
        self.stdout.write(f"{verb}: item {item.pk} ({item.status}) on {options['queue']}")
