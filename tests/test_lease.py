"""queues.engine.lease: one selector loop at a time, handed from tick to tick without a gap."""

import threading
import time

import pytest
from django.db import connection

from queues.engine import lease, selector
from queues.models import SelectorLease

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(function, *args, into: dict, key: str):
    def run():
        try:
            into[key] = function(*args)
        finally:
            connection.close()  # the test database is dropped at the end

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def holder():
    return SelectorLease.objects.get().holder


def test_a_free_lease_is_taken_at_once_and_renewed_while_nobody_waits():
    assert lease.acquire("a", wait=0)
    assert holder() == "a"
    assert lease.renew("a") == lease.HELD
    assert lease.renew("b") == lease.LOST


@pytest.mark.postgres  # threads racing on one row: SQLite's in-memory test database
# answers 'table is locked' instead of waiting
def test_a_waiting_successor_is_handed_the_lease_at_the_holders_next_renewal():
    assert lease.acquire("a", wait=0)
    taken = {}
    waiter = in_thread(lease.acquire, "b", 5, into=taken, key="b")
    assert_soon(lambda: SelectorLease.objects.get().successor == "b")
    assert lease.renew("a") == lease.HANDOVER
    lease.release("a")
    waiter.join(5)
    assert taken == {"b": True} and holder() == "b"
    assert SelectorLease.objects.get().successor == ""


@pytest.mark.postgres  # threads racing on one row: SQLite's in-memory test database
# answers 'table is locked' instead of waiting
def test_a_newer_successor_takes_the_place_of_an_older_one():
    assert lease.acquire("a", wait=0)
    results = {}
    older = in_thread(lease.acquire, "b", 5, into=results, key="b")
    assert_soon(lambda: SelectorLease.objects.get().successor == "b")
    newer = in_thread(lease.acquire, "c", 5, into=results, key="c")
    older.join(5)
    assert results == {"b": False}
    lease.release("a")
    newer.join(5)
    assert results == {"b": False, "c": True}


def test_a_lease_its_holder_stopped_renewing_is_taken_after_it_runs_out(monkeypatch):
    monkeypatch.setattr(lease, "TTL_SECONDS", 0.3)
    assert lease.acquire("dead", wait=0)
    began = time.monotonic()
    assert lease.acquire("b", wait=3)
    assert 0.2 < time.monotonic() - began < 2.5
    assert lease.renew("dead") == lease.LOST


@pytest.mark.postgres  # threads racing on one row: SQLite's in-memory test database
# answers 'table is locked' instead of waiting
def test_a_running_selector_loop_hands_over_to_a_newer_tick_within_a_second():
    loop = in_thread(selector.tick, 30, 0.1, into={}, key="taken")
    assert_soon(lambda: SelectorLease.objects.filter(holder__contains=":").exists())
    began = time.monotonic()
    assert lease.acquire("newer", wait=5)
    assert time.monotonic() - began < 1.5
    loop.join(5)
    assert not loop.is_alive()


def assert_soon(condition, seconds=5):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_the_lease_is_vacant_when_released_or_run_out_with_nobody_waiting(monkeypatch):
    assert lease.vacant()  # no row yet
    assert lease.acquire("a", wait=0)
    assert not lease.vacant()
    lease.release("a")
    assert lease.vacant()
    assert lease.acquire("a", wait=0)
    SelectorLease.objects.update(successor="b", successor_since=time.time())
    monkeypatch.setattr(lease, "TTL_SECONDS", 0)
    assert not lease.vacant()  # b takes over at its next poll
    SelectorLease.objects.update(successor="")
    time.sleep(0.01)  # the database clock moves on past the renewal
    assert lease.vacant()


def test_a_successor_that_died_waiting_does_not_keep_the_lease_from_being_vacant(monkeypatch):
    """A successor in a cluster killed with kill -9 never clears its name: the loop must still
    be restarted once its wait is surely over."""
    monkeypatch.setattr(lease, "TTL_SECONDS", 0)
    assert lease.acquire("dead-holder", wait=0)
    SelectorLease.objects.update(successor="dead-successor", successor_since=time.time())
    time.sleep(0.01)
    assert not lease.vacant()  # it may still take over
    monkeypatch.setattr(lease, "SUCCESSOR_WAIT_SECONDS", 0)
    SelectorLease.objects.update(successor_since=time.time() - 2)
    assert lease.vacant()


def test_a_loop_that_takes_the_lease_beside_a_dead_successor_keeps_it(monkeypatch):
    """Handing over to a successor that died waiting would end every new loop at once."""
    monkeypatch.setattr(lease, "TTL_SECONDS", 0)
    monkeypatch.setattr(lease, "SUCCESSOR_WAIT_SECONDS", 0)
    assert lease.acquire("dead-holder", wait=0)
    SelectorLease.objects.update(successor="dead-successor", successor_since=time.time() - 2)
    time.sleep(0.01)
    assert lease.acquire("new-loop", wait=0)
    assert lease.renew("new-loop") == lease.HELD
    assert SelectorLease.objects.get().successor == ""
