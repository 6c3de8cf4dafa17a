from django.core.management.base import BaseCommand

from queues.engine import sweeper
from queues.management.arguments import seconds


class Command(BaseCommand):
    help = "Run the sweeper once: rescue lost items, prune past retention, fold counters."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=seconds, default=240.0,
                            help="stop starting new batches after this long")

    def handle(self, *args, seconds, **options):
        counts = sweeper.run(seconds=seconds)
        if counts is None:
            self.stdout.write("another sweeper is running")
            return
        if not counts:
            self.stdout.write("nothing to do")
        for action, rows in sorted(counts.items()):
            self.stdout.write(f"{action}: {rows}")
