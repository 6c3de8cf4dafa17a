"""queues.engine.lifecycle: the transition table, fencing, retries, dead letters and counters."""

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from queues import enqueue
from queues.engine import counters, lifecycle
from queues.engine.lifecycle import TRANSITIONS, IllegalTransition, Outcome
from queues.models import (
    DEFAULT_BACKOFF_SECONDS,
    Attempt,
    CounterDelta,
    DeadLetter,
    Item,
    ItemEvent,
    OutcomeMinute,
    Status,
)
from tests.factories import QueueFactory, item_in_status, items_in_status

pytestmark = pytest.mark.django_db

ACTOR = "alice@example.com"
ELIGIBLE = [(name, source) for name, t in TRANSITIONS.items() for source in t.sources]
INELIGIBLE = [
    (name, status) for name, t in TRANSITIONS.items() for status in Status.values
    if status not in t.sources
]
LATER = timedelta(minutes=7)
# What the real callers (finish, rescue_lost) pass along with each worker transition.
VALUES = {
    "complete": {"worker": "worker-9"},
    "retry": {"error": "timeout talking to upstream", "traceback": "Traceback ...",
              "worker": "worker-9"},
    "fail": {"error": "bad input", "traceback": "Traceback ...", "worker": "worker-9",
             "dead_reason": "permanent"},
    "lost_retry": {"error": "worker lost"},
    "lost_fail": {"error": "worker lost", "dead_reason": "worker lost"},
}


@pytest.fixture
def queue():
    return QueueFactory()


def assert_counters_consistent(queue):
    exact = counters.exact_counts([queue.pk])
    assert counters.status_counts([queue.pk]) == exact
    counters.rollup()
    assert not CounterDelta.objects.exists()
    assert counters.status_counts([queue.pk]) == exact


def values_for(action, now):
    values = dict(VALUES.get(action, {}))
    if action in ("retry", "lost_retry"):
        values["run_at"] = now + LATER
    return values


def snapshot(item):
    item.refresh_from_db()
    return (item.status, item.previous_status, item.attempts, item.run_at, item.updated_at,
            item.last_error, item.events.count(), item.attempt_set.count(),
            item.dead_letters.count())


def assert_moved(item, action, source, before_attempts, now):
    transition = TRANSITIONS[action]
    item.refresh_from_db()
    assert item.status == transition.target
    assert item.previous_status == source
    expected_attempts = {"dispatch": before_attempts + 1, "requeue": 0,
                         "release": before_attempts - 1}.get(action, before_attempts)
    assert item.attempts == expected_attempts
    event = item.events.order_by("-id").first()
    assert (event.transition, event.from_status, event.to_status, event.actor, event.attempt) == (
        transition.event, source, transition.target, ACTOR, expected_attempts)
    assert (event.queue_id, event.account, event.identifier) == (
        item.queue_id, item.account, item.identifier)
    if transition.attempt_outcome:
        attempt = item.attempt_set.get(number=before_attempts)
        assert attempt.outcome == transition.attempt_outcome
        assert attempt.error == VALUES[action].get("error", "")
    if transition.dead_letter:
        letter = item.dead_letters.get()
        assert (letter.reason, letter.last_error, letter.attempts) == (
            VALUES[action]["dead_reason"], VALUES[action]["error"], before_attempts)
    if action in ("retry", "lost_retry"):
        assert item.run_at == now + LATER
        assert item.last_error == VALUES[action]["error"]


# --- the transition table --------------------------------------------------------------------

@pytest.mark.parametrize(("action", "source"), ELIGIBLE)
def test_transition_moves_an_item_from_each_source_status_to_the_target(queue, action, source):
    item = item_in_status(queue, source)
    before_attempts = item.attempts
    now = timezone.now()

    changed = lifecycle.transition(item.pk, action, actor=ACTOR, **values_for(action, now))

    assert (changed.id, changed.from_status) == (item.pk, source)
    assert_moved(item, action, source, before_attempts, now)
    assert_counters_consistent(queue)


@pytest.mark.parametrize(("action", "source"), ELIGIBLE)
def test_apply_moves_every_item_of_a_set_in_each_source_status(queue, action, source):
    items = items_in_status(queue, source, 3)
    ids = [item.pk for item in items]
    now = timezone.now()
    values = {pk: values_for(action, now) for pk in ids}

    result = lifecycle.apply(action, ids, actor=ACTOR, values=values)

    assert sorted(result.changed_ids) == sorted(ids)
    assert result.skipped == {}
    for item in items:
        assert_moved(item, action, source, item.attempts, now)
    assert_counters_consistent(queue)


