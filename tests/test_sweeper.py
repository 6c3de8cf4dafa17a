"""queues.engine.sweeper: rescue of lost items, retention, counters, and a record of every run."""

import logging
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queues import enqueue_many
from queues.engine import counters, heartbeat, lifecycle, selector, sweeper
from queues.engine.worker import run_batch
from queues.models import (
    Attempt,
    ClusterHeartbeat,
    DeadLetter,
    Item,
    ItemEvent,
    SelectorRound,
    Status,
    SweepRun,
)
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


def dispatched(queue, n=1, prefix="item"):
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"{prefix}-{i}"}
                             for i in range(n)])
    return selector.run_round(queue).item_ids


def age(ids, **delta):
    Item.objects.filter(pk__in=ids).update(updated_at=timezone.now() - timedelta(**delta))


def assert_counters_true(queue):
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk])


def test_it_rescues_items_dispatched_past_the_dispatch_timeout():
    queue = QueueFactory(dispatch_timeout=timedelta(minutes=5))
    ids = dispatched(queue, 2)
    age(ids, minutes=6)
    counts = sweeper.run()
    assert counts["dispatched items lost, retried"] == 2
    for item in Item.objects.filter(pk__in=ids):
        assert (item.status, item.last_error, item.attempts) == (Status.RETRY, "worker lost", 1)
        assert item.run_at > timezone.now()
    assert list(Attempt.objects.values_list("outcome", flat=True)) == ["lost", "lost"]
    assert_counters_true(queue)


def test_it_rescues_running_items_a_minute_past_their_handler_timeout_only():
    """The batch records a timeout at the deadline itself; still running a minute later means
    its worker process died under a cluster that beats on."""
    queue = QueueFactory(handler_timeout=timedelta(minutes=2), stale_threshold=timedelta(hours=2))
    ids = dispatched(queue, 2)
    lifecycle.apply("start", ids, actor="worker")
    age(ids[:1], minutes=3, seconds=5)
    age(ids[1:], minutes=2, seconds=55)
    counts = sweeper.run()
    assert counts["running items lost, retried"] == 1
    assert "dispatched items lost, retried" not in counts
    assert Item.objects.get(pk=ids[0]).status == Status.RETRY
    assert Item.objects.get(pk=ids[1]).status == Status.RUNNING


def test_the_selector_loop_rescues_overdue_running_items_between_sweeps():
    queue = QueueFactory(handler_timeout=timedelta(minutes=2))
    ids = dispatched(queue, 1)
    lifecycle.apply("start", ids, actor="worker")
    age(ids, minutes=4)

    assert sweeper.rescue_overdue() == {"running items lost, retried": 1}
    assert Item.objects.get(pk=ids[0]).status == Status.RETRY
    assert sweeper.rescue_overdue() == {}


def test_a_lost_item_with_no_retries_left_goes_to_the_dead_letters():
    queue = QueueFactory(max_retries=0)
    ids = dispatched(queue)
    age(ids, hours=1)
    sweeper.run()
    item = Item.objects.get(pk=ids[0])
    assert item.status == Status.FAILED
    assert DeadLetter.objects.get(item=item).reason == "worker lost"


def test_a_late_delivery_after_the_rescue_does_nothing():
    queue = QueueFactory(handler="noop")
    ids = dispatched(queue)
    age(ids, hours=1)
    sweeper.run()
    assert run_batch(queue.pk, [[ids[0], 1]]) == {"stale": 1}
    assert Item.objects.get(pk=ids[0]).status == Status.RETRY


def test_it_prunes_finished_items_past_retention_with_their_history():
    queue = QueueFactory(retention_days=60, handler="noop")
    ids = dispatched(queue, 3)
    run_batch(queue.pk, [[pk, 1] for pk in ids])
    long_ago = timezone.now() - timedelta(days=61)
    Item.objects.filter(pk__in=ids[:2]).update(finished_at=long_ago)
    Attempt.objects.filter(item_id__in=ids[:2]).update(finished_at=long_ago)
    ItemEvent.objects.filter(item_id__in=ids[:2]).update(at=long_ago)
    counts = sweeper.run()
    assert counts["items pruned"] == 2
    assert counts["item events pruned"] == 8  # enqueued, dispatched, started, completed
    assert list(Item.objects.values_list("pk", flat=True)) == ids[2:]
    assert not ItemEvent.objects.filter(item_id__in=ids[:2]).exists()
    assert not Attempt.objects.filter(item_id__in=ids[:2]).exists()
    assert ItemEvent.objects.filter(item_id=ids[2]).count() == 4
    assert_counters_true(queue)


