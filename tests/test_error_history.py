"""The error groups' failure history (queues.engine.history): each group's failed attempts per
queue per minute and hour, rolled up from the failure events of the run's window, rewritten
idempotently, capped per period with the rest as "other", pruned, and read for the errors page
in one statement."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from queues.engine import history, lifecycle
from queues.engine.errors import group_key, normalise_error
from queues.models import (
    OTHER_ERROR_GROUP,
    ErrorGroupHour,
    ErrorGroupMinute,
    HistoryRun,
    ItemEvent,
)
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db
T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def fail(queue, errors: list[str], at: datetime, *, permanent: bool = False):
    """Items run and failed through the lifecycle, one per error, their failure events moved to
    `at`."""
    items = items_in_status(queue, "running", len(errors))
    lifecycle.finish(queue, [lifecycle.Outcome(item_id=item.pk, attempt=1, error=error,
                                               permanent=permanent)
                             for item, error in zip(items, errors, strict=True)],
                     worker="worker-1")
    ItemEvent.objects.filter(item_id__in=[i.pk for i in items],
                             to_status__in=("retry", "failed")).update(at=at)


def failure_events(queue, at: datetime, counts: dict[str, int]):
    """`counts[error]` failure events of each error at `at`, written straight to the events
    table as the lifecycle writes them: for many groups at once."""
    ItemEvent.objects.bulk_create([
        ItemEvent(item_id=0, queue=queue, account="acme", identifier="x",
                  transition="retry_scheduled", from_status="running", to_status="retry",
                  attempt=1, at=at, actor="worker", reason=error)
        for error, n in counts.items() for _ in range(n)])


def word(n: int) -> str:
    """Letters only: the normalising turns digits into <n>, so groups are told apart by words."""
    return chr(97 + n // 26) + chr(97 + n % 26)


def rows(model=ErrorGroupMinute) -> dict[tuple, int]:
    return {(row.start, row.kind, row.message): row.failures
            for row in model.objects.order_by("start", "group_key")}


def test_failures_are_counted_per_group_and_minute_from_the_windows_events(queue):
    fail(queue, ["TimeoutError: read 3 s", "TimeoutError: read 12.5 s\nTraceback ..."], T)
    fail(queue, ["ValueError: invoice 'INV-7' has no lines"], T, permanent=True)
    fail(queue, ["TimeoutError: read 9 s"], T + MINUTE)
    fail(queue, ["TimeoutError: read 1 s"], T + 5 * MINUTE)  # after the window
    items_in_status(queue, "complete", 2)  # not failures

    written = history.roll_up_errors(ErrorGroupMinute, T, T + 2 * MINUTE)

    assert rows() == {
        (T, "TimeoutError", "TimeoutError: read <n> s"): 2,
        (T, "ValueError", "ValueError: invoice '…' has no lines"): 1,
        (T + MINUTE, "TimeoutError", "TimeoutError: read <n> s"): 1,
    }
    assert written == 3
    row = ErrorGroupMinute.objects.get(start=T, kind="ValueError")
    assert row.group_key == group_key(*normalise_error("ValueError: invoice 'X' has no lines"))


def test_only_events_above_the_runs_mark_are_read(queue):
    fail(queue, ["TimeoutError: read 3 s"], T)
    mark = ItemEvent.objects.order_by("-id").values_list("id", flat=True).first()
    fail(queue, ["TimeoutError: read 4 s"], T)

    history.roll_up_errors(ErrorGroupMinute, T, T + MINUTE, mark)

    assert rows() == {(T, "TimeoutError", "TimeoutError: read <n> s"): 1}


def test_rolling_up_again_rewrites_the_periods_and_never_double_counts(queue):
    fail(queue, ["TimeoutError: read 3 s", "KeyError: 'customer'"], T)
    history.roll_up_errors(ErrorGroupMinute, T, T + MINUTE)
    history.roll_up_error_hours(T, T + timedelta(hours=1))
    minutes, hours = rows(), rows(ErrorGroupHour)

    history.roll_up_errors(ErrorGroupMinute, T, T + MINUTE)
    history.roll_up_error_hours(T, T + timedelta(hours=1))
    assert (rows(), rows(ErrorGroupHour)) == (minutes, hours)

    fail(queue, ["TimeoutError: read 8 s"], T)  # committed late, rolled up by the next run
    history.roll_up_errors(ErrorGroupMinute, T, T + MINUTE)
    history.roll_up_error_hours(T, T + timedelta(hours=1))
    assert rows(ErrorGroupHour) == {(T, "KeyError", "KeyError: '…'"): 1,
                                    (T, "TimeoutError", "TimeoutError: read <n> s"): 2}


def test_an_hour_sums_its_minutes_per_group(queue):
    fail(queue, ["TimeoutError: read 3 s"], T)
    fail(queue, ["TimeoutError: read 4 s", "KeyError: 'a'"], T + 30 * MINUTE)
    fail(queue, ["TimeoutError: read 5 s"], T + timedelta(hours=1))  # the next hour
    history.roll_up_errors(ErrorGroupMinute, T, T + timedelta(hours=2))

    assert history.roll_up_error_hours(T, T + timedelta(hours=2)) == 3

    assert rows(ErrorGroupHour) == {
        (T, "KeyError", "KeyError: '…'"): 1,
        (T, "TimeoutError", "TimeoutError: read <n> s"): 2,
        (T + timedelta(hours=1), "TimeoutError", "TimeoutError: read <n> s"): 1,
    }


def test_each_period_keeps_its_largest_groups_and_counts_the_rest_as_other(queue):
    # 60 groups of 1 to 60 failures in one minute; 10 groups of 100 in the next.
    failure_events(queue, T, {f"LookupError: no {word(n)}": n for n in range(1, 61)})
    failure_events(queue, T + MINUTE, {f"OSError: disk {word(n)}": 100 for n in range(10)})

    history.roll_up_errors(ErrorGroupMinute, T, T + 2 * MINUTE)
    history.roll_up_error_hours(T, T + timedelta(hours=1))

    first = ErrorGroupMinute.objects.filter(start=T)
    assert first.count() == history.ERROR_GROUPS + 1
    assert min(first.exclude(group_key=OTHER_ERROR_GROUP).values_list("failures", flat=True)
               ) == 11
    other = first.get(group_key=OTHER_ERROR_GROUP)
    assert (other.failures, other.kind, other.message) == (sum(range(1, 11)), "", "")
    hour = ErrorGroupHour.objects.filter(start=T)
    assert hour.count() == history.ERROR_GROUPS + 1
    assert hour.filter(kind="OSError").count() == 10
    # The 40 largest of the first minute's groups stay; the rest of them join its other.
    assert hour.get(group_key=OTHER_ERROR_GROUP).failures == sum(range(1, 21))
    assert sum(hour.values_list("failures", flat=True)) == sum(range(1, 61)) + 1000


def test_pruning_keeps_48_hours_of_error_minutes_and_30_days_of_hours(queue):
    now = T + timedelta(days=40)
    for start in (now - timedelta(hours=49), now - timedelta(hours=47)):
        ErrorGroupMinute.objects.create(queue=queue, start=start, group_key="k", failures=1)
    for start in (now - timedelta(days=31), now - timedelta(days=29)):
        ErrorGroupHour.objects.create(queue=queue, start=start, group_key="k", failures=1)

    pruned = history.prune(now)

    assert list(ErrorGroupMinute.objects.values_list("start", flat=True)) == [
        now - timedelta(hours=47)]
    assert list(ErrorGroupHour.objects.values_list("start", flat=True)) == [
        now - timedelta(days=29)]
    assert pruned["error group minutes pruned"] == pruned["error group hours pruned"] == 1


def test_the_scheduled_run_keeps_the_error_groups_history(queue):
    now = timezone.now()
    history.run(now - timedelta(minutes=5))
    minute = now.replace(second=0, microsecond=0) - 2 * MINUTE
    fail(queue, ["TimeoutError: read 3 s", "TimeoutError: read 4 s"], minute)

    counts = history.run(now)

    key = group_key("TimeoutError", "TimeoutError: read <n> s")
    assert ErrorGroupMinute.objects.get(start=minute, group_key=key).failures == 2
    assert ErrorGroupHour.objects.get(start=minute.replace(minute=0), group_key=key
                                      ).failures == 2
    assert counts["error group minutes rewritten"] == 1
    assert counts["error group hours rewritten"] >= 1
    assert HistoryRun.objects.count() == 2


def test_trends_read_every_group_of_the_range_in_one_statement(queue,
                                                                django_assert_num_queries):
    other_queue = QueueFactory(key="reports")
    for hour, key, failures in ((0, "a", 3), (1, "a", 4), (5, "b", 2), (5, OTHER_ERROR_GROUP, 9),
                                (6, "a", 1), (-1, "a", 50)):  # 6 and -1: outside the range
        ErrorGroupHour.objects.create(queue=queue, start=T + timedelta(hours=hour),
                                      group_key=key, failures=failures)
    ErrorGroupHour.objects.create(queue=other_queue, start=T, group_key="a", failures=7)

    with django_assert_num_queries(1):
        trends = history.error_trends(queue.pk, T, T + timedelta(hours=6), timedelta(hours=2))

    assert trends == {"a": [7, 0, 0], "b": [0, 0, 2], OTHER_ERROR_GROUP: [0, 0, 9]}
