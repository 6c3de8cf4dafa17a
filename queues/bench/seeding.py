"""Fills the database with realistic queue data in bulk SQL, for `bench seed` and `demo`.

It bypasses the lifecycle module for speed but leaves the rows the lifecycle would have left:
items in every status, their attempts, events, dead letters and consistent counters. Rows are
generated inside the database (generate_series on PostgreSQL, a recursive CTE on SQLite), so
seeding a million items ships no rows through Python.
"""

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from queues.engine import history, partitions
from queues.models import (
    IN_FLIGHT_STATUSES,
    Attempt,
    DeadLetter,
    ErrorGroupHour,
    ErrorGroupMinute,
    Item,
    ItemEvent,
    MetricHour,
    MetricMinute,
    OutcomeMinute,
    Queue,
    StatusCount,
)

# Per-mille bands of the status mix: about 70% ready so the selector has a realistic backlog.
STATUS_BANDS = [
    ("queued", 620),
    ("retry", 80),
    ("dispatched", 5),
    ("running", 10),
    ("complete", 220),
    ("failed", 40),
    ("cancelled", 25),
]
# A queue never holds more items in flight than its concurrency (100 by default) plus the few
# a lost worker left: the in-flight bands above shrink so that a queue gets about this many.
# Unbounded, a 10M seed held 150,000 in flight, which no selector dispatches.
IN_FLIGHT_PER_QUEUE = 300
IN_FLIGHT_SCALE = 1_000_000  # the second hash's range, which decides which draws stay in flight
ERRORS = [
    "ConnectionError: HTTPSConnectionPool(host='api.partner.example', port=443): Read timed out.",
    "HTTP 503 Service Unavailable from https://hooks.example.com/ingest",
    "HTTP 429 Too Many Requests (Retry-After: 120)",
    "ValueError: invoice 'INV-1042' has no line items",
    "PermissionError: token for account expired",
]
# The frames of a failed attempt's traceback; its last line is the attempt's own error.
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/queues/worker.py", line 88, in run_one\n'
    "    handler(item)\n"
    '  File "/app/partners/handlers.py", line 41, in deliver\n'
    "    response.raise_for_status()\n"
)
# Six attempts ten minutes apart, and a minute to spare: how old the newest seeded item is.
HISTORY_SECONDS = 6 * 600 + 60
SEED_PRIME = 1_000_003  # multiplier that permutes 0..N-1 when N is not a multiple of it


@dataclass
class SeedResult:
    items: int
    accounts: int
    queues: int
    seconds: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    wall_seconds: float = 0.0  # steps overlap on PostgreSQL, so this is not their sum


class Dialect:
    """The few SQL fragments that differ between PostgreSQL and SQLite."""

    def __init__(self, now: datetime):
        self.pg = connection.vendor == "postgresql"
        self.now = now

    def now_plus(self, seconds_sql: str) -> str:
        if self.pg:
            return f"(TIMESTAMPTZ '{self.now.isoformat()}' + ({seconds_sql}) * INTERVAL '1 second')"
        base = self.now.strftime("%Y-%m-%d %H:%M:%S.%f")
        return f"strftime('%Y-%m-%d %H:%M:%f', '{base}', ({seconds_sql}) || ' seconds')"

    def plus(self, column: str, seconds_sql: str) -> str:
        if self.pg:
            return f"({column} + ({seconds_sql}) * INTERVAL '1 second')"
        return f"strftime('%Y-%m-%d %H:%M:%f', {column}, ({seconds_sql}) || ' seconds')"

    def minute(self, column: str) -> str:
        if self.pg:
            return f"date_trunc('minute', {column})"
        return f"strftime('%Y-%m-%d %H:%M:00', {column})"

    @property
    def fence(self) -> str:
        """Ends a subquery so that PostgreSQL computes each row once instead of inlining the
        expressions into a join above it (where they would run once per joined row)."""
        return "OFFSET 0" if self.pg else ""

    def zero_pad(self, number_sql: str, width: int) -> str:
        # Zero-padded identifiers sort like their numbers, so the identifier indexes grow at
        # their right edge during a bulk seed instead of being written all over.
        if self.pg:
            return f"lpad(({number_sql})::text, {width}, '0')"
        return f"printf('%0{width}d', {number_sql})"

    def json_object(self, *pairs: str) -> str:
        return f"{'jsonb_build_object' if self.pg else 'json_object'}({', '.join(pairs)})"

    def numbered_accounts(self, count: int) -> tuple[str, str]:
        """(prefix, source) of rows (n, account) for n = 0..count-1, where account is the one
        whose range in seed_accounts holds (n * SEED_PRIME) % count: a permutation, so every
        account gets exactly its share, spread over time."""
        if self.pg:
            # Walk each account's range and invert the permutation: no per-row index probe.
            inverse = pow(SEED_PRIME, -1, count)
            return "", (
                f"(SELECT (x.x * {inverse}) % {count} AS n, a.name AS account "
                f"FROM seed_accounts a, generate_series(a.lo, a.hi - 1) AS x(x)) numbered"
            )
        return (
            f"WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g "
            f"WHERE n < {count - 1}) ",
            f"(SELECT n, (SELECT name FROM seed_accounts WHERE lo <= (n * {SEED_PRIME}) % {count} "
            f"ORDER BY lo DESC LIMIT 1) AS account FROM g) numbered",
        )


