"""Item counts per (queue, status) and outcomes per minute without counting millions of rows.

Transitions insert CounterDelta rows in their own transaction; `rollup` folds them into
StatusCount and OutcomeMinute. Readers add the few deltas not yet folded to the base counts.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count, Sum

from queues.engine.db import from_db_datetime, is_postgres, to_db_datetime
from queues.models import (
    READY_STATUSES,
    AccountPolicy,
    AccountStat,
    CounterDelta,
    Item,
    OutcomeMinute,
    Queue,
    Status,
    StatusCount,
)

OUTCOME_STATUSES = (Status.COMPLETE, Status.RETRY, Status.FAILED, Status.CANCELLED)
ROLLUP_BATCH = 10_000
# Due items oldest_waiting reads past a paused account's before it trusts the sweeper's figures.
PAUSED_HEAD_WALK = 500
# Due items oldest_waiting reads to look past backdated ones (not-before before their enqueue).
HEAD_WALK = 50


def record(deltas: Mapping[tuple[int, str], int], now: datetime):
    minute = now.replace(second=0, microsecond=0)
    CounterDelta.objects.bulk_create(
        [
            CounterDelta(queue_id=queue_id, status=status, delta=delta, minute=minute)
            for (queue_id, status), delta in deltas.items()
            if delta
        ]
    )


def rollup() -> int:
    """Fold pending deltas into the base tables; returns how many delta rows it folded.

    DELETE ... RETURNING makes each delta counted exactly once even when two rollups race: the
    second one cannot delete (or see) the rows the first one took.
    """
    folded = 0
    while True:
        moved = _rollup_batch()
        folded += moved
        if moved < ROLLUP_BATCH:
            return folded


def _rollup_batch() -> int:
    table = CounterDelta._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT %s) "
            "RETURNING queue_id, status, delta, minute",
            [ROLLUP_BATCH],
        )
        rows = cursor.fetchall()
        if not rows:
            return 0
        totals: Counter = Counter()
        outcomes: Counter = Counter()
        for queue_id, status, delta, minute in rows:
            totals[(queue_id, status)] += delta
            if delta > 0 and status in OUTCOME_STATUSES:
                outcomes[(queue_id, from_db_datetime(minute), status)] += delta
        cursor.executemany(
            f"INSERT INTO {StatusCount._meta.db_table} (queue_id, status, count) "
            "VALUES (%s, %s, %s) ON CONFLICT (queue_id, status) "
            f"DO UPDATE SET count = {StatusCount._meta.db_table}.count + excluded.count",
            [(q, s, d) for (q, s), d in totals.items()],
        )
        if outcomes:
            cursor.executemany(
                f"INSERT INTO {OutcomeMinute._meta.db_table} (queue_id, minute, status, count) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (queue_id, minute, status) "
                f"DO UPDATE SET count = {OutcomeMinute._meta.db_table}.count + excluded.count",
                [(q, to_db_datetime(m), s, d) for (q, m, s), d in outcomes.items()],
            )
    return len(rows)


def outcome_rows(first_minute: datetime, statuses, queue_ids: Iterable[int] | None = None):
    """(queue id, minute, status, count) of items entering `statuses` from `first_minute` on:
    the rolled-up minutes plus the deltas the sweeper has not folded yet, in one statement so
    that a rollup committing meanwhile neither hides nor doubles any."""
    rolled = OutcomeMinute.objects.filter(minute__gte=first_minute, status__in=statuses)
    pending = CounterDelta.objects.filter(minute__gte=first_minute, status__in=statuses,
                                          delta__gt=0)
    if queue_ids is not None:
        queue_ids = list(queue_ids)
        rolled, pending = rolled.filter(queue_id__in=queue_ids), pending.filter(
            queue_id__in=queue_ids)
    return rolled.values_list("queue_id", "minute", "status", "count").union(
        pending.values("queue_id", "minute", "status").annotate(n=Sum("delta"))
        .values_list("queue_id", "minute", "status", "n"),
        all=True,
    )


def status_counts(queue_ids: Iterable[int] | None = None) -> dict[int, dict[str, int]]:
    """Current counts per queue and status: base counts plus deltas not yet rolled up."""
    counts: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(Status.values, 0))
    base = StatusCount.objects.all()
    pending = CounterDelta.objects.all()
    if queue_ids is not None:
        queue_ids = list(queue_ids)
        base = base.filter(queue_id__in=queue_ids)
        pending = pending.filter(queue_id__in=queue_ids)
        for queue_id in queue_ids:
            counts[queue_id]  # every asked-for queue appears, even when empty
    # One statement, so one snapshot: read in two, a rollup committing in between would make
    # the folded deltas vanish from both (or, the other way round, count twice).
    rows = base.values_list("queue_id", "status", "count").union(
        pending.values("queue_id", "status").annotate(total=Sum("delta"))
        .values_list("queue_id", "status", "total"),
        all=True,
    )
    for queue_id, status, count in rows:
        counts[queue_id][status] += count
    return dict(counts)


def exact_counts(queue_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """Counted from the items table: for verification and repair, never for page views."""
    counts: dict[int, dict[str, int]] = {q: dict.fromkeys(Status.values, 0) for q in queue_ids}
    rows = (
        Item.objects.filter(queue_id__in=list(counts))
        .values("queue_id", "status")
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts[row["queue_id"]][row["status"]] = row["n"]
    return counts


def total_sql(queue_id: int, statuses) -> tuple[str, list]:
    """How many items of one queue are in `statuses` now, as an SQL expression and its
    parameters: the base counts plus the deltas not yet folded, for embedding in a statement
    whose other parts must see the same snapshot."""
    marks = ", ".join(["%s"] * len(statuses))
    sql = (f"(SELECT COALESCE(SUM(count), 0) FROM {StatusCount._meta.db_table} "
           f"WHERE queue_id = %s AND status IN ({marks})) + "
           f"(SELECT COALESCE(SUM(delta), 0) FROM {CounterDelta._meta.db_table} "
           f"WHERE queue_id = %s AND status IN ({marks}))")
    return sql, [queue_id, *statuses, queue_id, *statuses]


def in_flight_sql() -> str:
    """Dispatched plus running items of one queue as an SQL expression taking the queue id
    twice: the selector embeds it in the statement that reads its settings."""
    statuses = ", ".join(f"'{s}'" for s in (Status.DISPATCHED, Status.RUNNING))
    return (f"(SELECT COALESCE(SUM(count), 0) FROM {StatusCount._meta.db_table} "
            f"WHERE queue_id = %s AND status IN ({statuses})) + "
            f"(SELECT COALESCE(SUM(delta), 0) FROM {CounterDelta._meta.db_table} "
            f"WHERE queue_id = %s AND status IN ({statuses}))")


def oldest_waiting(ids: list[int], now: datetime) -> dict[int, datetime | None]:
    """When each queue's longest-waiting ready item (queued or retry, due now) became due: the
    later of its enqueue and its not-before time, so an item enqueued with a delay, or a retry,
    has waited since it was due, not since it was enqueued. Read from the first HEAD_WALK due
    items of the (queue, run_at) ready index, one statement for every queue: the earliest
    not-before time is the wait of every item but a backdated one (not-before before its
    enqueue), which the walk looks past. Items of a paused account are held on purpose, so
    they do not make their queue look stuck."""
    if not ids:
        return {}
    ready = ", ".join(f"'{status}'" for status in READY_STATUSES)
    later = "GREATEST" if is_postgres() else "MAX"
    # Correlated on each queue's id: every subquery walks that queue's head of the index.
    heads = (f"SELECT MIN({later}(h.created_at, h.run_at)) FROM (SELECT created_at, run_at "
             f"FROM {Item._meta.db_table} i WHERE i.queue_id = q.id AND i.status IN ({ready}) "
             f"AND i.run_at <= %s ORDER BY i.run_at LIMIT {HEAD_WALK}) h")
    paused = (f"EXISTS (SELECT 1 FROM {AccountPolicy._meta.db_table} p "
              f"WHERE p.queue_id = q.id AND p.paused)")
    placeholders = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT q.id, ({heads}), {paused} FROM {Queue._meta.db_table} q "
                       f"WHERE q.id IN ({placeholders})", [to_db_datetime(now), *ids])
        rows = cursor.fetchall()
    oldest, holding = {}, []
    for pk, since, any_paused in rows:
        oldest[pk] = from_db_datetime(since)
        if since and any_paused:
            holding.append(pk)
    # A second read only where an account is paused: the overview and /metrics keep their count.
    paused_accounts = defaultdict(set)
    if holding:
        for queue_id, account in AccountPolicy.objects.filter(
                queue_id__in=holding, paused=True).values_list("queue_id", "account"):
            paused_accounts[queue_id].add(account)
    for queue_id, accounts in paused_accounts.items():
        oldest[queue_id] = _oldest_unpaused(queue_id, accounts, now)
    return oldest


def _oldest_unpaused(queue_id: int, paused: set[str], now: datetime) -> datetime | None:
    """The oldest wait outside the paused accounts, read from the first PAUSED_HEAD_WALK due
    items of the index. Skipping a paused account's items one by one could walk millions, so
    past that the sweeper's per-account figures (up to one run old) give the due time."""
    heads = list(Item.objects.filter(queue_id=queue_id, status__in=READY_STATUSES,
                                     run_at__lte=now)
                 .order_by("run_at").values_list("created_at", "run_at", "account")
                 [:PAUSED_HEAD_WALK])
    waits = [max(created, run_at) for created, run_at, account in heads
             if account not in paused]
    if waits or len(heads) < PAUSED_HEAD_WALK:
        return min(waits, default=None)
    return (AccountStat.objects.filter(queue_id=queue_id, first_due__lte=now)
            .exclude(account__in=paused).order_by("first_due", "account")
            .values_list("first_due", flat=True).first())
