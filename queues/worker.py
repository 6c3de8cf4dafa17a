"""The worker side: a django-q2 task runs one dispatched batch.

Items start with a compare-and-set on status and attempt number, so a late or duplicate
delivery of the batch does nothing; handlers run concurrently in a thread pool up to the queue's
concurrency; outcomes are recorded set-based through the lifecycle.
"""

import json
import logging
import os
import socket
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connection

from queues import handlers, lifecycle
from queues.handlers import PermanentError, RetryableError, Task
from queues.jsonlog import item_fields
from queues.models import Item, Queue

log = logging.getLogger(__name__)
MAX_THREADS = 32  # a batch of 60 no-op items gains nothing from more threads
TRACEBACK_FRAMES = 20
# Characters of JSON kept of a handler's result: a summary, such as a webhook's status and its
# 2,000-character body excerpt (which control characters escaped as \uXXXX can make 12,000).
RESULT_LIMIT = 16_000


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


def run_batch(queue_id: int, batch: list[list[int]]) -> dict[str, int]:
    """Run the items of one dispatched batch; returns how many ended in each outcome."""
    queue = Queue.objects.get(pk=queue_id)
    expected = {item_id: attempt for item_id, attempt in batch}
    started = lifecycle.apply("start", list(expected), actor="worker", expected_attempts=expected)
    if not started.changed:
        return {"stale": len(expected)}
    tasks = [
        Task(item_id=row["id"], queue=queue.key, account=row["account"],
             identifier=row["identifier"], payload=row["payload"], attempt=row["attempts"],
             options=queue.handler_options)
        for row in Item.objects.filter(pk__in=started.changed_ids).values(
            "id", "account", "identifier", "payload", "attempts")
    ]
    function = handlers.get(queue.handler)
    if function is None:
        outcomes = [lifecycle.Outcome(t.item_id, t.attempt, permanent=True,
                                      error=f"unknown handler {queue.handler!r}") for t in tasks]
    else:
        threads = max(1, min(queue.concurrency, len(tasks), MAX_THREADS))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="item") as pool:
            outcomes = list(pool.map(lambda task: _run_one(function, task), tasks))
    results = lifecycle.finish(queue, outcomes, worker=worker_id())
    _log_failures(queue, outcomes, results)
    summary = {kind: len(result.changed) for kind, result in results.items()}
    if len(expected) > len(started.changed):
        summary["stale"] = len(expected) - len(started.changed)
    return summary


def _log_failures(queue: Queue, outcomes: list[lifecycle.Outcome], results: dict):
    """One line per failed attempt, carrying queue, item and account as fields."""
    errors = {outcome.item_id: outcome.error for outcome in outcomes if outcome.error}
    for kind, verdict in (("retry", "retry scheduled"), ("fail", "dead-lettered")):
        for row in results[kind].changed if kind in results else ():
            log.warning("item %s attempt %s failed, %s: %s", row.id, row.attempts, verdict,
                        errors.get(row.id, ""),
                        extra=item_fields(queue.key, row.id, row.account, attempt=row.attempts))


def _run_one(function, task: Task) -> lifecycle.Outcome:
    try:
        result = function(task)
    except PermanentError as exc:
        return _failure(task, exc, permanent=True)
    except RetryableError as exc:
        return _failure(task, exc, delay=exc.delay)
    except Exception as exc:  # any other error is retryable by contract
        return _failure(task, exc)
    finally:
        # A handler that used the ORM opened a connection in this pool thread.
        if connection.connection is not None:
            close_old_connections()
            connection.close()
    return lifecycle.Outcome(task.item_id, task.attempt, result=_storable(result))


def _storable(result):
    """The handler's return value as the attempt keeps it. A value the JSON column cannot take
    is replaced by a note: it would otherwise fail the statement recording the whole batch."""
    if result is None:
        return None
    try:
        text = json.dumps(result, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return {"unsaved": f"not JSON-serialisable: {exc}"}
    if "\\u0000" in text:
        return {"unsaved": "contains NUL characters, which PostgreSQL's jsonb cannot store"}
    if len(text) > RESULT_LIMIT:
        return {"unsaved": f"{len(text)} characters of JSON, over the limit of {RESULT_LIMIT}"}
    return result


def _failure(task: Task, exc: BaseException, *, permanent=False, delay=None):
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    trace = "".join(traceback.format_exception(exc, limit=TRACEBACK_FRAMES))
    return lifecycle.Outcome(task.item_id, task.attempt, error=message, traceback=trace,
                             permanent=permanent, delay=delay)
