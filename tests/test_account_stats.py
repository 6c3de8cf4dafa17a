"""The accounts page's ranking (queues.engine.account_stats): one row per account with ready items
per queue, replaced at each sweep; and the recent service its order by share reads live."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queues.engine import account_stats, accounts, lifecycle, sweeper
from queues.models import AccountStat, SelectorRound
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db


def ranking(queue):
    return {stat.account: stat.backlog for stat in AccountStat.objects.filter(queue=queue)}


def served_round(queue, allocation, minutes_ago=0):
    SelectorRound.objects.create(
        queue=queue, started_at=timezone.now() - timedelta(minutes=minutes_ago), duration_ms=1,
        taken=sum(allocation.values()), accounts=len(allocation), allocation=allocation)


def test_it_counts_ready_items_per_account_and_nothing_else():
    queue, other = QueueFactory(key="emails"), QueueFactory(key="billing")
    enqueued(queue, 3, account="acme", prefix="a")
    items_in_status(queue, "retry", 2, account="acme")
    enqueued(queue, 1, account="zeta", prefix="z")
    items_in_status(queue, "running", 4, account="busy")
    items_in_status(queue, "failed", 1, account="broken")
    enqueued(other, 5, account="acme", prefix="o")
    assert account_stats.refresh(queue) == 2
    assert ranking(queue) == {"acme": 5, "zeta": 1}
    assert not AccountStat.objects.filter(queue=other).exists()


def test_it_keeps_when_the_first_ready_item_came_due():
    queue = QueueFactory()
    now = timezone.now()
    enqueued(queue, 1, account="acme", prefix="old", run_at=now - timedelta(hours=2))
    enqueued(queue, 1, account="acme", prefix="new", run_at=now)
    enqueued(queue, 1, account="later", prefix="l", run_at=now + timedelta(hours=1))
    account_stats.refresh(queue, now)
    stats = {s.account: s for s in AccountStat.objects.filter(queue=queue)}
    assert abs(stats["acme"].first_due - (now - timedelta(hours=2))) < timedelta(seconds=1)
    assert stats["later"].first_due > now  # nothing due yet: it ranks after every waiting one
    assert stats["acme"].refreshed_at == now


def test_recent_service_is_what_the_recent_rounds_took_per_account():
    queue, other = QueueFactory(), QueueFactory(key="other")
    served_round(queue, {"acme": 3, "gone": 5}, minutes_ago=2)
    served_round(queue, {"acme": 1}, minutes_ago=1)
    served_round(other, {"acme": 7})
    assert account_stats.recent_service(queue) == ({"acme": 4, "gone": 5}, 2)


def test_only_the_recent_rounds_count_as_served(monkeypatch):
    queue = QueueFactory()
    monkeypatch.setattr(account_stats, "SERVICE_ROUNDS", 2)
    for minutes_ago in (3, 2, 1):
        served_round(queue, {"acme": minutes_ago}, minutes_ago=minutes_ago)
    assert account_stats.recent_service(queue) == ({"acme": 2 + 1}, 2)


def test_accounts_that_emptied_drop_out_and_a_second_refresh_adds_no_duplicates():
    queue = QueueFactory()
    enqueued(queue, 2, account="acme", prefix="a")
    [gone] = enqueued(queue, 1, account="gone", prefix="g")
    account_stats.refresh(queue)
    assert set(ranking(queue)) == {"acme", "gone"}
    lifecycle.apply("cancel", [gone.pk], actor="admin")
    enqueued(queue, 1, account="acme", prefix="b")
    assert account_stats.refresh(queue) == 1
    assert account_stats.refresh(queue) == 1
    assert ranking(queue) == {"acme": 3}
    assert AccountStat.objects.count() == 1


def test_refresh_all_ranks_every_queue():
    for key in ("emails", "billing"):
        enqueued(QueueFactory(key=key), 1, account=f"{key}-acme")
    assert account_stats.refresh_all() == 2
    assert set(AccountStat.objects.values_list("account", flat=True)) == {"emails-acme",
                                                                           "billing-acme"}


def test_each_sweep_ranks_the_accounts_and_records_it():
    queue = QueueFactory()
    enqueued(queue, 2, account="acme", prefix="a")
    enqueued(queue, 1, account="zeta", prefix="z")
    counts = sweeper.run()
    assert counts["accounts ranked"] == 2
    assert ranking(queue) == {"acme": 2, "zeta": 1}


def test_a_sweep_with_no_backlog_ranks_nothing_and_stays_empty():
    QueueFactory()
    assert sweeper.run() == {}


def test_erasing_an_account_takes_it_out_of_the_ranking_at_once():
    queue = QueueFactory()
    enqueued(queue, 1, account="acme", prefix="a")
    enqueued(queue, 1, account="other", prefix="o")
    account_stats.refresh(queue)
    erased = accounts.erase("acme", actor="admin")
    assert erased["account rankings"] == 1
    assert set(ranking(queue)) == {"other"}
