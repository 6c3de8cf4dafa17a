"""queues.enqueue and queues.enqueue_many: dedup, all-or-nothing batches and input validation."""

import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from queues import enqueue, enqueue_many
from queues.engine import counters, lifecycle
from queues.engine.handlers import TASK_HANDLER
from queues.engine.lifecycle import EnqueueError, IdentifierConflict, UnknownQueue
from queues.models import CounterDelta, Item, ItemEvent, Status
from tests.factories import QueueFactory, item_in_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def written():
    return (Item.objects.count(), ItemEvent.objects.count(), CounterDelta.objects.count())


def good(**overrides):
    item = {"account": "acme", "identifier": "order-1", "payload": {"to": "a@example.com"}}
    item.update(overrides)
    return item


# --- creating --------------------------------------------------------------------------------

def test_enqueue_creates_a_queued_item_with_an_event_and_a_counter(queue):
    before = timezone.now()

    item = enqueue("emails", account="acme", identifier="order-1", payload={"to": "a@b.c"},
                   priority=5)

    assert item.created is True
    item.refresh_from_db()
    assert (item.queue_id, item.account, item.identifier, item.payload, item.priority) == (
        queue.pk, "acme", "order-1", {"to": "a@b.c"}, 5)
    assert (item.status, item.previous_status, item.attempts, item.last_error) == (
        "queued", "", 0, "")
    assert before <= item.created_at == item.updated_at == item.run_at <= timezone.now()
    event = ItemEvent.objects.get(item_id=item.pk)
    assert (event.transition, event.from_status, event.to_status, event.attempt, event.actor,
            event.queue_id, event.account, event.identifier) == (
        "enqueued", "", "queued", 0, "python", queue.pk, "acme", "order-1")
    assert counters.status_counts([queue.pk])[queue.pk]["queued"] == 1
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


def test_enqueue_without_payload_stores_an_empty_object(queue):
    item = enqueue("emails", account="acme", identifier="x")
    item.refresh_from_db()
    assert item.payload == {}
    assert item.priority == 0


def test_enqueue_keeps_a_future_run_at(queue):
    later = timezone.now() + timedelta(hours=3)
    item = enqueue("emails", account="acme", identifier="x", run_at=later)
    item.refresh_from_db()
    assert item.run_at == later
    assert item.created_at < later


def test_enqueue_many_returns_one_item_per_input_in_order(queue):
    items = enqueue_many("emails", [good(identifier=f"id-{i}", payload={"i": i})
                                    for i in range(5)])
    assert [item.identifier for item in items] == [f"id-{i}" for i in range(5)]
    assert all(item.created for item in items)
    assert Item.objects.filter(queue=queue, status="queued").count() == 5
    assert ItemEvent.objects.filter(transition="enqueued").count() == 5
    assert counters.status_counts([queue.pk])[queue.pk]["queued"] == 5


def test_enqueue_many_of_nothing_writes_nothing(queue):
    assert enqueue_many("emails", []) == []
    assert written() == (0, 0, 0)


def test_enqueue_many_takes_exactly_a_thousand_items(queue):
    items = enqueue_many("emails", [good(identifier=f"id-{i}") for i in range(1000)])
    assert len(items) == Item.objects.count() == 1000


# --- dedup -----------------------------------------------------------------------------------

def test_same_identifier_and_payload_returns_the_existing_item_and_writes_nothing(queue):
    first = enqueue("emails", **good())
    before = written()

    again = enqueue("emails", **good())

    assert again.created is False
    assert again.pk == first.pk
    assert written() == before


@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.RUNNING, Status.RETRY])
def test_an_identifier_stays_taken_while_the_item_is_live(queue, status):
    item = item_in_status(queue, status, prefix="order", payload={"v": 1})

    again = enqueue("emails", account="acme", identifier=item.identifier, payload={"v": 1})

    assert (again.pk, again.created, again.status) == (item.pk, False, status)
    with pytest.raises(IdentifierConflict):
        enqueue("emails", account="acme", identifier=item.identifier, payload={"v": 2})


