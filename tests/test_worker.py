"""queues.worker.run_batch: fenced start, concurrent handlers, set-based outcomes."""

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from queues import enqueue_many, handlers, selector
from queues.handlers import PermanentError, RetryableError
from queues.models import Attempt, DeadLetter, Item, Status
from queues.worker import run_batch
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db
behaviour = {}
running: list[str] = []
lock = threading.Lock()


@handlers.handler("test-behaviour")
def behave(task):
    action = behaviour.get(task.identifier, "ok")
    if action == "retry-later":
        raise RetryableError("rate limited", delay=90)
    if action == "permanent":
        raise PermanentError("payload rejected")
    if action == "crash":
        raise KeyError("customer_id")
    if action == "slow":
        with lock:
            running.append(task.identifier)
            behaviour["peak"] = max(behaviour.get("peak", 0), len(running))
        time.sleep(0.2)
        with lock:
            running.remove(task.identifier)


@pytest.fixture(autouse=True)
def clear_behaviour():
    behaviour.clear()


def dispatched_batch(queue, identifiers):
    enqueue_many(queue.key, [{"account": "acme", "identifier": i} for i in identifiers])
    result = selector.run_round(queue)
    return [[pk, 1] for pk in result.item_ids]


def test_it_completes_items_and_records_their_attempts():
    queue = QueueFactory(handler="test-behaviour")
    batch = dispatched_batch(queue, ["a", "b"])
    assert run_batch(queue.pk, batch) == {"complete": 2}
    assert set(Item.objects.values_list("status", flat=True)) == {Status.COMPLETE}
    attempts = list(Attempt.objects.values_list("outcome", "number"))
    assert attempts == [("complete", 1), ("complete", 1)]
    assert all(a.worker and a.duration is not None for a in Attempt.objects.all())


def test_a_duplicate_delivery_of_the_same_batch_does_nothing():
    queue = QueueFactory(handler="test-behaviour")
    batch = dispatched_batch(queue, ["a"])
    run_batch(queue.pk, batch)
    assert run_batch(queue.pk, batch) == {"stale": 1}
    assert Attempt.objects.count() == 1


def test_errors_become_retries_or_dead_letters_by_kind():
    queue = QueueFactory(handler="test-behaviour")
    behaviour.update({"later": "retry-later", "bad": "permanent", "boom": "crash"})
    batch = dispatched_batch(queue, ["later", "bad", "boom", "fine"])
    assert run_batch(queue.pk, batch) == {"complete": 1, "retry": 2, "fail": 1}
    later = Item.objects.get(identifier="later")
    assert later.status == Status.RETRY
    assert abs((later.run_at - timezone.now()) - timedelta(seconds=90)) < timedelta(seconds=5)
    boom = Item.objects.get(identifier="boom")
    assert boom.status == Status.RETRY
    assert boom.last_error == "KeyError: 'customer_id'"
    assert "Traceback" in boom.attempt_set.get().traceback
    bad = Item.objects.get(identifier="bad")
    assert bad.status == Status.FAILED
    assert DeadLetter.objects.get(item=bad).reason == "permanent"


def test_an_unknown_handler_fails_items_permanently_with_the_reason():
    queue = QueueFactory(handler="no-such-handler")
    batch = dispatched_batch(queue, ["a"])
    assert run_batch(queue.pk, batch) == {"fail": 1}
    letter = DeadLetter.objects.get()
    assert letter.last_error == "unknown handler 'no-such-handler'"


def test_handlers_of_a_batch_run_concurrently():
    queue = QueueFactory(handler="test-behaviour", concurrency=8)
    names = [f"s{i}" for i in range(8)]
    behaviour.update(dict.fromkeys(names, "slow"))
    run_batch(queue.pk, dispatched_batch(queue, names))
    assert behaviour["peak"] > 1
    assert Item.objects.filter(status=Status.COMPLETE).count() == 8
