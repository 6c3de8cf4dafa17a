"""The fair selector: one round per queue picks ready items across accounts and dispatches them.

A round reads only the demand it needs (the next accounts after the cursor, each counted up to
a fair share plus one), plans with fairness.plan_batch, claims the items, marks them dispatched
through the lifecycle and enqueues one worker task for the whole batch, all in one transaction:
the task row is written with the items' new status or not at all.
"""

import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone
from django_q.tasks import async_task

from queues.engine import counters, heartbeat, lease, lifecycle, stream, sweeper
from queues.engine.db import insert_rows, is_postgres, placeholders, to_db_datetime
from queues.engine.fairness import plan_batch
from queues.models import (
    IN_FLIGHT_STATUSES,
    READY_STATUSES,
    AccountPolicy,
    GlobalPause,
    Item,
    Queue,
    SelectorRound,
    SelectorState,
)

log = logging.getLogger(__name__)
LOCK_NAMESPACE = 7_466_001  # first key of the advisory lock; the queue id is the second
READY_SQL = "status IN ('queued', 'retry')"  # the ready-set partial index's predicate
# item_ready_idx's order within an account: a scan in it needs that index and no sort.
READY_ORDER_SQL = "priority DESC, run_at, id"
IDLE_SECONDS = 1.0  # longest wait between passes when nothing wakes the loop
SQLITE_POLL_SECONDS = 0.25
COALESCE_SECONDS = 0.05
# Freed capacity under half a batch is left to the running batches' top-ups this long; past it,
# their threads are all busy, and a small batch of its own is better than idle capacity.
FILL_GRACE_SECONDS = 0.1
RENEW_SECONDS = 0.5  # a waiting successor takes over within about this long
RESCUE_SECONDS = 5.0
FOLD_SECONDS = 2.0
# The loop ends this long before the django-q2 task timeout would kill it.
LOOP_MARGIN_SECONDS = 30
DATABASE_RETRY_SECONDS = 1.0  # between passes while the database does not answer
# Why a round did not select (Round.skipped), where a caller acts on it.
BUSY = "busy"
FULL = "full"
HELD_BACK = "waiting for a fuller batch"
ROUND_COLUMNS = ("queue_id", "started_at", "duration_ms", "taken", "accounts", "allocation",
                 "cursor")


@dataclass
class Round:
    queue: str
    taken: dict[str, int] = field(default_factory=dict)
    skipped: str = ""  # why the round did not select: "busy", "paused", "full", ...
    capacity: int = 0
    duration_ms: float = 0.0
    item_ids: list[int] = field(default_factory=list)
    batch: list[list[int]] = field(default_factory=list)  # [id, attempt, dispatch token]
    # A running batch's round (for_cluster): its items, started, as their handlers need them.
    started: list[dict] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.taken.values())

    @property
    def filled(self) -> bool:
        """The round took a whole batch: more work is likely waiting, so go on at once."""
        return self.capacity > 0 and self.total == self.capacity