def zipf_counts(total: int, accounts: int, rng: random.Random, exponent: float = 1.0) -> list[int]:
    """Split `total` items over accounts with Zipf-like sizes (the largest ~10% at 10k accounts),
    every account getting at least one item when there are enough."""
    weights = [1 / (rank + 1) ** exponent for rank in range(accounts)]
    scale = total / sum(weights)
    counts = [max(1, int(w * scale)) if total >= accounts else int(w * scale) for w in weights]
    counts[0] += total - sum(counts)
    rng.shuffle(counts)  # big accounts should not all sort first by name
    return counts


def seed(*, items: int, accounts: int, queues: list[Queue], spread_days: int = 30,
         account_prefix: str = "acct", seed_value: int = 7, in_flight_age: int = 0,
         waiting_within: int = 0, log=None) -> SeedResult:
    """`in_flight_age`: seconds since the seeded dispatched and running items last moved (the
    demo makes them old enough for the sweeper to find their worker lost). `waiting_within`:
    if set, items not yet finished were enqueued within that many seconds (a live queue's
    backlog is recent; the benchmarks spread every status over the whole range)."""
    if items < 1 or accounts < 1 or not queues:
        raise ValueError("need at least one item, one account and one queue")
    if items % SEED_PRIME == 0:
        items += 1  # keep the account permutation a bijection
    now = timezone.now().replace(microsecond=0)
    dialect = Dialect(now)
    result = SeedResult(items=items, accounts=accounts, queues=len(queues))
    plan = _Plan(dialect, items, queues, spread_days, f"s{int(time.time() * 1000):x}",
                 zipf_accounts(items, accounts, account_prefix, random.Random(seed_value)),
                 in_flight_age, waiting_within)

    def step(name):
        return _Timer(result, name, log)

    started = time.perf_counter()
    plan.first_id = _reserve_ids(Item, items)
    if dialect.pg:
        # Items and events are independent rows generated from the same numbers, so on
        # PostgreSQL the events load on a second connection while the items load here; both
        # transactions commit only when both loads succeeded.
        with _parallel(lambda: _load_events(plan, step, result)) as events:
            _load_items(plan, step, result)
            events.wait()
        with step("analyze"):
            for model in (Item, Attempt, ItemEvent, DeadLetter):
                _execute(f"ANALYZE {model._meta.db_table}")
    else:
        with transaction.atomic():
            _load_items(plan, step, result)
            _load_events(plan, step, result)
    with step("history"):
        # The charts' and the error trends' rollups of the seeded events, so that they can be
        # measured at scale.
        result.rows.update(history.backfill([queue.pk for queue in queues]))
        if dialect.pg:
            for model in (MetricMinute, MetricHour, ErrorGroupMinute, ErrorGroupHour):
                _execute(f"ANALYZE {model._meta.db_table}")
    result.wall_seconds = time.perf_counter() - started
    return result


@dataclass
class _Plan:
    dialect: "Dialect"
    items: int
    queues: list
    spread_days: int
    tag: str
    accounts: list[tuple[int, int, str]]
    in_flight_age: int
    waiting_within: int
    first_id: int = 0


