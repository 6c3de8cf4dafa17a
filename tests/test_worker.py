"""queues.engine.worker.run_batch: fenced start, concurrent handlers, set-based outcomes."""

import multiprocessing
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from queues import enqueue_many
from queues.bench import processes
from queues.engine import handlers, heartbeat, lifecycle, selector, worker
from queues.engine.handlers import PermanentError, RetryableError
from queues.engine.worker import TOP_UP_SECONDS, BatchRun, run_batch
from queues.models import Attempt, DeadLetter, Item, ItemEvent, Status
from tests.factories import QueueFactory
from tests.flaky_database import failing_statements
from tests.round_lock import round_lock_held

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


def dispatched_batch(queue, identifiers, *, concurrency=None):
    """The batch a selector round hands its worker task; `concurrency` then applies to running
    it (a round never dispatches more than the queue's concurrency)."""
    enqueue_many(queue.key, [{"account": "acme", "identifier": i} for i in identifiers])
    result = selector.run_round(queue)
    if concurrency is not None:
        queue.concurrency = concurrency
        queue.save()
    tokens = dict(Item.objects.values_list("pk", "dispatch_token"))
    return [[pk, 1, tokens[pk]] for pk in result.item_ids]


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
    assert letter.last_error == "PermanentError: unknown handler 'no-such-handler'"


def test_handlers_of_a_batch_run_concurrently():
    queue = QueueFactory(handler="test-behaviour", concurrency=8)
    names = [f"s{i}" for i in range(8)]
    behaviour.update(dict.fromkeys(names, "slow"))
    run_batch(queue.pk, dispatched_batch(queue, names))
    assert behaviour["peak"] > 1
    assert Item.objects.filter(status=Status.COMPLETE).count() == 8


# --- real work: each outcome durable at once, items running only while their handler runs ------

release_gate = threading.Event()
seen: dict[str, object] = {}


@handlers.handler("test-gated")
def gated(task):
    """"gate" items wait for the test to open the gate; "count" items note how many items of the
    queue are running while they run; others return at once."""
    if task.identifier.startswith("gate"):
        release_gate.wait(10)
    elif task.identifier.startswith("count"):
        seen[task.identifier] = Item.objects.filter(status=Status.RUNNING).count()
    elif task.identifier.startswith("nap"):
        time.sleep(0.3)


@pytest.fixture
def gate():
    release_gate.clear()
    seen.clear()
    yield release_gate
    release_gate.set()


def run_in_thread(queue, batch):
    outcome = {}

    def run():
        try:
            outcome.update(run_batch(queue.pk, batch))
        finally:
            connection.close()  # the test database is dropped at the end

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def status_of(identifier):
    return Item.objects.get(identifier=identifier).status


@pytest.mark.django_db(transaction=True)
def test_a_finished_handler_is_durable_while_the_rest_of_its_batch_still_runs(gate):
    queue = QueueFactory(handler="test-gated")
    thread, outcome = run_in_thread(queue, dispatched_batch(queue, ["gate-1", "quick-1"]))
    try:
        assert processes.wait_for(lambda: status_of("quick-1") == Status.COMPLETE, 5)
        assert status_of("gate-1") == Status.RUNNING
        assert Attempt.objects.filter(item__identifier="quick-1", outcome="complete").exists()
    finally:
        gate.set()
        thread.join(10)
    assert outcome == {"complete": 2}


@pytest.mark.django_db(transaction=True)
def test_an_item_is_running_only_while_its_handler_runs(gate):
    queue = QueueFactory(handler="test-gated")
    batch = dispatched_batch(queue, ["count-1", "count-2", "count-3"], concurrency=1)
    assert run_batch(queue.pk, batch) == {"complete": 3}
    assert seen == {"count-1": 1, "count-2": 1, "count-3": 1}


