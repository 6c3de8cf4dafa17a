"""django.tasks functions the tests enqueue through QueueAdmin's backend. Module-level, as the
worker finds a task by its module path."""

import asyncio

from queues.engine.handlers import PermanentError
from queues.engine.tasks import TaskContext, task

# What plain_function saw; the worker must never call it.
calls: list = []


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": args, "kwargs": kwargs}


@task(queue_name="maths", priority=7)
def multiply(a, b):
    return a * b


@task
async def greet(name, *, punctuation="!"):
    await asyncio.sleep(0)
    return f"hello {name}{punctuation}"


@task
def fail(kind):
    if kind == "permanent":
        raise PermanentError("the card was declined")
    if kind == "chained":
        try:
            {}["customer"]
        except KeyError as exc:
            raise RuntimeError("lookup failed\nsecond line of the message") from exc
    raise ValueError(f"bad {kind}")


@task
def give_back(kind):
    """Return values JSON holds, changes or cannot hold."""
    return {"tuple": (1, 2), "set": {1, 2}, "big": "x" * 20_000, "nul": "a\x00b",
            "none": None}[kind]


@task(takes_context=True)
def attempt_number(context: TaskContext):
    return {"attempt": context.attempt, "id": context.task_result.id}


def plain_function(*args, **kwargs):
    calls.append((args, kwargs))


def tenant_of(task):
    """OPTIONS["TENANT"] in the tests: the account from the task's queue name."""
    return f"tenant-of-{task.queue_name}"