def run_round(queue: Queue, *, for_cluster: str = "", limit: int | None = None,
              hold_small: bool = True) -> Round:
    """One round. The selector loop's rounds hand their batch to a new worker task; a running
    batch with idle threads asks for at most `limit` items `for_cluster` (its own) and gets them
    claimed for it and started, in its own transaction, with what their handlers need
    (`Round.started`)."""
    result = Round(queue=queue.key)
    # Inside a worker's transaction (a top-up starts what it takes in it), part of that one.
    with transaction.atomic(savepoint=False):
        if not _try_lock(queue):
            result.skipped = BUSY
            return result
        # Timed from holding the lock to just before commit, so recorded rounds of one queue
        # never overlap.
        started, now = time.perf_counter(), timezone.now()
        state = _refresh_settings(queue)
        previous_cursor = state.cursor
        if queue.paused or state.globally_paused:
            result.skipped = "paused globally" if state.globally_paused else "paused"
            return result
        result.capacity = _capacity(queue, now, state.in_flight)
        if limit is not None:
            result.capacity = min(result.capacity, limit)
        if result.capacity <= 0:
            result.skipped = FULL
            return result
        if (hold_small and not for_cluster and state.in_flight and result.capacity < _fill(queue)
                and _ready_beyond(queue, now, result.capacity)):
            # Under a backlog, a little freed capacity is left to the running batches, which
            # take it at once (worker top-ups); a new batch waits until half a batch is free,
            # so that it is worth a worker task. Decided before planning: the queue's lock is
            # held meanwhile, and a top-up that meets it goes without.
            result.skipped = HELD_BACK
            return result
        # Most queues have no account policies: then there is nothing to read.
        policies = list(AccountPolicy.objects.filter(queue=queue)) if state.has_policies else []
        excluded, caps, weights = _apply_policies(queue, policies)
        accounts = _next_accounts(queue, now, previous_cursor, result.capacity, excluded)
        demand, plan, cursor = _plan(queue, now, accounts, result.capacity, previous_cursor,
                                     caps, weights)
        if plan and sum(plan.values()) == sum(demand.values()):
            # All the demand we read was met, but it may be only the next accounts of a longer
            # ring: carry on after the last one served (accounts are in ring order).
            cursor = [account for account in accounts if plan.get(account)][-1]
        if plan:
            if for_cluster:
                result.started = lifecycle.dispatch_started(*_claim_sql(queue, now, plan),
                                                            cluster=for_cluster)
                dispatched = [(row["id"], row["attempts"], row["token"], row["account"])
                              for row in result.started]
            else:
                dispatched = [(row.id, row.attempts, row.token, row.account) for row in
                              lifecycle.apply_selected("dispatch", *_claim_sql(queue, now, plan),
                                                       actor="selector")]
            result.item_ids = [pk for pk, _, _, _ in dispatched]
            result.batch = [[pk, attempt, token] for pk, attempt, token, _ in dispatched]
            for *_, account in dispatched:
                result.taken[account] = result.taken.get(account, 0) + 1
            if dispatched and not for_cluster:
                # A batch that returns is not saved as a django-q2 success (a failed one
                # is): its items' outcomes are recorded already, and saving one locks every
                # saved success to prune the oldest (save_limit), for each batch that ends.
                async_task("queues.engine.worker.run_batch", queue.pk, result.batch,
                           task_name=f"{queue.key} batch of {len(dispatched)}", save=False)
            result.duration_ms = (time.perf_counter() - started) * 1000
            # Empty rounds change nothing and are not recorded: an idle queue is polled every
            # second.
            _record_round(queue, now, cursor or "", result)
    if not result.taken:
        result.skipped = "nothing ready"
    return result


def tick(seconds: float | None = None, idle_sleep: float = IDLE_SECONDS) -> dict[str, int]:
    """The scheduled task (every minute, and once when a cluster starts): the selector loop.

    It takes the lease from the running loop, which hands over at once, so the loop passes from
    tick to tick without a gap, and then passes over every queue that is not paused: the next
    pass at once while some round filled its batch, otherwise when an item is enqueued or ends
    (LISTEN/NOTIFY on PostgreSQL, a short poll on SQLite) or after `idle_sleep`. Every few
    seconds it rescues the items of clusters that stopped beating and folds the counters'
    deltas (rounds read the queue's in-flight count from them). It ends when a newer tick
    takes over, its cluster shuts down, or after `seconds` (by default as long as the task
    timeout allows). Returns the items taken per queue."""
    me = f"{heartbeat.worker_id()}:{secrets.token_hex(4)}"
    if seconds is None:
        seconds = settings.Q_CLUSTER["timeout"] - LOOP_MARGIN_SECONDS
    if not lease.acquire(me, wait=lease.SUCCESSOR_WAIT_SECONDS):
        return {}
    taken: Counter = Counter()
    deadline = time.monotonic() + seconds
    renew_at = rescue_at = fold_at = 0.0
    held_since: dict[int, float] = {}  # queue id: when a small batch was first held back
    try:
        with _Wakeups() as wakeups:
            while time.monotonic() < deadline and heartbeat.stopping_since() is None:
                try:
                    if time.monotonic() >= renew_at:
                        if lease.renew(me) != lease.HELD:
                            break
                        renew_at = time.monotonic() + RENEW_SECONDS
                    if time.monotonic() >= rescue_at:
                        _rescue_silent_clusters()
                        rescue_at = time.monotonic() + RESCUE_SECONDS
                    if time.monotonic() >= fold_at:
                        # Every round reads its queue's in-flight count as base plus the
                        # deltas not yet folded: left to the 5-minute sweeper, a busy queue's
                        # deltas grew to tens of thousands of rows per read.
                        counters.rollup()
                        fold_at = time.monotonic() + FOLD_SECONDS
                    if not _pass(held_since, taken):
                        wait = min(idle_sleep, max(0.0, deadline - time.monotonic()),
                                   max(0.0, renew_at - time.monotonic()))
                        if held_since:
                            wait = min(wait, max(0.0, min(held_since.values())
                                                 + FILL_GRACE_SECONDS - time.monotonic()))
                        wakeups.wait(wait)
                except DatabaseError as exc:
                    if connection.in_atomic_block:
                        raise  # the caller's transaction is lost: it must see why
                    # A database restart is waited out: a tick that ended here would leave the
                    # queues without a selector until the next schedule, up to 90 s later.
                    log.warning("selector pass failed, trying again: %s", exc)
                    connection.close()
                    time.sleep(DATABASE_RETRY_SECONDS)
    finally:
        lease.release(me)
    if any(taken.values()):
        log.info("selector dispatched %s", dict(taken))
    return dict(taken)