@pytest.mark.parametrize(("action", "status"), INELIGIBLE)
def test_transition_refuses_an_item_in_any_other_status(queue, action, status):
    item = item_in_status(queue, status)
    before = snapshot(item)

    with pytest.raises(IllegalTransition) as excinfo:
        lifecycle.transition(item.pk, action, actor=ACTOR,
                             **values_for(action, timezone.now()))

    message = str(excinfo.value)
    assert f"cannot {action} item {item.pk}" in message
    assert Status(status).label.lower() in message
    assert snapshot(item) == before
    assert_counters_consistent(queue)


@pytest.mark.parametrize(("action", "status"), INELIGIBLE)
def test_apply_leaves_items_in_any_other_status_unchanged_and_says_why(queue, action, status):
    items = items_in_status(queue, status, 2)
    before = [snapshot(item) for item in items]
    events = ItemEvent.objects.count()

    result = lifecycle.apply(action, [item.pk for item in items], actor=ACTOR)

    assert result.changed == []
    assert set(result.skipped) == {item.pk for item in items}
    for reason in result.skipped.values():
        assert Status(status).label.lower() in reason
    assert [snapshot(item) for item in items] == before
    assert ItemEvent.objects.count() == events
    assert_counters_consistent(queue)


def test_the_table_covers_every_status_as_a_source_or_target():
    statuses = {t.target for t in TRANSITIONS.values()}
    statuses |= {s for t in TRANSITIONS.values() for s in t.sources}
    assert statuses == set(Status.values)


def test_it_refuses_an_unknown_action(queue):
    item = item_in_status(queue, Status.QUEUED)
    with pytest.raises(IllegalTransition, match="unknown transition 'explode'"):
        lifecycle.apply("explode", [item.pk], actor=ACTOR)


def test_it_says_when_an_item_does_not_exist(queue):
    with pytest.raises(IllegalTransition, match="no such item"):
        lifecycle.transition(987_654, "cancel", actor=ACTOR)
    assert lifecycle.apply("cancel", [987_654], actor=ACTOR).skipped == {
        987_654: "no such item"}


def test_it_records_actor_and_reason_on_the_event(queue):
    item = item_in_status(queue, Status.QUEUED)
    lifecycle.transition(item.pk, "cancel", actor=ACTOR, reason="customer asked")
    event = item.events.order_by("-id").first()
    assert (event.transition, event.actor, event.reason) == ("cancelled", ACTOR, "customer asked")
    assert abs(event.at - timezone.now()) < timedelta(seconds=5)


# --- sets ------------------------------------------------------------------------------------

def test_it_moves_exactly_the_eligible_items_of_a_mixed_set_in_one_call(queue):
    eligible = (items_in_status(queue, Status.QUEUED, 2)
                + items_in_status(queue, Status.DISPATCHED, 2)
                + items_in_status(queue, Status.RETRY, 1))
    running = items_in_status(queue, Status.RUNNING, 2)
    finished = items_in_status(queue, Status.COMPLETE, 1) + items_in_status(
        queue, Status.CANCELLED, 1)
    ids = [item.pk for item in eligible + running + finished]
    random.Random(4).shuffle(ids)

    result = lifecycle.apply("cancel", ids, actor=ACTOR)

    assert sorted(result.changed_ids) == sorted(item.pk for item in eligible)
    assert set(result.skipped) == {item.pk for item in running + finished}
    assert Item.objects.filter(pk__in=[i.pk for i in eligible], status="cancelled").count() == 5
    assert Item.objects.filter(pk__in=[i.pk for i in running], status="running").count() == 2
    assert result.skipped[finished[0].pk] == "it is complete"
    assert result.skipped[finished[1].pk] == "it is cancelled"
    assert_counters_consistent(queue)


def test_it_moves_more_than_a_thousand_items_in_one_call_in_chunks(queue):
    queued = items_in_status(queue, Status.QUEUED, 1000) + items_in_status(queue, Status.QUEUED,
                                                                           150)
    running = items_in_status(queue, Status.RUNNING, 3)
    ids = [item.pk for item in queued + running]
    assert len(ids) > lifecycle.BATCH_LIMIT

    dispatched = lifecycle.apply("dispatch", ids, actor=ACTOR)
    assert sorted(dispatched.changed_ids) == sorted(item.pk for item in queued)
    assert set(dispatched.skipped) == {item.pk for item in running}

    cancelled = lifecycle.apply("cancel", ids, actor=ACTOR)
    assert len(cancelled.changed) == 1150
    assert Item.objects.filter(queue=queue, status="cancelled", attempts=1).count() == 1150
    assert ItemEvent.objects.filter(queue=queue, transition="cancelled").count() == 1150

    requeued = lifecycle.apply("requeue", ids, actor=ACTOR)
    assert len(requeued.changed) == 1150
    assert Item.objects.filter(queue=queue, status="queued", attempts=0).count() == 1150
    assert_counters_consistent(queue)


