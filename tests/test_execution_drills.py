"""Execution on real work, with real processes on PostgreSQL: django-q2 clusters started as
`manage.py qcluster` at their defaults (each runs its own selector loop), handlers that take
real time, a cluster killed or stopped mid-run. Bounds are generous for a loaded 2-core machine;
the strict figures come from `manage.py bench workload`."""

import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest

from queues import enqueue_many
from queues.bench import processes
from queues.bench import scenarios as bench
from queues.models import Attempt, ClusterHeartbeat, Item, ItemEvent, Status
from tests.factories import QueueFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TERMINAL = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)


def put(queue, identifiers, account="acct"):
    return enqueue_many(queue.key, [{"account": account, "identifier": i} for i in identifiers])


def wait_for(condition, seconds, what="condition"):
    assert processes.wait_for(condition, seconds), f"timed out waiting for {what}"


def demo_queue(key, **fields):
    options = {"min_ms": 0, "max_ms": 0, "retry_rate": 0, "permanent_rate": 0}
    options.update(fields.pop("options", {}))
    return QueueFactory(key=key, handler="demo", handler_options=options,
                        **{"backoff_seconds": [1], **fields})


def completions(queue):
    return Counter(ItemEvent.objects.filter(queue_id=queue.pk, transition="completed")
                   .values_list("item_id", flat=True))


def statuses(queue):
    return Counter(Item.objects.filter(queue=queue).values_list("status", flat=True))


def test_a_cluster_killed_holding_the_whole_concurrency_is_replaced_within_90_seconds():
    queue = demo_queue("drill-kill", concurrency=10, batch_size=10,
                       options={"min_ms": 4000, "max_ms": 4000})
    put(queue, [f"item-{i:02d}" for i in range(30)])
    [doomed] = bench.start_clusters(1)
    survivor = []
    try:
        wait_for(lambda: statuses(queue)[Status.RUNNING] == 10, 60, "10 items running")
        survivor = bench.start_clusters(1)
        wait_for(lambda: ClusterHeartbeat.objects.count() == 2, 60, "the second cluster")
        held = set(Item.objects.filter(queue=queue, status=Status.RUNNING)
                   .values_list("pk", flat=True))
        processes.stop([doomed], signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: Item.objects.filter(pk__in=held, status=Status.RUNNING).count() == 0,
                 90, "the killed cluster's items rescued")
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.RUNNING).exists(), 20,
                 "the queue running again")
        resumed_after = time.monotonic() - killed_at
        wait_for(lambda: statuses(queue) == {Status.COMPLETE: 30}, 90, "every item complete")
    finally:
        processes.stop([doomed, *survivor], signal.SIGKILL)
    assert resumed_after < 90
    assert set(completions(queue).values()) == {1} and len(completions(queue)) == 30
    lost = Attempt.objects.filter(item__queue=queue, outcome="lost")
    assert set(lost.values_list("item_id", flat=True)) == held
    assert {error.split(": cluster")[0] for error in lost.values_list("error", flat=True)} == {
        "worker lost"}


def test_a_handler_past_its_timeout_is_recorded_and_its_late_result_refused(tmp_path):
    done = tmp_path / "completions.txt"
    queue = demo_queue("drill-timeout", handler_timeout=timedelta(seconds=3),
                       backoff_seconds=[600],
                       options={"slow_prefixes": {"long-": 8000}, "completions_file": str(done)})
    put(queue, ["long-1", *(f"quick-{i}" for i in range(5))])
    clusters = bench.start_clusters(1)
    try:
        wait_for(lambda: statuses(queue) == {Status.COMPLETE: 5, Status.RETRY: 1}, 60,
                 "the quick items complete and the long one time out")
        long_item = Item.objects.get(queue=queue, identifier="long-1")
        # The abandoned handler returns after 8 s; its result must not be recorded.
        wait_for(lambda: f"{long_item.pk} 1" in done.read_text().split("\n"), 30,
                 "the abandoned handler to return")
        time.sleep(1)
    finally:
        processes.stop(clusters)
    long_item.refresh_from_db()
    assert long_item.status == Status.RETRY
    assert long_item.last_error.startswith("HandlerTimeout: still running after 3 s")
    assert list(long_item.attempt_set.values_list("outcome", flat=True)) == ["retry"]
    assert set(completions(queue).values()) == {1} and len(completions(queue)) == 5


