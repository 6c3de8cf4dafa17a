"""The sweeper: rescues items whose worker vanished, prunes what is past retention, folds the
counter deltas, makes new big queues known to the planner, ranks the accounts for the accounts
page, and records every run (empty ones too) as its liveness signal.

Each step handles one bounded batch in one short transaction and says whether to go on at
once; `run` repeats steps for a while. Steps are safe to repeat and to race: rescue goes through
the lifecycle (fenced by attempt number) and pruning deletes by id.
"""

import logging
import time
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from queues.engine import (
    account_stats,
    bulk,
    counters,
    heartbeat,
    lifecycle,
    partitions,
    table_stats,
)
from queues.engine.db import is_postgres, to_db_datetime
from queues.engine.logfields import item_fields
from queues.models import (
    FINISHED_STATUSES,
    Item,
    OutcomeMinute,
    Queue,
    SelectorRound,
    Status,
    SweepRun,
)

log = logging.getLogger(__name__)
BATCH = 2000  # most rows per transaction: short enough never to hold locks for long
# How long past its queue's handler timeout a running item waits before it counts as lost: its
# batch records a timeout at the deadline itself, within a loop of its own.
OVERDUE_MARGIN = timedelta(seconds=60)
LOCK_KEY = 7_466_002
ROUND_RETENTION = timedelta(days=1)
ROLLUP_RETENTION = timedelta(days=7)
RUN_RETENTION = timedelta(days=30)
# A bulk operation's steps run every few seconds; one silent this long lost its worker task.
BULK_STEP_LOST_AFTER = timedelta(minutes=2)
# Silent clusters whose every item was handed back: {cluster: (its last beat, when)}. What a
# cluster holds is found by reading the whole in-flight index (the cluster column is in no
# index, migration 0039), and a killed cluster stays on record, silent, for a day
# (heartbeat.PRUNE_AFTER): it is read again only once it beats again, or after
# HANDED_BACK_RECHECK, for a frozen cluster that woke, claimed and froze again between beats.
_handed_back: dict[str, tuple[datetime, float]] = {}
HANDED_BACK_RECHECK = 300.0


def run(seconds: float = 240.0) -> dict[str, int] | None:
    """The scheduled task: steps until nothing is left or time is up; records the run.
    Returns what changed, or None when another sweeper is running."""
    started = timezone.now()
    totals: Counter = Counter()
    deadline = time.monotonic() + seconds
    with _single_runner() as alone:
        if not alone:
            return None
        EVENT_PASSES.clear()
        ITEM_PASSES.clear()
        while True:
            changed, more = step()
            totals.update(changed)
            if not more or time.monotonic() > deadline:
                break
        totals["partitions created"] += len(partitions.ensure_days_ahead(started))
        totals["counter deltas folded"] += counters.rollup()
        totals["bulk operations resumed"] += bulk.resume_lost(
            timezone.now() - BULK_STEP_LOST_AFTER)
        # Before the ranking, whose reads are planned with what this learns.
        totals["queues made known to the planner"] += len(table_stats.refresh())
        # Last, so that the ranking counts the items this run rescued. Once per run (5 minutes)
        # rather than every minute: it reads every ready item, and the page says its age.
        totals["accounts ranked"] += account_stats.refresh_all()
    counts = {action: n for action, n in totals.items() if n}
    record_run(started, counts)
    if counts:
        log.info("sweeper changed %s", counts)
    return counts


def record_run(started: datetime, counts: dict[str, int]):
    SweepRun.objects.create(started_at=started, finished_at=timezone.now(), counts=counts)