def _rescue_silent_clusters():
    """Also the running items of worker processes that died under a live cluster."""
    started = timezone.now()
    if rescued := sweeper.rescue_silent_clusters(started) + sweeper.rescue_overdue(started):
        # Shown with the sweeper's runs: what the loop changed, when.
        sweeper.record_run(started, dict(rescued))


def _pass(held_since: dict[int, float], taken: Counter) -> bool:
    """A round of every queue that is not paused; True when one filled its batch (go on at
    once)."""
    go_on = False
    for queue in Queue.objects.filter(paused=False):
        held = held_since.get(queue.pk)
        result = run_round(queue, hold_small=held is None
                           or time.monotonic() - held < FILL_GRACE_SECONDS)
        if result.skipped == HELD_BACK:
            held_since.setdefault(queue.pk, time.monotonic())
        else:
            held_since.pop(queue.pk, None)
        taken[queue.key] += result.total
        go_on |= result.filled
    return go_on


class _Wakeups:
    """Waits until an item may have become ready or capacity freed: every transition's
    transaction notifies the events channel on PostgreSQL (queues.engine.stream); SQLite polls."""

    def __enter__(self):
        self.listening = None
        return self

    def wait(self, timeout: float):
        if not is_postgres():
            time.sleep(min(timeout, SQLITE_POLL_SECONDS))
            return
        raw = connection.connection
        if raw is None or raw is not self.listening:  # a new connection listens anew
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {stream.CHANNEL}")
            raw = self.listening = connection.connection
        if next(raw.notifies(timeout=timeout, stop_after=1), None) is not None:
            # Outcomes and enqueues arrive in bursts: gather a little before the next pass.
            time.sleep(COALESCE_SECONDS)
            for _ in raw.notifies(timeout=0):
                pass

    def __exit__(self, *exc):
        if self.listening is not None and self.listening is connection.connection:
            # The connection outlives this task in the worker: stop collecting notifications.
            try:
                with connection.cursor() as cursor:
                    cursor.execute("UNLISTEN *")
            except DatabaseError:
                # The database went away as the loop ended: closing the connection drops its
                # subscriptions too, and the items taken are already committed.
                connection.close()


@dataclass(frozen=True)
class RoundState:
    cursor: str
    globally_paused: bool
    in_flight: int
    has_policies: bool


def _refresh_settings(queue: Queue) -> RoundState:
    """Re-read, in one statement, what may have changed since the queue was loaded (pause,
    sizes), the cursor, the global pause, the items in flight and whether any account has a
    policy."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT q.paused, q.batch_size, q.concurrency, q.rate_limit_per_minute, s.cursor, "
            f"COALESCE(g.paused, %s), {counters.in_flight_sql()}, "
            f"EXISTS (SELECT 1 FROM {AccountPolicy._meta.db_table} p WHERE p.queue_id = q.id) "
            f"FROM {Queue._meta.db_table} q LEFT JOIN {SelectorState._meta.db_table} s "
            f"ON s.queue_id = q.id LEFT JOIN {GlobalPause._meta.db_table} g ON g.id = 1 "
            f"WHERE q.id = %s", [False, queue.pk, queue.pk, queue.pk])
        (queue.paused, queue.batch_size, queue.concurrency, queue.rate_limit_per_minute,
         cursor_value, globally_paused, in_flight, has_policies) = cursor.fetchone()
    return RoundState(cursor_value or "", bool(globally_paused), int(in_flight),
                      bool(has_policies))


def _record_round(queue: Queue, now: datetime, cursor: str, result: Round):
    """Saves the cursor and the round record (for the fairness view and the rate limit), in
    one statement on PostgreSQL: the queue's lock is held meanwhile."""
    state_table, round_table = SelectorState._meta.db_table, SelectorRound._meta.db_table
    save_cursor = (f"INSERT INTO {state_table} (queue_id, cursor, last_round_at) "
                   f"VALUES (%s, %s, %s) ON CONFLICT (queue_id) DO UPDATE SET "
                   f"cursor = excluded.cursor, last_round_at = excluded.last_round_at")
    at = to_db_datetime(now)
    allocation = SelectorRound._meta.get_field("allocation").get_db_prep_save(
        result.taken, connection)
    round_row = [queue.pk, at, result.duration_ms, result.total, len(result.taken), allocation,
                 cursor]
    with connection.cursor() as db:
        if is_postgres():
            db.execute(f"WITH saved AS ({save_cursor}) INSERT INTO {round_table} "
                       f"({', '.join(ROUND_COLUMNS)}) VALUES "
                       f"({placeholders(len(ROUND_COLUMNS))})",
                       [queue.pk, cursor, at, *round_row])
            return
        db.execute(save_cursor, [queue.pk, cursor, at])
    insert_rows(SelectorRound, ROUND_COLUMNS, [tuple(round_row)])


