import itertools
from datetime import timedelta

import factory
from django.utils import timezone

from queues.models import AccountPolicy, Queue


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue
        django_get_or_create = ("key",)

    key = factory.Sequence(lambda n: f"queue-{n}")
    name = factory.LazyAttribute(lambda o: o.key.replace("-", " ").title())


class AccountPolicyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AccountPolicy

    queue = factory.SubFactory(QueueFactory)
    account = factory.Sequence(lambda n: f"account-{n}")


def enqueued(queue, n=1, *, account="acme", prefix="item", **kwargs):
    """Items put on the queue through the public enqueue path (events and counters included)."""
    from queues import enqueue_many

    now = timezone.now()
    return enqueue_many(
        queue.key,
        [{"account": account, "identifier": f"{prefix}-{i}", "payload": {"n": i},
          "run_at": kwargs.get("run_at", now)} for i in range(n)],
    )


def items_in_status(queue, status, n=1, *, account="acme", prefix=None, payload=None,
                    task_path=""):
    """`n` items brought to `status` through the lifecycle itself (enqueue, dispatch, start,
    finish, cancel), so that their events, attempts and counters are what production writes.
    `task_path` makes them django.tasks items (on a queue running the task handler)."""
    from queues.engine import lifecycle
    from queues.models import Item, Status

    prefix = prefix or f"{status}-{next(_prefixes)}"
    items = lifecycle.enqueue_many(
        queue.key,
        [{"account": account, "identifier": f"{prefix}-{i}",
          "payload": {"n": i} if payload is None else payload} for i in range(n)],
        task_path=task_path,
    )
    ids = [item.pk for item in items]
    if status == Status.CANCELLED:
        lifecycle.apply("cancel", ids, actor="admin")
    elif status != Status.QUEUED:
        lifecycle.apply("dispatch", ids, actor="selector")
        if status != Status.DISPATCHED:
            lifecycle.apply("start", ids, actor="worker", expected_attempts=dict.fromkeys(ids, 1))
            outcome = {
                Status.RUNNING: None,
                Status.COMPLETE: {},
                Status.RETRY: {"error": "temporary trouble"},
                Status.FAILED: {"error": "bad input", "permanent": True},
            }[status]
            if outcome is not None:
                lifecycle.finish(
                    queue, [lifecycle.Outcome(item_id=pk, attempt=1, **outcome) for pk in ids],
                    worker="worker-1",
                )
    by_id = Item.objects.in_bulk(ids)
    result = [by_id[pk] for pk in ids]
    assert all(item.status == status for item in result), f"could not reach {status}"
    return result


def item_in_status(queue, status, **kwargs):
    return items_in_status(queue, status, 1, **kwargs)[0]


_prefixes = itertools.count()


def run_one_round(queue_key: str) -> dict:
    """One selector round of the queue and its batch run by a worker in this process; what the
    batch did. The queue is paused while the batch runs: a running batch tops itself up through
    rounds of its own, and callers count what one round took."""
    from queues.engine import selector
    from queues.engine.worker import run_batch
    from queues.models import Item, Queue

    queue = Queue.objects.get(key=queue_key)
    result = selector.run_round(queue)
    batch = [list(row) for row in Item.objects.filter(pk__in=result.item_ids).values_list(
        "pk", "attempts", "dispatch_token")]
    Queue.objects.filter(pk=queue.pk).update(paused=True)
    try:
        return run_batch(queue.pk, batch)
    finally:
        Queue.objects.filter(pk=queue.pk).update(paused=False)


def failures_finished_in_reverse_order(queue):
    """Seven failures enqueued one by one and finished latest-enqueued first, in pairs that
    share a finish time (a bulk cancel or one batch's outcomes do), and one failure from two
    days ago. Returns the identifiers latest finished first."""
    from queues.models import Item

    now = timezone.now()
    for i, item in enumerate(items_in_status(queue, "failed", 7, prefix="f")):
        Item.objects.filter(pk=item.pk).update(
            created_at=now - timedelta(hours=1) + timedelta(minutes=i),
            finished_at=now - timedelta(minutes=10 + i // 2))
    [old] = items_in_status(queue, "failed", 1, prefix="old")
    Item.objects.filter(pk=old.pk).update(finished_at=now - timedelta(days=2))
    items_in_status(queue, "complete", 1, prefix="done")
    return ["f-1", "f-0", "f-3", "f-2", "f-5", "f-4", "f-6"]


def index_entries_read(*indexes):
    """Entries this transaction has read from the named indexes of queues_item (all of them
    when none is named): how a plan test tells an index range from a whole queue read."""
    from django.db import connection

    names = list(indexes) or None
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(SUM(pg_stat_get_xact_tuples_returned(indexrelid)), 0) "
                       "FROM pg_index WHERE indrelid = 'queues_item'::regclass "
                       "AND (%s::text[] IS NULL OR indexrelid::regclass::text = ANY(%s::text[]))",
                       [names, names])
        return cursor.fetchone()[0]


def analyzed_before_new_queues(status="complete", known=1000):
    """Statistics as a database that has run a while has them: ANALYZE after another queue's
    `known` items in `status`, so that a queue made next is unknown to them."""
    from django.db import connection

    other = QueueFactory()
    for batch in range(0, known, 1000):
        items_in_status(other, status, min(1000, known - batch), prefix=f"known-{batch}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_item")