def test_a_repeated_id_moves_once(queue):
    item = item_in_status(queue, Status.QUEUED)
    result = lifecycle.apply("dispatch", [item.pk, item.pk, str(item.pk)], actor=ACTOR)
    assert result.changed_ids == [item.pk]
    item.refresh_from_db()
    assert item.attempts == 1
    assert item.events.filter(transition="dispatched").count() == 1


def test_apply_selected_moves_and_records_the_items_its_select_finds(queue):
    queued = items_in_status(queue, Status.QUEUED, 3)
    running = item_in_status(queue, Status.RUNNING)
    wanted = [queued[0].pk, queued[2].pk, running.pk]

    changed = lifecycle.apply_selected(
        "dispatch", f"SELECT id FROM {Item._meta.db_table} WHERE id IN (%s, %s, %s)", wanted,
        actor=ACTOR)

    assert sorted(row.id for row in changed) == [queued[0].pk, queued[2].pk]
    assert all(row.attempts == 1 and row.from_status == Status.QUEUED for row in changed)
    for item in (queued[0], queued[2]):
        assert_moved(item, "dispatch", Status.QUEUED, 0, timezone.now())
    assert Item.objects.get(pk=queued[1].pk).status == Status.QUEUED
    assert_counters_consistent(queue)


def test_run_now_writes_no_counter_delta_that_changes_nothing(queue):
    items = items_in_status(queue, Status.QUEUED, 2)
    CounterDelta.objects.all().delete()
    lifecycle.apply("run_now", [item.pk for item in items], actor=ACTOR)
    assert not CounterDelta.objects.filter(delta=0).exists()
    assert ItemEvent.objects.filter(transition="run_now").count() == 2


def _records(queue, given=()):
    """What a transition wrote, without the parts that differ from run to run (times other than
    the `given` ones)."""

    def label(at):
        return given.index(at) if at in given else "another time"

    events = sorted(ItemEvent.objects.filter(queue=queue).values_list(
        "identifier", "transition", "from_status", "to_status", "attempt", "actor", "reason"))
    deltas = sorted(CounterDelta.objects.filter(queue=queue).values_list("status", "delta"))
    letters = sorted((identifier, reason, error, attempts, by, at is None)
                     for identifier, reason, error, attempts, by, at in DeadLetter.objects
                     .filter(queue=queue).values_list("item__identifier", "reason", "last_error",
                                                      "attempts", "replayed_by", "replayed_at"))
    attempts = sorted((identifier, number, outcome, error, traceback, worker, str(result),
                       label(started), label(finished))
                      for identifier, number, outcome, error, traceback, worker, result, started,
                      finished in Attempt.objects.filter(item__queue=queue).values_list(
                          "item__identifier", "number", "outcome", "error", "traceback",
                          "worker", "result", "started_at", "finished_at"))
    items = sorted(Item.objects.filter(queue=queue).values_list(
        "identifier", "status", "attempts", "last_error", "cluster"))
    return events, deltas, letters, attempts, items


@pytest.mark.postgres
@pytest.mark.parametrize(("action", "source"), ELIGIBLE)
def test_postgres_writes_the_same_records_in_one_statement_as_row_by_row(
        queue, monkeypatch, action, source):
    """On PostgreSQL every transition records in the UPDATE's own statement (events, deltas,
    attempts, dead letters); the rows it writes must be the ones the general path writes."""
    started, finished = timezone.now() - LATER, timezone.now()
    records = []
    for in_sql in (True, False):
        ItemEvent.objects.all().delete()
        CounterDelta.objects.all().delete()
        DeadLetter.objects.all().delete()
        Attempt.objects.all().delete()
        Item.objects.all().delete()
        items = items_in_status(queue, source, 3, prefix="same")
        ItemEvent.objects.all().delete()
        CounterDelta.objects.all().delete()
        values = {item.pk: {**VALUES.get(action, {}), "started_at": started,
                            "finished_at": finished, "result": {"n": n, "text": "<é>"}}
                  for n, item in enumerate(items)} if action in VALUES else None
        with monkeypatch.context() as patch:
            patch.setattr(lifecycle, "_records_in_sql", lambda in_sql=in_sql: in_sql)
            lifecycle.apply(action, [item.pk for item in items], actor=ACTOR, reason="why",
                            values=values)
        records.append(_records(queue, (started, finished)))
    assert records[0] == records[1]
    assert records[0][0]


