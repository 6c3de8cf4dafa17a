"""queues.engine.counters: deltas written by transitions, folded exactly once by the rollup."""

import threading
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum

from queues.engine import counters, lifecycle
from queues.engine.lifecycle import Outcome
from queues.models import CounterDelta, OutcomeMinute, Status, StatusCount
from tests.factories import QueueFactory, enqueued, item_in_status, items_in_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory()


def base_counts(queue):
    return dict(StatusCount.objects.filter(queue=queue).exclude(count=0)
                .values_list("status", "count"))


def outcome_totals(queue):
    return dict(OutcomeMinute.objects.filter(queue=queue).values("status")
                .annotate(total=Sum("count")).values_list("status", "total"))


def busy_queue(queue):
    """A queue with items in every status, moved there by the lifecycle."""
    for status, n in [(Status.QUEUED, 4), (Status.DISPATCHED, 3), (Status.RUNNING, 2),
                      (Status.COMPLETE, 5), (Status.RETRY, 2), (Status.FAILED, 1),
                      (Status.CANCELLED, 3)]:
        items_in_status(queue, status, n)


def test_transitions_write_deltas_that_readers_add_to_the_base_counts(queue):
    busy_queue(queue)

    assert CounterDelta.objects.filter(queue=queue).exists()
    assert not StatusCount.objects.exists()
    assert counters.status_counts([queue.pk]) == counters.exact_counts([queue.pk]) == {
        queue.pk: {"queued": 4, "dispatched": 3, "running": 2, "complete": 5, "retry": 2,
                   "failed": 1, "cancelled": 3}}


def test_rollup_folds_every_delta_exactly_once(queue):
    busy_queue(queue)
    pending = CounterDelta.objects.count()
    exact = counters.exact_counts([queue.pk])

    assert counters.rollup() == pending

    assert not CounterDelta.objects.exists()
    assert counters.status_counts([queue.pk]) == exact
    folded = base_counts(queue)
    assert folded == {status: n for status, n in exact[queue.pk].items() if n}
    outcomes = outcome_totals(queue)

    assert counters.rollup() == 0  # nothing left to fold: a second rollup changes nothing
    assert base_counts(queue) == folded
    assert outcome_totals(queue) == outcomes
    assert counters.status_counts([queue.pk]) == exact


def test_rollup_adds_new_deltas_to_the_folded_counts(queue):
    busy_queue(queue)
    counters.rollup()
    running = [item.pk for item in items_in_status(queue, Status.RUNNING, 2)]
    lifecycle.finish(queue, [Outcome(item_id=pk, attempt=1) for pk in running], worker="w")
    lifecycle.apply("cancel", list(
        queue.items.filter(status="queued").values_list("pk", flat=True)), actor="admin")
    exact = counters.exact_counts([queue.pk])

    assert counters.status_counts([queue.pk]) == exact
    counters.rollup()
    assert counters.status_counts([queue.pk]) == exact
    assert base_counts(queue) == {s: n for s, n in exact[queue.pk].items() if n}
    assert outcome_totals(queue)["complete"] == 7


def test_rollup_in_many_small_batches_gives_the_same_counts(queue, monkeypatch):
    busy_queue(queue)
    pending = CounterDelta.objects.count()
    exact = counters.exact_counts([queue.pk])
    monkeypatch.setattr(counters, "ROLLUP_BATCH", 3)
    assert pending > 3 * 3

    assert counters.rollup() == pending

    assert not CounterDelta.objects.exists()
    assert counters.status_counts([queue.pk]) == exact
    assert outcome_totals(queue) == {"complete": 5, "retry": 2, "failed": 1, "cancelled": 3}


def test_counts_are_kept_per_queue(queue):
    other = QueueFactory()
    empty = QueueFactory()
    items_in_status(queue, Status.COMPLETE, 2)
    items_in_status(other, Status.QUEUED, 3)

    for _ in range(2):  # before and after the rollup
        counts = counters.status_counts([queue.pk, other.pk, empty.pk])
        assert counts == counters.exact_counts([queue.pk, other.pk, empty.pk])
        assert counts[queue.pk]["complete"] == 2
        assert counts[other.pk]["queued"] == 3
        assert set(counts[empty.pk].values()) == {0}
        assert counters.status_counts()[other.pk]["queued"] == 3  # all queues
        counters.rollup()


def test_status_counts_stay_right_when_a_rollup_commits_between_reads(queue):
    busy_queue(queue)
    counters.rollup()
    item = item_in_status(queue, Status.RUNNING)
    lifecycle.finish(queue, [Outcome(item_id=item.pk, attempt=1)], worker="w")
    expected = counters.exact_counts([queue.pk])
    fired = []

    def rollup_first(execute, sql, params, many, context):
        # Another process's rollup commits just before the reader looks at the pending deltas.
        reads_deltas = CounterDelta._meta.db_table in sql and "DELETE" not in sql.upper()
        if not fired and reads_deltas:
            fired.append(sql)
            counters.rollup()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(rollup_first):
        counts = counters.status_counts([queue.pk])

    assert fired
    assert not CounterDelta.objects.exists()
    assert counts == expected