def test_same_payload_with_keys_in_another_order_is_the_same_payload(queue):
    first = enqueue("emails", **good(payload={"a": 1, "b": [1, 2]}))
    again = enqueue("emails", **good(payload={"b": [1, 2], "a": 1}))
    assert (again.pk, again.created) == (first.pk, False)


def test_a_different_payload_is_a_conflict_naming_the_identifier(queue):
    first = enqueue("emails", **good())
    before = written()

    with pytest.raises(IdentifierConflict) as excinfo:
        enqueue("emails", **good(payload={"to": "someone-else@example.com"}))

    assert "'order-1'" in str(excinfo.value)
    assert excinfo.value.identifier == "order-1"
    assert excinfo.value.existing_id == first.pk
    assert excinfo.value.code == "identifier_conflict"
    assert "identifier" in excinfo.value.fields
    assert written() == before


def test_the_same_identifier_on_another_queue_is_another_item(queue):
    QueueFactory(key="sms")
    a = enqueue("emails", **good())
    b = enqueue("sms", **good(payload={"other": True}))
    assert a.pk != b.pk and b.created


@pytest.mark.parametrize("status", [Status.COMPLETE, Status.FAILED, Status.CANCELLED])
def test_an_identifier_can_be_used_again_after_the_item_ends(queue, status):
    old = item_in_status(queue, status, prefix="order", payload={"v": 1})

    new = enqueue("emails", account="acme", identifier=old.identifier, payload={"v": 2})

    assert new.created is True
    assert new.pk != old.pk
    assert Item.objects.filter(identifier=old.identifier).count() == 2
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


def test_duplicates_inside_one_batch_with_the_same_payload_make_one_item(queue):
    items = enqueue_many("emails", [good(), good(identifier="other"), good()])

    assert items[0].pk == items[2].pk != items[1].pk
    assert items[0].created is True
    assert Item.objects.count() == 2
    assert ItemEvent.objects.count() == 2
    assert counters.status_counts([queue.pk])[queue.pk]["queued"] == 2


def test_duplicates_inside_one_batch_with_different_payloads_write_nothing(queue):
    with pytest.raises(IdentifierConflict, match="'order-1'"):
        enqueue_many("emails", [good(identifier="fine"), good(), good(payload={"x": 1})])
    assert written() == (0, 0, 0)


def test_a_conflict_with_a_stored_item_writes_nothing_from_the_whole_batch(queue):
    enqueue("emails", **good())
    before = written()

    with pytest.raises(IdentifierConflict):
        enqueue_many("emails", [good(identifier="new-1"), good(payload={"changed": 1}),
                                good(identifier="new-2")])

    assert written() == before
    assert not Item.objects.filter(identifier__startswith="new-").exists()


def test_a_batch_mixing_new_and_existing_identifiers_creates_only_the_new(queue):
    existing = enqueue("emails", **good())
    items = enqueue_many("emails", [good(identifier="new"), good()])
    assert [item.created for item in items] == [True, False]
    assert items[1].pk == existing.pk
    assert Item.objects.count() == 2


# --- errors ----------------------------------------------------------------------------------

def test_an_unknown_queue_is_refused(queue):
    with pytest.raises(UnknownQueue, match="'nope'") as excinfo:
        enqueue("nope", **good())
    assert excinfo.value.code == "unknown_queue"
    assert isinstance(excinfo.value, EnqueueError)
    assert written() == (0, 0, 0)