def _load_items(plan: "_Plan", step, result: SeedResult):
    with transaction.atomic(), _bulk_load(plan.dialect, [Item, Attempt], step, "item indexes"):
        _create_seeded_days(plan, partitions.ATTEMPTS)
        _create_account_table(plan.accounts)
        with step("items"):
            _execute(_insert_items_sql(plan))
            result.rows["items"] = plan.items
        with step("attempts"):
            result.rows["attempts"] = _insert_attempts(plan.dialect, plan.first_id)
        with step("dead letters"):
            result.rows["dead_letters"] = _insert_dead_letters(plan.first_id)
        with step("counters"):
            _add_counters(plan.first_id)
        _execute("DROP TABLE seed_accounts")


def _load_events(plan: "_Plan", step, result: SeedResult):
    with transaction.atomic(), _bulk_load(plan.dialect, [ItemEvent], step, "event indexes"):
        _create_seeded_days(plan, partitions.EVENTS)
        _create_account_table(plan.accounts)
        with step("events"):
            result.rows["events"] = _execute(_insert_events_sql(plan))
        with step("outcome rollups"):
            _add_outcome_minutes(plan.dialect, plan.first_id)
        _execute("DROP TABLE seed_accounts")


def _create_seeded_days(plan: "_Plan", table: partitions.PartitionedTable):
    """The seeded days get their own partitions, as the sweeper creates them for live rows,
    so that retention can drop them whole."""
    if not plan.dialect.pg:
        return
    with connection.cursor() as cursor:
        if partitions.is_partitioned(cursor, table):
            partitions.create_days(cursor, table, plan.dialect.now - timedelta(
                days=plan.spread_days + 1), plan.dialect.now)


class _parallel:
    """Runs `work` in a thread with its own database connection. Its transaction commits only
    after the caller's block finished without error (the caller waits for it with wait())."""

    def __init__(self, work):
        self.work = work
        self.error: BaseException | None = None
        self.loaded = threading.Event()
        self.verdict = threading.Event()
        self.commit = False

    def _run(self):
        try:
            with transaction.atomic():
                self.work()
                self.loaded.set()
                self.verdict.wait()
                if not self.commit:
                    raise _Abandoned
        except _Abandoned:
            pass
        except BaseException as exc:  # reported to the caller in wait()
            self.error = exc
        finally:
            self.loaded.set()
            connection.close()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, name="seed-events")
        self.thread.start()
        return self

    def wait(self):
        self.loaded.wait()
        if self.error:
            raise self.error

    def __exit__(self, exc_type, *exc):
        self.commit = exc_type is None and self.error is None
        self.verdict.set()
        self.thread.join()
        if exc_type is None and self.error:
            raise self.error


class _Abandoned(Exception):
    pass


@contextmanager
def _bulk_load(d: Dialect, models: list, step, label: str):
    """On PostgreSQL, load empty tables without their secondary indexes and build those once at
    the end: a sorted build is several times faster than a million random index insertions.
    Tables that already hold rows keep their indexes; everything stays in one transaction."""
    saved = []
    if d.pg:
        with connection.cursor() as cursor:
            # Django's foreign keys are deferred; checking them per statement instead lets the
            # index builds below run (PostgreSQL refuses them while trigger events are pending).
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            # The generated statements are large expressions run once: compiling them with JIT
            # costs seconds and saves nothing.
            cursor.execute("SET LOCAL jit = off")
            # Sorting a million generated rows by time fits in memory instead of spilling.
            cursor.execute("SET LOCAL work_mem = '256MB'")
            cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
            _skip_foreign_key_triggers(cursor)
            for model in models:
                table = model._meta.db_table
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")
                if cursor.fetchone()[0]:
                    continue
                cursor.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND "
                    "indexname NOT IN (SELECT conname FROM pg_constraint)", [table])
                for name, definition in cursor.fetchall():
                    cursor.execute(f'DROP INDEX "{name}"')
                    saved.append(definition)
    yield
    if saved:
        with step(label), connection.cursor() as cursor:
            for definition in saved:
                # A partitioned table's index reads "ON ONLY": built that way it would cover
                # none of the partitions.
                cursor.execute(definition.replace(" ON ONLY ", " ON ", 1))


