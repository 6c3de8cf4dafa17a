"""Fault drills with real processes on PostgreSQL: worker clusters (manage.py qcluster) and a
selector loop started as subprocesses against the test database."""

import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Count

from queues import enqueue_many
from queues.bench import processes
from queues.bench import scenarios as bench
from queues.engine import sweeper
from queues.models import Attempt, DeadLetter, Item, ItemEvent, SelectorRound, Status
from tests.factories import QueueFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TERMINAL = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)


def put(queue, n, prefix="drill"):
    for offset in range(0, n, 1000):
        enqueue_many(queue.key, [{"account": f"acct-{i % 37:02d}", "identifier": f"{prefix}-{i}"}
                                 for i in range(offset, min(n, offset + 1000))])


def wait_for(condition, seconds):
    assert processes.wait_for(condition, seconds), "timed out"


def test_two_clusters_push_10k_items_through_none_lost_none_completed_twice():
    items = 10_000
    queue = QueueFactory(key="drill", handler="noop", batch_size=60, concurrency=100_000)
    put(queue, items)
    clusters = bench.start_clusters(2)
    try:
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.COMPLETE).count()
                 == items, 600)
    finally:
        processes.stop(clusters)
    completions = Counter(ItemEvent.objects.filter(queue_id=queue.pk, transition="completed")
                          .values_list("item_id", flat=True))
    assert len(completions) == items and set(completions.values()) == {1}
    assert not Attempt.objects.filter(item__queue=queue).exclude(outcome="complete").exists()
    rounds = list(SelectorRound.objects.filter(queue=queue).order_by("started_at")
                  .values_list("started_at", "duration_ms"))
    # A round is timed on the monotonic clock and stamped with the wall clock, which the host
    # may slew by a little: rounds hold the queue's lock in turn, so each starts after the
    # previous one ended, give or take that slew.
    slew = timedelta(milliseconds=5)
    for (start, duration), (next_start, _) in zip(rounds, rounds[1:], strict=False):
        assert start + timedelta(milliseconds=duration) <= next_start + slew


def test_a_cluster_killed_mid_batch_loses_nothing_and_runs_nothing_twice():
    # Each item takes a second, so the kill lands while batches run.
    queue = QueueFactory(key="drill", handler="demo", batch_size=20, concurrency=100_000,
                         backoff_seconds=[1],
                         handler_options={"min_ms": 1000, "max_ms": 1000, "retry_rate": 0,
                                          "permanent_rate": 0})
    put(queue, 200)
    first = bench.start_clusters(1)
    try:
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.RUNNING).exists(), 60)
    finally:
        processes.stop(first, signal.SIGKILL)
    lost = Item.objects.filter(queue=queue, status__in=(Status.DISPATCHED, Status.RUNNING))
    lost_count = lost.count()
    assert lost_count
    # Test-short thresholds: the drill, not the system check, decides how long "lost" takes.
    queue.__class__.objects.filter(pk=queue.pk).update(
        dispatch_timeout=timedelta(seconds=1), stale_threshold=timedelta(seconds=1))
    time.sleep(1.5)
    rescued = sweeper.run()
    assert sum(n for action, n in rescued.items() if "lost" in action) == lost_count
    second = bench.start_clusters(1)
    try:
        wait_for(lambda: not Item.objects.filter(queue=queue).exclude(
            status__in=TERMINAL).exists(), 240)
    finally:
        processes.stop(second)
    statuses = dict(Item.objects.filter(queue=queue).values_list("status")
                    .annotate(n=Count("id")))
    assert statuses == {Status.COMPLETE: 200}
    completions = Counter(ItemEvent.objects.filter(queue_id=queue.pk, transition="completed")
                          .values_list("item_id", flat=True))
    assert set(completions.values()) == {1}
    assert Attempt.objects.filter(item__queue=queue, outcome="lost").exists()
    assert not DeadLetter.objects.filter(queue=queue).exists()


def drive_until_terminal(queue, seconds):
    """Run the sweeper every second, as its schedule would with test-short thresholds, until
    every item of the queue is terminal."""
    deadline = time.monotonic() + seconds
    while Item.objects.filter(queue=queue).exclude(status__in=TERMINAL).exists():
        assert time.monotonic() < deadline, "items still not terminal"
        sweeper.run()
        time.sleep(1)


def test_a_handler_that_always_raises_makes_one_plus_max_retries_attempts_then_dead_letters():
    queue = QueueFactory(key="drill", handler="demo", batch_size=60, concurrency=100_000,
                         max_retries=2, backoff_seconds=[1],
                         handler_options={"min_ms": 0, "max_ms": 0, "retry_rate": 1.0,
                                          "permanent_rate": 0})
    put(queue, 50)
    clusters = bench.start_clusters(1)
    try:
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.FAILED).count() == 50,
                 120)
    finally:
        processes.stop(clusters)
    outcomes = {}
    for item_id, outcome in Attempt.objects.filter(item__queue=queue).order_by(
            "item_id", "number").values_list("item_id", "outcome"):
        outcomes.setdefault(item_id, []).append(outcome)
    # 1 + max_retries attempts each: the last one, exhausted, counts as failed.
    assert len(outcomes) == 50
    assert {tuple(kinds) for kinds in outcomes.values()} == {("retry", "retry", "failed")}
    assert DeadLetter.objects.filter(queue=queue, reason="exhausted").count() == 50
    assert not ItemEvent.objects.filter(queue_id=queue.pk, transition="completed").exists()


def test_a_poison_item_that_kills_its_worker_ends_in_the_dead_letters():
    # One item per round, so the poison takes down no batch-mates and the outcome is exact.
    queue = QueueFactory(key="drill", handler="demo", batch_size=1, concurrency=100_000,
                         max_retries=2, backoff_seconds=[1],
                         dispatch_timeout=timedelta(seconds=2),
                         stale_threshold=timedelta(seconds=2),
                         handler_options={"min_ms": 0, "max_ms": 0, "retry_rate": 0,
                                          "permanent_rate": 0,
                                          "crash_identifiers": ["drill-3"]})
    put(queue, 10)
    clusters = bench.start_clusters(1)
    try:
        drive_until_terminal(queue, 180)
    finally:
        processes.stop(clusters)
    poison = Item.objects.get(queue=queue, identifier="drill-3")
    assert poison.status == Status.FAILED
    assert list(Attempt.objects.filter(item=poison).values_list("outcome", flat=True)) == [
        "lost"] * 3
    assert DeadLetter.objects.get(item=poison).reason == "worker lost"
    others = Item.objects.filter(queue=queue).exclude(pk=poison.pk)
    assert set(others.values_list("status", flat=True)) == {Status.COMPLETE}
    completions = Counter(ItemEvent.objects.filter(queue_id=queue.pk, transition="completed")
                          .values_list("item_id", flat=True))
    assert len(completions) == 9 and set(completions.values()) == {1}
