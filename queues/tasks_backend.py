"""QueueAdmin as a backend of Django's tasks framework: a `@task` enqueued with `.enqueue()`
becomes an item for a tenant account, dispatched fairly across accounts like every item, run by
the worker clusters with the queue's retries, and read back with `get_result()`.

    TASKS = {
        "default": {
            "BACKEND": "queues.tasks_backend.QueueAdminBackend",
            "QUEUES": [],  # any queue name; or the names tasks may use
            "OPTIONS": {"CREATE_QUEUES": True, "DEFAULT_TENANT": "default", "TENANT": ""},
        }
    }

The tenant account of an enqueue is, first found: `with tenant("acme"):` around the call; the
callable OPTIONS["TENANT"] names (called with the task, returning an account or None); and
OPTIONS["DEFAULT_TENANT"] (None refuses work without a tenant). The item is written in the
caller's transaction: a rollback leaves no item. Arguments follow the JSON API's rules (JSON
values only, the same size limit, run_after within the same horizon); bad input raises
queues.engine.lifecycle.EnqueueError (a ValueError) naming the argument, and writes nothing.
"""

import contextvars
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import cached_property

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from queues.conf import setting
from queues.engine import lifecycle, strictjson
from queues.engine import tasks as framework
from queues.engine.handlers import TASK_HANDLER
from queues.models import TIME_BOUNDS_TEXT, Queue, key_validator, time_in_bounds

OPTIONS = {
    # A queue named by a task's queue_name is created on first use, with the defaults of any
    # new queue and the task handler; False refuses tasks for queues that do not exist.
    "CREATE_QUEUES": True,
    # The account of work enqueued without a tenant; None refuses such work.
    "DEFAULT_TENANT": "default",
    # Dotted path of a callable(task) -> account or None, asked when no `tenant()` is active.
    "TENANT": "",
}
ACTOR = "django.tasks"

_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("queueadmin_tenant",
                                                                     default=None)


@contextmanager
def tenant(account: str) -> Iterator[None]:
    """Tasks enqueued inside the block belong to `account` (threads and async code included:
    it is a context variable)."""
    token = _tenant.set(account)
    try:
        yield
    finally:
        _tenant.reset(token)


class QueueAdminBackend(framework.BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict):
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] has unknown options "
                                       f"{', '.join(unknown)}; known: {', '.join(OPTIONS)}")
        options = OPTIONS | self.options
        if not isinstance(options["CREATE_QUEUES"], bool):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['CREATE_QUEUES'] must be "
                                       "True or False")
        if options["DEFAULT_TENANT"] is not None and not isinstance(options["DEFAULT_TENANT"],
                                                                    str):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['DEFAULT_TENANT'] must be "
                                       "an account or None")
        if not isinstance(options["TENANT"], str):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['TENANT'] must be the "
                                       "dotted path of a callable")
        self.create_queues = options["CREATE_QUEUES"]
        self.default_tenant = options["DEFAULT_TENANT"]
        self.tenant_path = options["TENANT"]

    @cached_property
    def tenant_source(self):
        # Imported on first use: tasks modules create the backend while they are imported,
        # and the callable's module may import them in turn.
        return import_string(self.tenant_path) if self.tenant_path else None

    def validate_task(self, task):
        super().validate_task(task)
        try:
            key_validator(task.queue_name)
        except ValidationError:
            raise framework.InvalidTask(
                f"queue name {task.queue_name!r} is not a queue key: 1-64 lowercase letters, "
                "digits, '-' or '_', starting with a letter or digit") from None
        if task.run_after is not None and not time_in_bounds(task.run_after):
            raise framework.InvalidTask(f"run_after {TIME_BOUNDS_TEXT}")

    def enqueue(self, task, args, kwargs):
        self.validate_task(task)
        self._check_importable(task)
        account = self._account(task)
        try:
            strictjson.check_python({"args": args, "kwargs": kwargs})
        except strictjson.JSONBodyError as exc:
            raise lifecycle.EnqueueError(f"invalid task arguments: {exc.field} {exc.message}",
                                         {exc.field: exc.message}) from None
        result = framework.TaskResult(
            task=task, id=str(uuid.uuid4()), status=framework.TaskResultStatus.READY,
            enqueued_at=None, started_at=None, last_attempted_at=None, finished_at=None,
            args=args, kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[])
        payload = {"args": result.args, "kwargs": result.kwargs}
        _check_limits(payload, task.run_after)
        with transaction.atomic():
            # One savepoint: a refused item takes the queue it created with it.
            queue = self._queue(task.queue_name)
            (item,) = lifecycle.enqueue_many(queue.key, [{
                "account": account, "identifier": result.id, "payload": payload,
                "run_at": task.run_after, "priority": task.priority,
            }], actor=ACTOR, task_path=task.module_path)
        object.__setattr__(result, "enqueued_at", item.created_at)
        framework.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        item = framework.find(result_id)
        if item is None:
            raise framework.TaskResultDoesNotExist(result_id)
        return framework.task_result(item, self.alias)

    def _check_importable(self, task):
        """The worker finds a task by its module path: refuse one it could not find there (a
        script's __main__ is not the worker's)."""
        try:
            found = framework.load(task.module_path)
        except (ImportError, framework.InvalidTask):
            found = None
        if found is None or found.func is not task.func or task.func.__module__ == "__main__":
            raise framework.InvalidTask(
                f"the worker finds tasks by module path, and {task.module_path} is not this "
                "task: define it at the top level of a module, under its function's name")

    def _account(self, task) -> str:
        account = _tenant.get()
        if account is None and self.tenant_source is not None:
            account = self.tenant_source(task)
        if account is None:
            account = self.default_tenant
        if account is None:
            raise lifecycle.EnqueueError(
                f"task {task.name} has no tenant: enqueue it inside `with tenant(account):`",
                {"account": "is required"})
        return account

    def _queue(self, name: str) -> Queue:
        if not self.create_queues:
            queue = Queue.objects.filter(key=name).first()
            if queue is None:
                raise lifecycle.UnknownQueue(
                    f"there is no queue {name!r}: create it with the handler {TASK_HANDLER!r}, "
                    "or allow CREATE_QUEUES", {"queue": "unknown"})
            return queue
        queue, _ = Queue.objects.get_or_create(key=name, defaults={
            "name": name, "handler": TASK_HANDLER})
        return queue


def _check_limits(payload: dict, run_after):
    """The JSON API's limits on what one item carries (queues.conf)."""
    size = len(json.dumps(payload, ensure_ascii=False).encode())
    limit = setting("API_MAX_PAYLOAD_BYTES")
    if size > limit:
        raise lifecycle.EnqueueError(
            f"invalid task arguments: {size} bytes of JSON; at most {limit}",
            {"payload": f"is {size} bytes; at most {limit}"})
    horizon = setting("API_MAX_DELAY_DAYS")
    if run_after is not None and run_after - timezone.now() > timedelta(days=horizon):
        raise lifecycle.EnqueueError(f"run_after is more than {horizon} days ahead",
                                     {"run_after": f"is more than {horizon} days ahead"})
