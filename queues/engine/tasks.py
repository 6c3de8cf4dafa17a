"""Django's tasks framework on the engine: the one place that imports it (django.tasks from
Django 6.0 on, the django-tasks backport on Django 5.2, the same API), the handler that runs
task items, and the TaskResult an item reads as.

A task item is an Item whose task_path names a Task made by `@task` (only the tasks backend,
queues.tasks_backend, writes that column) and whose payload is {"args": [...], "kwargs": {...}}.
Its queue runs the reserved handler TASK_HANDLER, so the worker runs it like any other item:
fairness, pausing, retries with backoff, dead letters, timeouts and rescue all apply.
"""

import builtins
import json
import re

from django.utils.module_loading import import_string

from queues.engine.handlers import TASK_HANDLER, PermanentError, RetryableError, handler
from queues.engine.handlers import Task as Work
from queues.engine.worker import RESULT_LIMIT
from queues.models import (
    MAX_IDENTIFIER_LENGTH,
    Attempt,
    Item,
    ItemEvent,
    Queue,
    Status,
    printable,
)

try:  # Django 6.0 and later
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError:  # Django 5.2 with the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued

# Re-exported for the backend (queues.tasks_backend) and the tests: the framework is imported
# here only.
__all__ = ["BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskResult",
           "TaskResultDoesNotExist", "TaskResultStatus", "task", "task_enqueued"]

# Django has four statuses: an item waiting for its first or next attempt is READY (dispatched
# but not started included), and a cancelled one is FAILED ("unable to start").
STATUSES = {
    Status.QUEUED: TaskResultStatus.READY,
    Status.DISPATCHED: TaskResultStatus.READY,
    Status.RETRY: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.COMPLETE: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}
TRACEBACK_START = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(:|$)")


class AttemptInterrupted(Exception):
    """What a TaskResult's error names for an attempt that ended without the task raising: it
    overran the queue's handler timeout, or its worker was lost or shut down. The error's text
    says which."""


INTERRUPTED = f"{__name__}.{AttemptInterrupted.__qualname__}"


def load(path: str) -> Task:
    """The Task at a module path. Raises ImportError when nothing imports there, InvalidTask
    when what does is not a Task made by @task: a stored path never runs an arbitrary callable."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is a {type(found).__name__}, not a task made by @task")
    return found


@handler(TASK_HANDLER)
def run(work: Work):
    """Runs a task item: the task's function with the stored arguments (an async one in an
    event loop of its own), returning its JSON return value for the attempt to keep."""
    if not work.task_path:
        raise PermanentError("the item names no task: this queue runs django.tasks tasks, "
                             "which are enqueued with Task.enqueue()")
    try:
        task = load(work.task_path)
    except ImportError as exc:
        # The path imported where the task was enqueued: a worker still on the code of an
        # earlier deploy finds it once it is updated, within the item's retries.
        raise RetryableError(f"task {work.task_path} does not import here: {exc}") from None
    except InvalidTask as exc:
        raise PermanentError(str(exc)) from None
    payload = work.payload
    if not (isinstance(payload, dict) and isinstance(payload.get("args"), list)
            and isinstance(payload.get("kwargs"), dict)):
        raise PermanentError('the payload is not a task\'s {"args": [...], "kwargs": {...}}')
    if task.takes_context:
        item = Item.objects.select_related("queue").get(pk=work.item_id)
        context = TaskContext(task_result=task_result(item, task.backend, task))
        value = task.call(context, *payload["args"], **payload["kwargs"])
    else:
        value = task.call(*payload["args"], **payload["kwargs"])
    return storable(value)


def storable(value):
    """The return value as JSON stores it (tuples become lists), or a PermanentError saying
    why it cannot be kept: get_result() must never read back something the task did not
    return."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode()  # lone surrogates, which no database stores
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"the task returned a value JSON cannot hold: {exc}") from None
    if "\\u0000" in text:
        raise PermanentError("the task returned text with NUL characters, which PostgreSQL's "
                             "jsonb cannot store")
    if len(text) > RESULT_LIMIT:
        raise PermanentError(f"the task returned {len(text):,} characters of JSON, over the "
                             f"limit of {RESULT_LIMIT:,}; store large results elsewhere and "
                             "return where")
    return json.loads(text)


