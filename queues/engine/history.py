"""Metric history for the dashboard's charts: per queue, and per top account of each queue, per
minute for 48 hours and per hour for 30 days, the items completed, failed for good, scheduled for
retry and enqueued, the depth by status, and the wait and run times of the items that finished,
as histograms (models.HISTOGRAM_BOUNDS) whose buckets add up over any window.

`run` (a django-q2 schedule, every minute) rewrites the last minutes from the item events in one
INSERT ... SELECT ... GROUP BY, rewrites the hours they belong to from the minutes, samples each
queue's depth from the counters and prunes what is past retention. A rewrite replaces what the
period held, so a minute may be rolled up again: each run rewrites the last two, so that events
committed a little late still count. Pages read these tables only, never the items.

The same run keeps each error group's failures (queues.engine.errors) per queue per minute and
per hour, for the errors page's trends: the window's failure events are grouped by their text in
SQL, each distinct text is normalised once in Python (the normalising is Python's), and each
period keeps its ERROR_GROUPS largest groups and the rest under OTHER_ERROR_GROUP; the hours are
summed from the minutes in SQL, capped the same way.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Max, Min
from django.utils import timezone

from queues.engine import counters
from queues.engine.db import insert_rows, is_postgres, placeholders, to_db_datetime
from queues.engine.errors import group_key, normalise_error
from queues.models import (
    HISTOGRAM_BOUNDS,
    HISTOGRAM_BUCKETS,
    HISTOGRAM_KINDS,
    OTHER_ERROR_GROUP,
    ErrorGroupHour,
    ErrorGroupMinute,
    HistoryRun,
    InstallationHour,
    InstallationMinute,
    Item,
    ItemEvent,
    MetricHour,
    MetricMinute,
    Queue,
    Status,
    histogram_column,
)

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
MINUTE_RETENTION = timedelta(hours=48)
HOUR_RETENTION = timedelta(days=30)
# A run's mark serves windows up to the minutes' retention back (after an outage).
RUN_RETENTION = MINUTE_RETENTION + HOUR
REWRITE = timedelta(minutes=2)  # each run rewrites at least the last two whole minutes
# How far an event's time may lie before the moment its row got its id: the writing process's
# clock against the rollup's, and the moments between taking the time and inserting.
CLOCK_SLACK = timedelta(minutes=1)
TOP_ACCOUNTS = 20
LOCK_KEY = 7_466_003  # the sweeper's is 7_466_002
ERROR_GROUPS = 50  # error groups kept per queue and period; the rest count as OTHER_ERROR_GROUP
# The characters of an event's error that the rollup groups by in SQL: the first line's
# MESSAGE_LIMIT that make its group, with room for blanks before them, and not the rest of a
# long error, whose distinct tails would each be a row to read.
ERROR_PREFIX = 1_024
ERROR_COLUMNS = ("queue_id", "start", "group_key", "kind", "message", "failures")

COUNTS = ("completed", "failed", "retried", "enqueued")
DEPTHS = ("depth_queued", "depth_retry", "depth_dispatched", "depth_running", "depth_failed")
DEPTH_STATUSES = (Status.QUEUED, Status.RETRY, Status.DISPATCHED, Status.RUNNING, Status.FAILED)
BUCKETS = {kind: tuple(histogram_column(kind, b) for b in range(HISTOGRAM_BUCKETS))
           for kind in HISTOGRAM_KINDS}
SUMMED = COUNTS + BUCKETS["wait"] + BUCKETS["run"]


# --- the scheduled run -------------------------------------------------------------------------

def run(now: datetime | None = None) -> dict[str, int] | None:
    """The scheduled task: the last minutes and their hours rewritten, depth sampled, old rows
    pruned, the run recorded (empty ones too). None when another run holds the lock."""
    now = _utc(now or timezone.now())
    with transaction.atomic():
        if not _alone():
            return None
        mark = _newest_event_id()
        start, end, after = _window(now)
        changed: Counter = Counter()
        if start < end:
            changed["minutes rewritten"] = roll_up(MetricMinute, start, end, after)
            changed["error group minutes rewritten"] = roll_up_errors(
                ErrorGroupMinute, start, end, after)
            # Into the last minute of the window, so that no minute has a depth but no counts.
            changed["depth samples"] = sample_depth(end - MINUTE)
            hours = _floor(start, HOUR), _ceil(end, HOUR)
            changed["hours rewritten"] = roll_up_hours(*hours)
            changed["error group hours rewritten"] = roll_up_error_hours(*hours)
            changed["installation periods rewritten"] = (
                roll_up_installation(InstallationMinute, start, end)
                + roll_up_installation(InstallationHour, *hours))
        changed.update(prune(now))
        counts = {action: n for action, n in changed.items() if n}
        HistoryRun.objects.create(started_at=now, finished_at=timezone.now(), rolled_to=end,
                                  last_event_id=mark, counts=counts)
    return counts


def _window(now: datetime) -> tuple[datetime, datetime, int]:
    """(start, end, after_event_id): the whole minutes to rewrite, from those the last run left
    (catching up after a gap, within the retention) to the last whole minute, and an event id
    that every event of the window is above. Before the first run's mark is CLOCK_SLACK old the
    window is empty: history begins with the first run."""
    end = _floor(now, MINUTE)
    start = end - REWRITE
    last = HistoryRun.objects.order_by("-started_at").values_list("rolled_to", flat=True).first()
    if last is not None:
        start = min(start, last)
    start = max(start, end - MINUTE_RETENTION)
    after = (HistoryRun.objects.filter(started_at__lte=start - CLOCK_SLACK)
             .order_by("-started_at").values_list("last_event_id", flat=True).first())
    if after is None:
        first = HistoryRun.objects.order_by("started_at").values_list(
            "started_at", "last_event_id").first()
        if first is None:
            return end, end, 0
        start = max(start, _ceil(first[0] + CLOCK_SLACK, MINUTE))
        after = first[1]
    return start, end, after


def _alone() -> bool:
    """One run at a time across machines (two would collide on the account rows they insert);
    on SQLite the write transaction already serialises them."""
    if not is_postgres():
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
        return cursor.fetchone()[0]


def _newest_event_id() -> int:
    return ItemEvent.objects.aggregate(newest=Max("id"))["newest"] or 0


def backfill(queue_ids: list[int], now: datetime | None = None) -> dict[str, int]:
    """History of the events already in the database (`bench seed` and `demo` seed 30 days of
    them): hours older than the minutes' retention straight from the events, then minutes, and
    their hours from the minutes; the error groups' alike. Reads every event of the queues
    twice and their failure events twice more: a one-off."""
    now = _utc(now or timezone.now())
    end = _floor(now, MINUTE)
    split = _ceil(end - MINUTE_RETENTION, HOUR)
    oldest = _floor(end - HOUR_RETENTION, HOUR)
    changed = Counter({
        "hours rewritten": roll_up(MetricHour, oldest, split, 0, queue_ids),
        "minutes rewritten": roll_up(MetricMinute, split, end, 0, queue_ids),
        "error group hours rewritten": roll_up_errors(ErrorGroupHour, oldest, split, 0,
                                                      queue_ids),
        "error group minutes rewritten": roll_up_errors(ErrorGroupMinute, split, end, 0,
                                                        queue_ids),
    })
    changed["hours rewritten"] += roll_up_hours(split, _ceil(end, HOUR), queue_ids)
    changed["error group hours rewritten"] += roll_up_error_hours(split, _ceil(end, HOUR),
                                                                  queue_ids)
    changed["installation periods rewritten"] = (
        roll_up_installation(InstallationMinute, split, end)
        + roll_up_installation(InstallationHour, oldest, _ceil(end, HOUR)))
    counts = dict(changed)
    # The next runs rewrite from REWRITE before `end` and need a run whose mark vouches for
    # those minutes: a mark taken now would vouch only for events from CLOCK_SLACK after now,
    # and the minutes between `end` and then would never be rolled up again.
    vouched = end - REWRITE - CLOCK_SLACK
    HistoryRun.objects.create(started_at=vouched, finished_at=timezone.now(), rolled_to=end,
                              last_event_id=_mark_below(vouched), counts=counts)
    return counts


def _mark_below(moment: datetime) -> int:
    """An event id below every event timed at or after `moment`, found by time rather than by
    when ids were handed out (a seed inserts old events with new ids). On PostgreSQL it reads
    the newest days' partitions of events: a one-off, like the backfill."""
    first = ItemEvent.objects.filter(at__gte=moment).aggregate(first=Min("id"))["first"]
    return _newest_event_id() if first is None else first - 1


