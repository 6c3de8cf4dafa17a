"""The live event stream: reading ItemEvent rows in order without skips or repeats, and the
per-process hub that wakes open streams when events are written.

Ordering. Event ids come from a sequence, but on PostgreSQL transactions commit out of id order:
a reader can see id 11 while id 10 is still uncommitted. A position is therefore a Cursor: the
highest id examined plus the ids below it that were not visible yet ("pending"). Each pending id
carries the snapshot xmax of the read that first missed it; once a later snapshot's xmin has
passed that value, every transaction that could hold the id has ended, so if it is still not
visible it never will be (rolled back) and is dropped. This needs no schema change and, unlike a
time window, is exact: an event of a transaction that commits minutes late is still delivered.
It relies on event rows being written after their transaction's first write (the item's UPDATE
or INSERT), so the transaction already has an xid when it takes event ids; lifecycle does that.
On SQLite writers are serialised (IMMEDIATE transactions), ids commit in order, nothing is pending.

Wake-ups. One hub per event loop (one per web process) reads new events once per wake-up and
fans the batch out to every open stream, so open tabs add no queries of their own after they
connect. PostgreSQL: one LISTEN connection on CHANNEL, NOTIFY without payload from the writing
transaction (PostgreSQL delivers identical notifications of one transaction once, at commit).
SQLite: a poll of the event table every SQLITE_POLL_SECONDS.

Readable rates. Past a few dozen rows a second nobody reads a stream, and each row still costs
the web process a render and a write per open stream. A stream therefore shows at most a
configured number of rows per SUMMARY_SECONDS (RowCap) and counts the other matching events by
transition, sent as one Summary when the interval ends; a stream catching up after a disconnect
counts what it does not show in SQL (missed). Counts are exact, and no position a page is given
passes an event that was neither shown nor counted. While every stream of a process is over its
cap, the hub reads once per interval instead of once per notification.
"""

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import Count, Max, Min, Q

from queues.engine.db import from_db_datetime, is_postgres
from queues.models import MAX_ID, ItemEvent

log = logging.getLogger(__name__)

CHANNEL = "queueadmin_events"
BACKLOG_SIZE = 50  # events a new stream starts with
READ_LIMIT = 1000  # rows per hub read; a longer backlog is read in several steps
COUNT_LIMIT = 100_000  # events a catch-up counts at most (one grouped count over their ids)
SUMMARY_SECONDS = 1.0  # a stream over its row cap sends one summary per interval this long
START_WINDOW = 10_000  # ids below the newest one checked for in-flight transactions at start
MAX_PENDING = 20_000  # pending ids a position holds at most (START_WINDOW fits with room)
SQLITE_POLL_SECONDS = 0.5
PENDING_RECHECK_SECONDS = 5.0  # a commit notifies; only a rollback (silent) needs this re-read
COALESCE_SECONDS = 0.02  # after a read, notifications of the next 20 ms share one read
RETRY_SECONDS = 1.0  # after a database error
SUBSCRIBER_LIMIT = 5000  # events held for a stream that does not keep up; then it reconnects
EVENT_COLUMNS = ("id", "item_id", "queue_id", "account", "identifier", "transition",
                 "from_status", "to_status", "attempt", "at", "reason")


