"""A selector round of another process holding a queue's lock, for tests of what meets it."""

import contextlib
import threading

from django.db import connection, transaction

from queues.engine import selector


@contextlib.contextmanager
def round_lock_held(queue):
    """Holds the queue's round lock from a thread of its own until the block ends or the
    yielded event is set."""
    holding, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            selector._try_lock(queue)
            holding.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join(10)