# --- writing -----------------------------------------------------------------------------------

def roll_up(model, start: datetime, end: datetime, after_event_id: int = 0,
            queue_ids: Iterable[int] | None = None) -> int:
    """Rewrites `model`'s periods (MetricMinute or MetricHour) in [start, end) from the item
    events with ids above `after_event_id`: one row per queue and period, and one per period for
    each of the queue's TOP_ACCOUNTS accounts that did the most (by items completed, then failed
    or retried, then enqueued). Returns the rows written."""
    table = model._meta.db_table
    unit = "minute" if model is MetricMinute else "hour"
    where, params = _range(start, end, queue_ids)
    with connection.cursor() as cursor:
        # The top accounts of a period may change when it is rolled up again; the queue's row
        # keeps its depth sample, so it is zeroed and overwritten rather than replaced.
        cursor.execute(f"DELETE FROM {table} WHERE {where} AND account <> ''", params)
        zeroes = ", ".join(f"{column} = 0" for column in SUMMED)
        cursor.execute(f"UPDATE {table} SET {zeroes} WHERE {where} AND account = ''", params)
        events_where, events_params = _events_range(start, end, after_event_id, queue_ids)
        per_account = ", ".join(
            [f"SUM({c}) AS {c}" for c in COUNTS]
            + [f"SUM(CASE WHEN {kind}_bucket = {b} THEN 1 ELSE 0 END) AS {column}"
               for kind, columns in BUCKETS.items() for b, column in enumerate(columns)])
        summed = ", ".join(SUMMED)
        updates = ", ".join(f"{c} = excluded.{c}" for c in SUMMED)
        # The WITH inside the INSERT: SQLite's driver reports the rows of statements that
        # begin with INSERT only.
        cursor.execute(
            f"INSERT INTO {table} (queue_id, account, start, {summed}) "
            f"WITH grouped AS (SELECT queue_id, account, period, {per_account} "
            f"FROM ({_event_rows_sql(unit, events_where)}) AS timed "
            f"GROUP BY queue_id, account, period) "
            f"SELECT queue_id, '', period, {', '.join(f'SUM({c})' for c in SUMMED)} "
            f"FROM grouped GROUP BY queue_id, period "
            f"UNION ALL SELECT queue_id, account, period, {summed} FROM ("
            f"SELECT grouped.*, ROW_NUMBER() OVER (PARTITION BY queue_id, period "
            f"ORDER BY completed DESC, failed + retried DESC, enqueued DESC, account) AS position "
            f"FROM grouped WHERE account <> '') AS ranked WHERE position <= {TOP_ACCOUNTS} "
            f"ON CONFLICT (queue_id, account, start) DO UPDATE SET {updates}",
            events_params)
        return cursor.rowcount


