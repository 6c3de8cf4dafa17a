"""queues.engine.tasks: the worker runs only tasks made by @task, with the queue's retries and
dead letters, and an item reads back as the TaskResult of its lifecycle."""

import sys
import traceback
from datetime import timedelta

import pytest
from django.utils import timezone

from queues.engine import lifecycle, selector, tasks
from queues.engine.handlers import TASK_HANDLER
from queues.engine.tasks import TaskResultStatus
from queues.models import Attempt, DeadLetter, Item, Queue, Status
from queues.tasks_backend import tenant
from tests import tasks as functions
from tests.factories import QueueFactory, run_one_round

pytestmark = pytest.mark.django_db


def result_of(task_result):
    return functions.add.get_backend().get_result(task_result.id)


def item_of(task_result):
    return Item.objects.get(identifier=task_result.id)


def make_due(task_result):
    Item.objects.filter(identifier=task_result.id).update(run_at=timezone.now())


# --- running tasks ---------------------------------------------------------------------------

def test_the_worker_runs_a_task_and_its_result_carries_the_return_value():
    with tenant("acme"):
        enqueued = functions.add.enqueue(2, 3)
    assert run_one_round("default") == {"complete": 1}
    result = result_of(enqueued)
    attempt = Attempt.objects.get()
    assert (result.status, result.return_value, result.errors) == (
        TaskResultStatus.SUCCESSFUL, 5, [])
    assert (result.attempts, result.worker_ids) == (1, [attempt.worker])
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (
        attempt.started_at, attempt.started_at, item_of(enqueued).finished_at)
    assert result.enqueued_at == enqueued.enqueued_at


def test_an_async_task_runs_with_its_keyword_arguments():
    enqueued = functions.greet.enqueue("ada", punctuation="?")
    run_one_round("default")
    assert result_of(enqueued).return_value == "hello ada?"


def test_a_failing_task_is_retried_with_the_queues_backoff_then_dead_lettered():
    QueueFactory(key="default", handler=TASK_HANDLER, max_retries=1, backoff_seconds=[600])
    enqueued = functions.fail.enqueue("input")

    assert run_one_round("default") == {"retry": 1}
    item = item_of(enqueued)
    assert item.status == Status.RETRY
    assert timedelta(seconds=500) < item.run_at - timezone.now() < timedelta(seconds=700)
    result = result_of(enqueued)
    assert (result.status, result.attempts, result.finished_at) == (
        TaskResultStatus.READY, 1, None)
    [error] = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.rstrip().endswith("ValueError: bad input")

    make_due(enqueued)
    assert run_one_round("default") == {"fail": 1}
    result = result_of(enqueued)
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 2, 2)
    assert result.finished_at == item_of(enqueued).finished_at is not None
    assert DeadLetter.objects.get().reason == "exhausted"
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_a_permanent_error_dead_letters_the_task_at_once():
    enqueued = functions.fail.enqueue("permanent")
    assert run_one_round("default") == {"fail": 1}
    [error] = result_of(enqueued).errors
    assert error.exception_class_path == "queues.engine.handlers.PermanentError"
    assert DeadLetter.objects.get().last_error == "PermanentError: the card was declined"


@pytest.mark.django_db(transaction=True)
def test_a_task_taking_context_learns_its_attempt():
    # The handler thread reads the item through its own connection: committed data only.
    enqueued = functions.attempt_number.enqueue()
    run_one_round("default")
    assert result_of(enqueued).return_value == {"attempt": 1, "id": enqueued.id}


def test_a_paused_queue_runs_no_task_until_resumed():
    enqueued = functions.add.enqueue(1, 1)
    Queue.objects.filter(key="default").update(paused=True)
    assert selector.run_round(Queue.objects.get(key="default")).item_ids == []
    Queue.objects.filter(key="default").update(paused=False)
    run_one_round("default")
    assert result_of(enqueued).status == TaskResultStatus.SUCCESSFUL


# --- only tasks made by @task run -------------------------------------------------------------

def redirect(enqueued, path):
    Item.objects.filter(identifier=enqueued.id).update(task_path=path)