def test_each_attempt_records_its_own_times_and_thread():
    queue = QueueFactory(handler="test-gated")
    run_batch(queue.pk, dispatched_batch(queue, ["nap-1", "quick-1", "quick-2"]))
    attempts = {a.item.identifier: a for a in Attempt.objects.select_related("item")}
    assert attempts["nap-1"].duration >= timedelta(milliseconds=300)
    assert attempts["quick-1"].duration < timedelta(milliseconds=200)
    # host:pid:thread of the handler thread, not of the batch's own.
    assert all(a.worker.rsplit(":", 1)[1].startswith("item-") for a in attempts.values())


@pytest.mark.django_db(transaction=True)
def test_a_handler_past_the_handler_timeout_is_recorded_as_timed_out_and_its_late_result_refused(
        gate):
    queue = QueueFactory(handler="test-gated", handler_timeout=timedelta(seconds=1))
    began = time.monotonic()
    assert run_batch(queue.pk, dispatched_batch(queue, ["gate-1", "quick-1"])) == {
        "complete": 1, "retry": 1}
    assert time.monotonic() - began < 5
    item = Item.objects.get(identifier="gate-1")
    assert item.status == Status.RETRY
    assert item.last_error.startswith("HandlerTimeout: still running after 1 s")
    gate.set()  # the abandoned handler returns now: nothing may record it
    time.sleep(0.3)
    item.refresh_from_db()
    assert (item.status, item.attempt_set.count()) == (Status.RETRY, 1)
    late = lifecycle.finish(queue, [lifecycle.Outcome(item.pk, 1)], worker="late")
    assert late["complete"].changed == []


def test_items_not_started_when_the_batch_runs_out_of_time_are_released_without_an_attempt(
        settings):
    # The last start must leave a whole handler timeout before the task timeout: here 1 s, and
    # six naps of 0.3 s one after another cannot all start in it.
    timeout = settings.Q_CLUSTER["timeout"]
    queue = QueueFactory(handler="test-gated", handler_timeout=timedelta(seconds=timeout - 16))
    batch = dispatched_batch(queue, [f"nap-{i}" for i in range(6)], concurrency=1)
    summary = run_batch(queue.pk, batch)
    assert summary["complete"] >= 1 and summary["released"] >= 1
    assert summary["complete"] + summary["released"] == 6
    released = Item.objects.filter(status=Status.QUEUED)
    assert released.count() == summary["released"]
    for item in released:
        assert item.attempts == 0 and not item.attempt_set.exists()
        event = item.events.order_by("-id").first()
        assert (event.transition, event.reason) == (
            "released", "its batch ran out of time before starting it")


def test_a_stopping_cluster_releases_what_it_has_not_started(monkeypatch):
    queue = QueueFactory(handler="test-gated")
    batch = dispatched_batch(queue, ["stop-1", "quick-1", "quick-2"], concurrency=1)

    @handlers.handler("test-stopper")
    def stopper(task):
        monkeypatch.setattr(heartbeat, "_stopping", multiprocessing.Value("d", time.time()))

    queue.handler = "test-stopper"
    queue.save()
    assert run_batch(queue.pk, batch) == {"complete": 1, "released": 2}
    assert Counter(Item.objects.values_list("status", flat=True)) == {
        Status.COMPLETE: 1, Status.QUEUED: 2}
    assert set(ItemEvent.objects.filter(transition="released").values_list("reason", flat=True)
               ) == {"shutdown"}


@pytest.mark.django_db(transaction=True)
def test_after_the_shutdown_grace_running_handlers_go_to_retry_with_the_reason_shutdown(
        gate, monkeypatch, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "SHUTDOWN_GRACE_SECONDS": 1}
    queue = QueueFactory(handler="test-gated")
    batch = dispatched_batch(queue, ["gate-1"])
    thread, outcome = run_in_thread(queue, batch)
    assert processes.wait_for(lambda: status_of("gate-1") == Status.RUNNING, 5)
    monkeypatch.setattr(heartbeat, "_stopping", multiprocessing.Value("d", time.time()))
    thread.join(5)
    assert outcome == {"retry": 1}
    item = Item.objects.get()
    assert (item.status, item.last_error, item.attempts) == (Status.RETRY, "shutdown", 1)
    assert item.run_at <= timezone.now()


