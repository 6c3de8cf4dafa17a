"""queues.engine.selector: one fair round per queue, claimed atomically, one worker task per
batch."""

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import OrmQ, Task
from django_q.monitor import save_task
from django_q.signing import SignedPackage

from queues import enqueue_many
from queues.engine import counters, lifecycle, selector
from queues.models import (
    ClusterHeartbeat,
    CounterDelta,
    Item,
    ItemEvent,
    SelectorLease,
    SelectorRound,
    SelectorState,
    Status,
    SweepRun,
)
from tests.factories import AccountPolicyFactory, QueueFactory, index_entries_read
from tests.flaky_database import failing_statements
from tests.round_lock import round_lock_held

pytestmark = pytest.mark.django_db


def put(queue, account, n, *, prefix=None, **fields):
    prefix = prefix or f"{account}-{fields.get('priority', 0)}-{Item.objects.count()}"
    return enqueue_many(queue.key, [
        {"account": account, "identifier": f"{prefix}-{i}", "payload": {"i": i}, **fields}
        for i in range(n)
    ])


def dispatched_tasks():
    return [SignedPackage.loads(task.payload) for task in OrmQ.objects.order_by("id")]


def test_a_round_dispatches_a_fair_batch_and_one_worker_task():
    queue = QueueFactory(batch_size=10)
    put(queue, "big", 50)
    put(queue, "small", 2)
    put(queue, "mid", 5)
    result = selector.run_round(queue)
    assert result.taken == {"big": 4, "mid": 4, "small": 2}
    assert Item.objects.filter(status=Status.DISPATCHED).count() == 10
    [task] = dispatched_tasks()
    assert task["func"] == "queues.engine.worker.run_batch"
    queue_id, batch = task["args"]
    assert queue_id == queue.pk
    assert sorted(item_id for item_id, _, _ in batch) == sorted(result.item_ids)
    assert {attempt for _, attempt, _ in batch} == {1}
    tokens = dict(Item.objects.values_list("pk", "dispatch_token"))
    assert all(token == tokens[item_id] != 0 for item_id, _, token in batch)
    record = SelectorRound.objects.get()
    assert (record.taken, record.accounts, record.allocation) == (10, 3, result.taken)


def test_django_q2_saves_a_batch_task_only_when_it_fails():
    # Saving a success locks every saved success to prune the oldest: for each batch, at the
    # default save_limit. A batch's items record their own outcomes. ("sync": the test
    # database stays open.)
    queue = QueueFactory(batch_size=10)
    put(queue, "acme", 3)
    selector.run_round(queue)
    [task] = dispatched_tasks()
    broker = get_broker()
    now = timezone.now()
    for success in (True, False):
        save_task({**task, "id": f"batch-{success}", "started": now, "stopped": now,
                   "result": None, "success": success, "sync": True}, broker)
    assert list(Task.objects.values_list("id", "success")) == [("batch-False", False)]


def test_accounts_whose_names_are_array_syntax_are_planned_and_claimed_as_they_are():
    # The plan travels to PostgreSQL as arrays: quotes, commas, braces, backslashes and the
    # word NULL in an account must arrive as themselves.
    queue = QueueFactory(batch_size=30)
    accounts = ['a"b', "c,d", "{e}", "f\\g", "NULL", "h i", "j'k"]
    for account in accounts:
        put(queue, account, 3)
    first = selector.run_round(queue, hold_small=False)
    assert first.taken == dict.fromkeys(accounts, 3)
    assert Item.objects.filter(status=Status.DISPATCHED).count() == 21


def test_the_cursor_rotates_service_across_rounds_and_persists():
    queue = QueueFactory(batch_size=2)
    for account in "abcde":
        put(queue, account, 3)
    served = [set(selector.run_round(queue).taken) for _ in range(3)]
    assert served[0] | served[1] | served[2] == set("abcde")
    assert SelectorState.objects.get(queue=queue).cursor in set("abcde")


def test_within_an_account_higher_priority_then_oldest_ready_go_first():
    queue = QueueFactory(batch_size=3)
    now = timezone.now()
    old = put(queue, "acme", 2, prefix="old", run_at=now - timedelta(hours=1))
    urgent = put(queue, "acme", 1, prefix="urgent", priority=5)
    put(queue, "acme", 2, prefix="new")
    result = selector.run_round(queue)
    assert set(result.item_ids) == {urgent[0].pk, old[0].pk, old[1].pk}


