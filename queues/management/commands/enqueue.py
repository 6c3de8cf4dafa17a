import json

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

import queues
from queues.engine.lifecycle import EnqueueError
from queues.management.arguments import text


class Command(BaseCommand):
    help = "Put one item on a queue from the shell."

    def add_arguments(self, parser):
        parser.add_argument("queue", type=text)
        parser.add_argument("--account", required=True)
        parser.add_argument("--identifier", required=True)
        parser.add_argument("--payload", default="{}", help="JSON object")
        parser.add_argument("--run-at", help="ISO 8601 with a time zone, e.g. 2026-01-01T09:00Z")
        parser.add_argument("--priority", type=int, default=0)

    def handle(self, *args, **options):
        try:
            payload = json.loads(options["payload"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--payload is not valid JSON: {exc}") from None
        run_at = None
        if options["run_at"]:
            run_at = parse_datetime(options["run_at"])
            if run_at is None:
                raise CommandError("--run-at is not an ISO 8601 datetime")
        try:
            item = queues.enqueue(options["queue"], account=options["account"],
                                  identifier=options["identifier"], payload=payload,
                                  run_at=run_at, priority=options["priority"])
        except EnqueueError as exc:
            raise CommandError(exc.message) from None
        verb = "enqueued" if item.created else "already live"
        self.stdout.write(f"{verb}: item {item.pk} ({item.status}) on {options['queue']}")
