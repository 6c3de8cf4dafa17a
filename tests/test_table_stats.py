"""queues.engine.table_stats: a big queue the planner's statistics do not know gets them."""

import pytest
from django.db import connection

from queues.engine import sweeper, table_stats
from tests.factories import QueueFactory, analyzed_before_new_queues, enqueued

pytestmark = pytest.mark.django_db


def estimated_rows(queue):
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) SELECT id FROM queues_item WHERE queue_id = %s",
                       [queue.pk])
        return cursor.fetchone()[0][0]["Plan"]["Plan Rows"]


def filled_after_analyze(monkeypatch):
    """A queue of 1,500 items made after an ANALYZE that saw only another queue's finished
    items, with the size of a big queue lowered to 1,000 so the test stays small."""
    monkeypatch.setattr(table_stats, "BIG_QUEUE_ITEMS", 1000)
    analyzed_before_new_queues()
    queue = QueueFactory(key="newcomer")
    for batch in range(3):
        enqueued(queue, 500, account=f"acct-{batch}", prefix=f"new-{batch}")
    return queue


@pytest.mark.postgres
def test_a_big_queue_the_statistics_do_not_know_is_analyzed_and_then_known(monkeypatch):
    queue = filled_after_analyze(monkeypatch)
    assert estimated_rows(queue) < 15
    assert table_stats.unknown_queues() == ["newcomer"]

    assert table_stats.refresh() == ["newcomer"]
    assert estimated_rows(queue) > 500
    assert table_stats.refresh() == []  # nothing left to learn: no second ANALYZE


@pytest.mark.postgres
def test_a_small_queue_or_one_the_statistics_know_is_left_alone(monkeypatch):
    monkeypatch.setattr(table_stats, "BIG_QUEUE_ITEMS", 1000)
    small = QueueFactory(key="small")
    enqueued(small, 999, prefix="small")
    known = QueueFactory(key="known")
    enqueued(known, 1000, prefix="known")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_item")
    enqueued(known, 500, prefix="more")  # misjudged by a third, not unknown
    assert table_stats.unknown_queues() == []


@pytest.mark.postgres
def test_the_sweeper_run_records_the_queues_it_made_known(monkeypatch):
    filled_after_analyze(monkeypatch)
    assert sweeper.run(seconds=5)["queues made known to the planner"] == 1
    assert "queues made known to the planner" not in sweeper.run(seconds=5)


def test_nothing_is_analyzed_while_every_queue_is_small():
    enqueued(QueueFactory(), 10, prefix="any")
    assert table_stats.refresh() == []