def test_it_skips_delayed_items_and_retries_not_yet_due():
    queue = QueueFactory(batch_size=10)
    later = timezone.now() + timedelta(minutes=10)
    put(queue, "acme", 3, prefix="delayed", run_at=later)
    [retrying] = put(queue, "acme", 1, prefix="retrying")
    lifecycle.apply("dispatch", [retrying.pk], actor="t")
    lifecycle.apply("start", [retrying.pk], actor="t")
    lifecycle.finish(queue, [lifecycle.Outcome(retrying.pk, 1, error="boom")], worker="w")
    assert selector.run_round(queue).taken == {}
    assert not OrmQ.objects.exists()


def test_a_due_retry_is_selected_again_with_the_next_attempt_number():
    queue = QueueFactory(batch_size=10)
    [item] = put(queue, "acme", 1)
    selector.run_round(queue)
    lifecycle.apply("start", [item.pk], actor="t")
    lifecycle.finish(queue, [lifecycle.Outcome(item.pk, 1, error="boom", delay=0)], worker="w")
    result = selector.run_round(queue)
    assert result.item_ids == [item.pk]
    item.refresh_from_db()
    assert dispatched_tasks()[-1]["args"][1] == [[item.pk, 2, item.dispatch_token]]


def test_a_paused_queue_selects_nothing():
    queue = QueueFactory(paused=True)
    put(queue, "acme", 3)
    assert selector.run_round(queue).skipped == "paused"
    assert not Item.objects.filter(status=Status.DISPATCHED).exists()


def test_a_paused_account_selects_nothing_while_others_are_served():
    queue = QueueFactory(batch_size=10)
    AccountPolicyFactory(queue=queue, account="held", paused=True)
    put(queue, "held", 5)
    put(queue, "free", 5)
    assert selector.run_round(queue).taken == {"free": 5}


def test_an_account_in_flight_cap_holds_across_rounds():
    queue = QueueFactory(batch_size=10)
    AccountPolicyFactory(queue=queue, account="capped", max_in_flight=3)
    put(queue, "capped", 10)
    put(queue, "other", 10)
    assert selector.run_round(queue).taken == {"capped": 3, "other": 7}
    assert selector.run_round(queue).taken == {"other": 3}


def test_account_weights_scale_the_share():
    queue = QueueFactory(batch_size=8)
    AccountPolicyFactory(queue=queue, account="heavy", weight=3)
    put(queue, "heavy", 20)
    put(queue, "light", 20)
    assert selector.run_round(queue).taken == {"heavy": 6, "light": 2}


def test_the_queue_concurrency_caps_items_in_flight():
    queue = QueueFactory(batch_size=10, concurrency=4)
    put(queue, "acme", 10)
    assert selector.run_round(queue).total == 4
    second = selector.run_round(queue)
    assert (second.total, second.skipped) == (0, "full")


def test_the_rate_limit_caps_items_started_per_minute():
    queue = QueueFactory(batch_size=10, rate_limit_per_minute=15)
    put(queue, "acme", 40)
    assert [selector.run_round(queue).total for _ in range(3)] == [10, 5, 0]
    SelectorRound.objects.update(started_at=timezone.now() - timedelta(minutes=2))
    assert selector.run_round(queue).total == 10


def test_tick_goes_on_at_once_while_rounds_fill_their_batch():
    queue = QueueFactory(batch_size=5)
    put(queue, "acme", 12)
    selector.tick(seconds=0.3, idle_sleep=0.1)
    takes = list(SelectorRound.objects.order_by("id").values_list("taken", flat=True))
    assert takes == [5, 5, 2]  # idle rounds afterwards change nothing and leave no record


def test_tick_runs_every_queue_that_is_not_paused():
    running, paused = QueueFactory(batch_size=5), QueueFactory(paused=True)
    put(running, "acme", 7)
    put(paused, "acme", 7)
    assert selector.tick(seconds=0.5, idle_sleep=0.1) == {running.key: 7}


def test_select_command_prints_what_each_round_took(capsys):
    from django.core.management import call_command

    queue = QueueFactory(key="mail", batch_size=4)
    put(queue, "acme", 3)
    put(queue, "zeta", 3)
    call_command("select", "--queue", "mail")
    call_command("select", "--queue", "mail")
    out = capsys.readouterr().out
    assert "mail: 4 of 4" in out
    assert "from 2 accounts (acme=2, zeta=2)" in out


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_round_for_the_same_queue_returns_at_once_without_selecting():
    queue = QueueFactory()
    put(queue, "acme", 5)
    with round_lock_held(queue):
        assert selector.run_round(queue).skipped == "busy"
    assert selector.run_round(queue).total == 5


