"""Statements that fail as they do while PostgreSQL restarts, on this thread's connection."""

import contextlib
import random

from django.db import OperationalError, connection


@contextlib.contextmanager
def failing_statements(rate: float, seed: int = 7, spare: str = "\0"):
    """Each statement of this thread fails with `rate` probability (seeded): a retry of a write
    of several statements gets through, as it does once the database is back. Statements that
    contain `spare` never fail."""
    chance = random.Random(seed)
    failed = []

    def maybe_fail(execute, sql, params, many, context):
        if chance.random() < rate and spare not in sql:
            failed.append(sql)
            raise OperationalError("terminating connection due to administrator command")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(maybe_fail):
        yield failed