def _try_lock(queue: Queue) -> bool:
    """One round per queue at a time across processes and machines, and the settings of the
    round's transaction. On SQLite the IMMEDIATE transaction already holds the database's single
    write lock."""
    if not is_postgres():
        return True
    with connection.cursor() as cursor:
        # A round lost in a crash loses its items' dispatch and their worker task together (same
        # transaction): they are simply ready again. So the round need not wait for its commit
        # to reach the disk. (A worker's outcomes commit before its top-up's round.)
        #
        # The account scan and the claim read the ready set in item_ready_idx's order. On a
        # queue the statistics do not know yet (a new queue's first backlog: at 10M rows,
        # autoanalyze waits for 200,000 changes) the planner rates the smaller
        # item_ready_due_idx plus a sort as just as cheap, and that plan reads every ready item
        # of the queue once per account (125 ms a round at 10,000 items instead of 3). With
        # sorts ruled out, only item_ready_idx fits; nothing else in a round needs one.
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s), "
            "set_config('synchronous_commit', 'off', true), "
            "set_config('enable_sort', 'off', true)", [LOCK_NAMESPACE, queue.pk])
        return cursor.fetchone()[0]


def _capacity(queue: Queue, now: datetime, in_flight: int) -> int:
    capacity = min(queue.batch_size, queue.concurrency - in_flight)
    if queue.rate_limit_per_minute is not None:
        recent = SelectorRound.objects.filter(
            queue=queue, started_at__gt=now - timedelta(minutes=1)
        ).aggregate(n=Sum("taken"))["n"] or 0
        capacity = min(capacity, queue.rate_limit_per_minute - recent)
    return capacity