@pytest.mark.parametrize("path", ["tests.tasks.plain_function", "tests.tasks.calls",
                                  "os.system"])
def test_a_stored_path_to_anything_but_a_task_fails_permanently_without_calling_it(path):
    enqueued = functions.add.enqueue("echo", "hello")
    redirect(enqueued, path)
    assert run_one_round("default") == {"fail": 1}
    assert "not a task made by @task" in item_of(enqueued).last_error
    assert functions.calls == []


def test_a_task_path_that_does_not_import_is_retried():
    # A worker still on an earlier deploy's code: the path imports once it is updated.
    enqueued = functions.add.enqueue(1, 2)
    redirect(enqueued, "tests.tasks.added_in_the_next_deploy")
    assert run_one_round("default") == {"retry": 1}
    assert item_of(enqueued).last_error.startswith(
        "RetryableError: task tests.tasks.added_in_the_next_deploy does not import here")


def test_an_item_without_a_task_on_a_task_queue_fails_permanently():
    # Enqueued through the API before an Admin switched the queue's handler.
    queue = QueueFactory(key="default")
    item = lifecycle.enqueue_many("default", [{"account": "acme", "identifier": "x"}])[0]
    Queue.objects.filter(pk=queue.pk).update(handler=TASK_HANDLER)
    assert run_one_round("default") == {"fail": 1}
    item.refresh_from_db()
    assert "the item names no task" in item.last_error


def test_a_payload_that_is_not_a_tasks_arguments_fails_permanently():
    enqueued = functions.add.enqueue(1, 2)
    Item.objects.filter(identifier=enqueued.id).update(payload={"args": "1, 2"})
    assert run_one_round("default") == {"fail": 1}
    assert "not a task's" in item_of(enqueued).last_error


# --- return values ---------------------------------------------------------------------------

def test_a_tuple_return_value_is_stored_as_an_array():
    enqueued = functions.give_back.enqueue("tuple")
    run_one_round("default")
    assert result_of(enqueued).return_value == [1, 2]


@pytest.mark.parametrize(("kind", "words"), [
    ("set", "JSON cannot hold"),
    ("big", "over the limit of 16,000"),
    ("nul", "NUL characters"),
])
def test_a_return_value_that_cannot_be_kept_fails_the_task_permanently(kind, words):
    enqueued = functions.give_back.enqueue(kind)
    assert run_one_round("default") == {"fail": 1}
    assert words in item_of(enqueued).last_error


def test_a_none_return_value_reads_back_as_none():
    enqueued = functions.give_back.enqueue("none")
    run_one_round("default")
    result = result_of(enqueued)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, None)


# --- every item status as a TaskResult ---------------------------------------------------------

def drive(item, steps):
    """Moves a task item through lifecycle transitions as the selector, worker, sweeper and
    operators would."""
    queue = item.queue
    for step in steps:
        attempt = Item.objects.get(pk=item.pk).attempts
        if step in ("dispatch", "start", "cancel", "requeue"):
            fence = {item.pk: attempt} if step == "start" else None
            lifecycle.apply(step, [item.pk], actor="test", expected_attempts=fence)
        elif step == "complete":
            lifecycle.finish(queue, [lifecycle.Outcome(item.pk, attempt, result=3)],
                             worker="host:1:item-0")
        elif step == "error":
            lifecycle.finish(queue, [lifecycle.Outcome(item.pk, attempt, error="ValueError: x",
                                                       traceback="ValueError: x\n")],
                             worker="host:1:item-0")
        elif step == "lost":
            lifecycle.rescue_lost(queue, {item.pk: attempt})