def find(result_id: str) -> Item | None:
    """The task item whose identifier is `result_id`. Asked queue by queue, so that the
    (queue, identifier) index answers it (there are at most a few hundred queues); unordered,
    as the identifiers the backend gives are UUIDs, and an ORDER BY could tempt the planner
    into walking the whole table by id."""
    if (not isinstance(result_id, str) or len(result_id) > MAX_IDENTIFIER_LENGTH
            or not printable(result_id)):
        return None
    queues = list(Queue.objects.values_list("pk", flat=True))
    found = list(Item.objects.select_related("queue").filter(
        queue_id__in=queues, identifier=result_id).exclude(task_path="")[:1])
    return found[0] if found else None


def task_result(item: Item, backend: str, task: Task | None = None) -> TaskResult:
    """The item as Django's TaskResult: its status (STATUSES), the attempts of its current run
    (an operator's retry starts a new one, as it resets the item's attempts) with their workers
    and errors, and the return value of a completed one."""
    if task is None:
        try:
            task = load(item.task_path)
        except ImportError as exc:
            raise InvalidTask(f"task {item.task_path} does not import here: {exc}") from None
    attempts = _current_run(item)
    starts = [a.started_at for a in attempts if a.started_at]
    workers = [a.worker for a in attempts]
    if item.status == Status.RUNNING:
        starts.append(item.started_at)
        workers.append(item.cluster)
    result = TaskResult(
        task=task.using(priority=item.priority, queue_name=item.queue.key, backend=backend),
        id=item.identifier,
        status=STATUSES[item.status],
        enqueued_at=item.created_at,
        started_at=starts[0] if starts else None,
        last_attempted_at=starts[-1] if starts else None,
        finished_at=item.finished_at,
        args=item.payload.get("args", []),
        kwargs=item.payload.get("kwargs", {}),
        backend=backend,
        errors=[TaskError(exception_class_path=exception_path(a), traceback=a.traceback or a.error)
                for a in attempts if a.outcome != Attempt.Outcome.COMPLETE],
        worker_ids=workers,
    )
    if item.status == Status.COMPLETE:
        completed = [a for a in attempts if a.outcome == Attempt.Outcome.COMPLETE]
        object.__setattr__(result, "_return_value", completed[-1].result if completed else None)
    return result


def _current_run(item: Item) -> list[Attempt]:
    attempts = item.attempt_set.order_by("id")
    requeued = (ItemEvent.objects.filter(item_id=item.pk, transition="requeued")
                .order_by("-id").values_list("at", flat=True).first())
    if requeued is not None:
        attempts = attempts.filter(finished_at__gt=requeued)
    return list(attempts)


def exception_path(attempt: Attempt) -> str:
    """The dotted path of the exception that ended an attempt, read from the last exception
    line of its traceback ("billing.errors.Declined: ..." or, for a builtin, "ValueError: ...")
    or else from its error. An attempt without a traceback ended without the task raising."""
    if not attempt.traceback:
        return INTERRUPTED
    lines = attempt.traceback.splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith(TRACEBACK_START)]
    after_frames = lines[starts[-1] + 1:] if starts else lines
    # The last traceback's frames are indented; the first line after them names the exception.
    header = next((line for line in after_frames if line and not line[0].isspace()), "")
    for line in (header, attempt.error):
        if match := _EXCEPTION_LINE.match(line):
            name = match.group(1)
            return f"builtins.{name}" if "." not in name and hasattr(builtins, name) else name
    return INTERRUPTED