def _skip_foreign_key_triggers(cursor):
    """The seeded rows reference each other correctly by construction; per-row foreign-key
    triggers would double the load time. Only a superuser may skip them: others just wait."""
    try:
        with transaction.atomic():
            cursor.execute("SET LOCAL session_replication_role = replica")
    except DatabaseError:
        pass


class _Timer:
    def __init__(self, result: SeedResult, name: str, log):
        self.result, self.name, self.log = result, name, log

    def __enter__(self):
        self.started = time.perf_counter()

    def __exit__(self, *exc):
        elapsed = time.perf_counter() - self.started
        self.result.seconds[self.name] = elapsed
        if self.log and exc[0] is None:
            self.log(f"  {self.name:<13} {elapsed:6.2f} s")


def _execute(sql: str) -> int:
    # No parameters: the generated SQL holds only integers and literal() strings, and leaving
    # the driver's %-interpolation out lets strftime formats through unescaped.
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.rowcount


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def zipf_accounts(items: int, accounts: int, prefix: str,
                  rng: random.Random) -> list[tuple[int, int, str]]:
    """(lo, hi, name): each account owns a range of the permuted item numbers."""
    rows, lo = [], 0
    for index, count in enumerate(zipf_counts(items, accounts, rng)):
        if count:
            rows.append((lo, lo + count, f"{prefix}-{index:05d}"))
            lo += count
    return rows


def _create_account_table(rows: list[tuple[int, int, str]]):
    # A temporary table is private to its connection: each loading connection makes its own.
    _execute("DROP TABLE IF EXISTS seed_accounts")
    _execute("CREATE TEMPORARY TABLE seed_accounts "
             "(lo BIGINT PRIMARY KEY, hi BIGINT, name VARCHAR(200))")
    with connection.cursor() as cursor:
        cursor.executemany("INSERT INTO seed_accounts (lo, hi, name) VALUES (%s, %s, %s)", rows)