@pytest.mark.parametrize(("steps", "status", "expected", "attempts"), [
    ([], Status.QUEUED, TaskResultStatus.READY, 0),
    (["dispatch"], Status.DISPATCHED, TaskResultStatus.READY, 0),
    (["dispatch", "start"], Status.RUNNING, TaskResultStatus.RUNNING, 1),
    (["dispatch", "start", "error"], Status.RETRY, TaskResultStatus.READY, 1),
    (["dispatch", "start", "complete"], Status.COMPLETE, TaskResultStatus.SUCCESSFUL, 1),
    (["dispatch", "start", "error", "dispatch", "start", "error"] * 3, Status.FAILED,
     TaskResultStatus.FAILED, 6),
    (["cancel"], Status.CANCELLED, TaskResultStatus.FAILED, 0),
    (["dispatch", "start", "error", "cancel"], Status.CANCELLED, TaskResultStatus.FAILED, 1),
    (["dispatch", "lost"], Status.RETRY, TaskResultStatus.READY, 1),
])
def test_every_item_status_maps_to_a_task_result_status(steps, status, expected, attempts):
    enqueued = functions.add.enqueue(1, 2)
    item = item_of(enqueued)
    drive(item, steps)
    item.refresh_from_db()
    assert item.status == status
    result = result_of(enqueued)
    assert (result.status, result.attempts) == (expected, attempts)
    assert result.is_finished == (status in (Status.COMPLETE, Status.FAILED, Status.CANCELLED))
    assert len(result.errors) == steps.count("error") + steps.count("lost")


def test_a_running_task_names_its_cluster_among_the_workers():
    enqueued = functions.add.enqueue(1, 2)
    item = item_of(enqueued)
    drive(item, ["dispatch", "start", "error", "dispatch", "start"])
    Item.objects.filter(pk=item.pk).update(cluster="host:2")
    result = result_of(enqueued)
    assert result.worker_ids == ["host:1:item-0", "host:2"]
    assert result.last_attempted_at == item_of(enqueued).started_at > result.started_at


def test_an_attempt_lost_with_its_worker_is_an_interrupted_attempt():
    enqueued = functions.add.enqueue(1, 2)
    drive(item_of(enqueued), ["dispatch", "lost"])
    [error] = result_of(enqueued).errors
    assert error.exception_class is tasks.AttemptInterrupted
    assert error.traceback == "worker lost"


def test_an_operators_retry_starts_a_new_run_of_the_task():
    enqueued = functions.add.enqueue(1, 2)
    drive(item_of(enqueued), ["dispatch", "start", "error", "dispatch", "start", "complete",
                              "requeue"])
    result = result_of(enqueued)
    assert (result.status, result.attempts, result.errors, result.finished_at) == (
        TaskResultStatus.READY, 0, [], None)
    drive(item_of(enqueued), ["dispatch", "start", "complete"])
    result = result_of(enqueued)
    assert (result.status, result.attempts, result.return_value) == (
        TaskResultStatus.SUCCESSFUL, 1, 3)


# --- exception paths -------------------------------------------------------------------------

class DeclinedError(Exception):
    pass


def traceback_of(exc):
    try:
        raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def chained():
    try:
        {}["customer"]
    except KeyError as exc:
        raise RuntimeError("lookup failed\nValueError: a line of the message") from exc


@pytest.mark.parametrize(("make", "path"), [
    (lambda: ValueError("bad"), "builtins.ValueError"),
    (lambda: DeclinedError("card\ndeclined"), f"{__name__}.DeclinedError"),
    (lambda: KeyError(), "builtins.KeyError"),
])
def test_the_exception_path_is_read_from_the_traceback(make, path):
    attempt = Attempt(error="whatever", traceback=traceback_of(make()))
    assert tasks.exception_path(attempt) == path


def test_a_chained_exception_is_named_by_its_last_exception():
    try:
        chained()
    except RuntimeError:
        text = "".join(traceback.format_exception(*sys.exc_info()))
    assert "KeyError" in text
    assert tasks.exception_path(Attempt(error="", traceback=text)) == "builtins.RuntimeError"


def test_a_traceback_without_an_exception_line_falls_back_to_the_error():
    attempt = Attempt(error="TimeoutError: too slow", traceback="  | nested group frames\n")
    assert tasks.exception_path(attempt) == "builtins.TimeoutError"


def test_an_attempt_without_a_traceback_was_interrupted():
    attempt = Attempt(error="HandlerTimeout: still running after 181 s", traceback="")
    assert tasks.exception_path(attempt) == "queues.engine.tasks.AttemptInterrupted"
