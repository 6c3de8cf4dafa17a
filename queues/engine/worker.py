"""The worker side: a django-q2 task runs one dispatched batch.

The task's own thread is the only one that writes. It claims the batch for its cluster, starts
items only as handler threads become free (an item is `running` only while its handler runs),
and records every outcome as soon as it arrives, with whatever else finished meanwhile in one
transaction: a handler that returned is durable within a fraction of a second, whatever happens
to the rest of its batch. Handler threads only run handlers.

While the batch has idle threads (its items ended, a slow one may still run) and no other
queue's batch waits for a worker, it takes more of its queue's items, claimed for its cluster:
first those of its queue's batches still waiting for a worker process, then ready ones through a
selector round of its own, right after recording the outcomes that freed the capacity, and
starts them in the same transaction: freed capacity is used at once, without a trip through
django-q2's broker, and a long item no longer idles the worker process it holds.

A handler that overruns its queue's handler timeout is recorded as timed out and its thread
abandoned (a late result is refused by the attempt fence). Items not started when the batch's
time runs out or its cluster shuts down are released, with no attempt spent.
"""

import json
import logging
import queue as queues
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass

from django.db import DatabaseError, close_old_connections, connection, transaction
from django.utils import timezone

from queues.conf import setting, task_timeout_seconds
from queues.engine import handlers, heartbeat, lifecycle, selector, strictjson
from queues.engine.handlers import PermanentError, RetryableError, Task
from queues.engine.logfields import item_fields
from queues.models import Item, Queue, Status

log = logging.getLogger(__name__)
# Handler threads of one batch at most; a batch is at most 1000 items (the batch size's cap).
MAX_THREADS = 1000
TRACEBACK_FRAMES = 20
# Characters of JSON kept of a handler's result: a summary, such as a webhook's status and its
# 2,000-character body excerpt (which control characters escaped as \uXXXX can make 12,000).
RESULT_LIMIT = 16_000
# Time kept at the end of the django-q2 task timeout to record the last outcomes: the batch
# returns before django-q2 would kill it.
RECORD_MARGIN_SECONDS = 15
# A batch asks for more items with every outcome it records; with idle threads and no outcome,
# at most every 20 ms, and after finding nothing, not again for a while: rounds take the
# queue's lock.
TOP_UP_SECONDS = 0.02
TOP_UP_RETRY_SECONDS = 0.5
# Whether other queues' batches wait for a worker process changes slowly next to a top-up's
# pace, and asking scans every dispatched row: asked at most this often.
WAITING_CHECK_SECONDS = 0.25
WAIT_SECONDS = 0.5  # longest wait for an outcome before deadlines and shutdown are checked again
DATABASE_RETRY_SECONDS = 30  # a database restart during a batch is waited out this long
DATABASE_PAUSE_SECONDS = 1.0  # between tries of a statement the database did not answer
SHUTDOWN = "shutdown"


def run_batch(queue_id: int, batch: list[list[int]]) -> dict[str, int]:
    """Run the items of one dispatched batch ([id, attempt, dispatch token] each); returns how
    many ended in each outcome, were released, or were stale (no longer this batch's)."""
    return BatchRun(_retrying(lambda: Queue.objects.get(pk=queue_id)), batch).run()


@dataclass
class _Running:
    task: Task
    started: float  # time.monotonic() values
    deadline: float  # past which the attempt has timed out


