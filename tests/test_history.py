"""queues.engine.history: the metric history behind the charts, rolled up set-based from the item
events, rewritten idempotently, summed into hours, read back as percentiles and pruned."""

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Count, Sum
from django.utils import timezone

from queues.bench import seeding
from queues.engine import history
from queues.models import (
    HISTOGRAM_BOUNDS,
    ErrorGroupHour,
    HistoryRun,
    InstallationHour,
    InstallationMinute,
    Item,
    ItemEvent,
    MetricHour,
    MetricMinute,
    Status,
    histogram_column,
)
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db
T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # a minute the tests place events in


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def place(items, minute: datetime, *, wait: float = 5.0, run: float = 0.3):
    """Moves the items' events into `minute`: enqueued at its start, due then, started `wait`
    seconds later, finished (or retried) `run` seconds after that."""
    ids = [item.pk for item in items]
    due = minute
    started = due + timedelta(seconds=wait)
    finished = started + timedelta(seconds=run)
    ItemEvent.objects.filter(item_id__in=ids, transition="enqueued").update(at=due)
    ItemEvent.objects.filter(item_id__in=ids).exclude(transition="enqueued").update(at=finished)
    Item.objects.filter(pk__in=ids).update(created_at=due, run_at=due, started_at=started)
    Item.objects.filter(pk__in=ids, status__in=(Status.COMPLETE, Status.FAILED)).update(
        finished_at=finished)


def queue_row(queue, minute=T, model=MetricMinute):
    return model.objects.get(queue=queue, account="", start=minute)


def minute_rows() -> list[dict]:
    return [{k: v for k, v in row.items() if k != "id"}
            for row in MetricMinute.objects.order_by("queue", "account", "start").values()]


def buckets(row, kind: str) -> dict[int, int]:
    values = {b: getattr(row, histogram_column(kind, b)) for b in range(len(HISTOGRAM_BOUNDS) + 1)}
    return {b: n for b, n in values.items() if n}


def test_a_minute_counts_what_its_items_did(queue):
    place(items_in_status(queue, "complete", 3), T)
    place(items_in_status(queue, "failed", 1), T)
    place(items_in_status(queue, "retry", 2), T)
    place(enqueued(queue, 4, prefix="new"), T)
    place(items_in_status(queue, "complete", 5), T + timedelta(minutes=1))  # the next minute

    history.roll_up(MetricMinute, T, T + timedelta(minutes=2))

    row = queue_row(queue)
    assert (row.completed, row.failed, row.retried, row.enqueued) == (3, 1, 2, 10)
    assert queue_row(queue, T + timedelta(minutes=1)).completed == 5


def test_finished_items_count_their_wait_and_run_time_in_the_buckets(queue):
    place(items_in_status(queue, "complete", 3), T, wait=5.0, run=0.3)
    place(items_in_status(queue, "failed", 1), T, wait=30.0, run=0.003)
    place(items_in_status(queue, "retry", 2), T)  # not finished: no times

    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))

    row = queue_row(queue)
    assert buckets(row, "wait") == {history.bucket_of(5.0): 3, history.bucket_of(30.0): 1}
    assert buckets(row, "run") == {history.bucket_of(0.3): 3, history.bucket_of(0.003): 1}


def test_rolling_a_minute_up_again_replaces_it(queue):
    place(items_in_status(queue, "complete", 3, account="a"), T)
    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))
    before = minute_rows()

    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))
    assert minute_rows() == before

    place(items_in_status(queue, "complete", 2, account="b"), T)  # committed late
    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))
    assert queue_row(queue).completed == 5
    assert dict(MetricMinute.objects.exclude(account="").values_list("account", "completed")) == {
        "a": 3, "b": 2}


def test_a_rewrite_keeps_the_depth_sampled_for_the_minute(queue):
    items_in_status(queue, "queued", 4)
    history.sample_depth(T)
    place(items_in_status(queue, "complete", 1), T)

    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))

    row = queue_row(queue)
    assert (row.depth_queued, row.depth_retry, row.completed) == (4, 0, 1)


def test_only_the_top_accounts_of_a_queue_get_rows_of_their_own(queue):
    for n in range(1, history.TOP_ACCOUNTS + 6):
        place(items_in_status(queue, "complete", n, account=f"acct-{n:02d}"), T)

    history.roll_up(MetricMinute, T, T + timedelta(minutes=1))

    accounts = dict(MetricMinute.objects.exclude(account="").values_list("account", "completed"))
    assert len(accounts) == history.TOP_ACCOUNTS
    assert min(accounts.values()) == 6 and accounts["acct-25"] == 25
    assert queue_row(queue).completed == sum(range(1, history.TOP_ACCOUNTS + 6))