def step(now: datetime | None = None) -> tuple[Counter, bool]:
    """One batch of each action for each queue; returns (what changed, go on at once?)."""
    now = now or timezone.now()
    changed: Counter = Counter()
    more = False
    queues = list(Queue.objects.all())
    longest = max((queue.retention_days for queue in queues), default=0)
    attempts_by_day = partitions.drops_by_partition(partitions.ATTEMPTS)
    for queue in queues:
        for status, timeout in ((Status.DISPATCHED, queue.dispatch_timeout),
                                (Status.RUNNING, queue.stale_threshold)):
            rescued, full = _rescue(queue, status, now - timeout)
            changed.update(rescued)
            more |= full
        # The attempts of a queue kept as long as the longest go with their day, after the
        # item: deleting them by item read cold pages all over the table (up to 1.25 s at 10M).
        pruned, full = _prune_items(queue, now - timedelta(days=queue.retention_days),
                                    with_attempts=not (attempts_by_day
                                                       and queue.retention_days == longest))
        changed.update(pruned)
        more |= full
    pruned, full = _prune_events(queues, now, longest)
    changed.update(pruned)
    more |= full
    if attempts_by_day and queues:
        pruned, full = _prune_attempts(now - timedelta(days=longest))
        changed.update(pruned)
        more |= full
    for model, field, age in ((SelectorRound, "started_at", ROUND_RETENTION),
                              (OutcomeMinute, "minute", ROLLUP_RETENTION),
                              (SweepRun, "started_at", RUN_RETENTION)):
        deleted, full = _prune_old(model, field, now - age)
        changed[f"{model._meta.verbose_name_plural} pruned"] += deleted
        more |= full
    changed.update(rescue_silent_clusters(now))
    changed.update(rescue_overdue(now))
    # A handful of rows at most: clusters stopped or replaced a day ago.
    changed["cluster heartbeats pruned"] += heartbeat.prune(now)
    return changed, more


def _rescue(queue: Queue, status: str, older_than: datetime) -> tuple[Counter, bool]:
    """Items stuck dispatched or running: their attempt counts, then retry or dead letter."""
    size = RESCUE_BATCH.size
    started = time.perf_counter()
    stuck = dict(
        Item.objects.filter(queue=queue, status=status, updated_at__lt=older_than)
        .order_by("updated_at").values_list("id", "attempts")[:size]
    )
    changed: Counter = Counter()
    if stuck:
        # One transaction for the whole batch; an item that moved on since it was read stays.
        results = lifecycle.rescue_lost(queue, stuck, guard=(
            "status = %s AND updated_at < %s", [status, to_db_datetime(older_than)]))
        RESCUE_BATCH.took(time.perf_counter() - started)
        for kind, result in results.items():
            changed[f"{status} items lost, {'retried' if kind == 'retry' else 'failed'}"] += len(
                result.changed)
            for row in result.changed:
                log.warning("item %s lost with its worker while %s, %s", row.id, status,
                            "retry scheduled" if kind == "retry" else "dead-lettered",
                            extra=item_fields(queue.key, row.id, row.account,
                                              attempt=row.attempts))
    return changed, len(stuck) == size


def rescue_overdue(now: datetime | None = None) -> Counter:
    """Running items past their queue's handler timeout by OVERDUE_MARGIN. The batch that ran
    one records a timeout at the deadline, so one still running has no batch left: its worker
    process died (the OOM killer, a crash) while its cluster beats on, and the queue would wait
    for the stale threshold with the item's slot held. The selector loop runs this every few
    seconds: one read of the running items, which the in-flight index holds."""
    now = now or timezone.now()
    changed: Counter = Counter()
    queues = {queue.pk: queue for queue in Queue.objects.all()}
    if not queues:
        return changed
    due = Q()
    for queue in queues.values():
        due |= Q(queue_id=queue.pk, updated_at__lt=now - queue.handler_timeout - OVERDUE_MARGIN)
    overdue = Item.objects.filter(due, status=Status.RUNNING).values_list(
        "queue_id", flat=True).distinct()
    for queue_id in overdue:
        queue = queues[queue_id]
        rescued, _ = _rescue(queue, Status.RUNNING, now - queue.handler_timeout - OVERDUE_MARGIN)
        changed.update(rescued)
    return changed


def rescue_silent_clusters(now: datetime | None = None) -> Counter:
    """Items held by clusters that stopped beating (killed, frozen, cut off), without waiting
    for the dispatch timeout or the stale threshold: dispatched ones they never started are
    released, running ones count a lost attempt. Both are fenced by the claim and attempt
    number, so a frozen cluster that wakes up can record nothing. The selector loop runs this
    every few seconds."""
    now = now or timezone.now()
    found = heartbeat.silent_clusters(now)
    # Clusters that beat again or were pruned are forgotten: a long-lived loop keeps no more
    # than the clusters silent now.
    for cluster in _handed_back.keys() - found.keys():
        del _handed_back[cluster]
    silent = {cluster: beat for cluster, beat in found.items()
              if not _all_handed_back(cluster, beat)}
    if not silent:
        return Counter()
    changed = rescue_held(list(silent), "stopped beating", "silent clusters")
    if changed:
        log.info("rescued from silent clusters %s: %s", list(silent), dict(changed))
    if sum(changed.values()) < lifecycle.BATCH_LIMIT:
        _handed_back.update({cluster: (beat, time.monotonic()) for cluster, beat in silent.items()})
    return changed


