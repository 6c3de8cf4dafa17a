"""Handler registry: `@handler("name")` in any installed app's handlers.py.

A handler receives a Task and returns normally (complete), raises RetryableError (try again
later, optionally after `delay` seconds) or PermanentError (dead letter at once). Any other
exception counts as retryable.
"""

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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


@handler("noop")
def noop(task: Task):
    """Does nothing: for throughput benchmarks and smoke tests."""


@handler("demo")
def demo(task: Task):
    """Takes a little time and fails sometimes, like a call to a flaky partner API.

    Options: min_ms / max_ms (duration), retry_rate and permanent_rate (0..1), and
    crash_identifiers: items whose handling kills the worker process, as a segfault in a native
    library or the OOM killer would (fault drills).
    """
    options = task.options
    if task.identifier in options.get("crash_identifiers", ()):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(random.uniform(options.get("min_ms", 20), options.get("max_ms", 300)) / 1000)
    roll = random.random()
    if roll < options.get("permanent_rate", 0.02):
        raise PermanentError(f"partner rejected {task.identifier}: 422 invalid payload")
    if roll < options.get("permanent_rate", 0.02) + options.get("retry_rate", 0.06):
        raise RetryableError("partner answered 503 Service Unavailable")


# Built-in handlers kept in their own modules register on import; last, since they import us.
from queues import webhook  # noqa: E402, F401
