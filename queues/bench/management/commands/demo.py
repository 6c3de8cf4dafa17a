import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from queues.bench import seeding
from queues.engine import counters
from queues.models import AccountPolicy, Item, Queue

# Five queues with different settings, as an operator would run them.
# The "demo" handler takes 20-300 ms and fails sometimes (see queues/handlers.py).
FLAKY = {"handler": "demo", "handler_options": {"retry_rate": 0.06, "permanent_rate": 0.02}}
DEMO_QUEUES = [
    {"key": "webhooks", "name": "Partner webhooks", "batch_size": 60, "concurrency": 20, **FLAKY},
    {"key": "emails", "name": "Transactional e-mail", "batch_size": 100, "concurrency": 50,
     "rate_limit_per_minute": 600, **FLAKY},
    {"key": "thumbnails", "name": "Image thumbnails", "batch_size": 30, "concurrency": 8,
     "stale_threshold": timedelta(minutes=30), "retention_days": 14, **FLAKY},
    {"key": "billing", "name": "Invoice sync", "batch_size": 20, "concurrency": 4,
     "max_retries": 8, "backoff_seconds": [60, 300, 900, 1800, 3600], **FLAKY},
    {"key": "reports", "name": "Nightly reports", "batch_size": 10, "concurrency": 2,
     "paused": True, **FLAKY},
]
CREDENTIALS_FILE = settings.BASE_DIR / "var" / "demo-credentials.txt"


class Command(BaseCommand):
    help = "Create demo queues, a realistic snapshot of items and an admin user."

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, default=60_000)
        parser.add_argument("--accounts", type=int, default=250)

    def handle(self, *args, items, accounts, **options):
        with transaction.atomic():
            queues = [self._queue(spec) for spec in DEMO_QUEUES]
            self._policies(queues[0])
        if Item.objects.filter(queue__in=queues).exists():
            self.stdout.write("Demo data already present; leaving it as it is.")
        else:
            self.stdout.write(f"Seeding {items:,} items across {accounts} accounts ...")
            # The seeded in-flight items belong to no live worker: old enough, the first
            # sweep finds them lost, as it would after a crash. The backlog is the last six
            # hours', as on a live queue; finished items go back 30 days.
            result = seeding.seed(items=items, accounts=accounts, queues=queues,
                                  account_prefix="tenant", in_flight_age=3600,
                                  waiting_within=6 * 3600)
            counters.rollup()
            self.stdout.write(f"Seeded in {result.wall_seconds:.1f} s.")
        username, password = self._admin()
        self.stdout.write(self.style.SUCCESS(
            f"Admin login: {username} / {password}  (also in {CREDENTIALS_FILE})"))

    def _queue(self, spec):
        spec = dict(spec)
        queue, _ = Queue.objects.update_or_create(key=spec.pop("key"), defaults=spec)
        return queue

    def _policies(self, queue):
        # A heavier tenant, a capped one and a paused one, so the fairness settings show.
        for account, policy in {
            "tenant-00001": {"weight": 3},
            "tenant-00002": {"max_in_flight": 5},
            "tenant-00003": {"paused": True},
        }.items():
            AccountPolicy.objects.update_or_create(queue=queue, account=account, defaults=policy)

    def _admin(self):
        User = get_user_model()
        user = User.objects.filter(username="admin").first()
        if user is not None and CREDENTIALS_FILE.exists():
            return "admin", CREDENTIALS_FILE.read_text().split()[-1]
        password = secrets.token_urlsafe(12)
        if user is None:
            user = User(username="admin", email="admin@example.com")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        CREDENTIALS_FILE.parent.mkdir(parents=True, exist_ok=True)
        CREDENTIALS_FILE.write_text(f"admin {password}\n")
        CREDENTIALS_FILE.chmod(0o600)
        return "admin", password
