"""QueueAdmin's public Python surface: `enqueue` and `enqueue_many`.

The functions import the lifecycle module on call, because an app package is imported before
Django's model registry is ready.
"""

from queues import moved

moved.install()


def enqueue(queue_key, *, account, identifier, payload=None, run_at=None, priority=0):
    """Put one item on a queue; returns the Item (`item.created` is False for a deduplicated one).

    Raises lifecycle.UnknownQueue, lifecycle.EnqueueError for bad input, and
    lifecycle.IdentifierConflict when the identifier is live with a different payload.
    """
    from queues.engine.lifecycle import enqueue_many as _enqueue_many

    item = {"account": account, "identifier": identifier, "payload": payload, "run_at": run_at,
            "priority": priority}
    return _enqueue_many(queue_key, [item])[0]


def enqueue_many(queue_key, items):
    """Put up to 1000 items on a queue, all or nothing; returns one Item per input item."""
    from queues.engine.lifecycle import enqueue_many as _enqueue_many

    return _enqueue_many(queue_key, items)
