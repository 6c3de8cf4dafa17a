import time

from django.core.management.base import BaseCommand

from queues.engine import alerts
from queues.management.arguments import seconds


class Command(BaseCommand):
    help = ("Evaluate the alert rules and deliver their notices from outside the worker "
            "clusters, which cannot report that none of them is beating.")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true",
                            help="keep evaluating (Ctrl-C or SIGTERM to stop)")
        parser.add_argument("--interval", type=seconds, default=60.0,
                            help="seconds between evaluations with --loop (default 60)")

    def handle(self, *args, loop=False, interval=60.0, **options):
        while True:
            counts = alerts.evaluate(source="command")
            if counts is None:
                self.stdout.write("another evaluation is running")
            elif not counts:
                self.stdout.write("nothing changed")
            for action, n in sorted((counts or {}).items()):
                self.stdout.write(f"{action}: {n}")
            if not loop:
                return
            time.sleep(interval)