def test_a_stale_delivery_after_a_release_and_a_new_dispatch_does_nothing():
    queue = QueueFactory(handler="test-behaviour")
    first = dispatched_batch(queue, ["a"])
    [[pk, attempt, _]] = first
    lifecycle.apply("release", [pk], actor="test", reason="test")
    second = selector.run_round(queue)
    assert second.item_ids == [pk]
    assert run_batch(queue.pk, first) == {"stale": 1}
    item = Item.objects.get()
    assert (item.status, item.attempts) == (Status.DISPATCHED, 1)
    assert run_batch(queue.pk, [[pk, 1, item.dispatch_token]]) == {"complete": 1}
    assert Attempt.objects.get().number == 1


def test_a_batch_claims_its_items_for_its_cluster_and_a_second_delivery_gets_none(monkeypatch):
    queue = QueueFactory(handler="test-behaviour")
    batch = dispatched_batch(queue, ["a", "b"])
    claimed = lifecycle.claim(batch, "host:1")
    assert set(claimed) == {pk for pk, _, _ in batch}
    assert set(Item.objects.values_list("cluster", flat=True)) == {"host:1"}
    assert run_batch(queue.pk, batch) == {"stale": 2}


def test_a_batch_of_quick_items_goes_on_with_its_queue_when_every_item_ended():
    queue = QueueFactory(handler="test-gated", batch_size=2, concurrency=2)
    batch = dispatched_batch(queue, ["quick-0", "quick-1"])
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"quick-{i}"} for i in range(2, 7)])
    assert run_batch(queue.pk, batch) == {"complete": 7, "taken while running": 5}
    assert Item.objects.filter(status=Status.COMPLETE).count() == 7
    # A taken item's history reads as a dispatched batch's: its top-up started it at once.
    taken = Item.objects.get(identifier="quick-6")
    assert list(ItemEvent.objects.filter(item_id=taken.pk).order_by("id").values_list(
        "transition", flat=True)) == ["enqueued", "dispatched", "started", "completed"]
    assert Attempt.objects.get(item=taken).outcome == Attempt.Outcome.COMPLETE


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_idle_threads_takes_more_of_its_queue_while_a_slow_item_runs(gate):
    queue = QueueFactory(handler="test-gated", batch_size=2)
    batch = dispatched_batch(queue, ["gate-1", "quick-0"])
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"quick-{i}"} for i in (1, 2, 3)])
    thread, outcome = run_in_thread(queue, batch)
    try:
        assert processes.wait_for(lambda: Item.objects.filter(
            identifier__startswith="quick-", status=Status.COMPLETE).count() == 4, 10)
        assert status_of("gate-1") == Status.RUNNING
    finally:
        gate.set()
        thread.join(10)
    assert outcome == {"complete": 5, "taken while running": 3}
    assert {a.worker.split(":")[0] for a in Attempt.objects.all()} == {heartbeat.this_cluster(
        ).split(":")[0]}


