"""Which process runs the selector loop: a lease in one database row, timed by the database's
clock so that machines with skewed clocks agree.

A scheduled tick that finds the lease held writes itself as the successor and waits; the holder
sees it at its next renewal and lets go, so the loop passes from tick to tick without a gap. A
holder that died is replaced once its lease runs out (TTL). Only one successor waits at a time: a
newer one takes the place of an older, which gives up, so ticks never pile up in the workers.
"""

import time

from django.db import connection

from queues.engine.db import is_postgres
from queues.models import SelectorLease

TTL_SECONDS = 15.0
POLL_SECONDS = 0.1
# The longest a successor waits; one that wrote itself longer ago gave up or died (killed, its
# name is never cleared), and is ignored: it held every new loop to a handover nobody took.
SUCCESSOR_WAIT_SECONDS = TTL_SECONDS + 5


def _live_successor() -> str:
    return f"(successor <> '' AND successor_since >= {{now}} - {SUCCESSOR_WAIT_SECONDS + 1})"


HELD, HANDOVER, LOST = "held", "handover", "lost"


def _now_sql() -> str:
    if is_postgres():
        return "EXTRACT(EPOCH FROM clock_timestamp())"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def _execute(sql: str, params: list) -> tuple[int, list]:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=SelectorLease._meta.db_table, now=_now_sql()), params)
        rows = cursor.fetchall() if cursor.description else []
        return cursor.rowcount, rows


def acquire(me: str, wait: float) -> bool:
    """Take the lease, waiting up to `wait` seconds as the successor; False if another holder
    kept it or a newer successor took our place."""
    wait = min(wait, SUCCESSOR_WAIT_SECONDS)
    _execute("INSERT INTO {table} (id, holder, renewed_at, successor, successor_since) "
             "VALUES (1, '', 0, '', 0) "
             "ON CONFLICT (id) DO NOTHING", [])
    deadline = time.monotonic() + wait
    waiting = False
    while True:
        taken, _ = _execute(
            "UPDATE {table} SET holder = %s, renewed_at = {now}, successor = CASE WHEN "
            "successor = %s OR NOT " + _live_successor() + " THEN '' ELSE successor END "
            "WHERE id = 1 AND (holder = '' OR renewed_at < {now} - %s)",
            [me, me, TTL_SECONDS])
        if taken:
            return True
        if not waiting:
            _execute("UPDATE {table} SET successor = %s, successor_since = {now} WHERE id = 1",
                     [me])
            waiting = True
        else:
            _, rows = _execute("SELECT successor FROM {table} WHERE id = 1", [])
            if rows[0][0] != me:
                return False
        if time.monotonic() > deadline:
            _execute("UPDATE {table} SET successor = '' WHERE id = 1 AND successor = %s", [me])
            return False
        time.sleep(POLL_SECONDS)


def renew(me: str) -> str:
    """HELD while we hold the lease and nobody waits; HANDOVER when a successor waits; LOST when
    the lease ran out and another process took it."""
    _, rows = _execute("UPDATE {table} SET renewed_at = {now} WHERE id = 1 AND holder = %s "
                       "RETURNING successor, " + _live_successor(), [me])
    if not rows:
        return LOST
    successor, live = rows[0]
    return HANDOVER if live and successor != me else HELD


def release(me: str):
    _execute("UPDATE {table} SET holder = '' WHERE id = 1 AND holder = %s", [me])


def vacant() -> bool:
    """Nobody runs the selector loop and nobody waits to: its holder let go or died and its
    lease ran out, and no live successor waits."""
    _, rows = _execute("SELECT holder = '' OR renewed_at < {now} - %s, NOT " + _live_successor()
                       + " FROM {table} WHERE id = 1", [TTL_SECONDS])
    return not rows or (bool(rows[0][0]) and bool(rows[0][1]))