def test_events_go_by_their_own_age_even_of_an_item_still_live():
    queue = QueueFactory(retention_days=7)
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": "slow"}])
    pk = item.pk
    ItemEvent.objects.update(at=timezone.now() - timedelta(days=8))
    lifecycle.apply("cancel", [pk], actor="user:ops")
    lifecycle.apply("requeue", [pk], actor="user:ops")
    counts, _ = sweeper.step()
    assert counts["item events pruned"] == 1
    assert list(ItemEvent.objects.filter(item_id=pk).values_list("transition", flat=True)
                .order_by("id")) == ["cancelled", "requeued"]
    assert Item.objects.get(pk=pk).status == Status.QUEUED


def test_each_queue_keeps_its_events_as_long_as_its_own_retention():
    short, long = QueueFactory(retention_days=2), QueueFactory(retention_days=30)
    for queue in (short, long):
        enqueue_many(queue.key, [{"account": "acme", "identifier": "a"}])
    ItemEvent.objects.update(at=timezone.now() - timedelta(days=3))
    counts, more = sweeper.step()
    assert (counts["item events pruned"], more) == (1, False)
    assert list(ItemEvent.objects.values_list("queue_id", flat=True)) == [long.pk]


def test_a_slow_batch_halves_the_next_and_a_quick_one_grows_it_by_a_quarter():
    size = sweeper.BatchSize(start=400, least=100, most=1000, target_seconds=0.1)
    size.took(0.25)
    assert size.size == 200
    size.took(0.2)
    size.took(0.2)
    assert size.size == 100  # never below the least
    size.took(0.07)  # under the target but not well under it: kept
    assert size.size == 100
    size.took(0.01)
    assert size.size == 125
    for _ in range(10):
        size.took(0.01)
    assert size.size == 1000  # never above the most


def test_a_step_deletes_event_batches_back_to_back_while_its_time_lasts(monkeypatch):
    queue = QueueFactory(retention_days=1)
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"i{n}"} for n in range(5)])
    ItemEvent.objects.update(at=timezone.now() - timedelta(days=2))
    monkeypatch.setattr(sweeper, "EVENT_BATCH", sweeper.BatchSize(2, least=2, most=2))
    changed, more = sweeper.step()
    assert (changed["item events pruned"], more) == (5, False)


def test_a_pruning_step_says_go_on_when_its_time_ran_out_on_a_full_batch(monkeypatch):
    queue = QueueFactory(retention_days=1)
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"i{n}"} for n in range(3)])
    ItemEvent.objects.update(at=timezone.now() - timedelta(days=2))
    monkeypatch.setattr(sweeper, "EVENT_BATCH", sweeper.BatchSize(2, least=2, most=2))
    monkeypatch.setattr(sweeper, "EVENT_SECONDS_PER_STEP", 0)
    changed, more = sweeper.step()
    assert (changed["item events pruned"], more) == (2, True)
    changed, more = sweeper.step()
    assert (changed["item events pruned"], more) == (1, False)
    assert ItemEvent.objects.count() == 0


def test_event_batches_walk_the_ids_a_span_at_a_time(monkeypatch):
    queue = QueueFactory(retention_days=1)
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"i{n}"} for n in range(5)])
    e1, e2, e3, e4, e5 = ItemEvent.objects.order_by("id").values_list("id", flat=True)
    assert e5 - e1 == 4
    ItemEvent.objects.exclude(pk=e3).update(at=timezone.now() - timedelta(days=2))
    monkeypatch.setattr(sweeper, "EVENT_ID_SPAN", 2)
    monkeypatch.setattr(sweeper, "EVENT_SECONDS_PER_STEP", 0)
    steps = [sweeper.step() for _ in range(4)]
    assert [(changed["item events pruned"], more) for changed, more in steps] == [
        (2, True), (1, True), (1, False), (0, False)]
    assert list(ItemEvent.objects.values_list("id", flat=True)) == [e3]


