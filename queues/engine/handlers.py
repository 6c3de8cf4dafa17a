"""Handler registry: `@handler("name")` in any installed app's handlers.py.

A handler receives a Task and returns normally (complete), raises RetryableError (try again
later, optionally after `delay` seconds) or PermanentError (dead letter at once). Any other
exception counts as retryable.

The name TASK_HANDLER is reserved: queues holding django.tasks tasks run it
(queues.engine.tasks), so a queue's handler always says what runs its items.
"""

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TASK_HANDLER = "django_task"


class RetryableError(Exception):
    def __init__(self, message: str = "", *, delay: float | None = None):
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    pass


@dataclass(frozen=True)
class Task:
    item_id: int
    queue: str
    account: str
    identifier: str
    payload: Any
    attempt: int
    options: dict = field(default_factory=dict)
    # The module path of the django.tasks task the item runs; empty for other items.
    task_path: str = ""


_registry: dict[str, Callable[[Task], Any]] = {}


def handler(name: str):
    def register(function: Callable[[Task], Any]):
        if name in _registry and _registry[name] is not function:
            raise ValueError(f"handler {name!r} is registered twice")
        _registry[name] = function
        return function

    return register


def get(name: str) -> Callable[[Task], Any] | None:
    return _registry.get(name)


def names() -> list[str]:
    return sorted(_registry)


@handler("noop")
def noop(task: Task):
    """Does nothing: for throughput benchmarks and smoke tests."""


@handler("demo")
def demo(task: Task):
    """Takes a little time and fails sometimes, like a call to a flaky partner API.

    Options: min_ms / max_ms (duration), slow_prefixes ({identifier prefix: ms}, a fixed
    duration for matching items), retry_rate and permanent_rate (0..1), crash_identifiers
    (items whose handling kills the worker process, as a segfault in a native library or the
    OOM killer would) and completions_file (see `note_completion`): for fault drills.
    """
    options = task.options
    if task.identifier in options.get("crash_identifiers", ()):
        os.kill(os.getpid(), signal.SIGKILL)
    duration = next((ms for prefix, ms in options.get("slow_prefixes", {}).items()
                     if task.identifier.startswith(prefix)), None)
    if duration is None:
        duration = random.uniform(options.get("min_ms", 20), options.get("max_ms", 300))
    time.sleep(duration / 1000)
    roll = random.random()
    if roll < options.get("permanent_rate", 0.02):
        raise PermanentError(f"partner rejected {task.identifier}: 422 invalid payload")
    if roll < options.get("permanent_rate", 0.02) + options.get("retry_rate", 0.06):
        raise RetryableError("partner answered 503 Service Unavailable")
    note_completion(options.get("completions_file"), task.item_id, task.attempt)


@handler("workload")
def workload(task: Task):
    """Work described by the item itself (`manage.py bench workload`): sleeps payload["ms"],
    then raises a retryable error on the first attempt when payload["fail"] is "first", a
    permanent one when it is "always"; notes each run that returns (option completions_file)."""
    run_work(task.payload, task.attempt)
    note_completion(task.options.get("completions_file"), task.item_id, task.attempt)


def run_work(work: dict, attempt: int):
    time.sleep(work.get("ms", 0) / 1000)
    if work.get("fail") == "always":
        raise PermanentError("partner rejected the payload: 422")
    if work.get("fail") == "first" and attempt == 1:
        raise RetryableError("partner answered 503 Service Unavailable")


def note_completion(path: str | None, item: int | str, attempt: int):
    """Appends "item attempt" to `path` for a handler run that returned, so that drills and
    benchmarks count real executions whatever the database recorded. One short O_APPEND write
    per line: lines of concurrent writers never interleave."""
    if path:
        with open(path, "a") as completions:
            completions.write(f"{item} {attempt}\n")

