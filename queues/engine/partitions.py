"""Daily partitions of the item event and attempt tables on PostgreSQL.

Events and attempts are written in time order and kept by their own age, so each table is
partitioned by range of its time (an event's `at`, an attempt's `finished_at`), one partition a
day (00:00 UTC). Retention drops a day whose every row is past every queue's retention whole
(detached, then dropped), instead of deleting millions of rows spread over the table. A day
rather than a week because dropping a table frees its files in one commit, in time that grows
with their size: a week of events at 10M items (0.95 GB of heap) took 202 to 224 ms to drop on
a disk mounted with online discard, a day's (0.14 GB) 37 to 43 ms. Partitions of a week made by
earlier releases are kept until they expire, and days follow them. A default partition takes
any row no day holds (a clock far off, days not yet created because the sweeper was down), so
that a transition never fails for want of a partition. The sweeper creates the coming days
ahead; migrations 0025 (events) and 0027 (attempts) made the tables.

SQLite has no partitions: there retention deletes events row by row, as it does here for
queues whose retention is shorter than the longest, and attempts with their items.
"""

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, connection, transaction

from queues.engine.db import is_postgres

DAY = timedelta(days=1)
# Created ahead of the rows that need them: a week without a sweeper run still finds them.
DAYS_AHEAD = 7
# Creating or dropping a partition locks the whole table for an instant. Waiting behind a long
# transaction would queue every transition behind it, so give up and try again next run.
LOCK_TIMEOUT = "200ms"
# A partition detached for dropping: the name says the sweeper may drop it.
EXPIRED_PREFIX = "expired_"
_BOUND = re.compile(r"FROM \((MINVALUE|'[^']+')\) TO \((MAXVALUE|'[^']+')\)")


@dataclass(frozen=True)
class PartitionedTable:
    name: str
    column: str  # the time its rows are partitioned by

    @property
    def default_partition(self) -> str:
        return f"{self.name}_default"

    def partition_name(self, start: datetime) -> str:
        return f"{self.name}_p{start:%Y%m%d}"


EVENTS = PartitionedTable("queues_itemevent", "at")
ATTEMPTS = PartitionedTable("queues_attempt", "finished_at")
TABLES = (EVENTS, ATTEMPTS)


@dataclass(frozen=True)
class Partition:
    name: str
    lower: datetime | None  # None: MINVALUE, or the default partition
    upper: datetime | None  # None: MAXVALUE, or the default partition
    is_default: bool = False


def day_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def is_partitioned(cursor, table: PartitionedTable) -> bool:
    cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
                   [table.name])
    row = cursor.fetchone()
    return bool(row and row[0])


def drops_by_partition(table: PartitionedTable) -> bool:
    """Whether retention drops this table's rows a partition at a time here."""
    if not is_postgres():
        return False
    with connection.cursor() as cursor:
        return is_partitioned(cursor, table)


def partitions(cursor, table: PartitionedTable) -> list[Partition]:
    """The table's partitions, oldest first, the default last."""
    cursor.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [table.name])
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


def create_days(cursor, table: PartitionedTable, first: datetime, last: datetime) -> list[str]:
    """Creates the daily partitions from the day of `first` to the day of `last` that no
    partition covers yet (a week of an earlier release, say). A day the default partition
    already holds rows of is left to it (PostgreSQL would refuse it): those rows are then
    pruned row by row."""
    existing = [p for p in partitions(cursor, table) if not p.is_default]
    created = []
    start = day_start(first)
    while start <= last:
        end = start + DAY
        overlaps = any((p.lower is None or p.lower < end) and (p.upper is None or start < p.upper)
                       for p in existing)
        if not overlaps:
            try:
                _briefly_locking(cursor, f"CREATE TABLE {table.partition_name(start)} "
                                         f"PARTITION OF {table.name} FOR VALUES FROM (%s) TO (%s)",
                                 [start, end])
                created.append(table.partition_name(start))
            except DatabaseError:
                pass  # the default holds rows of that day, or the lock was busy: next run
        start = end
    return created