def deeply_nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("key", ["a\x00b", "Emails", 42, None])
def test_a_key_no_queue_could_have_is_an_unknown_queue_not_a_database_error(queue, key):
    with pytest.raises(UnknownQueue):
        enqueue(key, **good())
    assert written() == (0, 0, 0)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"account": ""}, "account"),
        ({"account": "   "}, "account"),
        ({"account": None}, "account"),
        ({"account": 42}, "account"),
        ({"account": "a" * 201}, "account"),
        ({"account": "ac\x00me"}, "account"),
        ({"identifier": ""}, "identifier"),
        ({"identifier": None}, "identifier"),
        ({"identifier": 7}, "identifier"),
        ({"identifier": ["a"]}, "identifier"),
        ({"identifier": "i" * 256}, "identifier"),
        ({"identifier": "order\x001"}, "identifier"),
        ({"run_at": datetime(2030, 1, 1, 12, 0)}, "run_at"),  # naive
        ({"run_at": "2030-01-01T12:00:00Z"}, "run_at"),
        ({"run_at": 1_900_000_000}, "run_at"),
        ({"priority": True}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 32768}, "priority"),
        ({"priority": -32769}, "priority"),
        ({"payload": {"when": datetime(2030, 1, 1, tzinfo=UTC)}}, "payload"),
        ({"payload": {"x": object()}}, "payload"),
        ({"payload": {1, 2}}, "payload"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": [float("inf")]}, "payload"),
        # What the API refuses, refused here too: PostgreSQL cannot store a NUL, a lone
        # surrogate cannot be encoded when the item is read, a huge integer not read back in
        # JavaScript, nor nesting past the API's 32 levels.
        ({"payload": {"note": "a\x00b"}}, "payload"),
        ({"payload": {"note\ud800": 1}}, "payload"),
        ({"payload": {"n": 2**70}}, "payload"),
        ({"payload": deeply_nested(200)}, "payload"),
        ({"colour": "blue"}, "colour"),
        ({"task_path": "os.system"}, "task_path"),  # set by the django.tasks backend only
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, dict) else v,
)
def test_an_invalid_item_fails_the_whole_batch_naming_the_field(queue, overrides, field):
    items = [good(identifier="fine-1"), good(**overrides), good(identifier="fine-2")]

    with pytest.raises(EnqueueError) as excinfo:
        enqueue_many("emails", items)

    assert field in excinfo.value.fields
    assert field in str(excinfo.value)
    assert excinfo.value.code == "invalid"
    assert written() == (0, 0, 0)


def test_a_queue_of_django_tasks_takes_only_tasks(queue):
    queue.handler = TASK_HANDLER
    queue.save()
    with pytest.raises(EnqueueError, match="enqueue them with Task.enqueue") as excinfo:
        enqueue("emails", **good())
    assert excinfo.value.fields == {"queue": "runs django.tasks tasks only"}
    item = lifecycle.enqueue_many("emails", [good()], task_path="billing.tasks.charge")[0]
    item.refresh_from_db()
    assert item.task_path == "billing.tasks.charge"


def test_a_queue_running_another_handler_takes_no_tasks(queue):
    with pytest.raises(EnqueueError, match="runs handler 'noop'") as excinfo:
        lifecycle.enqueue_many("emails", [good()], task_path="billing.tasks.charge")
    assert excinfo.value.fields == {"queue": "does not run django.tasks tasks"}
    assert written() == (0, 0, 0)


def test_items_of_other_handlers_have_no_task(queue):
    item = enqueue("emails", **good())
    item.refresh_from_db()
    assert item.task_path == ""


def test_a_missing_field_is_named(queue):
    with pytest.raises(EnqueueError) as excinfo:
        enqueue_many("emails", [{"identifier": "x"}])
    assert set(excinfo.value.fields) == {"account"}


def test_every_offending_field_is_named(queue):
    with pytest.raises(EnqueueError) as excinfo:
        enqueue("emails", account="", identifier="", priority="high")
    assert set(excinfo.value.fields) == {"account", "identifier", "priority"}


def test_an_item_that_is_not_a_mapping_is_refused(queue):
    with pytest.raises(EnqueueError) as excinfo:
        enqueue_many("emails", [good(), ["acme", "x"]])
    assert excinfo.value.fields == {"item": "must be an object"}
    assert written() == (0, 0, 0)


def test_more_than_a_thousand_items_are_refused(queue):
    with pytest.raises(EnqueueError, match="at most 1000") as excinfo:
        enqueue_many("emails", [good(identifier=f"id-{i}") for i in range(1001)])
    assert "items" in excinfo.value.fields
    assert written() == (0, 0, 0)


