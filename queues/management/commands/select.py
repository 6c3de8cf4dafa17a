import time

from django.core.management.base import BaseCommand, CommandError

from queues.engine import selector
from queues.management.arguments import seconds, text
from queues.models import Queue, is_queue_key


class Command(BaseCommand):
    help = "Run selector rounds from the shell and print what each took per account."

    def add_arguments(self, parser):
        parser.add_argument("--queue", type=text,
                            help="queue key (default: every queue that is not paused)")
        parser.add_argument("--loop", action="store_true",
                            help="keep running rounds (Ctrl-C to stop)")
        parser.add_argument("--interval", type=seconds, default=1.0,
                            help="seconds to wait after a round that did not fill its batch")

    def handle(self, *args, queue=None, loop=False, interval=1.0, **options):
        queues = Queue.objects.filter(paused=False)
        if queue:
            queues = Queue.objects.filter(key=queue)
            if not is_queue_key(queue) or not queues.exists():
                raise CommandError(f"unknown queue {queue!r}")
        while True:
            filled = False
            for target in queues:
                result = selector.run_round(target)
                filled |= result.filled
                self.stdout.write(self._describe(result))
            if not loop:
                return
            if not filled:
                time.sleep(interval)

    def _describe(self, result) -> str:
        if not result.taken:
            return f"{result.queue}: {result.skipped}"
        shares = ", ".join(f"{account}={n}" for account, n in sorted(result.taken.items()))
        return (f"{result.queue}: {result.total} of {result.capacity} in "
                f"{result.duration_ms:.1f} ms from {len(result.taken)} accounts ({shares})")
