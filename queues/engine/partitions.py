"""Weekly partitions of the item event table on PostgreSQL.

Events are written in time order and kept by their own age, so the table is partitioned by
range of `at`, one partition a week (Monday 00:00 UTC). Retention drops a week whose every event
is past every queue's retention whole (detached, then dropped), instead of deleting millions of
rows spread over the table. A default partition takes any event no week holds (a clock far
off, weeks not yet created because the sweeper was down), so that a transition never fails for
want of a partition. The sweeper creates the coming weeks ahead; migration 0025 made the table.

SQLite has no partitions: there retention deletes events row by row, as it does here for
queues whose retention is shorter than the longest.
"""

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, connection, transaction

from queues.engine.db import is_postgres

TABLE = "queues_itemevent"
DEFAULT_PARTITION = f"{TABLE}_default"
WEEK = timedelta(days=7)
WEEKS_AHEAD = 4
# Creating or dropping a partition locks the whole table for an instant. Waiting behind a long
# transaction would queue every transition behind it, so give up and try again next run.
LOCK_TIMEOUT = "200ms"
# A week detached for dropping: the name says the sweeper may drop it.
EXPIRED_PREFIX = "expired_"
_BOUND = re.compile(r"FROM \((MINVALUE|'[^']+')\) TO \((MAXVALUE|'[^']+')\)")


@dataclass(frozen=True)
class Partition:
    name: str
    lower: datetime | None  # None: MINVALUE, or the default partition
    upper: datetime | None  # None: MAXVALUE, or the default partition
    is_default: bool = False


def week_start(moment: datetime) -> datetime:
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def week_name(start: datetime) -> str:
    return f"{TABLE}_p{start:%Y%m%d}"


def is_partitioned(cursor) -> bool:
    cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", [TABLE])
    row = cursor.fetchone()
    return bool(row and row[0])


def partitions(cursor) -> list[Partition]:
    """The table's partitions, oldest first, the default last."""
    cursor.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)", [TABLE])
    found = []
    for name, bound in cursor.fetchall():
        if bound == "DEFAULT":
            found.append(Partition(name, None, None, is_default=True))
            continue
        lower, upper = _BOUND.search(bound).groups()
        found.append(Partition(name, _bound_time(lower), _bound_time(upper)))
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(found, key=lambda p: (p.is_default, p.lower or oldest))


def _bound_time(text: str) -> datetime | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    value = text.strip("'")
    if re.search(r"[+-]\d\d$", value):  # PostgreSQL writes +00 where Python wants +00:00
        value += ":00"
    return datetime.fromisoformat(value)


def create_weeks(cursor, first: datetime, last: datetime) -> list[str]:
    """Creates the weekly partitions from the week of `first` to the week of `last` that no
    partition covers yet. A week the default partition already holds events of is left to it
    (PostgreSQL would refuse it): those events are then pruned row by row."""
    existing = [p for p in partitions(cursor) if not p.is_default]
    created = []
    start = week_start(first)
    while start <= last:
        end = start + WEEK
        overlaps = any((p.lower is None or p.lower < end) and (p.upper is None or start < p.upper)
                       for p in existing)
        if not overlaps:
            try:
                _briefly_locking(cursor, f"CREATE TABLE {week_name(start)} PARTITION OF "
                                         f"{TABLE} FOR VALUES FROM (%s) TO (%s)", [start, end])
                created.append(week_name(start))
            except DatabaseError:
                pass  # the default holds events of that week, or the lock was busy: next run
        start = end
    return created


def ensure_weeks_ahead(now: datetime) -> list[str]:
    """The sweeper's part: this week and the next WEEKS_AHEAD exist before events need them."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        if not is_partitioned(cursor):
            return []
        return create_weeks(cursor, now, now + WEEKS_AHEAD * WEEK)


def drop_older_than(moment: datetime) -> list[str]:
    """Drops every partition whose events are all older than `moment`; returns their names.

    Detached and renamed first, in a short transaction of its own: that locks the whole table
    for an instant and touches no file, so its commit is quick. The DROP then locks only the
    detached table, which no query reaches any more, while its commit removes the files.
    PostgreSQL always waits for the disk before removing files, and freeing a week of events
    took 0.65 to 0.9 s at 10M items; a DROP of an attached week (and before that a TRUNCATE)
    held the table, or that week's readers, for that long. A week left detached by a crash in
    between is dropped by the next run; a week an operator detached by hand keeps its name and
    is left alone."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        if not is_partitioned(cursor):
            return []
        for part in partitions(cursor):
            if part.is_default or part.upper is None or part.upper > moment:
                continue
            try:
                _briefly_locking(cursor, f'ALTER TABLE {TABLE} DETACH PARTITION "{part.name}"; '
                                         f'ALTER TABLE "{part.name}" RENAME TO '
                                         f'"{EXPIRED_PREFIX}{part.name}"', flush=False)
            except DatabaseError:
                break  # the lock was busy: the next run detaches it
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r' "
                       "AND starts_with(relname, %s) "
                       "AND relnamespace = current_schema()::regnamespace ORDER BY relname",
                       [EXPIRED_PREFIX])
        expired = [name for (name,) in cursor.fetchall()]
        for name in expired:
            cursor.execute(f'DROP TABLE "{name}"')
    return [name.removeprefix(EXPIRED_PREFIX) for name in expired]


def _briefly_locking(cursor, statement: str, params=None, *, flush: bool = True):
    """DDL in a transaction of its own that gives up after LOCK_TIMEOUT; with
    flush=False its commit does not wait for the disk (what a crash loses, the next run does
    again)."""
    with transaction.atomic():
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        if not flush:
            cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(statement, params)