@pytest.mark.django_db(transaction=True)
def test_a_batch_leaves_its_worker_to_another_queue_whose_batch_waits(gate):
    queue, other = QueueFactory(handler="test-gated", batch_size=2), QueueFactory()
    batch = dispatched_batch(queue, ["gate-1", "quick-0"])
    enqueue_many(queue.key, [{"account": "acme", "identifier": "quick-1"}])
    enqueue_many(other.key, [{"account": "acme", "identifier": "waiting"}])
    selector.run_round(other)  # dispatched, not claimed by any worker yet
    thread, outcome = run_in_thread(queue, batch)
    try:
        assert processes.wait_for(lambda: status_of("quick-0") == Status.COMPLETE, 5)
        time.sleep(0.5)
        assert status_of("quick-1") == Status.QUEUED
    finally:
        gate.set()
        thread.join(10)
    assert outcome == {"complete": 2}


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_idle_threads_takes_over_items_whose_batch_waits_for_a_worker(gate):
    queue = QueueFactory(handler="test-gated", batch_size=2)
    batch = dispatched_batch(queue, ["gate-1", "quick-0"])
    enqueue_many(queue.key, [{"account": "acme", "identifier": "quick-1"}])
    waiting = selector.run_round(queue).batch  # its task waits: every worker is busy
    thread, outcome = run_in_thread(queue, batch)
    try:
        assert processes.wait_for(lambda: status_of("quick-1") == Status.COMPLETE, 5)
    finally:
        gate.set()
        thread.join(10)
    assert outcome == {"complete": 3, "taken while running": 1}
    assert run_batch(queue.pk, waiting) == {"stale": 1}  # when a worker finally runs it


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_outcome_is_durable_while_another_round_holds_the_queues_lock(gate):
    queue = QueueFactory(handler="test-gated", batch_size=2, concurrency=2)
    batch = dispatched_batch(queue, ["gate-1", "quick-0"])
    enqueue_many(queue.key, [{"account": "acme", "identifier": "quick-1"}])
    with round_lock_held(queue) as release:
        thread, outcome = run_in_thread(queue, batch)
        try:
            assert processes.wait_for(lambda: status_of("quick-0") == Status.COMPLETE, 5)
            assert status_of("quick-1") == Status.QUEUED  # the top-up met the other round
            release.set()
            assert processes.wait_for(lambda: status_of("quick-1") == Status.COMPLETE, 5)
        finally:
            gate.set()
            thread.join(10)
    assert outcome == {"complete": 3, "taken while running": 1}


def test_a_top_up_that_met_another_round_of_its_queue_asks_again_soon(monkeypatch):
    queue = QueueFactory(batch_size=2)
    batch = dispatched_batch(queue, ["a", "b"])
    run = BatchRun(queue, batch)
    monkeypatch.setattr(selector, "run_round", lambda *a, **k: selector.Round(
        queue=queue.key, skipped=selector.BUSY))
    run._top_up(1)
    assert run.top_up_after - time.monotonic() <= TOP_UP_SECONDS


def test_a_top_up_that_found_nothing_ready_waits_longer(monkeypatch):
    queue = QueueFactory(batch_size=2)
    run = BatchRun(queue, dispatched_batch(queue, ["a", "b"]))
    run._top_up(1)
    assert run.top_up_after - time.monotonic() > TOP_UP_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_rescued_item_taken_back_by_its_own_batch_runs_its_new_attempt_to_the_end(gate):
    queue = QueueFactory(handler="test-gated", batch_size=2, backoff_seconds=[0])
    batch = dispatched_batch(queue, ["gate-1", "nap-0"])
    thread, outcome = run_in_thread(queue, batch)
    try:
        assert processes.wait_for(lambda: status_of("gate-1") == Status.RUNNING, 5)
        # The sweeper took attempt 1 for lost (its batch looked frozen); the batch's next top-up
        # takes the item back while attempt 1's handler still runs here.
        gated_item = Item.objects.get(identifier="gate-1")
        lifecycle.rescue_lost(queue, {gated_item.pk: 1})
        assert processes.wait_for(lambda: Item.objects.get(pk=gated_item.pk).attempts == 2, 5)
        assert status_of("gate-1") == Status.RUNNING
    finally:
        gate.set()
        thread.join(10)
    assert status_of("gate-1") == Status.COMPLETE
    assert list(Attempt.objects.filter(item__identifier="gate-1").order_by("number")
                .values_list("number", "outcome")) == [(1, "lost"), (2, "complete")]
    assert outcome["complete"] == 2 and outcome["taken while running"] == 1


scripted: dict[tuple[str, int], threading.Event] = {}


@handlers.handler("test-scripted")
def scripted_handler(task):
    """Waits for the test to open the gate of its (identifier, attempt), if it has one."""
    if (gate_of := scripted.get((task.identifier, task.attempt))) is not None:
        gate_of.wait(10)


