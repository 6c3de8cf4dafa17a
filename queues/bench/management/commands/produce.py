import random
import time
from itertools import count

from django.core.management.base import BaseCommand, CommandError

from queues import enqueue_many
from queues.bench.seeding import zipf_counts
from queues.management import arguments
from queues.models import Queue


class Producer:
    """Puts a second's worth of items on the queues, from Zipf-skewed tenant accounts."""

    def __init__(self, queues: list[str], rate: float, accounts: int, rng: random.Random):
        self.queues = queues
        self.rate = rate
        self.rng = rng
        sizes = zipf_counts(100 * accounts, accounts, rng)
        self.accounts = [f"tenant-{i:05d}" for i in range(accounts)]
        self.weights = sizes
        self.serial = count()
        self.run_id = f"{int(time.time()):x}"

    def step(self) -> int:
        """One second's items (the rate varies by +-50% from second to second)."""
        n = max(0, round(self.rate * self.rng.uniform(0.5, 1.5)))
        by_queue: dict[str, list] = {}
        for account in self.rng.choices(self.accounts, self.weights, k=n):
            queue = self.rng.choice(self.queues)
            serial = next(self.serial)
            by_queue.setdefault(queue, []).append({
                "account": account, "identifier": f"live-{self.run_id}-{serial}",
                "payload": {"order": serial, "amount_cents": self.rng.randrange(100, 100_000)},
                "priority": 5 if self.rng.random() < 0.05 else 0,
            })
        for queue, items in by_queue.items():
            enqueue_many(queue, items)
        return n


class Command(BaseCommand):
    help = "Keep putting demo items on the queues (Ctrl-C to stop)."

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=arguments.rate, default=5.0, help="items per second")
        parser.add_argument("--accounts", type=arguments.count, default=250)
        parser.add_argument("--seconds", type=float, default=None, help="stop after this long")

    def handle(self, *args, rate, accounts, seconds, **options):
        queues = list(Queue.objects.filter(paused=False).values_list("key", flat=True))
        if not queues:
            raise CommandError("no queue to produce for; run manage.py demo first")
        producer = Producer(queues, rate, accounts, random.Random())
        self.stdout.write(f"producing about {rate}/s for {len(queues)} queues")
        deadline = time.monotonic() + seconds if seconds is not None else None
        while deadline is None or time.monotonic() < deadline:
            started = time.monotonic()
            producer.step()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
