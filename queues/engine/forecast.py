"""When a waiting item should run, and what holds it back: one estimate for the item list, the
item page and the API, so that no two places disagree ("now" on one page and "due 11 min ago"
on another).

An item waits for its run_at. Past it, the selector takes it in its next round unless
something holds it: every queue paused, its queue paused, its account paused or at its
in-flight cap, its queue's concurrency used up, or simply the items ahead of it.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count

from queues.engine import counters, pausing
from queues.models import IN_FLIGHT_STATUSES, READY_STATUSES, AccountPolicy, Item, Queue

# The selector's loop takes a due item within a second or so; later than this it is overdue.
DUE_GRACE = timedelta(seconds=5)
SCHEDULED, DUE = "scheduled", "due"
BACKLOG, QUEUE_FULL = "backlog ahead", "queue full"
EVERY_QUEUE_PAUSED, QUEUE_PAUSED = "every queue paused", "queue paused"
ACCOUNT_PAUSED, ACCOUNT_AT_CAP = "account paused", "account at cap"
REASONS = (SCHEDULED, DUE, BACKLOG, QUEUE_FULL, EVERY_QUEUE_PAUSED, QUEUE_PAUSED,
           ACCOUNT_PAUSED, ACCOUNT_AT_CAP)
HOLDS = {EVERY_QUEUE_PAUSED, QUEUE_PAUSED, ACCOUNT_PAUSED, ACCOUNT_AT_CAP}


@dataclass(frozen=True)
class NextRun:
    at: datetime  # the item's run_at: when it may run, possibly past
    reason: str  # one of REASONS

    @property
    def held(self) -> bool:
        """Something other than time keeps it waiting: it will not run until that changes."""
        return self.reason in HOLDS



def next_runs(queue: Queue, items, now: datetime) -> dict[int, NextRun]:
    """The estimate for each waiting item of `items` (all of one queue); a few short queries
    for a page of items, whatever their number."""
    waiting = [item for item in items if item.status in READY_STATUSES]
    if not waiting:
        return {}
    if pausing.global_pause().paused:
        return {item.pk: NextRun(item.run_at, EVERY_QUEUE_PAUSED) for item in waiting}
    if queue.paused:
        return {item.pk: NextRun(item.run_at, QUEUE_PAUSED) for item in waiting}
    holds = account_holds(queue, {item.account for item in waiting})
    full = None
    runs = {}
    for item in waiting:
        reason = holds.get(item.account)
        if reason is None and item.run_at > now:
            reason = SCHEDULED
        elif reason is None and item.run_at > now - DUE_GRACE:
            reason = DUE
        elif reason is None:
            if full is None:
                counts = counters.status_counts([queue.pk])[queue.pk]
                full = sum(counts[s] for s in IN_FLIGHT_STATUSES) >= queue.concurrency
            reason = QUEUE_FULL if full else BACKLOG
        runs[item.pk] = NextRun(item.run_at, reason)
    return runs


def next_run(item: Item, now: datetime) -> NextRun | None:
    return next_runs(item.queue, [item], now).get(item.pk)


def account_holds(queue: Queue, accounts) -> dict[str, str]:
    """Accounts of `accounts` that may not run now: paused, or at their in-flight cap."""
    policies = list(AccountPolicy.objects.filter(queue=queue, account__in=list(accounts)))
    reasons = {p.account: ACCOUNT_PAUSED for p in policies if p.paused}
    capped = {p.account: p.max_in_flight for p in policies
              if p.max_in_flight is not None and not p.paused}
    if capped:
        in_flight = dict(
            Item.objects.filter(queue=queue, account__in=list(capped),
                                status__in=IN_FLIGHT_STATUSES)
            .values("account").annotate(n=Count("id")).values_list("account", "n"))
        reasons |= {a: ACCOUNT_AT_CAP for a, cap in capped.items()
                    if in_flight.get(a, 0) >= cap}
    return reasons