class BatchRun:
    def __init__(self, queue: Queue, batch: list[list[int]]):
        self.queue = queue
        self.began = time.monotonic()
        task_timeout = task_timeout_seconds()
        self.handler_timeout = queue.handler_timeout.total_seconds()
        # The django-q2 task is killed at its timeout: every attempt ends before it, and the
        # last item starts early enough to get its whole handler timeout.
        self.must_end = self.began + task_timeout - RECORD_MARGIN_SECONDS
        self.start_until = self.must_end - self.handler_timeout
        self.cluster = heartbeat.this_cluster()
        claimed = _retrying(lambda: lifecycle.claim(batch, self.cluster))
        self.tokens = {int(e[0]): e[2] for e in batch if len(e) > 2}
        self.pending = [int(entry[0]) for entry in batch if int(entry[0]) in claimed]
        self.attempts = claimed
        self.summary: Counter = Counter()
        if len(batch) > len(claimed):
            self.summary["stale"] = len(batch) - len(claimed)
        self.function = handlers.get(queue.handler) or _unknown_handler(queue.handler)
        self.threads_wanted = max(1, min(queue.concurrency, queue.batch_size, MAX_THREADS))
        self.top_up_after = self.idle_until = 0.0
        self.waiting_checked_at = -WAITING_CHECK_SECONDS
        self.others_wait = self.own_wait = False
        self.threads_alive = 0
        self.work: queues.SimpleQueue = queues.SimpleQueue()
        self.results: queues.SimpleQueue = queues.SimpleQueue()
        # By (item id, attempt): a rescued item can come back to this batch through a top-up
        # while its earlier attempt's handler still runs here.
        self.running: dict[tuple[int, int], _Running] = {}
        self.abandoned: set[tuple[int, int]] = set()

    def run(self) -> dict[str, int]:
        while self.pending or self.running:
            stopping = heartbeat.stopping_since()
            if self.pending and (stopping is not None or time.monotonic() > self.start_until):
                self._release(SHUTDOWN if stopping is not None
                              else "its batch ran out of time before starting it")
            # An idle thread waits for its next top-up, not for the next outcome.
            free = self.threads_wanted - len(self.running)
            outcomes = self._collect(self.top_up_after if self._may_top_up(free, stopping)
                                     else None)
            outcomes += self._overdue(stopping)
            # Asked again: a shutdown may have begun while the batch waited for outcomes.
            self._step(outcomes, heartbeat.stopping_since())
        for _ in range(self.threads_alive):
            self.work.put(None)  # idle handler threads end
        return dict(self.summary)

    def _may_top_up(self, free: int, stopping: float | None) -> bool:
        # Also when every item ended: a batch of quick items goes on with its queue, not back
        # through django-q2's broker, which would cost a worker's poll per batch.
        return bool(not self.pending and stopping is None and free > 0
                    and time.monotonic() < self.start_until)

    def _step(self, outcomes: list[lifecycle.Outcome], stopping: float | None):
        """Records what ended, then takes more of the queue for the threads that are free and
        starts them. The outcomes commit first, on their own: a returned handler is durable
        before anything can make its batch wait (the queue's lock, say), which keeps the window
        in which a killed cluster's finished work is run again to a few milliseconds."""
        if outcomes:
            ended = [outcome.item_id for outcome in outcomes]
            results = _retrying(lambda: lifecycle.finish(
                self.queue, outcomes, worker=heartbeat.worker_id(), guard=self._guard(ended)))
            # An item taken back while its earlier attempt still ran here keeps the claim of
            # its current attempt until that one's outcome is recorded under it.
            current = {pk for pk, _ in self.running}
            for pk in ended:
                if pk not in current:
                    self.tokens.pop(pk, None)
            for kind, result in results.items():
                self.summary[kind] += len(result.changed)
            _log_failures(self.queue, outcomes, results)
        free = self.threads_wanted - len(self.running)
        # An outcome freed capacity, so it is worth a round at once, unless the last one found
        # nothing to take; without one, the round waits for its time.
        now = time.monotonic()
        top_up = self._may_top_up(free, stopping) and (
            now >= self.top_up_after or bool(outcomes) and now >= self.idle_until)
        # Items left over are released at the top of the loop.
        startable = free if stopping is None and now <= self.start_until else 0
        if not (top_up or (self.pending and startable > 0)):
            return
        taken, started, rows = _retrying(lambda: self._take_and_start(startable, top_up))
        self.tokens.update({pk: token for pk, _, token in taken})
        self.attempts.update({pk: attempt for pk, attempt, _ in taken})
        if taken:
            self.summary["taken while running"] += len(taken)
        begun = set(started)
        self.pending = [pk for pk in self.pending + [pk for pk, _, _ in taken]
                        if pk not in begun]
        # Started items keep their token until their outcome is recorded under it, no longer
        # their attempt: a batch that goes on with its queue for minutes would keep every one.
        for pk in started:
            self.attempts.pop(pk, None)
        if len(rows) < len(started):
            self.summary["stale"] += len(started) - len(rows)
            moved = {row["id"] for row in rows}
            for pk in started:
                if pk not in moved:
                    self.tokens.pop(pk, None)
        self._hand_out(rows)

    def _take_and_start(self, free: int, top_up: bool):
        """One transaction: what is taken is also started, so it never waits dispatched.
        Returns what was taken ([id, attempt, dispatch token]), the ids started and the rows of
        those that moved."""
        with transaction.atomic(savepoint=False):
            taken, rows = self._top_up(free) if top_up else ([], [])
            # A round of our own started what it took; a waiting batch's items and this
            # batch's own start here.
            begun = [row["id"] for row in rows]
            begun_ids = set(begun)
            dispatched = [pk for pk, _, _ in taken if pk not in begun_ids]
            starting = (self.pending + dispatched)[:max(0, free - len(begun))]
            if starting:
                tokens = {pk: token for pk, _, token in taken}
                attempts = {pk: attempt for pk, attempt, _ in taken}
                rows += lifecycle.start_claimed(
                    starting, cluster=self.cluster,
                    expected_attempts={pk: attempts.get(pk, self.attempts.get(pk))
                                       for pk in starting},
                    tokens={tokens.get(pk, self.tokens.get(pk)) for pk in starting} - {None})
        return taken, begun + starting, rows

    def _top_up(self, free: int) -> tuple[list[list[int]], list[dict]]:
        """First the queue's items whose batch still waits for a worker process (one held by a
        long item, say), then ready items through a selector round of our own; returns them
        ([id, attempt, dispatch token]), claimed for this cluster, and the rows of those the
        round started already."""
        if time.monotonic() >= self.waiting_checked_at + WAITING_CHECK_SECONDS:
            self.others_wait, self.own_wait = _batches_waiting(self.queue)
            self.waiting_checked_at = time.monotonic()
        if self.others_wait:
            # Their batch needs a worker process: this one should end rather than grow.
            self.top_up_after = self.idle_until = time.monotonic() + TOP_UP_RETRY_SECONDS
            return [], []
        batch = (lifecycle.claim_waiting(self.queue.pk, self.cluster, free)
                 if self.own_wait else [])
        started: list[dict] = []
        contended = False
        if not batch:
            self.own_wait = False
            # The round re-reads what an operator may have changed (pause, concurrency).
            round_ = selector.run_round(self.queue, for_cluster=self.cluster, limit=free)
            batch, started = round_.batch, round_.started
            # Another round of the queue ran meanwhile, or took the capacity ours freed: ask
            # again soon. Only an empty or paused queue is worth the longer wait.
            contended = round_.skipped in (selector.BUSY, selector.FULL)
        self.top_up_after = time.monotonic() + (
            TOP_UP_SECONDS if batch or contended else TOP_UP_RETRY_SECONDS)
        self.idle_until = 0.0 if batch or contended else self.top_up_after
        return batch, started

    def _guard(self, ids: list[int]) -> tuple[str, list]:
        return lifecycle.claimed_by(self.cluster, {self.tokens[pk] for pk in ids
                                                   if pk in self.tokens})

    def _release(self, reason: str):
        ids, self.pending = self.pending, []
        result = _retrying(lambda: lifecycle.apply(
            "release", ids, actor="worker", reason=reason,
            expected_attempts={pk: self.attempts[pk] for pk in ids}, guard=self._guard(ids)))
        self.summary["released"] += len(result.changed)

    def _hand_out(self, rows: list[dict]):
        """Items just marked running go to the handler threads, started as needed."""
        now = time.monotonic()
        for row in rows:
            task = Task(item_id=row["id"], queue=self.queue.key, account=row["account"],
                        identifier=row["identifier"], payload=row["payload"],
                        attempt=row["attempts"], options=self.queue.handler_options,
                        task_path=row["task_path"])
            self.running[task.item_id, task.attempt] = _Running(
                task, now, min(now + self.handler_timeout, self.must_end))
            self.work.put(task)
        while self.threads_alive < len(self.running):
            threading.Thread(target=self._serve, daemon=True,
                             name=f"item-{self.queue.key}-{self.threads_alive}").start()
            self.threads_alive += 1

    def _serve(self):
        """A handler thread: runs tasks until told to end, or until its handler overran (the
        batch replaced it then)."""
        while (task := self.work.get()) is not None:
            self.results.put(_run_one(self.function, task))
            if (task.item_id, task.attempt) in self.abandoned:
                return

    def _collect(self, top_up_at: float | None) -> list[lifecycle.Outcome]:
        """Outcomes that arrived, waiting for the first until the nearest deadline (or the next
        top-up)."""
        if not self.running:
            return []
        now = time.monotonic()
        wait = min([WAIT_SECONDS, *(r.deadline - now for r in self.running.values())])
        if top_up_at is not None:
            wait = min(wait, top_up_at - now)
        outcomes = []
        try:
            outcomes.append(self.results.get(timeout=max(0.0, wait)))
            while True:
                outcomes.append(self.results.get_nowait())
        except queues.Empty:
            pass
        # A late outcome of an abandoned attempt was recorded as timed out already.
        return [o for o in outcomes if self.running.pop((o.item_id, o.attempt), None) is not None]

    def _overdue(self, stopping: float | None) -> list[lifecycle.Outcome]:
        """Attempts past their handler timeout, and, once a shutdown's grace is over, every
        attempt still running: their threads are abandoned and replaced."""
        now = time.monotonic()
        grace_over = (stopping is not None and time.time() - stopping
                      > setting("SHUTDOWN_GRACE_SECONDS"))
        outcomes = []
        for key, running in list(self.running.items()):
            if grace_over:
                error, delay = SHUTDOWN, 0
            elif now >= running.deadline:
                error = (f"HandlerTimeout: still running after {now - running.started:.0f} s "
                         f"(the queue's handler timeout is {self.handler_timeout:.0f} s)")
                delay = None
            else:
                continue
            del self.running[key]
            self.abandoned.add(key)
            self.threads_alive -= 1
            item_id, attempt = key
            outcomes.append(lifecycle.Outcome(item_id, attempt, error=error, delay=delay))
        return outcomes


