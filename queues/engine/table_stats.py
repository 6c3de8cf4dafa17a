"""The items table's planner statistics, kept aware of every big queue.

PostgreSQL's statistics list the queues it saw at the last ANALYZE; a queue that filled up since
(a new tenant's backfill) is estimated at one row, and plans made for one row read the whole
queue (a list's first page 190 ms, a payload filter 160 ms beside 50,000 new items at 10M).
Autoanalyze waits for 2% of the table to change (200,000 rows at 10M items), which a new queue
of 50,000 does not reach. The sweeper asks the planner what it believes of each big queue and
analyzes the table when one is taken for nearly empty.
"""

from django.db import connection

from queues.engine import counters
from queues.engine.db import is_postgres
from queues.models import Item, Queue

# A queue this big is worth a plan of its own: below it, any plan reads little.
BIG_QUEUE_ITEMS = 10_000
# Estimated at under this share of its items, the queue is unknown to the statistics (a plain
# misestimate of a known queue is left to autoanalyze).
UNKNOWN_BELOW = 0.01


def unknown_queues() -> list[str]:
    """Keys of the big queues the planner estimates at under 1% of their items."""
    if not is_postgres():
        return []
    keys = dict(Queue.objects.values_list("pk", "key"))
    unknown = []
    with connection.cursor() as cursor:
        for queue_id, counts in counters.status_counts(keys).items():
            items = sum(max(0, n) for n in counts.values())
            if items < BIG_QUEUE_ITEMS:
                continue
            cursor.execute(f"EXPLAIN (FORMAT JSON) SELECT id FROM {Item._meta.db_table} "
                           f"WHERE queue_id = %s", [queue_id])
            # The driver parses EXPLAIN's JSON column.
            estimate = cursor.fetchone()[0][0]["Plan"]["Plan Rows"]
            if estimate < items * UNKNOWN_BELOW:
                unknown.append(keys[queue_id])
    return unknown


def refresh() -> list[str]:
    """ANALYZE the items table when a big queue is unknown to its statistics; returns those
    queues. ANALYZE reads a sample (30,000 rows at the default target) and blocks no reader or
    writer."""
    unknown = unknown_queues()
    if unknown:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Item._meta.db_table}")
    return unknown