def _event_rows_sql(unit: str, where: str) -> str:
    """One row per event of the window that the history counts, with the period it falls in
    and, for an item finishing complete or failed, the buckets of its wait (due to started)
    and run (started to finished) times: its final attempt's, as the overview's figures."""
    events, items = ItemEvent._meta.db_table, Item._meta.db_table
    fence = "OFFSET 0" if is_postgres() else ""
    # The fences keep PostgreSQL from pulling the subqueries up and computing each time once
    # per bucket column.
    return (
        f"SELECT queue_id, account, period, completed, failed, retried, enqueued, "
        f"{_bucket_sql('wait')} AS wait_bucket, {_bucket_sql('run')} AS run_bucket FROM ("
        f"SELECT e.queue_id, e.account, {_truncate(unit, 'e.at')} AS period, "
        f"CASE WHEN e.to_status = 'complete' THEN 1 ELSE 0 END AS completed, "
        f"CASE WHEN e.to_status = 'failed' THEN 1 ELSE 0 END AS failed, "
        f"CASE WHEN e.to_status = 'retry' THEN 1 ELSE 0 END AS retried, "
        f"CASE WHEN e.transition = 'enqueued' THEN 1 ELSE 0 END AS enqueued, "
        f"{_seconds('i.started_at', 'i.run_at')} AS wait, "
        f"{_seconds('i.finished_at', 'i.started_at')} AS run "
        f"FROM {events} AS e LEFT JOIN {items} AS i ON i.id = e.item_id "
        # The finishing transition wrote the event's time as the item's finish: an item retried
        # and finished again since then is not taken for this event.
        f"AND e.to_status IN ('complete', 'failed') AND i.finished_at = e.at "
        f"AND i.started_at IS NOT NULL "
        f"WHERE {where} AND (e.transition = 'enqueued' "
        f"OR e.to_status IN ('complete', 'retry', 'failed')) {fence}) AS events {fence}")