def _batches_waiting(queue: Queue) -> tuple[bool, bool]:
    """Whether batches of other queues, and of this queue, are dispatched but not yet claimed
    by any worker (all worker processes busy), in one statement: a top-up asks every few
    milliseconds. Another queue's waiting batch needs the worker process this batch holds; this
    queue's can be taken over at once."""
    table = Item._meta.db_table
    waiting = f"SELECT 1 FROM {table} WHERE status = %s AND cluster = ''"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS ({waiting} AND queue_id <> %s), "
                       f"EXISTS ({waiting} AND queue_id = %s)",
                       [Status.DISPATCHED, queue.pk, Status.DISPATCHED, queue.pk])
        others, own = cursor.fetchone()
    return bool(others), bool(own)


def _retrying(write):
    """Run a database statement, waiting out a database restart: every write here is fenced, so
    a repeat after an unanswered commit changes nothing. Every statement of a batch goes through
    here: one that raised would end the batch and strand its running items."""
    deadline = time.monotonic() + DATABASE_RETRY_SECONDS
    while True:
        try:
            return write()
        except DatabaseError as exc:
            if time.monotonic() > deadline or connection.in_atomic_block:
                raise
            log.warning("worker statement failed, trying again: %s", exc)
            connection.close()
            time.sleep(DATABASE_PAUSE_SECONDS)