# --- concurrency (PostgreSQL) ----------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_rollups_while_items_move_never_double_count(queue):
    items = items_in_status(queue, Status.QUEUED, 120)
    ids = [item.pk for item in items]
    movers, rounds = 4, 15
    groups = [ids[n::movers] for n in range(movers)]
    completed: Counter = Counter()
    folded: Counter = Counter()
    errors: list = []
    bad_reads: list = []
    stop = threading.Event()

    def move(n):
        group = groups[n]
        try:
            for _ in range(rounds):
                lifecycle.apply("dispatch", group, actor="selector")
                lifecycle.apply("start", group, actor="worker",
                                expected_attempts=dict.fromkeys(group, 1))
                results = lifecycle.finish(queue, [Outcome(item_id=pk, attempt=1)
                                                   for pk in group], worker=f"w{n}")
                completed[n] += len(results["complete"].changed)
                lifecycle.apply("requeue", group, actor="admin")
        except Exception as exc:  # collected and asserted on below
            errors.append(exc)
        finally:
            connection.close()

    def roll(n):
        try:
            while not stop.is_set():
                folded[n] += counters.rollup()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    def read():
        # Moves keep the total constant, so every consistent read sums to it.
        try:
            while not stop.is_set():
                counts = counters.status_counts([queue.pk])[queue.pk]
                if sum(counts.values()) != len(ids) or min(counts.values()) < 0:
                    bad_reads.append(counts)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    background = [threading.Thread(target=roll, args=(n,)) for n in range(2)]
    background.append(threading.Thread(target=read))
    workers = [threading.Thread(target=move, args=(n,)) for n in range(movers)]
    for thread in background + workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=120)
    stop.set()
    for thread in background:
        thread.join(timeout=60)

    assert not any(thread.is_alive() for thread in background + workers)
    assert errors == []
    assert bad_reads == []
    assert sum(completed.values()) == len(ids) * rounds
    assert all(folded[n] > 0 for n in range(2)), folded  # both rollups took part
    exact = counters.exact_counts([queue.pk])
    assert exact[queue.pk]["queued"] == len(ids)
    assert counters.status_counts([queue.pk]) == exact
    counters.rollup()
    assert not CounterDelta.objects.exists()
    assert counters.status_counts([queue.pk]) == exact
    assert base_counts(queue) == {"queued": len(ids)}
    assert outcome_totals(queue) == {"complete": len(ids) * rounds}


def age_items(items, created_at):
    from queues.models import Item
    Item.objects.filter(pk__in=[item.pk for item in items]).update(created_at=created_at,
                                                                   run_at=created_at)


def test_oldest_waiting_leaves_out_the_items_of_a_paused_account(queue):
    from datetime import timedelta

    from django.utils import timezone

    from queues.engine import pausing
    now = timezone.now()
    age_items(enqueued(queue, 2, account="held"), now - timedelta(hours=7))
    age_items(enqueued(queue, 1, account="flowing", prefix="flowing"), now - timedelta(minutes=3))
    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(hours=7)

    pausing.set_account_paused(queue, "held", True, actor="admin")

    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(minutes=3)


def test_oldest_waiting_is_none_when_only_paused_accounts_wait(queue):
    from django.utils import timezone

    from queues.engine import pausing
    enqueued(queue, 3, account="held")
    pausing.set_account_paused(queue, "held", True, actor="admin")

    assert counters.oldest_waiting([queue.pk], timezone.now()) == {queue.pk: None}


def test_past_a_long_paused_head_oldest_waiting_reads_the_sweepers_account_figures(
        queue, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from queues.engine import account_stats, pausing
    monkeypatch.setattr(counters, "PAUSED_HEAD_WALK", 2)
    now = timezone.now()
    age_items(enqueued(queue, 3, account="held"), now - timedelta(hours=7))
    age_items(enqueued(queue, 1, account="flowing", prefix="flowing"), now - timedelta(minutes=3))
    pausing.set_account_paused(queue, "held", True, actor="admin")
    account_stats.refresh(queue, now)

    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(minutes=3)


def test_oldest_waiting_counts_from_when_an_item_came_due_not_from_its_enqueue(queue):
    """An item enqueued with a 3 h delay, due 4 s ago, has waited 4 s: counted from its enqueue
    it fired the oldest-wait alert the moment it came due."""
    from datetime import timedelta

    from django.utils import timezone

    from queues.models import Item
    now = timezone.now()
    [delayed] = enqueued(queue, 1, prefix="delayed")
    Item.objects.filter(pk=delayed.pk).update(created_at=now - timedelta(hours=3),
                                              run_at=now - timedelta(seconds=4))
    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(seconds=4)


def test_oldest_waiting_counts_retries_that_are_due(queue):
    from datetime import timedelta

    from django.utils import timezone

    from queues.models import Item
    now = timezone.now()
    [retry] = items_in_status(queue, "retry", 1)
    Item.objects.filter(pk=retry.pk).update(created_at=now - timedelta(hours=2),
                                            run_at=now - timedelta(minutes=1))
    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(minutes=1)


def test_oldest_waiting_looks_past_a_backdated_item_to_the_longest_wait(queue):
    """Not-before before the enqueue: due since its enqueue. Read by not-before time it comes
    first, though an item due for two hours has waited longer."""
    from datetime import timedelta

    from django.utils import timezone

    from queues.models import Item
    now = timezone.now()
    [backdated] = enqueued(queue, 1, prefix="backdated")
    Item.objects.filter(pk=backdated.pk).update(created_at=now - timedelta(seconds=1),
                                                run_at=now - timedelta(days=300))
    age_items(enqueued(queue, 1, prefix="waiting"), now - timedelta(hours=2))
    assert counters.oldest_waiting([queue.pk], now)[queue.pk] == now - timedelta(hours=2)