def test_sigterm_stops_a_cluster_within_its_grace_leaving_nothing_for_the_sweeper():
    queue = demo_queue("drill-stop", batch_size=10,
                       options={"slow_prefixes": {"long-": 30_000}, "min_ms": 500,
                                "max_ms": 500})
    put(queue, [f"long-{i:02d}" for i in range(30)] + [f"short-{i:02d}" for i in range(20)])
    [cluster] = bench.start_clusters(1, env={"QUEUEADMIN_SHUTDOWN_GRACE": "3"})
    try:
        wait_for(lambda: statuses(queue)[Status.RUNNING] >= 20, 60, "batches running")
        time.sleep(1)
        os.kill(cluster.pid, signal.SIGTERM)  # as docker stop does: the main process only
        stopped_at = time.monotonic()
        cluster.wait(timeout=60)
        stopped_after = time.monotonic() - stopped_at
    finally:
        processes.stop([cluster], signal.SIGKILL)
    assert stopped_after < 3 + 20
    # Nothing the stopped cluster held is left dispatched or running for the sweeper.
    assert not Item.objects.filter(queue=queue, status=Status.RUNNING).exists()
    assert not Item.objects.filter(queue=queue, status=Status.DISPATCHED).exclude(
        cluster="").exists()
    shut = Item.objects.filter(queue=queue, status=Status.RETRY)
    assert shut.exists() and set(shut.values_list("last_error", flat=True)) == {"shutdown"}
    assert all(identifier.startswith("long-")
               for identifier in shut.values_list("identifier", flat=True))
    released = ItemEvent.objects.filter(queue_id=queue.pk, transition="released")
    assert set(released.values_list("reason", flat=True)) <= {"shutdown"}
    assert not Attempt.objects.filter(item__queue=queue, outcome="lost").exists()


def test_sigterm_to_the_whole_process_group_ends_the_cluster_and_hands_back_its_items():
    """systemd's default kill mode and `kill -TERM -<pgid>` reach django-q2's sentinel and
    workers too, which die at once: the main process hung for good, beating, its items running
    on no one."""
    queue = demo_queue("drill-group-stop", batch_size=10, concurrency=10,
                       options={"min_ms": 20_000, "max_ms": 20_000})
    put(queue, [f"item-{i:02d}" for i in range(15)])
    [cluster] = bench.start_clusters(1)
    try:
        wait_for(lambda: statuses(queue)[Status.RUNNING] == 10, 60, "10 items running")
        os.killpg(cluster.pid, signal.SIGTERM)
        cluster.wait(timeout=20)
    finally:
        processes.stop([cluster], signal.SIGKILL)
    assert statuses(queue) == {Status.RETRY: 10, Status.QUEUED: 5}
    errors = set(Item.objects.filter(queue=queue, status=Status.RETRY)
                 .values_list("last_error", flat=True))
    assert len(errors) == 1 and errors.pop().endswith("was stopped with its workers")


def test_items_enqueued_across_tick_boundaries_are_dispatched_within_seconds():
    queue = demo_queue("drill-latency")
    put(queue, ["before-start"])
    started = time.monotonic()
    clusters = bench.start_clusters(1)
    try:
        wait_for(lambda: statuses(queue)[Status.COMPLETE] == 1, 20,
                 "a new cluster to run the waiting item")
        first_dispatch = time.monotonic() - started
        for i in range(20):  # 70 s: at least one minute's tick hands the loop over
            put(queue, [f"spread-{i:02d}"])
            time.sleep(3.5)
        wait_for(lambda: statuses(queue)[Status.COMPLETE] == 21, 20, "every item complete")
    finally:
        processes.stop(clusters)
    assert first_dispatch < 20  # includes Django's start-up; bench workload measures it
    waits = [
        (item.dispatched_at - item.created_at).total_seconds()
        for item in Item.objects.filter(queue=queue, identifier__startswith="spread-")
    ]
    assert len(waits) == 20 and max(waits) < 5, sorted(waits)