def notify_events_written():
    """Wake the streams of every web process when this transaction commits. Called where events
    are inserted; PostgreSQL folds repeated identical notifications of a transaction into one."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


@dataclass(frozen=True)
class StreamEvent:
    id: int
    item_id: int
    queue_id: int
    account: str
    identifier: str
    transition: str
    from_status: str
    to_status: str
    attempt: int
    at: datetime
    reason: str

    @classmethod
    def from_row(cls, row) -> "StreamEvent":
        values = dict(zip(EVENT_COLUMNS, row, strict=True))
        values["at"] = from_db_datetime(values["at"])
        return cls(**values)


_RUN = r"\d{1,19}(?:~\d{1,19})?:\d{1,19}"
CURSOR_TEXT = re.compile(rf"\d{{1,19}}(?:-{_RUN}(?:,{_RUN})*)?", re.ASCII)


@dataclass(frozen=True)
class Cursor:
    """Every event with id <= last has been examined, except the `pending` ids (id -> snapshot
    xmax after which it can be given up)."""

    last: int
    pending: Mapping[int, int] = field(default_factory=dict)

    def seen(self, event_id: int) -> bool:
        return event_id <= self.last and event_id not in self.pending

    def encode(self) -> str:
        """"120", or "120-117:5531,118~119:5532" with runs of ids that share a horizon written
        as ranges: ids freed by rollbacks come in runs, and a long transaction elsewhere can
        keep thousands of them pending, which must still fit an SSE id and a URL."""
        if not self.pending:
            return str(self.last)
        parts, run = [], None
        for event_id, horizon in sorted(self.pending.items()):
            if run and event_id == run[1] + 1 and horizon == run[2]:
                run[1] = event_id
                continue
            if run:
                parts.append(_run_text(*run))
            run = [event_id, event_id, horizon]
        parts.append(_run_text(*run))
        return f"{self.last}-" + ",".join(parts)

    @classmethod
    def parse(cls, text: str | None) -> "Cursor | None":
        # Only what encode writes: int() alone would also read "1_0" as 10 and " 7" as 7.
        if not text or len(text) > 20_000 or not CURSOR_TEXT.fullmatch(text):
            return None
        head, _, tail = text.partition("-")
        try:
            last = int(head)
            pending = {}
            for part in filter(None, tail.split(",")):
                ids, _, horizon = part.partition(":")
                first, _, end = ids.partition("~")
                first, end = int(first), int(end or first)
                # A forged range must not make the server build a huge set.
                if end < first or len(pending) + end - first >= MAX_PENDING:
                    return None
                pending.update(dict.fromkeys(range(first, end + 1), int(horizon)))
        except ValueError:
            return None
        if not 0 <= last <= MAX_ID or any(i > last or i < 1 or x < 0 for i, x in pending.items()):
            return None
        return cls(last, pending)


def _run_text(first: int, end: int, horizon: int) -> str:
    return f"{first}:{horizon}" if first == end else f"{first}~{end}:{horizon}"


@dataclass(frozen=True)
class Filters:
    queue_id: int | None = None
    account: str = ""
    statuses: frozenset[str] = frozenset()
    transitions: frozenset[str] = frozenset()

    def matches(self, event: StreamEvent) -> bool:
        return ((self.queue_id is None or event.queue_id == self.queue_id)
                and (not self.account or event.account == self.account)
                and (not self.statuses or event.to_status in self.statuses)
                and (not self.transitions or event.transition in self.transitions))

    def q(self) -> Q:
        q = Q()
        if self.queue_id is not None:
            q &= Q(queue_id=self.queue_id)
        if self.account:
            q &= Q(account=self.account)
        if self.statuses:
            q &= Q(to_status__in=self.statuses)
        if self.transitions:
            q &= Q(transition__in=self.transitions)
        return q


@dataclass(frozen=True)
class Batch:
    """One read: the events found (in id order), the cursor after it, and pending ids that were
    given up (their transaction rolled back)."""

    events: list[StreamEvent]
    cursor: Cursor
    resolved: frozenset[int] = frozenset()
    complete: bool = True  # False when READ_LIMIT cut the read short


@dataclass
class Summary:
    """Matching events a stream did not show: how many of each transition, and when the first
    and the last of them happened."""

    counts: Counter = field(default_factory=Counter)
    first_at: datetime | None = None
    last_at: datetime | None = None
    more: bool = False  # a catch-up stopped counting at COUNT_LIMIT; there were more

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, events: list[StreamEvent]):
        if events:
            self.counts.update(event.transition for event in events)
            self.span(min(event.at for event in events), max(event.at for event in events))

    def span(self, first: datetime, last: datetime):
        self.first_at = min(self.first_at or first, first)
        self.last_at = max(self.last_at or last, last)


def _table() -> str:
    return ItemEvent._meta.db_table


def start_cursor() -> Cursor:
    """Where a reader starting now begins: after the last id handed out, with the ids of the
    last START_WINDOW that are not visible pending (they may be in transactions in flight)."""
    table = _table()
    with connection.cursor() as cursor:
        if not is_postgres():
            cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")
            return Cursor(cursor.fetchone()[0])
        # The sequence, not MAX(id): ids handed out may all still be uncommitted (or pruned).
        # It is read in a statement before the snapshot's: an id handed out between the
        # snapshot and the sequence read could belong to a transaction the snapshot's xmax does
        # not cover, and that id would be given up while its transaction is still open.
        cursor.execute(f"SELECT COALESCE(pg_sequence_last_value("
                       f"pg_get_serial_sequence('{table}', 'id')::regclass), 0)")
        last = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, e.id "
            f"FROM (SELECT 1) AS one LEFT JOIN {table} AS e ON e.id > %s AND e.id <= %s",
            [last - START_WINDOW, last])
        rows = cursor.fetchall()
    horizon = rows[0][0]
    visible = {row[1] for row in rows if row[1] is not None}
    return Cursor(last, {i: horizon for i in range(max(1, last - START_WINDOW + 1), last + 1)
                         if i not in visible})


def read(position: Cursor, limit: int = READ_LIMIT) -> Batch:
    """Events after `position` (all queues), including pending ids that became visible."""
    columns = ", ".join(f"e.{c}" for c in EVENT_COLUMNS)
    with connection.cursor() as cursor:
        if not is_postgres():
            cursor.execute(f"SELECT {columns} FROM {_table()} AS e WHERE e.id > %s "
                           f"ORDER BY e.id LIMIT %s", [position.last, limit])
            events = [StreamEvent.from_row(row) for row in cursor.fetchall()]
            last = events[-1].id if events else position.last
            return Batch(events, Cursor(last), complete=len(events) < limit)
        # The snapshot functions and the scan share the statement's snapshot.
        cursor.execute(
            f"SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
            f"pg_snapshot_xmax(pg_current_snapshot())::text::bigint, {columns} "
            f"FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT * FROM {_table()} "
            f"WHERE id > %s OR id = ANY(%s) ORDER BY id LIMIT %s) AS e ON true ORDER BY e.id",
            [position.last, list(position.pending), limit])
        rows = cursor.fetchall()
    xmin, xmax = rows[0][0], rows[0][1]
    events = [StreamEvent.from_row(row[2:]) for row in rows if row[2] is not None]
    found = {event.id for event in events}
    pending, resolved = {}, set()
    for event_id, horizon in position.pending.items():
        if event_id in found:
            continue
        if xmin >= horizon:
            resolved.add(event_id)
        else:
            pending[event_id] = horizon
    last = max(found | {position.last})
    for event_id in range(position.last + 1, last):
        if event_id not in found:
            pending[event_id] = xmax
    if len(pending) > MAX_PENDING:
        # Only a transaction open for very long (or ids freed by many rollbacks) gets here:
        # the oldest ids are given up so that positions stay bounded; said in the log.
        dropped = sorted(pending)[:len(pending) - MAX_PENDING]
        log.warning("stream gave up %d pending event ids below %d", len(dropped),
                    dropped[-1] + 1)
        for event_id in dropped:
            del pending[event_id]
            resolved.add(event_id)
    return Batch(events, Cursor(last, pending), frozenset(resolved), complete=len(rows) < limit)


def _seen_by(position: Cursor) -> Q:
    return Q(id__lte=position.last) & ~Q(id__in=list(position.pending))


def _unseen_by(position: Cursor) -> Q:
    return Q(id__gt=position.last) | Q(id__in=list(position.pending))


def _events(queryset) -> list[StreamEvent]:
    return [StreamEvent.from_row(row) for row in queryset.values_list(*EVENT_COLUMNS)]


def backlog(filters: Filters, hub: Cursor, size: int = BACKLOG_SIZE) -> list[StreamEvent]:
    """The newest `size` matching events the hub has already passed, oldest first."""
    newest = ItemEvent.objects.filter(filters.q() & _seen_by(hub)).order_by("-id")[:size]
    return _events(newest)[::-1]


def missed(filters: Filters, page: Cursor, hub: Cursor, limit: int
           ) -> tuple[list[StreamEvent], Summary | None]:
    """Matching events the hub has passed but the page has not shown: the newest `limit`, oldest
    first, and a Summary of the older ones counted by transition in SQL (a long absence costs one
    grouped count, not a row each; at most COUNT_LIMIT are counted, the summary says if more)."""
    unseen = ItemEvent.objects.filter(filters.q() & _seen_by(hub) & _unseen_by(page))
    newest = _events(unseen.order_by("-id")[:limit])[::-1]
    if len(newest) < limit:
        return newest, None
    older = unseen.filter(id__lt=newest[0].id)
    counted = (ItemEvent.objects.filter(id__in=older.order_by("-id").values("id")[:COUNT_LIMIT])
               .values("transition").order_by()
               .annotate(n=Count("id"), first=Min("at"), last=Max("at"), low=Min("id")))
    summary = Summary()
    for group in counted:
        summary.counts[group["transition"]] += group["n"]
        summary.span(group["first"], group["last"])
    if not summary.total:
        return newest, None
    summary.more = (summary.total >= COUNT_LIMIT
                    and older.filter(id__lt=min(g["low"] for g in counted)).exists())
    return newest, summary


def resume_position(page: Cursor, hub: Cursor) -> Cursor:
    """Where a stream that resumed at `page` and caught up to `hub` stands: an id is still to
    be shown when neither of them has shown it."""
    pending = {i: x for i, x in hub.pending.items() if not page.seen(i)}
    pending.update({i: x for i, x in page.pending.items() if i > hub.last})
    return Cursor(max(page.last, hub.last), pending)


def advance(position: Cursor, batch: Batch) -> tuple[list[StreamEvent], Cursor]:
    """The hub's batch as seen by one stream at `position`: the events it has not shown yet,
    and its position after them. Filtering for display is the caller's."""
    fresh = [event for event in batch.events if not position.seen(event.id)]
    found = {event.id for event in batch.events}
    pending = {i: x for i, x in position.pending.items()
               if i not in found and i not in batch.resolved}
    pending.update({i: x for i, x in batch.cursor.pending.items() if i > position.last})
    return fresh, Cursor(max(position.last, batch.cursor.last), pending)