def _fill(queue: Queue) -> int:
    return max(1, min(queue.batch_size, queue.concurrency) // 2)


def _ready_beyond(queue: Queue, now: datetime, count: int) -> bool:
    """More than `count` items are ready: a backlog (count is below half a batch)."""
    return Item.objects.filter(queue=queue, status__in=READY_STATUSES, run_at__lte=now).order_by(
        ).values("id")[count:count + 1].exists()


def _apply_policies(queue: Queue, policies: list[AccountPolicy]):
    """Paused accounts and accounts at their in-flight cap have no demand this round."""
    excluded = {p.account for p in policies if p.paused}
    capped = [p for p in policies if p.max_in_flight is not None and not p.paused]
    caps = {}
    if capped:
        in_flight = dict(
            Item.objects.filter(queue=queue, account__in=[p.account for p in capped],
                                status__in=IN_FLIGHT_STATUSES)
            .values("account").annotate(n=Count("id")).values_list("account", "n")
        )
        for policy in capped:
            room = policy.max_in_flight - in_flight.get(policy.account, 0)
            if room <= 0:
                excluded.add(policy.account)
            else:
                caps[policy.account] = room
    weights = {p.account: p.weight for p in policies if p.weight != 1}
    return excluded, caps, weights


def _next_accounts(queue: Queue, now: datetime, cursor: str, limit: int,
                   excluded: set[str]) -> list[str]:
    """Accounts with due ready items in ring order after the cursor, at most `limit` of them:
    a loose index scan that jumps from account to account, never reading all ready rows."""
    found = _accounts_after(queue, now, cursor, limit, excluded)
    if len(found) < limit and cursor:
        found += [a for a in _accounts_after(queue, now, "", limit - len(found), excluded)
                  if a <= cursor]
    return found


def _accounts_after(queue: Queue, now: datetime, after: str, limit: int,
                    excluded: set[str]) -> list[str]:
    table = Item._meta.db_table
    not_excluded = (f"AND account NOT IN ({placeholders(len(excluded))})" if excluded else "")
    step = (f"SELECT account FROM {table} WHERE queue_id = %s AND {READY_SQL} AND run_at <= %s "
            f"AND account > {{prev}} {not_excluded} ORDER BY account LIMIT 1")
    step_params = [queue.pk, to_db_datetime(now)]
    sql = (
        f"WITH RECURSIVE accounts(account, n) AS ("
        f" SELECT ({step.format(prev='%s')}), 1"
        f" UNION ALL"
        f" SELECT ({step.format(prev='accounts.account')}), n + 1 FROM accounts"
        f" WHERE accounts.account IS NOT NULL AND n < %s"
        f") SELECT account FROM accounts WHERE account IS NOT NULL"
    )
    params = [*step_params, after, *excluded, *step_params, *excluded, limit]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _plan(queue: Queue, now: datetime, accounts: list[str], capacity: int, cursor: str,
          caps: dict[str, int], weights: dict[str, int]):
    """Counts each account's due items only as far as the plan can use them.

    With more accounts than slots at equal weight each takes one item, which the loose scan
    already proved is there. Otherwise a first count stops at a fair share plus one; only if an
    account used all of that (the others lacking work) is it counted again up to the batch.
    """
    if len(accounts) >= capacity and not weights:
        demand = dict.fromkeys(accounts, 1)
        return demand, *plan_batch(demand, capacity, cursor or None)
    total_weight = sum(weights.get(a, 1) for a in accounts) or 1
    limits = {a: min(capacity, caps.get(a, capacity),
                     -(-capacity * weights.get(a, 1) // total_weight) + 1) for a in accounts}
    demand = _demand(queue, now, limits)
    plan, next_cursor = plan_batch(demand, capacity, cursor or None, weights)
    short = [a for a, n in demand.items() if n == limits[a] and plan.get(a) == n]
    if short:
        limits = {a: min(capacity, caps.get(a, capacity)) for a in accounts}
        demand = _demand(queue, now, limits)
        plan, next_cursor = plan_batch(demand, capacity, cursor or None, weights)
    return demand, plan, next_cursor


def _demand(queue: Queue, now: datetime, limits: dict[str, int]) -> dict[str, int]:
    """Due ready items per account, each counted only up to its limit."""
    if not limits:
        return {}
    table = Item._meta.db_table
    due = f"queue_id = %s AND {READY_SQL} AND run_at <= %s"
    if is_postgres():
        # One statement whatever the number of accounts, which travel as two arrays rather
        # than two parameters each (the same statement text every round, fewer to quote).
        # In the claim's order, which only item_ready_idx gives without a sort (see _try_lock):
        # by run_at, the planner may read the queue's whole ready set once per account.
        sql = (f"SELECT p.account, (SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE {due} "
               f"AND account = p.account ORDER BY {READY_ORDER_SQL} LIMIT p.n) AS d) "
               f"FROM unnest(%s::text[], %s::int[]) AS p(account, n)")
        params = [queue.pk, to_db_datetime(now), list(limits), list(limits.values())]
    else:
        parts, params = [], []
        for account, limit in limits.items():
            parts.append(f"SELECT %s, (SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE {due} "
                         f"AND account = %s LIMIT %s) AS d)")
            params += [account, queue.pk, to_db_datetime(now), account, limit]
        sql = " UNION ALL ".join(parts)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {account: count for account, count in cursor.fetchall() if count}


def _claim_sql(queue: Queue, now: datetime, plan: dict[str, int]) -> tuple[str, list]:
    """The ids of the planned number of items per account: highest priority, then oldest
    ready, first. PostgreSQL skips rows another transaction holds (an admin cancelling them,
    say)."""
    table = Item._meta.db_table
    order = f"ORDER BY {READY_ORDER_SQL}"
    due = f"queue_id = %s AND {READY_SQL} AND run_at <= %s"
    if is_postgres():
        sql = (f"SELECT c.id FROM unnest(%s::text[], %s::int[]) AS p(account, n) CROSS JOIN "
               f"LATERAL (SELECT id FROM {table} WHERE {due} AND account = p.account {order} "
               f"LIMIT p.n FOR UPDATE SKIP LOCKED) AS c")
        return sql, [list(plan), list(plan.values()), queue.pk, to_db_datetime(now)]
    parts, params = [], []
    for account, n in plan.items():
        parts.append(f"SELECT id FROM (SELECT id FROM {table} WHERE {due} AND account = %s "
                     f"{order} LIMIT %s)")
        params += [queue.pk, to_db_datetime(now), account, n]
    return " UNION ALL ".join(parts), params