# --- fencing and attempts --------------------------------------------------------------------

def test_start_with_a_stale_attempt_does_nothing(queue):
    item = item_in_status(queue, Status.DISPATCHED)
    lifecycle.rescue_lost(queue, {item.pk: 1})  # the sweeper gave up on attempt 1
    lifecycle.transition(item.pk, "dispatch", actor="selector")  # attempt 2 is out
    before = snapshot(item)

    with pytest.raises(IllegalTransition, match="attempt 1 is stale; the item is on attempt 2"):
        lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=1)

    assert snapshot(item) == before
    lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=2)
    item.refresh_from_db()
    assert item.status == Status.RUNNING


def test_finish_with_a_stale_attempt_does_nothing(queue):
    item = item_in_status(queue, Status.RUNNING)
    lifecycle.rescue_lost(queue, {item.pk: 1})
    lifecycle.transition(item.pk, "dispatch", actor="selector")
    lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=2)
    before = snapshot(item)

    results = lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1)], worker="late")

    assert results["complete"].changed == []
    assert "stale" in results["complete"].skipped[item.pk]
    assert snapshot(item) == before
    assert not Attempt.objects.filter(item=item, worker="late").exists()
    assert_counters_consistent(queue)


def test_a_stale_and_a_current_outcome_of_one_item_recorded_together_keep_the_current(queue):
    items = [item_in_status(queue, Status.RUNNING) for _ in range(2)]
    for item in items:
        lifecycle.rescue_lost(queue, {item.pk: 1})
        lifecycle.transition(item.pk, "dispatch", actor="selector")
        lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=2)
    first, second = (item.pk for item in items)

    # The late attempt 1 once after, once before the current attempt 2.
    results = lifecycle.finish(queue, [
        Outcome(first, 2), Outcome(first, 1, error="late"),
        Outcome(second, 1, error="late"), Outcome(second, 2),
    ], worker="w")

    assert sorted(row.id for row in results["complete"].changed) == [first, second]
    assert "retry" not in results or not results["retry"].changed
    for item in items:
        assert list(Attempt.objects.filter(item=item).order_by("number").values_list(
            "number", "outcome")) == [(1, "lost"), (2, "complete")]
    assert_counters_consistent(queue)


def test_a_late_duplicate_finish_does_nothing(queue):
    item = item_in_status(queue, Status.RUNNING)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1)], worker="w1")
    before = snapshot(item)

    results = lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="x")],
                               worker="w2")

    assert results["retry"].changed == []
    assert results["retry"].skipped[item.pk] == "it is complete"
    assert snapshot(item) == before


def test_dispatch_increments_attempts_and_clears_the_start_time(queue):
    item = item_in_status(queue, Status.QUEUED)
    lifecycle.transition(item.pk, "dispatch", actor="selector")
    item.refresh_from_db()
    assert item.attempts == 1
    assert item.dispatched_at is not None and item.started_at is None

    lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=1)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="e", delay=0)],
                     worker="w")
    changed = lifecycle.transition(item.pk, "dispatch", actor="selector")

    item.refresh_from_db()
    assert changed.attempts == item.attempts == 2
    assert item.started_at is None


def test_it_refuses_cancel_of_running_item(queue):
    item = item_in_status(queue, Status.RUNNING)

    with pytest.raises(IllegalTransition, match="running items are not cancelled mid-flight"):
        lifecycle.transition(item.pk, "cancel", actor=ACTOR)
    result = lifecycle.apply("cancel", [item.pk], actor=ACTOR)

    assert "not cancelled mid-flight" in result.skipped[item.pk]
    item.refresh_from_db()
    assert item.status == Status.RUNNING


# --- requeue ---------------------------------------------------------------------------------

def test_requeue_resets_attempts_makes_it_due_now_and_keeps_the_enqueue_time(queue):
    item = item_in_status(queue, Status.FAILED)
    created_at = item.created_at
    letter = DeadLetter.objects.get(item=item)
    assert letter.replayed_at is None

    lifecycle.transition(item.pk, "requeue", actor=ACTOR, reason="replay")

    item.refresh_from_db()
    assert (item.status, item.previous_status, item.attempts) == ("queued", "failed", 0)
    assert abs(item.run_at - timezone.now()) < timedelta(seconds=5)
    assert item.created_at == created_at
    assert (item.last_error, item.finished_at, item.started_at, item.dispatched_at) == (
        "", None, None, None)
    letter.refresh_from_db()  # kept as history, marked replayed
    assert letter.replayed_by == ACTOR
    assert abs(letter.replayed_at - timezone.now()) < timedelta(seconds=5)
    assert letter.reason == "permanent"