def roll_up_hours(start: datetime, end: datetime, queue_ids: Iterable[int] | None = None) -> int:
    """Rewrites the hours in [start, end) from their minutes: counts and buckets summed, depth
    the highest sample, and the TOP_ACCOUNTS accounts of each hour among the minutes' top
    accounts. Returns the rows written."""
    table, minutes = MetricHour._meta.db_table, MetricMinute._meta.db_table
    where, params = _range(start, end, queue_ids)
    summed = ", ".join(SUMMED + DEPTHS)
    totals = ", ".join([f"SUM({c}) AS {c}" for c in SUMMED] + [f"MAX({c}) AS {c}" for c in DEPTHS])
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {where}", params)
        cursor.execute(
            f"INSERT INTO {table} (queue_id, account, start, {summed}) "
            f"WITH grouped AS (SELECT queue_id, account, {_truncate('hour', 'start')} AS period, "
            f"{totals} FROM {minutes} WHERE {where} "
            f"GROUP BY queue_id, account, {_truncate('hour', 'start')}) "
            f"SELECT queue_id, account, period, {summed} FROM grouped WHERE account = '' "
            f"UNION ALL SELECT queue_id, account, period, {summed} FROM ("
            f"SELECT grouped.*, ROW_NUMBER() OVER (PARTITION BY queue_id, period "
            f"ORDER BY completed DESC, failed + retried DESC, enqueued DESC, account) AS position "
            f"FROM grouped WHERE account <> '') AS ranked WHERE position <= {TOP_ACCOUNTS}",
            params)
        return cursor.rowcount


def roll_up_installation(model, start: datetime, end: datetime) -> int:
    """Rewrites `model`'s periods (InstallationMinute or InstallationHour) in [start, end) as
    the sums of every queue's whole-queue rows of the same periods (MetricMinute or
    MetricHour), which must be rolled up first. Returns the rows written."""
    table = model._meta.db_table
    source = (MetricMinute if model is InstallationMinute else MetricHour)._meta.db_table
    where, params = _range(start, end, None)
    columns = ", ".join(SUMMED + DEPTHS)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {where}", params)
        cursor.execute(
            f"INSERT INTO {table} (start, {columns}) SELECT start, "
            f"{', '.join(f'SUM({c})' for c in SUMMED + DEPTHS)} FROM {source} "
            f"WHERE {where} AND account = '' GROUP BY start", params)
        return cursor.rowcount


def roll_up_errors(model, start: datetime, end: datetime, after_event_id: int = 0,
                   queue_ids: Iterable[int] | None = None) -> int:
    """Rewrites `model`'s periods (ErrorGroupMinute or ErrorGroupHour) in [start, end) from the
    failure events (attempts scheduled for retry or failed for good) with ids above
    `after_event_id`: per queue and period, a row for each of the ERROR_GROUPS groups with the
    most failures and one for the rest. Returns the rows written."""
    unit = "minute" if model is ErrorGroupMinute else "hour"
    events_where, events_params = _events_range(start, end, after_event_id, queue_ids)
    period, text = _truncate(unit, "e.at"), f"SUBSTR(e.reason, 1, {ERROR_PREFIX})"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.queue_id, {period}, {text}, COUNT(*) FROM {ItemEvent._meta.db_table} "
            f"AS e WHERE {events_where} AND e.to_status IN ('retry', 'failed') "
            f"GROUP BY e.queue_id, {period}, {text}", events_params)
        texts = cursor.fetchall()
    groups: defaultdict[tuple, Counter] = defaultdict(Counter)
    normalised: dict[str, tuple[str, str]] = {}
    for queue_id, moment, error, failures in texts:
        if error not in normalised:
            normalised[error] = normalise_error(error)
        groups[(queue_id, moment)][normalised[error]] += failures
    rows = []
    for (queue_id, moment), counted in groups.items():
        ranked = sorted(counted.items(), key=lambda group: (-group[1], group[0]))
        rows += [(queue_id, moment, group_key(kind, message), kind, message, failures)
                 for (kind, message), failures in ranked[:ERROR_GROUPS]]
        if rest := sum(failures for _, failures in ranked[ERROR_GROUPS:]):
            rows.append((queue_id, moment, OTHER_ERROR_GROUP, "", "", rest))
    where, params = _range(start, end, queue_ids)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE {where}", params)
    insert_rows(model, ERROR_COLUMNS, rows)
    return len(rows)