@pytest.mark.django_db(transaction=True)
def test_an_item_taken_back_keeps_its_claim_when_its_stale_attempt_ends_first(monkeypatch):
    # The frozen-worker drill's failure: the stale attempt's outcome dropped the claim of the
    # current one, whose outcome, recorded beside an item of another dispatch, was then refused.
    queue = QueueFactory(handler="test-scripted", batch_size=2, concurrency=2,
                         backoff_seconds=[0])
    scripted.clear()
    scripted.update({key: threading.Event() for key in
                     [("x", 1), ("y", 1), ("x", 2), ("z", 1)]})
    run = BatchRun(queue, dispatched_batch(queue, ["x", "y"]))
    hold, held, release = threading.Event(), threading.Event(), threading.Event()
    stopping_since = heartbeat.stopping_since

    def holding_the_loop():
        if hold.is_set():  # the batch's loop waits here while the test lines up two outcomes
            hold.clear()
            held.set()
            release.wait(10)
        return stopping_since()

    monkeypatch.setattr(heartbeat, "stopping_since", holding_the_loop)
    thread = threading.Thread(target=lambda: (run.run(), connection.close()))
    thread.start()

    def item(identifier):
        return Item.objects.get(identifier=identifier)

    try:
        assert processes.wait_for(lambda: Item.objects.filter(status=Status.RUNNING).count() == 2,
                                  5)
        lifecycle.rescue_lost(queue, {item("x").pk: 1})
        scripted["y", 1].set()  # y completes; the freed thread takes x's attempt 2 back
        assert processes.wait_for(lambda: item("x").status == Status.RUNNING, 5)
        enqueue_many(queue.key, [{"account": "other", "identifier": "z"}])
        scripted["x", 1].set()  # the stale attempt ends, refused; z takes its thread
        assert processes.wait_for(lambda: item("z").status == Status.RUNNING, 5)
        hold.set()
        assert held.wait(5)
        scripted["x", 2].set()
        scripted["z", 1].set()
        assert processes.wait_for(lambda: run.results.qsize() == 2, 5)
    finally:
        release.set()
        for gate_of in scripted.values():
            gate_of.set()
        thread.join(10)
    # Both are recorded in one statement, under each one's own dispatch.
    assert item("x").dispatch_token != item("z").dispatch_token
    assert {item(i).status for i in "xyz"} == {Status.COMPLETE}
    assert list(Attempt.objects.filter(item__identifier="x").order_by("number")
                .values_list("number", "outcome")) == [(1, "lost"), (2, "complete")]


@pytest.mark.django_db(transaction=True)
def test_a_batch_waits_out_failing_statements_and_runs_every_item_exactly_once(monkeypatch, gate):
    monkeypatch.setattr(worker, "DATABASE_PAUSE_SECONDS", 0.01)
    queue = QueueFactory(handler="test-gated", batch_size=2)
    batch = dispatched_batch(queue, ["gate-1", "quick-0"])
    # The gated item keeps the batch alive while its top-ups take the rest.
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"quick-{i}"} for i in range(1, 9)])
    failed, outcome = [], {}

    def run():
        try:
            with failing_statements(rate=0.2) as failures:
                outcome.update(run_batch(queue.pk, batch))
            failed.extend(failures)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert processes.wait_for(lambda: Item.objects.filter(
            identifier__startswith="quick-", status=Status.COMPLETE).count() == 9, 20)
    finally:
        gate.set()
        thread.join(20)
    assert failed  # the batch met failures and went on
    assert outcome == {"complete": 10, "taken while running": 8}
    completions = Counter(ItemEvent.objects.filter(transition="completed")
                          .values_list("item_id", flat=True))
    assert len(completions) == 10 and set(completions.values()) == {1}


def test_outcomes_are_recorded_under_the_batchs_claim_not_the_attempt_number_alone(monkeypatch):
    queue = QueueFactory(handler="test-behaviour")
    batch = dispatched_batch(queue, ["a"])
    guards = []
    finish = lifecycle.finish

    def recording(*args, **kwargs):
        guards.append(kwargs.get("guard"))
        return finish(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "finish", recording)
    assert run_batch(queue.pk, batch) == {"complete": 1}
    assert guards == [lifecycle.claimed_by(heartbeat.this_cluster(), [batch[0][2]])]