def test_requeue_leaves_dead_letters_already_replayed_alone(queue):
    item = item_in_status(queue, Status.FAILED)
    lifecycle.transition(item.pk, "requeue", actor="first")
    lifecycle.transition(item.pk, "dispatch", actor="selector")
    lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=1)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="again",
                                     permanent=True)], worker="w")

    lifecycle.transition(item.pk, "requeue", actor="second")

    assert sorted(DeadLetter.objects.filter(item=item).values_list("replayed_by", flat=True)) \
        == ["first", "second"]


def test_requeue_is_skipped_when_the_identifier_is_live_again_on_another_item(queue):
    old = item_in_status(queue, Status.COMPLETE, prefix="order")
    new = enqueue(queue.key, account="acme", identifier=old.identifier, payload={"v": 2})
    assert new.created and new.pk != old.pk

    result = lifecycle.apply("requeue", [old.pk], actor=ACTOR)

    assert result.changed == []
    assert result.skipped == {old.pk: "its identifier is live again on another item"}
    old.refresh_from_db()
    assert old.status == Status.COMPLETE
    with pytest.raises(IllegalTransition, match="live again on another item"):
        lifecycle.transition(old.pk, "requeue", actor=ACTOR)
    assert_counters_consistent(queue)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_requeue_racing_an_enqueue_of_one_identifier_skips_only_that_item():
    """The enqueue commits while the requeue's UPDATE waits on its unique index entry: the
    chunk fails with a unique violation and is redone item by item."""
    queue = QueueFactory()
    taken, free = items_in_status(queue, Status.COMPLETE, 2, prefix="race")
    enqueued, release = threading.Event(), threading.Event()

    def enqueue_and_hold():
        with transaction.atomic():
            enqueue(queue.key, account="acme", identifier=taken.identifier, payload={"v": 2})
            enqueued.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=enqueue_and_hold)
    holder.start()
    enqueued.wait(10)
    outcome = {}
    requeue = threading.Thread(target=lambda: (outcome.setdefault("result", lifecycle.apply(
        "requeue", [taken.pk, free.pk], actor=ACTOR)), connection.close()))
    requeue.start()
    _wait_for_a_lock_wait()
    release.set()
    holder.join()
    requeue.join()

    result = outcome["result"]
    assert result.changed_ids == [free.pk]
    assert result.skipped == {taken.pk: "its identifier is live again on another item"}
    assert Item.objects.get(pk=taken.pk).status == Status.COMPLETE
    assert Item.objects.get(pk=free.pk).status == Status.QUEUED
    assert ItemEvent.objects.filter(item_id=taken.pk, transition="requeued").count() == 0
    assert_counters_consistent(queue)


def _wait_for_a_lock_wait():
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND datname = current_database()")
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the requeue never waited for the enqueue")


@pytest.mark.parametrize("newest_first", [False, True])
def test_requeue_of_two_finished_items_sharing_an_identifier_requeues_only_the_newest(
        queue, newest_first):
    older = item_in_status(queue, Status.FAILED, prefix="order")
    newer = item_in_status(queue, Status.CANCELLED, prefix="order")
    assert older.identifier == newer.identifier and older.pk < newer.pk
    ids = [newer.pk, older.pk] if newest_first else [older.pk, newer.pk]

    result = lifecycle.apply("requeue", ids, actor=ACTOR)

    assert result.changed_ids == [newer.pk]
    assert "newer item with the same identifier" in result.skipped[older.pk]
    older.refresh_from_db()
    newer.refresh_from_db()
    assert (older.status, newer.status) == (Status.FAILED, Status.QUEUED)
    assert DeadLetter.objects.get(item=older).replayed_at is None
    assert_counters_consistent(queue)


def test_requeue_keeps_only_the_newest_of_a_shared_identifier_across_chunks(queue):
    older = item_in_status(queue, Status.COMPLETE, prefix="order")
    others = items_in_status(queue, Status.CANCELLED, lifecycle.BATCH_LIMIT)
    newer = item_in_status(queue, Status.COMPLETE, prefix="order")
    ids = [older.pk] + [item.pk for item in others] + [newer.pk]  # older and newer: two chunks

    result = lifecycle.apply("requeue", ids, actor=ACTOR)

    assert len(result.changed) == lifecycle.BATCH_LIMIT + 1
    assert newer.pk in result.changed_ids
    assert "newer item with the same identifier" in result.skipped[older.pk]
    assert Item.objects.get(pk=older.pk).status == Status.COMPLETE
    assert Item.objects.get(pk=newer.pk).status == Status.QUEUED
    assert_counters_consistent(queue)