def test_events_that_expire_behind_the_pass_wait_for_the_next_sweeper_run():
    queue = QueueFactory(retention_days=1)
    enqueue_many(queue.key, [{"account": "acme", "identifier": f"i{n}"} for n in range(2)])
    first, second = ItemEvent.objects.order_by("id").values_list("id", flat=True)
    ItemEvent.objects.filter(pk=first).update(at=timezone.now() - timedelta(days=2))
    assert sweeper.step()[0]["item events pruned"] == 1
    ItemEvent.objects.filter(pk=second).update(at=timezone.now() - timedelta(days=2))
    assert sweeper.step()[0]["item events pruned"] == 0
    assert sweeper.run()["item events pruned"] == 1


def test_it_keeps_live_items_however_old():
    queue = QueueFactory(retention_days=1)
    enqueue_many(queue.key, [{"account": "acme", "identifier": "old"}])
    Item.objects.update(created_at=timezone.now() - timedelta(days=90))
    sweeper.run()
    assert Item.objects.count() == 1


def test_item_batches_go_past_what_they_pruned_once_per_sweeper_run(monkeypatch):
    queue = QueueFactory(retention_days=1, handler="noop")
    ids = dispatched(queue, 4)
    run_batch(queue.pk, [[pk, 1] for pk in ids])
    for days, pk in zip((5, 4, 3), ids[:3], strict=True):
        Item.objects.filter(pk=pk).update(finished_at=timezone.now() - timedelta(days=days))
    monkeypatch.setattr(sweeper, "ITEM_BATCH", sweeper.BatchSize(2, least=2, most=2))
    assert sweeper.step()[0]["items pruned"] == 2
    # Finished before where the pass has got to: left to the next run's pass.
    Item.objects.filter(pk=ids[3]).update(finished_at=timezone.now() - timedelta(days=6))
    assert sweeper.step()[0]["items pruned"] == 1
    assert sweeper.step()[0]["items pruned"] == 0
    assert list(Item.objects.values_list("pk", flat=True)) == ids[3:]
    assert sweeper.run()["items pruned"] == 1


def test_it_prunes_old_round_records():
    queue = QueueFactory()
    dispatched(queue)
    SelectorRound.objects.update(started_at=timezone.now() - timedelta(days=2))
    assert sweeper.run()["selector rounds pruned"] == 1


def test_every_run_is_recorded_and_only_changes_are_logged(caplog):
    QueueFactory()
    with caplog.at_level(logging.INFO, logger="queues.engine.sweeper"):
        assert sweeper.run() == {}
    run = SweepRun.objects.get()
    assert run.counts == {} and run.finished_at >= run.started_at
    assert "sweeper changed" not in caplog.text


def test_a_step_says_whether_to_go_on_at_once(monkeypatch):
    queue = QueueFactory()
    ids = dispatched(queue, 3)
    age(ids, hours=1)
    monkeypatch.setattr(sweeper, "RESCUE_BATCH", sweeper.BatchSize(2, least=2, most=2))
    changed, more = sweeper.step()
    assert (changed["dispatched items lost, retried"], more) == (2, True)
    changed, more = sweeper.step()
    assert (changed["dispatched items lost, retried"], more) == (1, False)


def test_sweep_command_prints_what_changed(capsys):
    queue = QueueFactory()
    age(dispatched(queue), hours=1)
    call_command("sweep")
    assert "dispatched items lost, retried: 1" in capsys.readouterr().out


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_second_sweeper_does_nothing_while_one_runs():
    holding, release = threading.Event(), threading.Event()

    def hold():
        with sweeper._single_runner() as alone:
            assert alone
            holding.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    try:
        assert sweeper.run() is None
    finally:
        release.set()
        thread.join()
    assert sweeper.run() == {}


# --- clusters that stopped beating ---------------------------------------------------------------

def claimed_by(cluster, queue, prefix, *, start=False):
    [pk] = dispatched(queue, 1, prefix=prefix)
    item = Item.objects.get(pk=pk)
    lifecycle.claim([[pk, item.attempts, item.dispatch_token]], cluster)
    if start:
        lifecycle.apply("start", [pk], actor="worker", expected_attempts={pk: 1},
                        guard=lifecycle.claimed_by(cluster))
    return pk