def test_an_hour_sums_its_minutes_and_keeps_the_highest_depth(queue):
    place(items_in_status(queue, "complete", 2, account="a"), T, wait=1.0)
    place(items_in_status(queue, "complete", 3, account="b"), T + timedelta(minutes=30),
          wait=60.0)
    place(items_in_status(queue, "complete", 7), T + timedelta(hours=1))  # the next hour
    history.roll_up(MetricMinute, T, T + timedelta(hours=2))
    MetricMinute.objects.filter(queue=queue, account="", start=T).update(depth_queued=40)
    MetricMinute.objects.filter(queue=queue, account="", start=T + timedelta(minutes=30)).update(
        depth_queued=15)

    history.roll_up_hours(T, T + timedelta(hours=2))

    hour = queue_row(queue, T, MetricHour)
    assert (hour.completed, hour.enqueued, hour.depth_queued) == (5, 5, 40)
    assert buckets(hour, "wait") == {history.bucket_of(1.0): 2, history.bucket_of(60.0): 3}
    assert dict(MetricHour.objects.filter(start=T).exclude(account="")
                .values_list("account", "completed")) == {"a": 2, "b": 3}
    assert queue_row(queue, T + timedelta(hours=1), MetricHour).completed == 7


def test_percentiles_from_summed_buckets_match_the_exact_ones_within_a_bucket():
    rng = random.Random(22)
    minutes = [[10 ** rng.uniform(-3, 3) for _ in range(rng.randint(1, 400))] for _ in range(30)]
    summed = [0] * (len(HISTOGRAM_BOUNDS) + 1)
    for values in minutes:
        for value in values:
            summed[history.bucket_of(value)] += 1
    everything = sorted(v for values in minutes for v in values)
    for fraction in (0.5, 0.95, 0.99):
        exact = everything[math.ceil(fraction * len(everything)) - 1]  # nearest rank
        bucket = history.bucket_of(exact)
        low = HISTOGRAM_BOUNDS[bucket - 1] if bucket else 0.0
        assert low <= history.percentile(summed, fraction) <= HISTOGRAM_BOUNDS[bucket]
    assert history.percentile([0] * len(summed), 0.5) is None


def test_pruning_keeps_48_hours_of_minutes_and_30_days_of_hours(queue):
    now = T + timedelta(days=40)
    for start in (now - timedelta(hours=49), now - timedelta(hours=47)):
        MetricMinute.objects.create(queue=queue, start=start)
    for start in (now - timedelta(days=31), now - timedelta(days=29)):
        MetricHour.objects.create(queue=queue, start=start)
        InstallationHour.objects.create(start=start)
    InstallationMinute.objects.create(start=now - timedelta(hours=49))
    HistoryRun.objects.create(started_at=now - timedelta(days=3), finished_at=now,
                              rolled_to=now, last_event_id=0)

    pruned = history.prune(now)

    assert list(MetricMinute.objects.values_list("start", flat=True)) == [
        now - timedelta(hours=47)]
    assert list(MetricHour.objects.values_list("start", flat=True)) == [now - timedelta(days=29)]
    assert list(InstallationHour.objects.values_list("start", flat=True)) == [
        now - timedelta(days=29)]
    assert not HistoryRun.objects.exists() and not InstallationMinute.objects.exists()
    assert pruned["metric minutes pruned"] == pruned["metric hours pruned"] == 1


def test_the_first_run_only_marks_where_the_events_begin(queue):
    items_in_status(queue, "complete", 2)

    counts = history.run()

    assert not MetricMinute.objects.exists()
    assert counts == {}
    run = HistoryRun.objects.get()
    assert run.last_event_id == ItemEvent.objects.order_by("-id").first().pk


def test_a_run_rolls_up_the_events_after_an_earlier_runs_mark(queue):
    now = timezone.now()
    history.run(now - timedelta(minutes=5))
    items = items_in_status(queue, "complete", 2)
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    place(items, minute)

    counts = history.run(now)

    assert queue_row(queue, minute).completed == 2
    assert queue_row(queue, minute.replace(minute=0), MetricHour).completed == 2
    assert counts["minutes rewritten"] >= 2 and counts["depth samples"] == 1
    assert HistoryRun.objects.count() == 2
    latest = queue_row(queue, now.replace(second=0, microsecond=0) - timedelta(minutes=1))
    assert latest.depth_queued == 0 and latest.depth_failed == 0


def test_series_sums_the_queues_per_step_and_says_where_nothing_was_kept(queue):
    other = QueueFactory(key="reports")
    for q, completed, depth in ((queue, 3, 10), (other, 4, 5)):
        MetricMinute.objects.create(queue=q, start=T, completed=completed, depth_queued=depth)
        MetricMinute.objects.create(queue=q, start=T + timedelta(minutes=1), completed=1,
                                    depth_queued=depth * 2)
    MetricMinute.objects.create(queue=queue, account="a", start=T, completed=3)

    steps = history.series([queue.pk, other.pk], T, T + timedelta(minutes=15),
                           timedelta(minutes=5), ["completed", "depth_queued"])

    assert steps == [{"completed": 9, "depth_queued": 30}, None, None]