def roll_up_error_hours(start: datetime, end: datetime,
                        queue_ids: Iterable[int] | None = None) -> int:
    """Rewrites the error groups' hours in [start, end) from their minutes: the ERROR_GROUPS
    groups with the most failures in the hour among its minutes' groups, and the rest (the
    minutes' own rest too) as OTHER_ERROR_GROUP. Returns the rows written."""
    table, minutes = ErrorGroupHour._meta.db_table, ErrorGroupMinute._meta.db_table
    where, params = _range(start, end, queue_ids)
    period, other = _truncate("hour", "start"), f"'{OTHER_ERROR_GROUP}'"
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {where}", params)
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(ERROR_COLUMNS)}) "
            f"WITH grouped AS (SELECT queue_id, {period} AS period, group_key, "
            f"MAX(kind) AS kind, MAX(message) AS message, SUM(failures) AS failures "
            f"FROM {minutes} WHERE {where} GROUP BY queue_id, {period}, group_key), "
            # The rest ranks after every group, so that the first ERROR_GROUPS are groups.
            f"ranked AS (SELECT grouped.*, ROW_NUMBER() OVER (PARTITION BY queue_id, period "
            f"ORDER BY CASE WHEN group_key = {other} THEN 1 ELSE 0 END, failures DESC, "
            f"group_key) AS position FROM grouped) "
            f"SELECT queue_id, period, group_key, kind, message, failures FROM ranked "
            f"WHERE position <= {ERROR_GROUPS} AND group_key <> {other} "
            f"UNION ALL SELECT queue_id, period, {other}, '', '', SUM(failures) FROM ranked "
            f"WHERE position > {ERROR_GROUPS} OR group_key = {other} GROUP BY queue_id, period",
            params)
        return cursor.rowcount


def sample_depth(minute: datetime, queue_ids: Iterable[int] | None = None) -> int:
    """Every queue's depth by status now, from the counters, as the depth at the end of
    `minute` (kept when the minute's counts are rolled up again). Returns the queues sampled."""
    ids = list(queue_ids) if queue_ids is not None else list(
        Queue.objects.values_list("pk", flat=True))
    if not ids:
        return 0
    now_counts = counters.status_counts(ids)
    updates = ", ".join(f"{c} = excluded.{c}" for c in DEPTHS)
    insert_rows(
        MetricMinute, ("queue_id", "account", "start", *DEPTHS),
        [(queue_id, "", to_db_datetime(minute),
          *(max(0, now_counts[queue_id][s]) for s in DEPTH_STATUSES)) for queue_id in ids],
        suffix=f"ON CONFLICT (queue_id, account, start) DO UPDATE SET {updates}")
    return len(ids)


def prune(now: datetime) -> Counter:
    """Rows past retention. The minutes go by whole hours, so that an hour is never rolled up
    again from some of its minutes."""
    changed: Counter = Counter()
    minutes, hours = _floor(now - MINUTE_RETENTION, HOUR), _floor(now - HOUR_RETENTION, HOUR)
    for model, field, before in (
            (MetricMinute, "start", minutes), (MetricHour, "start", hours),
            (InstallationMinute, "start", minutes), (InstallationHour, "start", hours),
            (ErrorGroupMinute, "start", minutes), (ErrorGroupHour, "start", hours),
            (HistoryRun, "started_at", now - RUN_RETENTION)):
        deleted, _ = model.objects.filter(**{f"{field}__lt": before}).delete()
        changed[f"{model._meta.verbose_name_plural} pruned"] += deleted
    return changed


# --- reading -----------------------------------------------------------------------------------

