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
from datetime import datetime
from typing import NamedTuple

from queues.engine import audit, lifecycle
from queues.models import (
    FINISHED_STATUSES,
    PRINTABLE_TEXT,
    AccountStat,
    Attempt,
    DeadLetter,
    Item,
    ItemEvent,
    Queue,
    Status,
    printable,
)

BATCH = 1000
# JSON leaves these raw, but Python's splitlines and some JSON Lines readers break a line at
# them: a payload or an error holding one would split its record in two.
LINE_SAFE = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})
MAX_ITEMS = 100_000
COUNT_LIMIT = 10_000  # the page's counts stop past it
ATTEMPTS_COUNTED_ITEMS = 1_000
WAITING = (Status.QUEUED, Status.DISPATCHED, Status.RETRY)
ITEM_FIELDS = ("id", "queue__key", "account", "identifier", "status", "priority", "payload",
               "attempts", "last_error", "run_at", "created_at", "updated_at", "finished_at")


def _of(model, account: str):
    # Every index on these tables leads with the queue: naming all queues (a subquery, read
    # once per statement) lets the account part of (queue, account, ...) narrow the scan.
    return model.objects.filter(queue_id__in=Queue.objects.values("pk"), account=account)


def refusal(account: str) -> str | None:
    """Why `account` names no tenant whose data could be shown, exported or erased, or None.
    Every door refuses a name with a space at either end since session 27, but earlier releases
    stored some; taken exactly (never stripped, which would name another tenant), such a name
    is still reachable here while it holds data, so that a privacy request can be met."""
    if printable(account):
        return None
    if printable(account.strip(" ")) and (_of(Item, account).exists()
                                          or _of(DeadLetter, account).exists()):
        return None
    return PRINTABLE_TEXT


class Tally(NamedTuple):
    """A count that may stop at COUNT_LIMIT (then it reads "10,000+"), or was not made."""

    n: int | None
    exact: bool = True

    def __str__(self):
        if self.n is None:
            return "not counted"
        return f"{self.n:,}" + ("" if self.exact else "+")


def footprint(account: str) -> dict[str, Tally]:
    """How much of the account there is: items per status, and their history. Each count stops
    past COUNT_LIMIT: the largest account of a 1M-item seed (107,151 items) took 0.9 s to count
    exactly, and at 10M items the largest holds about a million."""
    items = {status: _capped(_of(Item, account).filter(status=status), "status")
             for status in Status}
    return {
        **{f"items {status.label.lower()}": tally for status, tally in items.items() if tally.n},
        "items in total": Tally(sum(tally.n for tally in items.values()),
                                all(tally.exact for tally in items.values())),
        "attempts": _attempts(account),
        "events": _capped(_of(ItemEvent, account), "queue_id"),
        "dead letters": _capped(_of(DeadLetter, account), "queue_id"),
    }


def _capped(rows, column: str) -> Tally:
    # One indexed column, so that PostgreSQL counts from the index alone.
    n = rows.values(column)[:COUNT_LIMIT + 1].count()
    return Tally(min(n, COUNT_LIMIT), n <= COUNT_LIMIT)


def _attempts(account: str) -> Tally:
    """Attempts are found by their item: through its id, which only the item's row holds, so
    they are counted for accounts of at most ATTEMPTS_COUNTED_ITEMS items (PostgreSQL joined the
    whole attempt table for an account of 34,056 items: 0.3 s at 1M items)."""
    ids = list(_of(Item, account).values_list("id", flat=True)[:ATTEMPTS_COUNTED_ITEMS + 1])
    if len(ids) > ATTEMPTS_COUNTED_ITEMS:
        return Tally(None)
    return _capped(Attempt.objects.filter(item_id__in=ids), "item_id")


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
    return json.dumps({"kind": kind, **row}, default=_json_value,
                      ensure_ascii=False).translate(LINE_SAFE) + "\n"


def _json_value(value) -> str:
    # Times as ISO 8601, as the API and the other exports write them (str() puts a space for T).
    return value.isoformat() if isinstance(value, datetime) else str(value)


def erase(account: str, *, actor) -> Counter:
    """Erase the account's items with their history; returns what went, and how many running
    items were left (erase again once they finish). The history of items retention already
    pruned no longer leads to the account: it goes by its own age, on PostgreSQL attempts at
    most a day after their item."""
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