# --- finishing: retries, backoff, dead letters -----------------------------------------------

def test_finish_without_error_completes_and_records_the_attempt(queue):
    item = item_in_status(queue, Status.RUNNING)

    results = lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1)], worker="worker-3")

    assert results["complete"].changed_ids == [item.pk]
    item.refresh_from_db()
    assert item.status == Status.COMPLETE and item.finished_at is not None
    attempt = Attempt.objects.get(item=item)
    assert (attempt.number, attempt.outcome, attempt.error, attempt.worker) == (
        1, "complete", "", "worker-3")
    assert attempt.started_at == item.started_at
    assert attempt.duration >= timedelta(0)
    assert not DeadLetter.objects.exists()


def test_finish_with_an_error_schedules_the_first_retry_about_two_minutes_later(queue):
    item = item_in_status(queue, Status.RUNNING)
    before = timezone.now()

    results = lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="HTTP 503",
                                               traceback="Traceback: boom")], worker="worker-3")

    after = timezone.now()
    assert results["retry"].changed_ids == [item.pk]
    item.refresh_from_db()
    assert (item.status, item.last_error, item.attempts) == ("retry", "HTTP 503", 1)
    assert before + timedelta(seconds=108) <= item.run_at <= after + timedelta(seconds=132)
    attempt = Attempt.objects.get(item=item)
    assert (attempt.number, attempt.outcome, attempt.error, attempt.traceback,
            attempt.worker) == (1, "retry", "HTTP 503", "Traceback: boom", "worker-3")
    event = item.events.order_by("-id").first()
    assert (event.transition, event.reason, event.actor) == ("retry_scheduled", "HTTP 503",
                                                             "worker")
    assert_counters_consistent(queue)


def test_finish_honours_the_delay_a_retryable_error_asks_for(queue):
    item = item_in_status(queue, Status.RUNNING)
    before = timezone.now()

    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="429", delay=3600)],
                     worker="w")

    after = timezone.now()
    item.refresh_from_db()
    assert before + timedelta(hours=1) <= item.run_at <= after + timedelta(hours=1)


def test_retries_back_off_along_the_queue_delays_then_fail_when_exhausted(queue):
    item = item_in_status(queue, Status.QUEUED)
    gaps = []
    for attempt in range(1, queue.max_retries + 2):
        lifecycle.transition(item.pk, "dispatch", actor="selector")
        lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=attempt)
        now = timezone.now()
        lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=attempt, error=f"e{attempt}")],
                         worker="w")
        item.refresh_from_db()
        if item.status == Status.RETRY:
            gaps.append((item.run_at - now).total_seconds())

    assert attempt == 1 + queue.max_retries == 6
    assert len(gaps) == 5
    for gap, base in zip(gaps, DEFAULT_BACKOFF_SECONDS, strict=True):
        assert base * 0.9 - 1 <= gap <= base * 1.1 + 1
    assert (item.status, item.attempts, item.last_error) == ("failed", 6, "e6")
    letter = DeadLetter.objects.get(item=item)
    assert (letter.reason, letter.last_error, letter.attempts, letter.account) == (
        "exhausted", "e6", 6, "acme")
    assert list(item.attempt_set.order_by("number").values_list("number", "outcome")) == [
        (1, "retry"), (2, "retry"), (3, "retry"), (4, "retry"), (5, "retry"), (6, "failed")]
    assert_counters_consistent(queue)


def test_the_last_allowed_retry_is_still_a_retry(queue):
    queue.max_retries = 1
    queue.save()
    item = item_in_status(queue, Status.RETRY)  # attempt 1 failed: one retry left
    lifecycle.transition(item.pk, "dispatch", actor="selector")
    lifecycle.transition(item.pk, "start", actor="worker", expected_attempt=2)

    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=2, error="again")], worker="w")

    item.refresh_from_db()
    assert item.status == Status.FAILED
    assert DeadLetter.objects.get(item=item).reason == "exhausted"


def test_max_retries_zero_fails_on_the_first_error(queue):
    queue.max_retries = 0
    queue.save()
    item = item_in_status(queue, Status.RUNNING)

    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="nope")], worker="w")

    item.refresh_from_db()
    assert item.status == Status.FAILED
    assert DeadLetter.objects.get(item=item).reason == "exhausted"