def position_through(before: Cursor, after: Cursor, event_id: int,
                     later: Iterable[int]) -> Cursor:
    """Where a stream stands that took a batch (from `before` to `after`) but showed its events
    only up to `event_id`: the batch's `later` event ids stay to be shown. One of them below
    before.last was pending there, so it keeps that horizon."""
    last = max(before.last, event_id)
    pending = {i: x for i, x in after.pending.items() if i <= last}
    pending.update({i: before.pending[i] for i in later if i <= last})
    return Cursor(last, pending)


@dataclass(frozen=True)
class Step:
    """What a stream sends after taking batches: the summary of an interval that ended (its
    events come before the rows), the rows to show, oldest first, and the position after both."""

    summary: Summary | None
    rows: list[StreamEvent]
    position: Cursor


class RowCap:
    """One stream's rows at a readable rate. In each interval of `seconds` the first `rows`
    matching events are shown; the others are counted and sent as one Summary when the interval
    ends. Until then the position the stream gives the page stops after the last row shown, so a
    page that disconnects in between catches those events up instead of losing them."""

    def __init__(self, position: Cursor, filters: Filters, rows: int,
                 seconds: float = SUMMARY_SECONDS, clock=time.monotonic):
        self.filters, self.rows, self.seconds, self.clock = filters, rows, seconds, clock
        self.taken = position  # after every event taken
        self.sendable = position  # after every event shown or summarised
        self.held = Summary()
        self.started = float("-inf")  # when the current interval began
        self.shown = 0  # rows shown in it

    def due(self) -> float:
        """When the held summary is due (on `clock`), or 0 when nothing is held."""
        return self.started + self.seconds if self.held.total else 0.0

    def wait(self, idle: float) -> float:
        """Seconds to wait for batches: until a held summary is due, else `idle`."""
        if not self.held.total:
            return idle
        return max(0.0, self.due() - self.clock())

    def take(self, batches: Iterable[Batch]) -> Step:
        summary = None
        now = self.clock()
        if now - self.started >= self.seconds:
            if self.held.total:
                summary, self.held, self.sendable = self.held, Summary(), self.taken
            # On a grid, so that the streams of a process end their intervals together and the
            # hub reads once for all of them (Hub._until_needed).
            self.started, self.shown = now - now % self.seconds, 0
        rows = []
        for batch in batches:
            fresh, after = advance(self.taken, batch)
            matching = filter_events(fresh, self.filters)
            room = self.rows - self.shown
            if len(matching) <= room and not self.held.total:
                rows += matching
                self.shown += len(matching)
                self.sendable = after
            else:
                shown = matching[:room]
                if shown:
                    rows += shown
                    self.shown += len(shown)
                    self.sendable = position_through(self.taken, after, shown[-1].id,
                                                     [e.id for e in fresh if e.id > shown[-1].id])
                self.held.add(matching[len(shown):])
            self.taken = after
        return Step(summary, rows, self.sendable)