def _all_handed_back(cluster: str, beat: datetime) -> bool:
    seen = _handed_back.get(cluster)
    return bool(seen and seen[0] == beat and time.monotonic() < seen[1] + HANDED_BACK_RECHECK)


def rescue_held(clusters: list[str], why: str, whose: str) -> Counter:
    """lifecycle.hand_back, each lost item logged."""
    changed, lost = lifecycle.hand_back(clusters, why, whose)
    for queue, cluster, kind, row in lost:
        log.warning("item %s lost with cluster %s, %s", row.id, cluster,
                    "retry scheduled" if kind == "retry" else "dead-lettered",
                    extra=item_fields(queue.key, row.id, row.account, attempt=row.attempts))
    return changed


class BatchSize:
    """How many rows a sweeper batch (rescue, prune) takes: halved after a batch that ran past
    the target, a quarter more after one well under it. Rows on cold, scattered pages cost a
    millisecond each and rows on neighbouring pages a hundredth of that, so no fixed size keeps
    every statement short without making catching up slow. Growing slowly keeps the size near
    the slow batches' pace: doubling let a run of cached batches reach sizes that took 700 ms
    once a checkpoint came."""

    def __init__(self, start: int, least: int, most: int, target_seconds: float = 0.05):
        self.size, self.least, self.most, self.target = start, least, most, target_seconds

    def took(self, seconds: float):
        if seconds > self.target:
            self.size = max(self.least, self.size // 2)
        elif seconds < self.target / 2:
            self.size = min(self.most, self.size + max(1, self.size // 4))


# One per sweeper process: the pace of the last batches is the best guess for the next.
# They start small: the first batch of a run meets cold pages (500 stuck items took 1.3 s,
# 90 took 1.2 s). Not smaller than 5: at 10M, rescues of one or two cold items still took up to
# 3.3 s while the disk was busy, as batches of five did, so going lower bought nothing. The
# target is a quarter of the 200 ms a statement may take: a checkpoint or two busy CPUs make a
# batch take three or four times its usual time.
RESCUE_BATCH = BatchSize(start=20, least=5, most=BATCH)
ITEM_BATCH = BatchSize(start=50, least=10, most=BATCH)
# Events aim at 50 ms as the rest do, now that each batch walks a bounded span of ids past the
# previous one (EVENT_PASSES): starting from the oldest, a batch that small walked mostly the
# index entries of the rows deleted before it (until vacuum), 800 events/s at 10M.
EVENT_BATCH = BatchSize(start=1000, least=100, most=20_000)
EVENT_SECONDS_PER_STEP = 2.0
# Most event ids one batch looks through: the index entries of rows deleted before it stay until
# vacuum, and at 10M a batch that walked from the oldest to find a few events took up to 4 s.
EVENT_ID_SPAN = 100_000
# {(retention days, queue ids): (last id looked at, newest id when the pass began)}: one pass
# over the ids per sweeper run, a span at a time; CAUGHT_UP once it has gone through them all.
# An event whose `at` is out of id order (another clock, a late commit) and expires behind the
# pass waits for the next run's pass.
EVENT_PASSES: dict[tuple[int, tuple[int, ...]], tuple[int, int] | str] = {}
CAUGHT_UP = "caught up"
# {queue id: the finish time the last full batch of expired items reached}, for the same reason:
# a batch from the oldest walked the index entries of every item pruned before it (up to 519 ms
# at 10M). One pass per queue per sweeper run; CAUGHT_UP after a short batch.
ITEM_PASSES: dict[int, datetime | str] = {}


def _prune_items(queue: Queue, finished_before: datetime, *,
                 with_attempts: bool) -> tuple[Counter, bool]:
    """Finished items past the queue's retention, with their dead letters (and attempts unless
    they go by their own age, _prune_attempts), a batch at a time. Their events go by their own
    age (_prune_events)."""
    passed = ITEM_PASSES.get(queue.pk)
    if passed == CAUGHT_UP:
        return Counter(), False
    size = ITEM_BATCH.size
    started = time.perf_counter()
    expired = Item.objects.filter(queue=queue, status__in=FINISHED_STATUSES,
                                  finished_at__lt=finished_before)
    if passed:
        expired = expired.filter(finished_at__gte=passed)
    rows = list(expired.order_by("finished_at").values_list("id", "finished_at")[:size])
    with _deleting():
        deleted = lifecycle.delete_finished(queue.pk, [pk for pk, _ in rows], with_events=False,
                                            with_attempts=with_attempts)
    if rows:
        ITEM_BATCH.took(time.perf_counter() - started)
    full = len(rows) == size
    ITEM_PASSES[queue.pk] = rows[-1][1] if full else CAUGHT_UP
    changed = Counter({f"{name} pruned": n for name, n in deleted.items()})
    return changed, full


def _prune_events(queues: list[Queue], now: datetime, longest: int) -> tuple[Counter, bool]:
    """Events past their queue's retention. On PostgreSQL a day whose events are all past
    every queue's retention is dropped whole; the rest (queues kept shorter than the longest,
    the hours of a day not yet all past) are deleted oldest first, a batch per retention."""
    changed: Counter = Counter()
    if not queues:
        return changed, False
    changed["event partitions dropped"] += len(
        partitions.drop_older_than(partitions.EVENTS, now - timedelta(days=longest)))
    by_retention: dict[int, list[int]] = {}
    for queue in queues:
        by_retention.setdefault(queue.retention_days, []).append(queue.pk)
    more = False
    # Batches back to back for a while: one batch per step would leave the events to the pace
    # of a step, which visits every queue (seconds at 100 queues).
    until = time.perf_counter() + EVENT_SECONDS_PER_STEP
    for days, queue_ids in sorted(by_retention.items()):
        key = (days, tuple(sorted(queue_ids)))  # the queues come in no set order
        if EVENT_PASSES.get(key) == CAUGHT_UP:
            continue
        after, end = EVENT_PASSES.get(key) or lifecycle.event_id_range()
        while True:
            size, upper = EVENT_BATCH.size, min(after + EVENT_ID_SPAN, end)
            started = time.perf_counter()
            with _deleting():
                deleted = lifecycle.delete_events_before(
                    queue_ids, now - timedelta(days=days), size, after_id=after, up_to_id=upper)
            if deleted:
                EVENT_BATCH.took(time.perf_counter() - started)
            changed["item events pruned"] += len(deleted)
            # A full batch may have left more in its span.
            after = max(deleted) if len(deleted) == size else upper
            go_on = after < end
            EVENT_PASSES[key] = (after, end) if go_on else CAUGHT_UP
            if not go_on or time.perf_counter() >= until:
                break
        more |= go_on
    return changed, more


def _prune_attempts(before: datetime) -> tuple[Counter, bool]:
    """Attempts of the partitioned table older than `before` (every queue's retention): days of
    them dropped whole, and those of the default partition (which no day holds) a batch at a
    time. The attempts of queues kept shorter go with their items; on SQLite, every queue's
    do."""
    changed: Counter = Counter()
    changed["attempt partitions dropped"] += len(
        partitions.drop_older_than(partitions.ATTEMPTS, before))
    with _deleting():
        pruned = partitions.prune_default(partitions.ATTEMPTS, before, BATCH)
    changed["attempts pruned"] += pruned
    return changed, pruned == BATCH


@contextmanager
def _deleting():
    """A transaction of retention's deletes, which commits without waiting for its WAL to reach
    the disk: were it lost in a crash, the next run would simply delete the same rows again.
    Waiting made COMMIT retention's slowest statement at 10M items (670 ms behind checkpoints)."""
    postgres, nested = is_postgres(), connection.in_atomic_block
    with transaction.atomic():
        if postgres:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield
        if postgres and nested:  # SET LOCAL would outlive this savepoint
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO DEFAULT")


def _prune_old(model, field: str, before: datetime) -> tuple[int, bool]:
    table = model._meta.db_table
    with _deleting(), connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {field} < %s "
            f"LIMIT %s)", [to_db_datetime(before), BATCH])
        return cursor.rowcount, cursor.rowcount == BATCH


class _single_runner:
    """One sweeper at a time across machines: a session advisory lock on PostgreSQL (each
    step commits on its own); on SQLite every step's write transaction is serialised anyway."""

    def __enter__(self) -> bool:
        self.held = False
        if not is_postgres():
            return True
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
            self.held = cursor.fetchone()[0]
        return self.held

    def __exit__(self, *exc):
        if self.held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