@pytest.mark.postgres
# More accounts than the round takes (the account scan and the claim), and fewer (the count of
# each account's due items).
@pytest.mark.parametrize(("accounts", "per_account"), [(20, 500), (10, 1000)])
def test_a_round_on_a_queue_the_statistics_do_not_know_reads_only_the_ready_items_it_needs(
        accounts, per_account):
    # As in a database that has run for a while: the items the statistics know have finished.
    for _ in range(5):
        known = QueueFactory()
        for account in range(3):
            put(known, f"acct-{account}", 1000)
    Item.objects.update(status=Status.COMPLETE, finished_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_item")
    queue = QueueFactory(concurrency=10_000)
    for account in range(accounts):
        put(queue, f"acct-{account:02d}", per_account)

    before = index_entries_read("item_ready_due_idx", "item_ready_idx")
    assert selector.run_round(queue, for_cluster="host:1", limit=20).total == 20
    # About one entry per account found and per item counted or claimed, not the queue's
    # 10,000 once per account.
    assert index_entries_read("item_ready_due_idx", "item_ready_idx") - before < 100


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_selectors_running_concurrently_never_select_the_same_item():
    queue = QueueFactory(batch_size=7, concurrency=10_000)
    for account in range(12):
        put(queue, f"acct-{account:02d}", 25)
    picked: list[list[int]] = [[], []]
    barrier = threading.Barrier(2)

    def select_until_empty(slot):
        barrier.wait()
        idle = 0
        while idle < 20:
            result = selector.run_round(queue)
            picked[slot] += result.item_ids
            idle = idle + 1 if not result.item_ids else 0
        connection.close()

    threads = [threading.Thread(target=select_until_empty, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = picked[0] + picked[1]
    assert len(everything) == len(set(everything)) == 300
    assert Item.objects.filter(status=Status.DISPATCHED, attempts=1).count() == 300
    rounds = list(SelectorRound.objects.order_by("started_at").values_list(
        "started_at", "duration_ms"))
    for (start, duration), (next_start, _) in zip(rounds, rounds[1:], strict=False):
        assert start + timedelta(milliseconds=duration) <= next_start


@pytest.mark.parametrize(
    ("cursor", "limit", "excluded", "expected"),
    [
        ("", 10, set(), ["a", "b", "c", "d", "e"]),
        ("c", 10, set(), ["d", "e", "a", "b", "c"]),
        ("c", 3, set(), ["d", "e", "a"]),
        ("e", 10, set(), ["a", "b", "c", "d", "e"]),
        ("zz", 10, set(), ["a", "b", "c", "d", "e"]),
        ("bb", 10, {"a", "d"}, ["c", "e", "b"]),
    ],
)
def test_the_account_scan_walks_the_ring_after_the_cursor(cursor, limit, excluded, expected):
    queue = QueueFactory()
    for account in "abcde":
        put(queue, account, 2)
    put(queue, "f", 1, run_at=timezone.now() + timedelta(hours=1))  # nothing due
    found = selector._next_accounts(queue, timezone.now(), cursor, limit, excluded)
    assert found == expected


def test_an_account_takes_the_slots_that_others_leave():
    queue = QueueFactory(batch_size=10)
    put(queue, "big", 100)
    put(queue, "small", 1)
    assert selector.run_round(queue).taken == {"big": 9, "small": 1}


def finish(queue, ids):
    lifecycle.apply("start", ids, actor="t", expected_attempts=dict.fromkeys(ids, 1))
    lifecycle.finish(queue, [lifecycle.Outcome(pk, 1) for pk in ids], worker="w")


def test_under_a_backlog_a_round_waits_for_half_a_batch_of_free_capacity():
    queue = QueueFactory(batch_size=10, concurrency=10)
    put(queue, "acme", 30)
    first = selector.run_round(queue)
    assert first.total == 10
    finish(queue, first.item_ids[:2])
    assert selector.run_round(queue).skipped == "waiting for a fuller batch"
    # A running batch with idle threads takes what is free at once.
    assert selector.run_round(queue, for_cluster="host:1", limit=1).total == 1
    finish(queue, first.item_ids[2:6])
    assert selector.run_round(queue).total == 5


def test_freed_capacity_that_no_running_batch_takes_goes_out_as_a_small_batch_after_the_grace():
    queue = QueueFactory(batch_size=10, concurrency=10)
    put(queue, "acme", 30)
    first = selector.run_round(queue)
    finish(queue, first.item_ids[:2])
    # Every thread of the running batch is busy: nobody tops up, so the loop sends the 2 itself.
    selector.tick(seconds=0.5, idle_sleep=1.0)
    rounds = list(SelectorRound.objects.order_by("id").values_list("taken", flat=True))
    assert rounds == [10, 2]


def test_a_round_told_not_to_hold_back_dispatches_a_small_batch_under_a_backlog():
    queue = QueueFactory(batch_size=10, concurrency=10)
    put(queue, "acme", 30)
    finish(queue, selector.run_round(queue).item_ids[:2])
    assert selector.run_round(queue, hold_small=False).total == 2


def test_a_round_dispatches_what_is_ready_at_once_when_it_all_fits():
    queue = QueueFactory(batch_size=10, concurrency=10)
    put(queue, "acme", 10)
    first = selector.run_round(queue)
    finish(queue, first.item_ids[:2])
    put(queue, "other", 1)
    assert selector.run_round(queue).taken == {"other": 1}


def test_a_round_for_a_running_batch_claims_and_starts_its_items_and_enqueues_no_task():
    queue = QueueFactory(batch_size=10)
    put(queue, "acme", 3, payload={"n": 1})
    result = selector.run_round(queue, for_cluster="host:1", limit=2)
    assert result.total == 2 and dispatched_tasks() == []
    items = Item.objects.filter(pk__in=result.item_ids)
    assert {(item.status, item.cluster, item.attempts) for item in items} == {
        (Status.RUNNING, "host:1", 1)}
    assert all(item.started_at >= item.dispatched_at for item in items)
    assert [entry[0] for entry in result.batch] == result.item_ids
    # What the handlers need, with the token that fences the batch's outcomes.
    tokens = {item.pk: item.dispatch_token for item in items}
    assert {(row["id"], row["attempts"], row["token"], row["payload"]["n"])
            for row in result.started} == {(pk, 1, token, 1) for pk, token in tokens.items()}
    # The history reads as for any batch: dispatched by the selector, started by the worker.
    events = list(ItemEvent.objects.filter(item_id=result.item_ids[0]).order_by("id").values_list(
        "transition", "from_status", "to_status", "actor"))
    assert events[1:] == [("dispatched", Status.QUEUED, Status.DISPATCHED, "selector"),
                          ("started", Status.DISPATCHED, Status.RUNNING, "worker")]
    counts = counters.status_counts([queue.pk])[queue.pk]
    assert {status: n for status, n in counts.items() if n} == {Status.QUEUED: 1,
                                                              Status.RUNNING: 2}


def test_the_selector_loop_rescues_the_items_of_a_silent_cluster_and_records_it():
    queue = QueueFactory(batch_size=10)
    [item] = put(queue, "acme", 1)
    selector.run_round(queue)
    item.refresh_from_db()
    lifecycle.claim([[item.pk, 1, item.dispatch_token]], "gone-host:7")
    ClusterHeartbeat.objects.create(cluster="gone-host:7", host="gone-host", pid=7,
                                    started_at=timezone.now() - timedelta(hours=1),
                                    beat_at=timezone.now() - timedelta(minutes=2))
    selector.tick(seconds=0.3, idle_sleep=0.1)
    item.refresh_from_db()
    # Released, then dispatched again by the same loop: the attempt was given back first.
    assert ItemEvent.objects.filter(item_id=item.pk, transition="released").exists()
    assert item.attempts == 1 and item.cluster == ""
    assert SweepRun.objects.get().counts == {
        "dispatched items of silent clusters released": 1}


@pytest.mark.django_db(transaction=True)
def test_the_selector_loop_waits_out_failing_statements_and_dispatches_everything(monkeypatch):
    monkeypatch.setattr(selector, "DATABASE_RETRY_SECONDS", 0.01)
    queue = QueueFactory(batch_size=5)
    put(queue, "acme", 12)
    # The lease is spared: a tick that cannot take it ends, and the next schedule starts anew.
    with failing_statements(rate=0.2, spare=SelectorLease._meta.db_table) as failed:
        taken = selector.tick(seconds=1.5, idle_sleep=0.05)
    assert failed
    assert taken == {queue.key: 12}
    assert Item.objects.filter(status=Status.DISPATCHED).count() == 12


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_loop_whose_database_goes_away_as_it_ends_still_reports_what_it_took():
    queue = QueueFactory(batch_size=5)
    put(queue, "acme", 3)

    def unlisten_fails(execute, sql, params, many, context):
        if sql.startswith("UNLISTEN"):
            raise OperationalError("terminating connection due to administrator command")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(unlisten_fails):
        taken = selector.tick(seconds=0.3, idle_sleep=0.1)
    assert taken == {queue.key: 3}
    # Closed, so the worker's next task does not inherit its subscription.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_listening_channels()")
        assert cursor.fetchone() == (0,)


def test_the_selector_loop_folds_the_counter_deltas_that_rounds_read():
    queue = QueueFactory(batch_size=5)
    put(queue, "acme", 7)
    assert CounterDelta.objects.exists()
    selector.tick(seconds=0.3, idle_sleep=0.1)
    # Folded at the loop's start; the rounds after it left a few rows of their own at most.
    assert CounterDelta.objects.filter(status=Status.QUEUED, delta__gt=0).count() == 0
    counts = counters.status_counts([queue.pk])[queue.pk]
    assert counts.get(Status.DISPATCHED) == 7 and not counts.get(Status.QUEUED)