def test_a_run_sums_every_queue_into_the_installations_rows_that_charts_of_every_queue_read(
        queue):
    other = QueueFactory(key="reports")
    now = timezone.now()
    history.run(now - timedelta(minutes=5))
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    place(items_in_status(queue, "complete", 2), minute, wait=1.0)
    place(items_in_status(other, "complete", 3, account="b"), minute, wait=30.0)
    place(items_in_status(other, "failed", 1), minute)

    counts = history.run(now)

    total = InstallationMinute.objects.get(start=minute)
    assert (total.completed, total.failed, total.enqueued) == (5, 1, 6)
    assert buckets(total, "wait") == {history.bucket_of(1.0): 2, history.bucket_of(30.0): 3,
                                      history.bucket_of(5.0): 1}
    last = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    assert InstallationMinute.objects.get(start=last).depth_failed == 1  # the samples summed
    assert InstallationHour.objects.get(start=minute.replace(minute=0)).completed == 5
    assert counts["installation periods rewritten"] >= 3
    columns = ["completed", "failed", "depth_failed"]
    start, step = last - timedelta(minutes=14), timedelta(minutes=5)
    assert history.series(None, start, last + timedelta(minutes=1), step, columns) == \
        history.series([queue.pk, other.pk], start, last + timedelta(minutes=1), step, columns)
    assert history.series(None, minute.replace(minute=0), minute.replace(minute=0) + timedelta(
        hours=1), timedelta(hours=1), ["completed"]) == [{"completed": 5}]


def test_top_accounts_are_read_from_the_account_rows(queue):
    for account, completed in (("a", 5), ("b", 9), ("c", 1)):
        MetricHour.objects.create(queue=queue, account=account, start=T, completed=completed)
    MetricHour.objects.create(queue=queue, account="a", start=T + timedelta(hours=1),
                              completed=2)

    accounts, per_step = history.top_accounts(queue.pk, T, T + timedelta(hours=2),
                                              timedelta(hours=1), 2)

    assert accounts == ["b", "a"]
    assert per_step == [{"a": 5, "b": 9}, {"a": 2}]


@pytest.mark.django_db(transaction=True)
def test_bench_seed_writes_30_days_of_history_that_agrees_with_its_events():
    queue = QueueFactory(key="bench-history")
    seeding.seed(items=3000, accounts=40, queues=[queue])

    hours = MetricHour.objects.filter(queue=queue, account="")
    assert hours.count() > 24 * 25
    oldest = hours.order_by("start").first().start
    assert timezone.now() - oldest > timedelta(days=29)
    assert MetricMinute.objects.filter(queue=queue, account="").exists()
    completed = ItemEvent.objects.filter(queue=queue, to_status=Status.COMPLETE, at__gte=oldest)
    assert hours.aggregate(n=Sum("completed"))["n"] == completed.count()
    assert InstallationHour.objects.filter(start__gte=oldest).aggregate(
        n=Sum("completed"))["n"] == completed.count()
    per_hour = (MetricHour.objects.filter(queue=queue).exclude(account="").values("start")
                .annotate(n=Count("id")).values_list("n", flat=True))
    assert per_hour and max(per_hour) <= history.TOP_ACCOUNTS
    # The error groups' hours too: every failed attempt in one of them, few groups an hour.
    error_hours = ErrorGroupHour.objects.filter(queue=queue)
    failures = ItemEvent.objects.filter(queue=queue, to_status__in=(Status.RETRY, Status.FAILED),
                                        at__gte=oldest)
    assert error_hours.aggregate(n=Sum("failures"))["n"] == failures.count() > 0
    assert set(error_hours.values_list("kind", flat=True)) >= {"ConnectionError", "HTTP <n>"}
    groups = error_hours.values("start").annotate(n=Count("id")).values_list("n", flat=True)
    assert max(groups) <= len(seeding.ERRORS)


def test_the_runs_after_a_backfill_roll_up_every_minute_from_where_it_stopped(queue):
    """A backfill rolls up to the last whole minute; a run a minute later rewrites from there
    even for events that got their ids before the backfill ended."""
    now = timezone.now().replace(second=30, microsecond=0)
    end = now.replace(second=0)
    earlier = items_in_status(queue, "failed", 2)
    place(earlier, end - timedelta(minutes=5))
    # Failed in the backfill's own unfinished minute, before it took any mark.
    during = items_in_status(queue, "failed", 3)
    place(during, end)
    history.backfill([queue.pk], now)
    assert queue_row(queue, end - timedelta(minutes=5)).failed == 2
    later = items_in_status(queue, "failed", 4)
    place(later, end + timedelta(minutes=1))

    for minutes in (1, 2, 3):
        history.run(now + timedelta(minutes=minutes))

    assert queue_row(queue, end).failed == 3
    assert queue_row(queue, end + timedelta(minutes=1)).failed == 4
    assert queue_row(queue, end - timedelta(minutes=5)).failed == 2