def series(queue_ids: Sequence[int] | None, start: datetime, end: datetime, step: timedelta,
           columns: Sequence[str]) -> list[dict[str, int] | None]:
    """The queues' `columns` per step from `start` to `end`, summed over the queues (a depth:
    each queue's highest sample in the step, summed), or with `queue_ids` None every queue's
    (the installation's rows: a depth is the highest of its summed samples in the step); None
    for a step without any row (the rollup was not running). Minutes for steps under an hour,
    hours from an hour on."""
    slots = int((end - start) / step)
    if not slots or (queue_ids is not None and not queue_ids):
        return [None] * slots
    slot = _slot_sql(start, step)
    inner = ", ".join(f"{'MAX' if c in DEPTHS else 'SUM'}({c}) AS {c}" for c in columns)
    if queue_ids is None:
        model = InstallationMinute if step < HOUR else InstallationHour
        sql = (f"SELECT {slot} AS slot, {inner} FROM {model._meta.db_table} "
               f"WHERE start >= %s AND start < %s GROUP BY {slot}")
        params = [to_db_datetime(start), to_db_datetime(end)]
    else:
        model = MetricMinute if step < HOUR else MetricHour
        outer = ", ".join(f"SUM({c})" for c in columns)
        sql = (f"SELECT slot, {outer} FROM (SELECT queue_id, {slot} AS slot, {inner} "
               f"FROM {model._meta.db_table} WHERE queue_id IN "
               f"({placeholders(len(queue_ids))}) AND account = '' AND start >= %s "
               f"AND start < %s GROUP BY queue_id, {slot}) AS per_queue GROUP BY slot")
        params = [*queue_ids, to_db_datetime(start), to_db_datetime(end)]
    found: list[dict[str, int] | None] = [None] * slots
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for index, *values in cursor.fetchall():
            if 0 <= index < slots:
                # PostgreSQL sums bigints into numerics.
                found[index] = {c: None if v is None else int(v)
                                for c, v in zip(columns, values, strict=True)}
    return found


def timings(queue_ids: Sequence[int], start: datetime,
            end: datetime) -> dict[int, tuple[tuple[float, float], tuple[float, float]]]:
    """Each queue's wait and run times, ((p50, p95), (p50, p95)) in seconds, of the items that
    finished in [start, end), from its minutes' histograms in one statement; a queue with
    none finished is left out."""
    if not queue_ids:
        return {}
    columns = BUCKETS["wait"] + BUCKETS["run"]
    sums = ", ".join(f"SUM({c})" for c in columns)
    found = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT queue_id, {sums} FROM {MetricMinute._meta.db_table} WHERE queue_id IN "
            f"({placeholders(len(queue_ids))}) AND account = '' AND start >= %s AND start < %s "
            f"GROUP BY queue_id", [*queue_ids, to_db_datetime(start), to_db_datetime(end)])
        for queue_id, *totals in cursor.fetchall():
            counts = [int(n) for n in totals]  # PostgreSQL sums integers into numerics
            wait, run = counts[:HISTOGRAM_BUCKETS], counts[HISTOGRAM_BUCKETS:]
            if any(run):
                found[queue_id] = ((percentile(wait, 0.5), percentile(wait, 0.95)),
                                   (percentile(run, 0.5), percentile(run, 0.95)))
    return found


def top_accounts(queue_id: int, start: datetime, end: datetime, step: timedelta,
                 limit: int) -> tuple[list[str], list[dict[str, int]]]:
    """The `limit` accounts that completed the most items on the queue from `start` to `end`
    (among the accounts the history keeps), and their items completed per step."""
    model = MetricMinute if step < HOUR else MetricHour
    table, slots = model._meta.db_table, int((end - start) / step)
    bounds = [queue_id, to_db_datetime(start), to_db_datetime(end)]
    where = "queue_id = %s AND account <> '' AND start >= %s AND start < %s"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT account FROM {table} WHERE {where} GROUP BY account "
                       f"ORDER BY SUM(completed) DESC, account LIMIT %s", [*bounds, limit])
        accounts = [row[0] for row in cursor.fetchall()]
        per_step: list[dict[str, int]] = [{} for _ in range(slots)]
        if accounts:
            slot = _slot_sql(start, step)
            cursor.execute(
                f"SELECT account, {slot}, SUM(completed) FROM {table} WHERE {where} "
                f"AND account IN ({placeholders(len(accounts))}) GROUP BY account, {slot}",
                [*bounds, *accounts])
            for account, index, completed in cursor.fetchall():
                if 0 <= index < slots:
                    per_step[index][account] = int(completed)
    return accounts, per_step