def _unknown_handler(name: str):
    def fail(task: Task):
        raise PermanentError(f"unknown handler {name!r}")
    return fail


def _log_failures(queue: Queue, outcomes: list[lifecycle.Outcome], results: dict):
    """One line per failed attempt, carrying queue, item and account as fields."""
    errors = {outcome.item_id: outcome.error for outcome in outcomes if outcome.error}
    for kind, verdict in (("retry", "retry scheduled"), ("fail", "dead-lettered")):
        for row in results[kind].changed if kind in results else ():
            log.warning("item %s attempt %s failed, %s: %s", row.id, row.attempts, verdict,
                        errors.get(row.id, ""),
                        extra=item_fields(queue.key, row.id, row.account, attempt=row.attempts))


def _run_one(function, task: Task) -> lifecycle.Outcome:
    started = timezone.now()
    try:
        result = function(task)
    except PermanentError as exc:
        return _failure(task, exc, started, permanent=True)
    except RetryableError as exc:
        return _failure(task, exc, started, delay=exc.delay)
    except Exception as exc:  # any other error is retryable by contract
        return _failure(task, exc, started)
    finally:
        # A handler that used the ORM opened a connection in this thread.
        if connection.connection is not None:
            close_old_connections()
            connection.close()
    return lifecycle.Outcome(task.item_id, task.attempt, result=_storable(result),
                             started_at=started, finished_at=timezone.now(),
                             worker=heartbeat.worker_id())


def _storable(result):
    """The handler's return value as the attempt keeps it. A value the JSON column cannot take
    is replaced by a note: it would otherwise fail the statement recording the whole batch."""
    if result is None:
        return None
    try:
        # The API's rules: what PostgreSQL's jsonb refuses (NUL) or no reader can encode (a
        # lone surrogate) would otherwise fail the statement recording the whole batch. A
        # result is only shown, never sent back or compared, so -0.0 shown as 0.0 is kept.
        strictjson.check_python(result, "result", negative_zero=True)
        text = json.dumps(result, ensure_ascii=False)
    except strictjson.JSONBodyError as exc:
        # The path names the key at fault, which may hold the very character refused.
        return {"unsaved": lifecycle.storable_text(
            f"not stored as JSON: {exc.message} (at {exc.field})")}
    if len(text) > RESULT_LIMIT:
        return {"unsaved": f"{len(text)} characters of JSON, over the limit of {RESULT_LIMIT}"}
    return result


def _failure(task: Task, exc: BaseException, started, *, permanent=False, delay=None):
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    trace = "".join(traceback.format_exception(exc, limit=TRACEBACK_FRAMES))
    return lifecycle.Outcome(task.item_id, task.attempt, error=message, traceback=trace,
                             permanent=permanent, delay=delay, started_at=started,
                             finished_at=timezone.now(), worker=heartbeat.worker_id())