# --- the per-process hub ----------------------------------------------------------------------

class Overflow(Exception):
    """The stream fell too far behind; it should close and let the page resume."""


class Subscription:
    def __init__(self):
        self.cursor: Cursor | None = None  # the hub's cursor when the subscription began
        self._started = asyncio.Event()
        self._batches: list[Batch] = []
        self._held = 0
        self._overflowed = False
        self._ready = asyncio.Event()
        # A stream over its row cap needs no batch before its interval ends (time.monotonic).
        self.quiet_until = 0.0

    def start(self, cursor: Cursor):
        self.cursor = cursor
        self._started.set()

    async def started(self) -> Cursor:
        await self._started.wait()
        return self.cursor

    def push(self, batch: Batch):
        if self._overflowed:
            return
        self._batches.append(batch)
        self._held += len(batch.events)
        self._overflowed = self._held > SUBSCRIBER_LIMIT
        self._ready.set()

    async def next(self, timeout: float) -> list[Batch]:
        """The batches published since the last call; empty after `timeout` seconds without."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        if self._overflowed:
            raise Overflow
        batches, self._batches, self._held = self._batches, [], 0
        self._ready.clear()
        return batches


class Hub:
    """Reads new events for every stream of this event loop; runs while streams are open."""

    def __init__(self):
        self.subscriptions: set[Subscription] = set()
        self.cursor: Cursor | None = None
        self.reads = 0
        self._wake = asyncio.Event()
        self._joined = asyncio.Event()
        self._task: asyncio.Task | None = None

    def join(self) -> Subscription:
        """A new subscription; it starts (takes the hub's cursor) once the hub has one, in the
        same step as a publication, so no batch falls between its cursor and its first batch."""
        subscription = Subscription()
        self.subscriptions.add(subscription)
        self._joined.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        elif self.cursor is not None:
            subscription.start(self.cursor)
        return subscription

    def unsubscribe(self, subscription: Subscription):
        self.subscriptions.discard(subscription)
        if not self.subscriptions and self._task is not None:
            self._task.cancel()
            self._task = None
            self.cursor = None

    def wake(self):
        self._wake.set()

    async def _run(self):
        loop = asyncio.get_running_loop()
        # One thread, so one database connection for all of this process's streams.
        executor = ThreadPoolExecutor(1, thread_name_prefix="stream-hub")
        listener = None
        try:
            while self.cursor is None:
                try:
                    self.cursor = await loop.run_in_executor(executor, _closing(start_cursor))
                except Exception as exc:  # the database may be down: retry
                    log.warning("stream hub cannot start: %s", exc)
                    await asyncio.sleep(RETRY_SECONDS)
            for subscription in self.subscriptions:
                subscription.start(self.cursor)
            postgres = connection.vendor == "postgresql"
            if postgres:
                listener = asyncio.create_task(self._listen(connection.settings_dict))
            behind = False  # the last read stopped at READ_LIMIT
            while True:
                if postgres:
                    timeout = PENDING_RECHECK_SECONDS if self.cursor.pending else None
                else:
                    timeout = SQLITE_POLL_SECONDS
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                if not behind:  # a backlog is read on, or the streams' summaries would lag
                    await self._until_needed()
                self._wake.clear()
                try:
                    batch = await loop.run_in_executor(executor, _closing(read), self.cursor)
                except Exception as exc:  # a database error: retry later
                    log.warning("stream hub read failed: %s", exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    self._wake.set()
                    continue
                self.reads += 1
                self.cursor = batch.cursor
                if batch.events or batch.resolved:
                    for subscription in self.subscriptions:
                        subscription.push(batch)
                behind = not batch.complete
                if behind:
                    self._wake.set()
                await asyncio.sleep(COALESCE_SECONDS)
        finally:
            if listener is not None:
                listener.cancel()
            with contextlib.suppress(Exception):
                await loop.run_in_executor(executor, close_connection)
            executor.shutdown(wait=False)

    async def _until_needed(self):
        """While every stream is over its row cap, wait for the first interval to end: one read
        then serves the whole interval instead of one per notification. A stream that joins
        ends the wait."""
        quiet = min((s.quiet_until for s in self.subscriptions), default=0.0) - time.monotonic()
        if quiet > 0:
            self._joined.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._joined.wait(), quiet)

    async def _listen(self, settings_dict: dict):
        import psycopg

        params = {"dbname": settings_dict["NAME"], "user": settings_dict["USER"] or None,
                  "password": settings_dict["PASSWORD"] or None,
                  "host": settings_dict["HOST"] or None, "port": settings_dict["PORT"] or None,
                  "application_name": "queueadmin-stream", "autocommit": True,
                  # A peer that vanishes without closing is noticed within about a minute.
                  "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                  "keepalives_count": 3}
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**params) as listen:
                    await listen.execute(f"LISTEN {CHANNEL}")
                    self._wake.set()  # notifications sent while not listening are lost: read
                    async for _ in listen.notifies():
                        self._wake.set()
            except psycopg.Error as exc:
                log.warning("stream hub lost its LISTEN connection: %s", exc)
                await asyncio.sleep(RETRY_SECONDS)


def _closing(function):
    """`function` for the hub's thread: a failed call closes the thread's connection so that
    the next call starts on a fresh one."""

    def call(*args):
        try:
            return function(*args)
        except Exception:
            connection.close()
            raise

    return call


def close_connection():
    connection.close()  # the calling thread's own connection (back to the pool on PostgreSQL)


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """This event loop's hub (uvicorn runs one loop per worker process)."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        for stale in [other for other in _hubs if other.is_closed()]:
            del _hubs[stale]
        _hubs[loop] = Hub()
    return _hubs[loop]


class StreamSlots:
    """Open streams per user, counted in this process only: with several web processes a user
    may open up to the limit in each, which still bounds what one user can hold."""

    def __init__(self):
        self._open: dict[int, int] = {}
        self._lock = threading.Lock()

    def acquire(self, user_id: int, limit: int) -> bool:
        with self._lock:
            if self._open.get(user_id, 0) >= limit:
                return False
            self._open[user_id] = self._open.get(user_id, 0) + 1
            return True

    def release(self, user_id: int):
        with self._lock:
            left = self._open.get(user_id, 0) - 1
            if left > 0:
                self._open[user_id] = left
            else:
                self._open.pop(user_id, None)

    def open_for(self, user_id: int) -> int:
        return self._open.get(user_id, 0)


slots = StreamSlots()


def filter_events(events: Iterable[StreamEvent], filters: Filters) -> list[StreamEvent]:
    return [event for event in events if filters.matches(event)]


def newest(events: list[StreamEvent], limit: int) -> tuple[list[StreamEvent], Summary | None]:
    """The newest `limit` of `events` (in id order), and a Summary of the others."""
    if len(events) <= limit:
        return events, None
    summary = Summary()
    summary.add(events[:len(events) - limit])
    return events[len(events) - limit:], summary