def test_limits_are_inclusive(queue):
    item = enqueue("emails", account="a" * 200, identifier="i" * 255, priority=32767,
                   payload={"nested": {"list": [1, 2.5, None, True, "é"]}})
    item.refresh_from_db()
    assert (len(item.account), len(item.identifier), item.priority) == (200, 255, 32767)
    assert item.payload == {"nested": {"list": [1, 2.5, None, True, "é"]}}
    assert enqueue("emails", account="b", identifier="low", priority=-32768).created


# --- concurrency (PostgreSQL) ----------------------------------------------------------------

def race(threads, work):
    """Run `work(n)` in `threads` real threads released at once; returns results and errors."""
    barrier = threading.Barrier(threads)
    results, errors = {}, {}

    def run(n):
        try:
            barrier.wait(timeout=30)
            results[n] = work(n)
        except Exception as exc:  # collected and asserted on by the test
            errors[n] = exc
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers)
    return results, errors


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_enqueueing_one_identifier_get_one_item(queue):
    results, errors = race(20, lambda n: enqueue("emails", **good()))

    assert errors == {}
    assert len(results) == 20
    assert len({item.pk for item in results.values()}) == 1
    assert sum(item.created for item in results.values()) == 1
    assert Item.objects.filter(identifier="order-1").count() == 1
    assert ItemEvent.objects.filter(transition="enqueued").count() == 1
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_racing_with_different_payloads_get_one_item_and_conflicts(queue):
    results, errors = race(20, lambda n: enqueue("emails", **good(payload={"n": n})))

    assert len(results) == 1
    assert len(errors) == 19
    assert all(isinstance(exc, IdentifierConflict) for exc in errors.values())
    (winner,) = results.values()
    assert {exc.existing_id for exc in errors.values()} == {winner.pk}
    assert list(Item.objects.values_list("pk", flat=True)) == [winner.pk]
    assert ItemEvent.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_threads_enqueueing_overlapping_batches_get_one_item_per_identifier(queue):
    def work(n):
        return enqueue_many("emails", [good(identifier=f"id-{(3 * n + i) % 30}", payload={})
                                       for i in range(10)])

    results, errors = race(20, work)

    assert errors == {}
    assert Item.objects.count() == 30
    by_identifier = {}
    for items in results.values():
        for item in items:
            assert by_identifier.setdefault(item.identifier, item.pk) == item.pk
    assert ItemEvent.objects.count() == 30
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_batches_sharing_identifiers_in_different_orders_do_not_deadlock(queue):
    # Each thread inserts the same 1000 identifiers in its own order: unless every batch takes
    # them in one global order, two inserts each wait for the other's uncommitted row.
    for round_ in range(6):
        identifiers = [f"r{round_}-{i}" for i in range(1000)]

        def work(n, identifiers=identifiers):
            order = random.Random(n).sample(identifiers, len(identifiers))
            return enqueue_many("emails", [good(identifier=i, payload={}) for i in order])

        results, errors = race(4, work)

        assert errors == {}, f"round {round_}: {errors}"
        assert Item.objects.filter(identifier__startswith=f"r{round_}-").count() == 1000
        assert sum(item.created for items in results.values() for item in items) == 1000
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


def test_lifecycle_enqueue_many_records_the_actor(queue):
    (item,) = lifecycle.enqueue_many("emails", [good()], actor="api:token-3")
    assert ItemEvent.objects.get(item_id=item.pk).actor == "api:token-3"


def test_an_identifier_and_account_typed_with_combining_accents_are_the_composed_ones(queue):
    composed = enqueue("emails", account="café", identifier="crème-1", payload={"n": 1})

    decomposed = enqueue("emails", account="cafe\u0301", identifier="cre\u0300me-1",
                         payload={"n": 1})

    assert decomposed.pk == composed.pk and not decomposed.created
    assert Item.objects.get().identifier == "crème-1"
    assert Item.objects.get().account == "café"
