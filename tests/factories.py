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