def create_days_ahead(cursor, table: PartitionedTable, now: datetime,
                      first: datetime | None = None) -> list[str]:
    """The days from `first` (today by default) to DAYS_AHEAD after today that are missing."""
    return create_days(cursor, table, first or now, now + DAYS_AHEAD * DAY)


def ensure_days_ahead(now: datetime) -> list[str]:
    """The sweeper's part: today and the next DAYS_AHEAD exist before rows need them."""
    if not is_postgres():
        return []
    created = []
    with connection.cursor() as cursor:
        for table in TABLES:
            if is_partitioned(cursor, table):
                created += create_days_ahead(cursor, table, now)
    return created


def drop_older_than(table: PartitionedTable, moment: datetime) -> list[str]:
    """Drops every partition whose rows are all older than `moment`; returns their names.

    Detached and renamed first, in a short transaction of its own: that locks the whole table
    for an instant and touches no file, so its commit is quick. The DROP then locks only the
    detached table, which no query reaches any more, while its commit removes the files.
    PostgreSQL always waits for the disk before removing files, and freeing a week of events
    took 0.65 to 0.9 s at 10M items; a DROP of an attached week (and before that a TRUNCATE)
    held the table, or that week's readers, for that long. A partition left detached by a crash
    in between is dropped by the next run; one an operator detached by hand keeps its name and
    is left alone."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        if not is_partitioned(cursor, table):
            return []
        for part in partitions(cursor, table):
            if part.is_default or part.upper is None or part.upper > moment:
                continue
            try:
                _briefly_locking(cursor, f'ALTER TABLE {table.name} DETACH PARTITION '
                                         f'"{part.name}"; '
                                         f'ALTER TABLE "{part.name}" RENAME TO '
                                         f'"{EXPIRED_PREFIX}{part.name}"', flush=False)
            except DatabaseError:
                break  # the lock was busy: the next run detaches it
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r' "
                       "AND starts_with(relname, %s) "
                       "AND relnamespace = current_schema()::regnamespace ORDER BY relname",
                       [f"{EXPIRED_PREFIX}{table.name}_"])
        expired = [name for (name,) in cursor.fetchall()]
        for name in expired:
            _drop_a_file_at_a_time(cursor, name)
    return [name.removeprefix(EXPIRED_PREFIX) for name in expired]


def _drop_a_file_at_a_time(cursor, name: str) -> None:
    """Drops a detached partition's indexes one statement each, then its table. A commit that
    drops a relation frees its files before it returns, in time that grows with their size:
    a week of events at 10M items (0.95 GB of heap, 0.92 GB in 4 indexes) took 395 to 446 ms
    in one statement, and 37 to 74 ms an index, then 202 to 224 ms the heap. A partition left
    half dropped keeps its name, and the next run finishes it."""
    cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
                   "AND contype IN ('p', 'u')", [f'"{name}"'])
    for (constraint,) in cursor.fetchall():
        cursor.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{constraint}"')
    cursor.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass",
                   [f'"{name}"'])
    for (index,) in cursor.fetchall():
        cursor.execute(f"DROP INDEX {index}")
    cursor.execute(f'DROP TABLE "{name}"')


def _briefly_locking(cursor, statement: str, params=None, *, flush: bool = True):
    """DDL in a transaction of its own that gives up after LOCK_TIMEOUT; with
    flush=False its commit does not wait for the disk (what a crash loses, the next run does
    again)."""
    with transaction.atomic():
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        if not flush:
            cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(statement, params)


def prune_default(table: PartitionedTable, before: datetime, limit: int) -> int:
    """Deletes up to `limit` rows of the default partition older than `before`: no day holds
    them, so no drop takes them. Returns how many went."""
    if not is_postgres():
        return 0
    with connection.cursor() as cursor:
        if not is_partitioned(cursor, table):
            return 0
        default = table.default_partition
        cursor.execute(f"DELETE FROM {default} WHERE (id, {table.column}) IN (SELECT id, "
                       f"{table.column} FROM {default} WHERE {table.column} < %s LIMIT %s)",
                       [before, limit])
        return cursor.rowcount