def beating(cluster, seconds_ago):
    host, pid = cluster.rsplit(":", 1)
    ClusterHeartbeat.objects.create(cluster=cluster, host=host, pid=int(pid),
                                    started_at=timezone.now() - timedelta(hours=1),
                                    beat_at=timezone.now() - timedelta(seconds=seconds_ago))


def test_items_of_a_silent_cluster_are_rescued_dispatched_released_running_lost():
    queue = QueueFactory()
    beating("dead-host:11", seconds_ago=60)
    beating("live-host:12", seconds_ago=5)
    waiting = claimed_by("dead-host:11", queue, "waiting")
    running = claimed_by("dead-host:11", queue, "running", start=True)
    healthy = claimed_by("live-host:12", queue, "healthy", start=True)

    changed = sweeper.rescue_silent_clusters()

    assert changed == {"dispatched items of silent clusters released": 1,
                       "running items of silent clusters lost, retried": 1}
    items = Item.objects.in_bulk([waiting, running, healthy])
    assert (items[waiting].status, items[waiting].attempts, items[waiting].cluster) == (
        Status.QUEUED, 0, "")
    assert items[running].status == Status.RETRY
    assert items[running].last_error == "worker lost: cluster dead-host:11 stopped beating"
    assert items[healthy].status == Status.RUNNING
    # A frozen cluster that wakes up can record nothing.
    late = lifecycle.finish(queue, [lifecycle.Outcome(running, 1)], worker="zombie")
    assert late["complete"].changed == []
    assert_counters_true(queue)


def test_a_cluster_within_its_beats_keeps_its_items():
    queue = QueueFactory()
    beating("slow-host:13", seconds_ago=30)
    pk = claimed_by("slow-host:13", queue, "item", start=True)
    assert sweeper.rescue_silent_clusters() == {}
    assert Item.objects.get(pk=pk).status == Status.RUNNING


def test_a_silent_cluster_handed_back_is_read_again_only_once_it_beat_again_or_after_a_while(
        monkeypatch):
    # Its items are found by reading every in-flight item: not every few seconds for the day
    # a killed cluster stays on record.
    queue = QueueFactory()
    beating("gone-host:15", seconds_ago=60)
    claimed_by("gone-host:15", queue, "first", start=True)
    assert sweeper.rescue_silent_clusters() == {
        "running items of silent clusters lost, retried": 1}
    with CaptureQueriesContext(connection) as queries:
        assert sweeper.rescue_silent_clusters() == {}
    assert not [q for q in queries if Item._meta.db_table in q["sql"]]

    # It beat again (a frozen cluster woke), took an item and fell silent again.
    ClusterHeartbeat.objects.filter(cluster="gone-host:15").update(
        beat_at=timezone.now() - timedelta(seconds=50))
    # (Queues of their own: a round of the first would take its retried item too.)
    second = claimed_by("gone-host:15", QueueFactory(), "second")
    assert sweeper.rescue_silent_clusters() == {
        "dispatched items of silent clusters released": 1}
    assert Item.objects.get(pk=second).status == Status.QUEUED

    # One that claimed without a beat between is found at the next recheck.
    third = claimed_by("gone-host:15", QueueFactory(), "third")
    assert sweeper.rescue_silent_clusters() == {}
    monkeypatch.setattr(sweeper, "HANDED_BACK_RECHECK", 0.0)
    assert sweeper.rescue_silent_clusters() == {
        "dispatched items of silent clusters released": 1}
    assert Item.objects.get(pk=third).status == Status.QUEUED


@pytest.mark.postgres
def test_nobody_is_declared_silent_right_after_the_database_restarted():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        restarted = cursor.fetchone()[0]
    # The cluster's last beat came before the restart: it had no chance to beat since.
    ClusterHeartbeat.objects.create(cluster="host:14", host="host", pid=14,
                                    started_at=restarted - timedelta(hours=1),
                                    beat_at=restarted - timedelta(seconds=60))
    assert heartbeat.silent_clusters(restarted + timedelta(seconds=30)) == {}
    assert list(heartbeat.silent_clusters(restarted + timedelta(seconds=60))) == ["host:14"]


@pytest.mark.postgres
def test_retention_deletes_commit_without_waiting_for_the_flush_and_nothing_else_does():
    def synchronous_commit():
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return cursor.fetchone()[0]

    with sweeper._deleting():
        assert synchronous_commit() == "off"
    assert synchronous_commit() == "on"
