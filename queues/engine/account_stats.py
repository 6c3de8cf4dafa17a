"""The accounts page's orders by backlog and oldest wait, kept in AccountStat, and the recent
service its order by share reads live.

Grouping every ready item by account on each page view is too slow at scale (1M items, 10,000
accounts), so the sweeper ranks the accounts once per run: for each queue, one INSERT ... SELECT
... GROUP BY over the ready-item index replaces the queue's rows in one transaction, so a reader
sees the old ranking or the new one, never a mix, and an account whose backlog emptied drops
out. The page reads its order here by keyset and shows live figures for the accounts on it.
"""

from collections import Counter
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from queues.engine.db import to_db_datetime
from queues.models import READY_STATUSES, AccountStat, Item, Queue, SelectorRound

SERVICE_ROUNDS = 20  # selector rounds behind "served recently" and the share of service


def recent_service(queue: Queue) -> tuple[Counter, int]:
    """Items dispatched per account over the queue's last SERVICE_ROUNDS rounds, and how many
    rounds that was."""
    allocations = list(SelectorRound.objects.filter(queue=queue).order_by("-started_at")
                       .values_list("allocation", flat=True)[:SERVICE_ROUNDS])
    served: Counter = Counter()
    for allocation in allocations:
        served.update(allocation)
    return served, len(allocations)


def refresh(queue: Queue, now: datetime | None = None) -> int:
    """Rank the queue's accounts with ready items anew; returns how many there are. One
    refresh at a time (the sweeper's single runner): two at once would collide on the unique
    (queue, account)."""
    now = now or timezone.now()
    # Literal statuses, as in the ready index's predicate, so that the planner uses it.
    ready = ", ".join(f"'{status}'" for status in READY_STATUSES)
    with transaction.atomic():
        AccountStat.objects.filter(queue=queue).delete()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {AccountStat._meta.db_table} "
                f"(queue_id, account, backlog, first_due, refreshed_at) "
                f"SELECT queue_id, account, COUNT(*), MIN(run_at), %s "
                f"FROM {Item._meta.db_table} WHERE queue_id = %s AND status IN ({ready}) "
                f"GROUP BY queue_id, account", [to_db_datetime(now), queue.pk])
            return cursor.rowcount


def refresh_all(now: datetime | None = None) -> int:
    """Every queue, one short transaction each; returns the accounts ranked."""
    now = now or timezone.now()
    return sum(refresh(queue, now) for queue in Queue.objects.all())