def _reserve_ids(model, count: int) -> int:
    """Items get explicit ids first_id + 1 + n, so events can be generated for them from the
    same numbers without reading the items back. Returns first_id."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SELECT pg_get_serial_sequence('{table}', 'id')")
            sequence = cursor.fetchone()[0]
            cursor.execute(
                f"SELECT setval('{sequence}', GREATEST((SELECT COALESCE(MAX(id), 0) FROM {table}),"
                f" (SELECT last_value FROM {sequence})) + {int(count)}) - {int(count)}")
        else:
            # AUTOINCREMENT never reuses an id, even of deleted rows: start past both.
            cursor.execute(
                f"SELECT MAX(COALESCE((SELECT MAX(id) FROM {table}), 0), COALESCE("
                f"(SELECT seq FROM sqlite_sequence WHERE name = '{table}'), 0))")
        return cursor.fetchone()[0]


ITEM_COLUMNS = ("id, queue_id, account, identifier, payload, priority, status, previous_status, "
                "attempts, run_at, last_error, created_at, updated_at, dispatched_at, started_at, "
                "finished_at")


def _insert_items_sql(plan: "_Plan") -> str:
    prefix, generated = _generated_items_sql(plan)
    return (f"{prefix} INSERT INTO {Item._meta.db_table} ({ITEM_COLUMNS}) "
            f"SELECT {ITEM_COLUMNS} FROM {generated} AS generated ORDER BY id")


def _generated_items_sql(plan: "_Plan") -> tuple[str, str]:
    """(prefix, subquery) yielding every column of the seeded items, id included."""
    d, items, queues, tag = plan.dialect, plan.items, plan.queues, plan.tag
    prefix, source = d.numbered_accounts(items)
    spread = plan.spread_days * 86400
    bands, upper = [], 0
    kept = _in_flight_kept(items, len(queues))
    for status, width in STATUS_BANDS:
        if status in IN_FLIGHT_STATUSES:
            # An in-flight draw past the queues' share stays queued; a second hash of n
            # decides, so the kept ones spread over every queue and the whole time range.
            bands.append(f"WHEN r < {upper + width} AND (n * 2246822519) % 4294967291 % "
                         f"{IN_FLIGHT_SCALE} < {kept} "
                         f"THEN '{status}'")
            bands.append(f"WHEN r < {upper + width} THEN 'queued'")
        else:
            bands.append(f"WHEN r < {upper + width} THEN '{status}'")
        upper += width
    queue_case = " ".join(f"WHEN {i} THEN {q.pk}" for i, q in enumerate(queues))
    # Every item is old enough for its attempts (ten minutes apart) and their events to lie in
    # the past, before the current attempt of an in-flight item.
    oldest_history = HISTORY_SECONDS + plan.in_flight_age
    created = d.now_plus(f"-{spread} - {oldest_history} + n * {spread} / {items}")
    if plan.waiting_within:
        recent = d.now_plus(f"-{oldest_history} - v % {int(plan.waiting_within)}")
        created = (f"CASE WHEN status IN ('queued', 'retry', 'dispatched', 'running') "
                   f"THEN {recent} ELSE {created} END")
    moved = d.now_plus(f"-({plan.in_flight_age} + v % 60)")  # in-flight items' last move
    started = d.now_plus(f"-({plan.in_flight_age} + v % 50)")
    # Attempts are ten minutes apart (see _insert_attempts): the last one is dispatched 1 s,
    # started 2 s and ended 3 s to a minute after its start of ten minutes.
    last = "CASE WHEN attempts > 1 THEN (attempts - 1) * 600 ELSE 0 END"
    finish = f"{last} + 3 + v % 60"
    # r picks the status, v varies the details; both are cheap integer hashes of n so that the
    # same SQL runs on both databases and repeated seeds are reproducible.
    sql = f"""(
    SELECT {plan.first_id + 1} + n AS id, queue_id, account, identifier, payload, priority,
        status,
        CASE status WHEN 'queued' THEN '' WHEN 'dispatched' THEN 'queued'
            WHEN 'running' THEN 'dispatched' WHEN 'cancelled' THEN 'queued' ELSE 'running' END
            AS previous_status,
        attempts,
        CASE WHEN status = 'queued' AND v % 40 = 0 THEN {d.now_plus("v % 3600")}
             WHEN status = 'retry' AND v % 4 = 0 THEN {d.now_plus("v % 2700")}
             WHEN status = 'retry' THEN {d.now_plus("-(v % 600)")}
             ELSE created END AS run_at,
        CASE WHEN status IN ('retry', 'failed') THEN {_error_case("v")} ELSE '' END AS last_error,
        created AS created_at,
        CASE WHEN status = 'dispatched' THEN {moved} WHEN status = 'running' THEN {started}
             WHEN status IN ('complete', 'failed', 'cancelled', 'retry')
                 THEN {d.plus("created", finish)}
             ELSE created END AS updated_at,
        CASE WHEN status = 'dispatched' THEN {moved}
             WHEN status = 'running' THEN {d.plus(started, "-1")}
             WHEN status IN ('queued', 'cancelled') THEN NULL
             ELSE {d.plus("created", f"{last} + 1")} END AS dispatched_at,
        CASE WHEN status = 'running' THEN {started}
             WHEN status IN ('complete', 'retry', 'failed') THEN {d.plus("created", f"{last} + 2")}
             ELSE NULL END AS started_at,
        CASE WHEN status IN ('complete', 'failed', 'cancelled') THEN {d.plus("created", finish)}
             ELSE NULL END AS finished_at
    FROM (
        SELECT n, r, v, status, account, {created} AS created,
            CASE n % {len(queues)} {queue_case} END AS queue_id,
            '{tag}-' || {d.zero_pad("n", 9)} AS identifier,
            {d.json_object("'order'", "n", "'amount_cents'", "v % 100000", "'currency'", "'EUR'")}
                AS payload,
            CASE WHEN v % 20 = 0 THEN 5 ELSE 0 END AS priority,
            CASE status WHEN 'queued' THEN 0 WHEN 'cancelled' THEN 0
                WHEN 'dispatched' THEN 1 + v % 2 WHEN 'running' THEN 1 + v % 2
                WHEN 'complete' THEN 1 + CASE WHEN v % 10 = 0 THEN 1 ELSE 0 END
                WHEN 'retry' THEN 1 + v % 4
                ELSE CASE WHEN v % 3 = 0 THEN 1 ELSE 6 END END AS attempts
        FROM (
            SELECT n, r, v, account, CASE {' '.join(bands)} END AS status
            FROM (SELECT n, account, (n * 2654435761) % 4294967291 % 1000 AS r,
                         (n * 40503) % 65521 AS v FROM {source}) hashed
        ) with_status
    ) seeded
    {d.fence}
    )"""
    return prefix, sql


def _in_flight_kept(items: int, queues: int) -> int:
    """Of IN_FLIGHT_SCALE in-flight draws, how many stay in flight: all of them in a small
    seed, fewer where the bands would give a queue more than IN_FLIGHT_PER_QUEUE."""
    drawn = items * sum(w for s, w in STATUS_BANDS if s in IN_FLIGHT_STATUSES) / 1000
    return min(IN_FLIGHT_SCALE, round(IN_FLIGHT_SCALE * IN_FLIGHT_PER_QUEUE * queues / drawn))


def _insert_attempts(d: Dialect, first_id: int) -> int:
    """One row per finished attempt; the current attempt of a dispatched or running item is
    still open and has none, as the lifecycle leaves it."""
    table, items = Attempt._meta.db_table, Item._meta.db_table
    sql = f"""
    INSERT INTO {table} (item_id, number, started_at, finished_at, outcome, error, traceback,
                         worker)
    SELECT i.id, k.k,
        CASE WHEN k.k = i.attempts THEN i.started_at
             ELSE {d.plus("i.created_at", "(k.k - 1) * 600 + 2")} END,
        CASE WHEN k.k = i.attempts THEN COALESCE(i.finished_at, i.updated_at)
             ELSE {d.plus("i.created_at", "(k.k - 1) * 600 + 3")} END,
        CASE WHEN k.k < i.attempts THEN 'retry' WHEN i.status = 'complete' THEN 'complete'
             WHEN i.status = 'failed' THEN 'failed' ELSE 'retry' END,
        CASE WHEN k.k = i.attempts THEN i.last_error ELSE {_error_case("i.id + k.k")} END,
        CASE WHEN k.k = i.attempts AND i.status = 'complete' THEN ''
             WHEN k.k = i.attempts THEN {literal(TRACEBACK)} || i.last_error
             ELSE {literal(TRACEBACK)} || {_error_case("i.id + k.k")} END,
        'worker-' || (i.id % 4)
    FROM {items} i JOIN ({_numbers(6)}) k ON k.k <= i.attempts
    WHERE i.id > {int(first_id)}
      AND (k.k < i.attempts OR i.status IN ('complete', 'retry', 'failed'))
    """
    return _execute(sql)


def _error_case(hash_sql: str) -> str:
    whens = " ".join(f"WHEN {i} THEN {literal(e)}" for i, e in enumerate(ERRORS))
    return f"CASE ({hash_sql}) % {len(ERRORS)} {whens} END"


def _numbers(count: int) -> str:
    return " UNION ALL ".join(f"SELECT {k} AS k" for k in range(1, count + 1))


def _insert_events_sql(plan: "_Plan") -> str:
    """The history the lifecycle writes: enqueued, then per attempt dispatched, started and its
    outcome, or cancelled. Generated from the same numbers as the items, not read from them."""
    d = plan.dialect
    prefix, generated = _generated_items_sql(plan)
    # phase 0 = enqueued/cancelled, 1 = dispatched, 2 = started, 3 = attempt outcome
    return f"""
    {prefix} INSERT INTO {ItemEvent._meta.db_table} (item_id, queue_id, account, identifier,
        transition, from_status, to_status, attempt, at, actor, reason)
    SELECT i.id, i.queue_id, i.account, i.identifier,
        CASE p.phase WHEN 0 THEN CASE WHEN p.k = 0 THEN 'enqueued' ELSE 'cancelled' END
            WHEN 1 THEN 'dispatched' WHEN 2 THEN 'started'
            ELSE CASE WHEN p.k < i.attempts OR i.status = 'retry' THEN 'retry_scheduled'
                      WHEN i.status = 'complete' THEN 'completed' ELSE 'failed' END END,
        CASE p.phase WHEN 0 THEN CASE WHEN p.k = 0 THEN '' ELSE 'queued' END
            WHEN 1 THEN CASE WHEN p.k = 1 THEN 'queued' ELSE 'retry' END
            WHEN 2 THEN 'dispatched' ELSE 'running' END,
        CASE p.phase WHEN 0 THEN CASE WHEN p.k = 0 THEN 'queued' ELSE 'cancelled' END
            WHEN 1 THEN 'dispatched' WHEN 2 THEN 'running'
            ELSE CASE WHEN p.k < i.attempts THEN 'retry' ELSE i.status END END,
        CASE WHEN p.phase = 0 THEN 0 ELSE p.k END,
        CASE WHEN p.phase = 0 AND p.k = 0 THEN i.created_at
             WHEN p.phase = 0 THEN i.finished_at
             WHEN p.k = i.attempts AND p.phase = 1 THEN i.dispatched_at
             WHEN p.k = i.attempts AND p.phase = 2 THEN i.started_at
             WHEN p.k = i.attempts THEN COALESCE(i.finished_at, i.updated_at)
             ELSE {d.plus("i.created_at", "(p.k - 1) * 600 + p.phase")} END,
        CASE WHEN p.phase = 0 AND p.k = 0 THEN 'producer' WHEN p.phase = 0 THEN 'user:admin'
             WHEN p.phase = 1 THEN 'selector' ELSE 'worker' END,
        CASE WHEN p.phase = 3 AND p.k < i.attempts THEN {_error_case("i.id + p.k")}
             WHEN p.phase = 3 THEN i.last_error ELSE '' END
    FROM {generated} AS i JOIN ({_phases()}) AS p ON
        (p.phase = 0 AND p.k = 0)
        OR (p.phase = 0 AND p.k = 1 AND i.status = 'cancelled')
        OR (p.phase = 1 AND p.k <= i.attempts)
        OR (p.phase = 2 AND (p.k < i.attempts OR (p.k = i.attempts AND i.status <> 'dispatched')))
        OR (p.phase = 3 AND (p.k < i.attempts
                             OR (p.k = i.attempts AND i.status IN ('complete', 'retry', 'failed'))))
    """


def _phases() -> str:
    rows = ["SELECT 0 AS phase, 0 AS k", "SELECT 0, 1"]
    rows += [f"SELECT {phase}, {k}" for phase in (1, 2, 3) for k in range(1, 7)]
    return " UNION ALL ".join(rows)


def _insert_dead_letters(first_id: int) -> int:
    sql = f"""
    INSERT INTO {DeadLetter._meta.db_table} (item_id, queue_id, account, reason, last_error,
                                            attempts, created_at, replayed_by)
    SELECT id, queue_id, account, CASE WHEN attempts = 1 THEN 'permanent' ELSE 'exhausted' END,
           last_error, attempts, finished_at, ''
    FROM {Item._meta.db_table} WHERE id > {int(first_id)} AND status = 'failed'
    """
    return _execute(sql)


def _add_counters(first_id: int):
    """Base counts for the seeded items."""
    items, counts = Item._meta.db_table, StatusCount._meta.db_table
    _execute(f"""
        INSERT INTO {counts} (queue_id, status, count)
        SELECT queue_id, status, COUNT(*) FROM {items} WHERE id > {int(first_id)}
        GROUP BY queue_id, status
        ON CONFLICT (queue_id, status) DO UPDATE SET count = {counts}.count + excluded.count
    """)


def _add_outcome_minutes(d: Dialect, first_id: int):
    """Outcome rollups for the last day of the seeded events."""
    minutes, events = OutcomeMinute._meta.db_table, ItemEvent._meta.db_table
    since = d.now_plus(f"-{int(timedelta(days=1).total_seconds())}")
    _execute(f"""
        INSERT INTO {minutes} (queue_id, minute, status, count)
        SELECT queue_id, {d.minute("at")}, to_status, COUNT(*) FROM {events}
        WHERE item_id > {int(first_id)} AND at >= {since}
          AND to_status IN ('complete', 'retry', 'failed', 'cancelled')
        GROUP BY queue_id, {d.minute("at")}, to_status
        ON CONFLICT (queue_id, minute, status)
        DO UPDATE SET count = {minutes}.count + excluded.count
    """)
