import random
from collections import Counter

import pytest
from django.db.models import Count

from queues.bench import seeding
from queues.engine import counters
from queues.models import (
    IN_FLIGHT_STATUSES,
    Attempt,
    DeadLetter,
    Item,
    ItemEvent,
    OutcomeMinute,
    Status,
)
from tests.factories import QueueFactory

# On PostgreSQL the seeder loads events on a second connection, which commits on its own and
# cannot see rows of an open test transaction: these tests commit for real.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def seeded():
    queues = [QueueFactory(), QueueFactory()]
    result = seeding.seed(items=5000, accounts=60, queues=queues)
    return queues, result


def test_zipf_counts_split_the_total_with_a_skew():
    counts = seeding.zipf_counts(100_000, 1000, random.Random(1))
    assert sum(counts) == 100_000
    assert min(counts) >= 1
    assert max(counts) > 50 * sorted(counts)[len(counts) // 2]


def test_seeder_leaves_counters_equal_to_a_real_count(seeded):
    queues, _ = seeded
    ids = [q.pk for q in queues]
    assert counters.status_counts(ids) == counters.exact_counts(ids)
    counters.rollup()
    assert counters.status_counts(ids) == counters.exact_counts(ids)


def test_seeder_fills_every_status_across_all_accounts_and_queues(seeded):
    queues, result = seeded
    assert result.rows["items"] == Item.objects.count() == 5000
    statuses = set(Item.objects.values_list("status", flat=True).distinct())
    assert statuses == set(Status.values)
    assert Item.objects.values("account").distinct().count() == 60
    per_queue = Counter(Item.objects.values_list("queue_id", flat=True))
    assert set(per_queue) == {q.pk for q in queues}


def test_account_sizes_are_skewed(seeded):
    sizes = sorted(
        (row["n"] for row in Item.objects.values("account").annotate(n=Count("id"))),
        reverse=True,
    )
    assert sizes[0] > 10 * sizes[len(sizes) // 2]


def test_seeded_rows_are_the_rows_the_lifecycle_would_leave(seeded):
    # One finished attempt per dispatch, except the open attempt of an in-flight item.
    for item in Item.objects.all()[:400]:
        open_attempt = item.status in (Status.DISPATCHED, Status.RUNNING)
        assert item.attempt_set.count() == item.attempts - int(open_attempt)
        events = list(item.events.order_by("at", "id").values_list("transition", flat=True))
        assert events[0] == "enqueued"
        assert events.count("dispatched") == item.attempts
        last = ItemEvent.objects.filter(item_id=item.pk).order_by("-at", "-id").first()
        assert last.to_status == item.status
        if item.status in (Status.RETRY, Status.FAILED):
            assert item.last_error
        if item.status in (Status.COMPLETE, Status.FAILED, Status.CANCELLED):
            assert item.finished_at is not None
    failed = Item.objects.filter(status=Status.FAILED)
    assert DeadLetter.objects.count() == failed.count()
    assert not Attempt.objects.filter(outcome="complete").exclude(item__status="complete").exists()


def test_seeded_history_is_consistent_and_in_the_past(seeded):
    """What the demo shows must be possible: no time ahead of now (run_at aside), timelines
    in order, attempts matching their item and tracebacks ending in their attempt's error."""
    from django.db.models import F
    from django.utils import timezone

    now = timezone.now()
    assert not ItemEvent.objects.filter(at__gt=now).exists()
    for column in ("created_at", "updated_at", "dispatched_at", "started_at", "finished_at"):
        assert not Item.objects.filter(**{f"{column}__gt": now}).exists(), column
    assert not Item.objects.filter(finished_at__lt=F("started_at")).exists()
    assert not Attempt.objects.filter(finished_at__lt=F("started_at")).exists()
    for item in Item.objects.exclude(status=Status.QUEUED)[:300]:
        transitions = list(item.events.order_by("at", "id").values_list("at", "to_status"))
        assert transitions[-1][1] == item.status
        if item.finished_at:
            assert transitions[-1][0] == item.finished_at
        last = item.attempt_set.order_by("-number").first()
        if last and item.status != Status.COMPLETE and item.status in (Status.FAILED,
                                                                       Status.RETRY):
            assert (last.error, last.finished_at) == (item.last_error, item.updated_at)
            assert last.traceback.rstrip().endswith(item.last_error)


def test_seeder_rolls_up_recent_outcomes_per_minute(seeded):
    assert OutcomeMinute.objects.filter(status=Status.COMPLETE).exists()
    assert not OutcomeMinute.objects.filter(count__lte=0).exists()


def test_seeding_twice_adds_to_existing_data_and_counters(seeded):
    queues, _ = seeded
    seeding.seed(items=1000, accounts=10, queues=queues[:1], seed_value=8)
    ids = [q.pk for q in queues]
    assert Item.objects.count() == 6000
    assert counters.status_counts(ids) == counters.exact_counts(ids)


def test_a_demo_backlog_is_recent_while_finished_items_go_back_further():
    from datetime import timedelta

    from django.utils import timezone

    queue = QueueFactory()
    seeding.seed(items=2000, accounts=20, queues=[queue], waiting_within=6 * 3600,
                 in_flight_age=3600)
    since = timezone.now() - timedelta(hours=6) - timedelta(seconds=seeding.HISTORY_SECONDS + 3601)
    waiting = Item.objects.filter(status__in=[Status.QUEUED, Status.RETRY, Status.RUNNING])
    assert waiting.exists() and not waiting.filter(created_at__lt=since).exists()
    assert Item.objects.filter(status=Status.COMPLETE, created_at__lt=since).exists()
    assert not ItemEvent.objects.filter(at__gt=timezone.now()).exists()


def test_seeded_queues_hold_in_flight_about_what_a_selector_would_dispatch(monkeypatch):
    # 5,000 items would draw about 75 in flight; at 10 per queue the draws past that stay queued.
    monkeypatch.setattr(seeding, "IN_FLIGHT_PER_QUEUE", 10)
    queues = [QueueFactory(), QueueFactory()]
    seeding.seed(items=5000, accounts=60, queues=queues)
    for queue in queues:
        in_flight = Item.objects.filter(queue=queue, status__in=IN_FLIGHT_STATUSES).count()
        assert 3 <= in_flight <= 20
    assert Item.objects.filter(status=Status.DISPATCHED).exists()
    assert Item.objects.filter(status=Status.RUNNING).exists()
    ids = [q.pk for q in queues]
    assert counters.status_counts(ids) == counters.exact_counts(ids)


def test_a_small_seed_keeps_every_in_flight_draw():
    assert seeding._in_flight_kept(5000, 2) == seeding.IN_FLIGHT_SCALE
    assert seeding._in_flight_kept(10_000_000, 100) == 200_000