def error_trends(queue_id: int, start: datetime, end: datetime,
                 step: timedelta) -> dict[str, list[int]]:
    """The queue's failures per error group (by group key) and step from `start` to `end`, read
    from the hours in one statement; OTHER_ERROR_GROUP holds the failures outside each hour's
    largest groups. A group without failures in the range is not in it."""
    slots = int((end - start) / step)
    slot = _slot_sql(start, step)
    trends: defaultdict[str, list[int]] = defaultdict(lambda: [0] * slots)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT group_key, {slot}, SUM(failures) FROM {ErrorGroupHour._meta.db_table} "
            f"WHERE queue_id = %s AND start >= %s AND start < %s GROUP BY group_key, {slot}",
            [queue_id, to_db_datetime(start), to_db_datetime(end)])
        for key, index, failures in cursor.fetchall():
            if 0 <= index < slots:
                trends[key][index] = int(failures)
    return dict(trends)


def percentile(buckets: Sequence[int], fraction: float) -> float | None:
    """The `fraction` percentile (0.95 for p95) of a histogram's counts, in seconds, placed
    linearly inside its bucket; None for an empty histogram."""
    total = sum(buckets)
    if not total:
        return None
    rank, seen = fraction * total, 0
    for bucket, n in enumerate(buckets):
        if n and seen + n >= rank:
            low = HISTOGRAM_BOUNDS[bucket - 1] if bucket else 0.0
            high = HISTOGRAM_BOUNDS[bucket] if bucket < len(HISTOGRAM_BOUNDS) else 2 * low
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return None


def bucket_of(seconds: float) -> int:
    """The histogram bucket a time falls in, as the rollup's SQL places it."""
    return next((b for b, bound in enumerate(HISTOGRAM_BOUNDS) if seconds < bound),
                len(HISTOGRAM_BOUNDS))


# --- SQL of the two databases ------------------------------------------------------------------

def _range(start: datetime, end: datetime, queue_ids: Iterable[int] | None,
           column: str = "start") -> tuple[str, list]:
    where, params = f"{column} >= %s AND {column} < %s", [to_db_datetime(start),
                                                          to_db_datetime(end)]
    if queue_ids is not None:
        ids = list(queue_ids) or [0]
        where += f" AND queue_id IN ({placeholders(len(ids))})"
        params += ids
    return where, params


def _events_range(start: datetime, end: datetime, after_event_id: int,
                  queue_ids: Iterable[int] | None) -> tuple[str, list]:
    where, params = _range(start, end, None, "e.at")
    where = f"e.id > %s AND {where}"
    params = [after_event_id, *params]
    if queue_ids is not None:
        ids = list(queue_ids) or [0]
        where += f" AND e.queue_id IN ({placeholders(len(ids))})"
        params += ids
    return where, params


def _truncate(unit: str, column: str) -> str:
    if is_postgres():
        # Django's connections to PostgreSQL use UTC, so periods are UTC minutes and hours.
        return f"date_trunc('{unit}', {column})"
    # Written as Django writes datetimes to SQLite; '%%' is how a '%' reaches SQLite's cursor.
    fmt = "%%Y-%%m-%%d %%H:%%M:00" if unit == "minute" else "%%Y-%%m-%%d %%H:00:00"
    return f"strftime('{fmt}', {column})"


def _seconds(later: str, earlier: str) -> str:
    if is_postgres():
        return f"EXTRACT(EPOCH FROM ({later} - {earlier}))"
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"


def _bucket_sql(column: str) -> str:
    """Negative times (a start a moment before the due time on another machine's clock) count
    in the first bucket."""
    whens = " ".join(f"WHEN {column} < {bound:.3f} THEN {b}"
                     for b, bound in enumerate(HISTOGRAM_BOUNDS))
    return f"CASE WHEN {column} IS NULL THEN NULL {whens} ELSE {len(HISTOGRAM_BOUNDS)} END"


def _slot_sql(start: datetime, step: timedelta) -> str:
    """The index of the step a row's start falls in. The numbers are written into the SQL (they
    are integers of our own), so that GROUP BY repeats the very expression the SELECT has."""
    origin, width = int(start.timestamp()), int(step.total_seconds())
    if is_postgres():
        return f"CAST(FLOOR((EXTRACT(EPOCH FROM start) - {origin}) / {width}) AS INTEGER)"
    return f"((CAST(strftime('%%s', start) AS INTEGER) - {origin}) / {width})"


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def _floor(moment: datetime, unit: timedelta) -> datetime:
    moment = _utc(moment)
    return moment.replace(second=0, microsecond=0, minute=0 if unit == HOUR else moment.minute)


def _ceil(moment: datetime, unit: timedelta) -> datetime:
    floor = _floor(moment, unit)
    return floor if floor == _utc(moment) else floor + unit