def test_a_permanent_error_fails_at_once_with_a_dead_letter(queue):
    item = item_in_status(queue, Status.RUNNING)

    results = lifecycle.finish(
        queue, [Outcome(item_id=item.pk, attempt=1, error="invalid address", permanent=True,
                        traceback="tb")], worker="worker-2")

    assert results["fail"].changed_ids == [item.pk]
    item.refresh_from_db()
    assert (item.status, item.last_error) == ("failed", "invalid address")
    assert item.finished_at is not None
    letter = DeadLetter.objects.get(item=item)
    assert (letter.reason, letter.last_error, letter.attempts, letter.queue_id) == (
        "permanent", "invalid address", 1, queue.pk)
    attempt = Attempt.objects.get(item=item)
    assert (attempt.outcome, attempt.error, attempt.traceback, attempt.worker) == (
        "failed", "invalid address", "tb", "worker-2")
    assert_counters_consistent(queue)


def test_finish_settles_a_batch_of_mixed_outcomes_in_one_call(queue):
    ok, retry, bad = items_in_status(queue, Status.RUNNING, 3)

    results = lifecycle.finish(queue, [
        Outcome(item_id=ok.pk, attempt=1),
        Outcome(item_id=retry.pk, attempt=1, error="later"),
        Outcome(item_id=bad.pk, attempt=1, error="never", permanent=True),
    ], worker="w")

    assert {kind: r.changed_ids for kind, r in results.items()} == {
        "complete": [ok.pk], "retry": [retry.pk], "fail": [bad.pk]}
    assert dict(Item.objects.filter(queue=queue).values_list("pk", "status")) == {
        ok.pk: "complete", retry.pk: "retry", bad.pk: "failed"}
    assert_counters_consistent(queue)


def test_long_errors_and_tracebacks_are_clipped(queue):
    item = item_in_status(queue, Status.RUNNING)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1, error="e" * 50_000,
                                     traceback="t" * 50_000)], worker="w")
    item.refresh_from_db()
    attempt = Attempt.objects.get(item=item)
    assert len(item.last_error) == len(attempt.error) == lifecycle.ERROR_LIMIT
    assert len(attempt.traceback) == lifecycle.TRACEBACK_LIMIT


# --- the sweeper's rescue --------------------------------------------------------------------

@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.RUNNING])
def test_rescue_lost_counts_the_attempt_and_schedules_a_retry(queue, status):
    item = item_in_status(queue, status)
    before = timezone.now()

    results = lifecycle.rescue_lost(queue, {item.pk: 1})

    assert results["retry"].changed_ids == [item.pk]
    item.refresh_from_db()
    assert (item.status, item.previous_status, item.last_error, item.attempts) == (
        "retry", status, "worker lost", 1)
    assert before + timedelta(seconds=108) <= item.run_at <= timezone.now() + timedelta(
        seconds=132)
    attempt = Attempt.objects.get(item=item)
    assert (attempt.number, attempt.outcome, attempt.error) == (1, "lost", "worker lost")
    assert (attempt.started_at is None) == (status == Status.DISPATCHED)
    event = item.events.order_by("-id").first()
    assert (event.transition, event.actor, event.reason) == ("lost", "sweeper", "worker lost")
    assert not DeadLetter.objects.exists()
    assert_counters_consistent(queue)


@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.RUNNING])
def test_rescue_lost_fails_the_item_when_its_attempts_are_exhausted(queue, status):
    queue.max_retries = 0
    queue.save()
    item = item_in_status(queue, status)

    results = lifecycle.rescue_lost(queue, {item.pk: 1})

    assert results["fail"].changed_ids == [item.pk]
    item.refresh_from_db()
    assert (item.status, item.last_error) == ("failed", "worker lost")
    letter = DeadLetter.objects.get(item=item)
    assert (letter.reason, letter.last_error, letter.attempts) == ("worker lost",
                                                                   "worker lost", 1)
    assert Attempt.objects.get(item=item).outcome == "lost"
    assert_counters_consistent(queue)


def test_rescue_lost_leaves_an_item_that_moved_on_alone(queue):
    item = item_in_status(queue, Status.RUNNING)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1)], worker="w")

    results = lifecycle.rescue_lost(queue, {item.pk: 1})

    assert results["retry"].changed == []
    item.refresh_from_db()
    assert item.status == Status.COMPLETE
    assert Attempt.objects.filter(item=item).count() == 1


