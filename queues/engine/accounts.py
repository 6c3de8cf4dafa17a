"""One tenant's data, on every queue: what there is, all of it as a file, and its erasure, which
is what a privacy request needs.

Erasing goes through the lifecycle: waiting items are cancelled (so that no worker starts them
while they go), then every finished item is deleted with its attempts, dead letters and events,
and the counters lose them in the same transactions; the account leaves the accounts page's
ranking (AccountStat) at once rather than at the next sweep. A running item is left to finish:
its handler holds it, and the erasure says how many to erase again afterwards. Work is done in
batches of BATCH items, each one short transaction, and at most MAX_ITEMS per call.
"""

import json
from collections import Counter
from collections.abc import Iterator

from django.db.models import Count

from queues.engine import audit, lifecycle
from queues.models import (
    FINISHED_STATUSES,
    AccountStat,
    Attempt,
    DeadLetter,
    Item,
    ItemEvent,
    Queue,
    Status,
)

BATCH = 1000
MAX_ITEMS = 100_000
WAITING = (Status.QUEUED, Status.DISPATCHED, Status.RETRY)
ITEM_FIELDS = ("id", "queue__key", "account", "identifier", "status", "priority", "payload",
               "attempts", "last_error", "run_at", "created_at", "updated_at", "finished_at")


def _of(model, account: str):
    # Every index on these tables leads with the queue: naming all queues (a subquery, read
    # once per statement) lets the account part of (queue, account, ...) narrow the scan.
    return model.objects.filter(queue_id__in=Queue.objects.values("pk"), account=account)


def footprint(account: str) -> dict[str, int]:
    """How much of the account there is: items per status, and their history."""
    counts = Counter(dict(_of(Item, account).values_list("status").annotate(n=Count("id"))))
    return {
        **{f"items {Status(status).label.lower()}": n for status, n in sorted(counts.items())},
        "items in total": sum(counts.values()),
        "attempts": Attempt.objects.filter(item__in=_of(Item, account)).count(),
        "events": _of(ItemEvent, account).count(),
        "dead letters": _of(DeadLetter, account).count(),
    }


def export_lines(account: str) -> Iterator[str]:
    """Every item of the account with its attempts, events and dead letters, one JSON object
    per line ("kind" says which), read by id in batches so that any size streams."""
    every_id = sorted(_of(Item, account).values_list("id", flat=True))
    for start in range(0, len(every_id), BATCH):
        ids = every_id[start:start + BATCH]
        items = Item.objects.filter(id__in=ids).order_by("id").values(*ITEM_FIELDS)
        for item in items:
            yield _line("item", item)
        for kind, model in (("attempt", Attempt), ("event", ItemEvent),
                            ("dead letter", DeadLetter)):
            for row in model.objects.filter(item_id__in=ids).order_by("item_id", "id").values():
                yield _line(kind, row)


def _line(kind: str, row: dict) -> str:
    return json.dumps({"kind": kind, **row}, default=str, ensure_ascii=False) + "\n"


def erase(account: str, *, actor) -> Counter:
    """Erase the account's items with their history; returns what went, and how many running
    items were left (erase again once they finish). The history of items retention already
    pruned no longer leads to the account: it goes by its own age, on PostgreSQL attempts at
    most a week after their item."""
    erased: Counter = Counter()
    while erased["items"] < MAX_ITEMS:
        waiting = list(_of(Item, account).filter(status__in=WAITING)
                       .values_list("id", flat=True)[:BATCH])
        cancelled = lifecycle.apply("cancel", waiting, actor=audit.actor_name(actor),
                                    reason="the account's data is being erased").changed
        finished = list(_of(Item, account).filter(status__in=FINISHED_STATUSES)
                        .values_list("queue_id", "id")[:BATCH])
        by_queue: dict[int, list[int]] = {}
        for queue_id, item_id in finished:
            by_queue.setdefault(queue_id, []).append(item_id)
        before = erased["items"]
        for queue_id, ids in by_queue.items():
            erased.update({str(what): n for what, n in
                           lifecycle.delete_finished(queue_id, ids).items()})
        if erased["items"] == before and not cancelled:
            break  # nothing left that may go now
    erased["account rankings"] = _of(AccountStat, account).delete()[0]
    erased["running, left to finish"] = _of(Item, account).filter(status=Status.RUNNING).count()
    audit.record(actor, "account.erase", target=f"account {account}",
                 counts={key: n for key, n in erased.items() if n})
    return erased