# --- retry_delay -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 42])
def test_retry_delay_stays_within_ten_percent_of_each_delay(seed):
    rng = random.Random(seed)
    for number, base in enumerate(DEFAULT_BACKOFF_SECONDS, start=1):
        for _ in range(200):
            assert base * 0.9 <= lifecycle.retry_delay(DEFAULT_BACKOFF_SECONDS, number,
                                                       rng) <= base * 1.1


def test_retry_delay_repeats_the_last_delay_beyond_the_list():
    rng = random.Random(7)
    for number in (6, 7, 20, 100):
        assert 2700 * 0.9 <= lifecycle.retry_delay(DEFAULT_BACKOFF_SECONDS, number, rng) \
            <= 2700 * 1.1
    assert 20 * 0.9 <= lifecycle.retry_delay([10, 20], 5, rng) <= 20 * 1.1
    assert 10 * 0.9 <= lifecycle.retry_delay([10, 20], 1, rng) <= 10 * 1.1


def test_retry_delay_jitters_and_is_reproducible_with_a_seed():
    first = [lifecycle.retry_delay([600], 1, random.Random(3)) for _ in range(3)]
    assert len(set(first)) == 1  # same seed, same delay
    rng = random.Random(3)
    spread = {round(lifecycle.retry_delay([600], 1, rng), 6) for _ in range(50)}
    assert len(spread) > 40
    assert min(spread) < 600 < max(spread)


# --- outcomes per minute ---------------------------------------------------------------------

def test_rollup_counts_outcomes_per_minute(queue):
    items_in_status(queue, Status.COMPLETE, 3)
    items_in_status(queue, Status.FAILED, 2)
    items_in_status(queue, Status.CANCELLED, 1)
    requeued = item_in_status(queue, Status.COMPLETE)
    lifecycle.transition(requeued.pk, "requeue", actor=ACTOR)  # leaving complete is no outcome
    assert not OutcomeMinute.objects.exists()

    counters.rollup()

    totals = dict(OutcomeMinute.objects.filter(queue=queue).values("status")
                  .annotate(total=Sum("count")).values_list("status", "total"))
    assert totals == {"complete": 4, "failed": 2, "cancelled": 1}
    for row in OutcomeMinute.objects.all():
        assert row.minute.second == 0 and row.minute.microsecond == 0
        assert abs(row.minute - timezone.now()) < timedelta(minutes=2)


def test_rollup_counts_retries_as_outcomes(queue):
    items_in_status(queue, Status.RETRY, 2)
    counters.rollup()
    assert OutcomeMinute.objects.filter(queue=queue, status="retry").aggregate(
        n=Sum("count"))["n"] == 2


def run_on(cluster: str, queue) -> tuple[int, tuple]:
    """A selector round's batch claimed and started by `cluster`: (item id, the claim a worker
    of that cluster guards its outcomes with)."""
    from queues.engine import selector
    round_ = selector.run_round(queue)
    [(pk, attempt, token)] = round_.batch
    lifecycle.claim([[pk, attempt, token]], cluster)
    lifecycle.start_claimed([pk], cluster=cluster, expected_attempts={pk: attempt},
                            tokens=[token])
    return pk, lifecycle.claimed_by(cluster, [token])


def test_a_frozen_clusters_late_result_is_refused_after_a_retry_ran_the_item_again():
    """A retry resets the attempt number, so the number alone would let the late result of
    the first run land on the second."""
    queue = QueueFactory(max_retries=0)
    enqueue(queue.key, account="acme", identifier="webhook-1")
    pk, frozen = run_on("host:1", queue)
    lifecycle.rescue_lost(queue, {pk: 1})  # the cluster stopped beating
    lifecycle.apply("requeue", [pk], actor="admin")
    _, live = run_on("host:2", queue)

    late = lifecycle.finish(queue, [Outcome(item_id=pk, attempt=1)], worker="w", guard=frozen)

    assert late["complete"].changed == []
    assert Item.objects.get(pk=pk).status == Status.RUNNING
    done = lifecycle.finish(queue, [Outcome(item_id=pk, attempt=1)], worker="w", guard=live)
    assert [row.id for row in done["complete"].changed] == [pk]


def test_a_rescue_guarded_by_status_leaves_an_item_that_started_meanwhile():
    queue = QueueFactory()
    item = item_in_status(queue, Status.DISPATCHED)
    lifecycle.apply("start", [item.pk], actor="worker", expected_attempts={item.pk: 1})

    results = lifecycle.rescue_lost(queue, {item.pk: 1},
                                    guard=("status = %s", [Status.DISPATCHED]))

    assert results["retry"].changed == []
    assert Item.objects.get(pk=item.pk).status == Status.RUNNING
