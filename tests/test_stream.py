"""The live stream: reading events in order (queues.engine.stream) and the SSE view over Django's
async test client. The views run in a real event loop with the per-process hub reading on its
own thread and connection, so these tests commit (transaction=True)."""

import asyncio
import contextlib
import re
import threading
import time
import zoneinfo
from collections import Counter
from datetime import timedelta

import pytest
import requests
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import AsyncClient, Client
from django.utils import timezone

from queues import enqueue, enqueue_many
from queues.bench import processes
from queues.engine import lifecycle, stream
from queues.engine.stream import Batch, Cursor, Filters, RowCap, Summary
from queues.models import ItemEvent
from queues.web import stream as stream_views
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 10  # seconds a test waits for a pushed message before failing
AT = timezone.now().replace(microsecond=0)


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def add(n, *, account="acme", prefix="item", queue_key="emails"):
    return [enqueue(queue_key, account=account, identifier=f"{prefix}-{i}") for i in range(n)]


def event(event_id, **fields):
    values = {"id": event_id, "item_id": event_id, "queue_id": 1, "account": "acme",
              "identifier": f"item-{event_id}", "transition": "enqueued", "from_status": "",
              "to_status": "queued", "attempt": 0, "at": AT, "reason": ""} | fields
    return stream.StreamEvent(**values)


# --- positions ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=False)
def test_a_position_survives_its_text_form():
    position = Cursor(120, {117: 5531, 118: 5532})
    assert Cursor.parse(position.encode()) == position
    assert Cursor.parse("42") == Cursor(42)


@pytest.mark.django_db(transaction=False)
def test_runs_of_pending_ids_are_written_as_ranges():
    # Ids freed by rollbacks come in runs; a long transaction elsewhere keeps them pending.
    position = Cursor(20_000, {i: 61979 for i in range(3, 12_000)} | {15_000: 61980})
    text = position.encode()
    assert text == "20000-3~11999:61979,15000:61980"
    assert Cursor.parse(text) == position


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("text", ["", "x", "-3", "10-11:5", "10-3", "10-3:x", "5-0:1",
                                  "10-5~3:1", "10-4~11:1", f"{10**12}-1~{10**12}:1",
                                  str(2**63),  # past bigint, which the database would refuse
                                  "1_0", " 7", "7 ", "1-", "1-,", "\u0663", "1-2:3,"])
def test_a_malformed_position_is_refused(text):
    assert Cursor.parse(text) is None


@pytest.mark.django_db(transaction=False)
def test_advance_shows_only_what_the_page_has_not_shown():
    page = Cursor(10, {8: 100})
    batch = Batch([event(8), event(9), event(11), event(13)], Cursor(13, {12: 101}))
    fresh, position = stream.advance(page, batch)
    assert [e.id for e in fresh] == [8, 11, 13]
    assert position == Cursor(13, {12: 101})


@pytest.mark.django_db(transaction=False)
def test_advance_keeps_an_unresolved_id_pending_and_drops_a_rolled_back_one():
    page = Cursor(10, {7: 100, 8: 100})
    fresh, position = stream.advance(page, Batch([], Cursor(12), frozenset({8})))
    assert fresh == [] and position == Cursor(12, {7: 100})


@pytest.mark.django_db(transaction=False)
def test_a_page_ahead_of_the_hub_is_not_shown_its_events_again():
    page, hub = Cursor(20, {15: 9}), Cursor(12, {11: 8})
    position = stream.resume_position(page, hub)
    assert position == Cursor(20, {15: 9})
    fresh, _ = stream.advance(position, Batch([event(11), event(15), event(16)], Cursor(16)))
    assert [e.id for e in fresh] == [15]


# --- the row cap ------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def burst(first_id, transitions):
    return [event(first_id + n, transition=t) for n, t in enumerate(transitions)]


@pytest.mark.django_db(transaction=False)
def test_below_the_row_cap_every_event_is_a_row_and_nothing_is_summarised():
    clock = Clock()
    cap = RowCap(Cursor(10), Filters(), rows=5, clock=clock)
    step = cap.take([Batch(burst(11, ["enqueued"] * 5), Cursor(15))])
    assert [e.id for e in step.rows] == [11, 12, 13, 14, 15] and step.summary is None
    assert step.position == Cursor(15)
    clock.now += 1
    assert cap.wait(15) == 15
    step = cap.take([Batch(burst(16, ["started"] * 5), Cursor(20))])
    assert len(step.rows) == 5 and step.summary is None and step.position == Cursor(20)


@pytest.mark.django_db(transaction=False)
def test_past_the_row_cap_the_others_are_counted_and_summarised_once_the_second_ends():
    clock = Clock()
    cap = RowCap(Cursor(10), Filters(), rows=3, clock=clock)
    transitions = ["enqueued", "started", "completed"] * 4
    step = cap.take([Batch(burst(11, transitions[:8]), Cursor(18))])
    assert [e.id for e in step.rows] == [11, 12, 13] and step.summary is None
    # The page is told it stands after the rows it was shown, not after the counted events.
    assert step.position == Cursor(13)
    clock.now += 0.4
    assert cap.wait(15) == pytest.approx(0.6)
    step = cap.take([Batch(burst(19, transitions[8:]), Cursor(22))])
    assert step.rows == [] and step.summary is None and step.position == Cursor(13)
    clock.now += 0.6
    step = cap.take([])
    assert step.summary.counts == {"enqueued": 3, "started": 3, "completed": 3}
    assert step.rows == [] and step.position == Cursor(22)
    clock.now += 0.1
    step = cap.take([Batch(burst(23, ["failed"]), Cursor(23))])
    assert [e.id for e in step.rows] == [23] and step.position == Cursor(23)


@pytest.mark.django_db(transaction=False)
def test_a_summary_due_with_new_events_comes_before_their_rows():
    clock = Clock()
    cap = RowCap(Cursor(0), Filters(), rows=1, clock=clock)
    cap.take([Batch(burst(1, ["enqueued"] * 3), Cursor(3))])
    clock.now += 1
    step = cap.take([Batch(burst(4, ["started"] * 2), Cursor(5))])
    assert step.summary.counts == {"enqueued": 2}
    assert [e.id for e in step.rows] == [4] and step.position == Cursor(4)


@pytest.mark.django_db(transaction=False)
def test_the_row_cap_counts_only_the_events_its_filters_match():
    clock = Clock()
    cap = RowCap(Cursor(0), Filters(account="beta"), rows=1, clock=clock)
    events = [event(i, account="beta" if i % 2 else "acme", transition="completed")
              for i in range(1, 11)]
    step = cap.take([Batch(events, Cursor(10))])
    assert [e.id for e in step.rows] == [1]
    clock.now += 1
    assert cap.take([]).summary.counts == {"completed": 4}


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("rows", range(0, 7))
def test_a_position_after_the_rows_shown_resumes_with_exactly_the_events_not_shown(rows):
    """Ids 7 to 9 were pending; 7 and 8 became visible, 9 not yet; 12 is a new gap."""
    page = Cursor(10, {7: 99, 8: 100, 9: 100})
    batch = Batch([event(i) for i in (7, 8, 11, 13, 14, 15)], Cursor(15, {12: 101}))
    fresh, after = stream.advance(page, batch)
    if rows:
        cut = stream.position_through(page, after, fresh[rows - 1].id,
                                      [e.id for e in fresh[rows:]])
    else:
        cut = page
    again, end = stream.advance(cut, batch)
    assert again == fresh[rows:]
    assert end == after


@pytest.mark.django_db(transaction=False)
def test_a_summary_row_escapes_what_it_counts_and_where_it_links():
    summary = Summary()
    summary.add([event(1, transition="<img src=x onerror=alert(1)>"),
                 event(2, transition="completed"), event(3, transition="completed")])
    row = stream_views.render_summary(summary, stream_views.LIVE_SPAN, "emails",
                                      '"><script>alert(2)</script>', show_queue=False)
    assert "<img" not in row and "<script" not in row
    assert "&lt;img src=x onerror=alert(1)&gt;" in row
    assert "3 events not shown in the last second" in row
    assert "2 completed, 1 &lt;img" in row
    assert 'data-count="3"' in row and 'colspan="5"' in row
    link = re.search(r'href="([^"]+)"', row).group(1).replace("&amp;", "&")
    assert link.startswith("/queues/emails/?") and "clock=updated" in link
    assert "account=%22%3E%3Cscript%3Ealert%282%29%3C%2Fscript%3E" in link
    framed = stream_views._sse("rows", stream_views.render_summary(
        Summary(Counter({"a\r\nevent: x": 2}), AT, AT), stream_views.AWAY_SPAN, None, "",
        show_queue=True))
    assert framed.count("\n\n") == 1 and "\nevent: x" not in framed
    assert 'href="/history/"' in framed


# --- reading -----------------------------------------------------------------------------------

def test_read_returns_new_events_in_id_order(queue):
    start = stream.start_cursor()
    add(3)
    batch = stream.read(start)
    assert [e.identifier for e in batch.events] == ["item-0", "item-1", "item-2"]
    assert batch.cursor == Cursor(batch.events[-1].id)
    assert stream.read(batch.cursor).events == []


def test_backlog_is_the_newest_matching_events_oldest_first(queue):
    add(60)
    add(5, account="other", prefix="other")
    events = stream.backlog(Filters(queue_id=queue.pk, account="acme"), stream.start_cursor())
    assert [e.identifier for e in events] == [f"item-{i}" for i in range(10, 60)]


def test_missed_is_the_newest_the_page_has_not_shown_and_a_count_of_the_older(queue):
    add(2)
    page = stream.start_cursor()
    items = add(5, prefix="later")
    lifecycle.apply("cancel", [items[0].pk, items[1].pk], actor="admin")
    hub = stream.start_cursor()
    events, summary = stream.missed(Filters(), page, hub, limit=3)
    assert [(e.identifier, e.transition) for e in events] == [
        ("later-4", "enqueued"), ("later-0", "cancelled"), ("later-1", "cancelled")]
    assert summary.counts == {"enqueued": 4} and not summary.more
    assert summary.first_at <= summary.last_at <= events[0].at
    events, summary = stream.missed(Filters(), page, hub, limit=7)
    assert len(events) == 7 and summary is None


def test_a_catch_up_says_when_it_stopped_counting(queue, monkeypatch):
    page = stream.start_cursor()
    add(6)
    monkeypatch.setattr(stream, "COUNT_LIMIT", 3)
    events, summary = stream.missed(Filters(), page, stream.start_cursor(), limit=2)
    assert [e.identifier for e in events] == ["item-4", "item-5"]
    assert summary.counts == {"enqueued": 3} and summary.more


def test_filters_select_by_queue_account_status_and_event_type(queue):
    QueueFactory(key="reports")
    items = add(2) + add(1, account="beta", prefix="b") + add(1, queue_key="reports")
    lifecycle.apply("cancel", [items[0].pk], actor="admin")
    every = stream.read(Cursor(0)).events
    cases = {
        Filters(queue_id=queue.pk): 4,
        Filters(account="beta"): 1,
        Filters(statuses=frozenset({"cancelled"})): 1,
        Filters(transitions=frozenset({"enqueued"})): 4,
        Filters(queue_id=queue.pk, transitions=frozenset({"cancelled", "enqueued"})): 4,
    }
    for filters, expected in cases.items():
        assert len(stream.filter_events(every, filters)) == expected, filters
        assert len(stream.backlog(filters, stream.start_cursor())) == expected, filters


# --- rows --------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=False)
def test_a_row_shows_its_time_relative_and_absolute_in_the_users_zone():
    at = timezone.now() - timedelta(seconds=90)
    with timezone.override(zoneinfo.ZoneInfo("Europe/Berlin")):
        row = stream_views.render_rows([event(7, at=at)], {1: "emails"}, show_queue=False)
    local = at.astimezone(zoneinfo.ZoneInfo("Europe/Berlin"))
    # The datetime attribute is what the page's script rewrites the relative part from.
    assert (f'<td class="unbroken"><time datetime="{at.isoformat()}">{local:%Y-%m-%d %H:%M:%S %Z} '
            '<span class="muted" data-relative>(1 min ago)</span></time></td>') in row


@pytest.mark.django_db(transaction=False)
def test_a_row_rendered_again_later_says_how_old_it_is_then(monkeypatch):
    at = timezone.now()
    first = stream_views.render_rows([event(8, at=at)], {1: "emails"}, show_queue=False)
    monkeypatch.setattr(timezone, "now", lambda: at + timedelta(minutes=5))
    again = stream_views.render_rows([event(8, at=at)], {1: "emails"}, show_queue=False)
    assert "(now)" in first and "(5 min ago)" in again


@pytest.mark.django_db(transaction=False)
def test_a_rows_frame_stays_one_event_whatever_the_row_holds():
    hostile = event(9, at=timezone.now(), identifier="a\rb", account="c\nd", reason="e\r\nf")
    rows = stream_views.render_rows([hostile, event(10, at=timezone.now())], {1: "emails"},
                                    show_queue=True)
    framed = stream_views._sse("rows", rows)
    assert framed.endswith("\n\n") and framed.count("\n\n") == 1
    assert all(line.startswith(("event: ", "data: ")) for line in framed.strip("\n").split("\n"))


@pytest.mark.postgres
def test_an_event_that_commits_after_a_higher_one_is_read_once(queue):
    """Two real transactions: the one holding the lower id commits last."""
    position = stream.start_cursor()
    holding, release, done = threading.Event(), threading.Event(), threading.Event()
    rolled_back = threading.Event()

    def slow(identifier, rollback=False):
        try:
            with transaction.atomic():
                enqueue("emails", account="acme", identifier=identifier)
                holding.set()
                release.wait(WAIT)
                if rollback:
                    raise RuntimeError("roll back")
        except RuntimeError:
            rolled_back.set()
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=slow, args=("slow",))
    thread.start()
    assert holding.wait(WAIT)
    fast = enqueue("emails", account="acme", identifier="fast")
    first = stream.read(position)
    assert [e.identifier for e in first.events] == ["fast"]
    assert len(first.cursor.pending) == 1 and first.cursor.last == max(
        ItemEvent.objects.filter(item_id=fast.pk).values_list("id", flat=True))
    again = stream.read(first.cursor)  # the slow transaction is still open: still pending
    assert again.events == [] and again.cursor == first.cursor
    release.set()
    thread.join(WAIT)
    late = stream.read(again.cursor)
    assert [e.identifier for e in late.events] == ["slow"]
    assert late.cursor == Cursor(first.cursor.last)
    assert stream.read(late.cursor).events == []

    # A rolled-back id is given up once its transaction has ended, and never shown.
    holding.clear(), release.clear(), done.clear()
    thread = threading.Thread(target=slow, args=("doomed", True))
    thread.start()
    assert holding.wait(WAIT)
    enqueue("emails", account="acme", identifier="fast-2")
    first = stream.read(late.cursor)
    assert [e.identifier for e in first.events] == ["fast-2"] and first.cursor.pending
    release.set()
    thread.join(WAIT)
    assert rolled_back.is_set()
    # Given up once every transaction older than the first read's snapshot has ended; any
    # session of the cluster can delay that, so this polls (bounded) instead of reading once.
    position, resolved, deadline = first.cursor, set(), time.monotonic() + 60
    while position.pending and time.monotonic() < deadline:
        later = stream.read(position)
        assert later.events == []
        resolved |= later.resolved
        position = later.cursor
        time.sleep(0.1)
    assert resolved == set(first.cursor.pending) and position == Cursor(first.cursor.last)


@pytest.mark.postgres
def test_a_transition_notifies_listeners_once_per_transaction(queue):
    import psycopg

    params = connection.get_connection_params()
    with psycopg.connect(host=params.get("host"), port=params.get("port"),
                         user=params.get("user"), dbname=params["dbname"],
                         autocommit=True) as listener:
        listener.execute(f"LISTEN {stream.CHANNEL}")
        with transaction.atomic():
            items = add(3)
            lifecycle.apply("cancel", [item.pk for item in items], actor="admin")
        received = list(listener.notifies(timeout=1))
    assert [(n.channel, n.payload) for n in received] == [(stream.CHANNEL, "")]


def test_the_hub_reads_nothing_while_every_stream_waits_out_its_interval(queue, monkeypatch):
    reads = []
    real_read = stream.read
    monkeypatch.setattr(stream, "read", lambda position: reads.append(position) or
                        real_read(position))

    async def scenario():
        hub = stream.Hub()
        quiet, eager = hub.join(), hub.join()
        await quiet.started()
        await sync_to_async(add)(1, prefix="first")
        # On PostgreSQL a batch may first give up ids of earlier tests' rolled-back transactions.
        seen, deadline = [], time.monotonic() + WAIT
        while "first-0" not in seen and time.monotonic() < deadline:
            seen += [e.identifier for b in await eager.next(WAIT) for e in b.events]
        assert seen == ["first-0"]
        quiet.quiet_until = time.monotonic() + 60
        eager.quiet_until = time.monotonic() + 1.5
        before = len(reads)
        await sync_to_async(add)(1, prefix="quiet")
        await asyncio.sleep(1)  # SQLite polls twice a second; PostgreSQL is notified at once
        assert len(reads) == before
        batches = await eager.next(WAIT)  # once the earliest interval has ended
        assert [e.identifier for b in batches for e in b.events] == ["quiet-0"]
        eager.quiet_until = time.monotonic() + 60
        before = len(reads)
        await sync_to_async(add)(1, prefix="joined")
        await asyncio.sleep(0.6)
        assert len(reads) == before
        late = hub.join()  # a stream that joins needs its batches now
        await late.started()
        assert [e.identifier for b in await late.next(WAIT) for e in b.events] == ["joined-0"]
        for subscription in (quiet, eager, late):
            hub.unsubscribe(subscription)

    run(scenario)


def test_a_hub_behind_reads_on_though_every_stream_is_quiet(queue, monkeypatch):
    subscriptions = []
    real_read = stream.read

    def read_two(position):
        batch = real_read(position, limit=2)
        if batch.events:  # the stream turns quiet after the first batch of the burst
            subscriptions[0].quiet_until = time.monotonic() + 60
        return batch

    monkeypatch.setattr(stream, "read", read_two)

    async def scenario():
        hub = stream.Hub()
        subscriptions.append(hub.join())
        await subscriptions[0].started()
        await sync_to_async(burst_of)(5)
        seen, deadline = [], time.monotonic() + WAIT
        while len(seen) < 5 and time.monotonic() < deadline:
            seen += [e.identifier for b in await subscriptions[0].next(WAIT) for e in b.events]
        assert seen == [f"burst-{i:02d}" for i in range(5)]
        hub.unsubscribe(subscriptions[0])

    run(scenario)


# --- the SSE view ------------------------------------------------------------------------------

def viewer(username="viewer"):
    user = User.objects.create_user(username, password="pw-for-tests-1")
    # Transactional tests flush the groups the migration made.
    user.groups.add(Group.objects.get_or_create(name="Viewer")[0])
    return user


def parse(chunk: bytes) -> dict:
    text = chunk.decode()
    if text.startswith(":"):
        return {"comment": text.strip(": \n")}
    message = {}
    for line in text.strip("\n").split("\n"):
        name, _, value = line.partition(": ")
        message[name] = message[name] + "\n" + value if name in message else value
    return message


def identifiers(message: dict) -> list[str]:
    return re.findall(r'<a href="/items/\d+/">([^<]+)</a>', message.get("data", ""))


class Stream:
    """Reads the response on a task of its own, as the ASGI server does; closing cancels that
    task, which is what Django does when the client disconnects."""

    opened: list["Stream"] = []

    def __init__(self, response):
        Stream.opened.append(self)
        self.response = response
        self.messages: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self):
        async for chunk in self.response.streaming_content:
            await self.messages.put(parse(chunk))

    async def next(self, timeout=WAIT) -> dict:
        return await asyncio.wait_for(self.messages.get(), timeout)

    async def shown(self, count: int) -> list[str]:
        """Identifiers of the rows sent until `count` have arrived (they may come in several
        messages: the catch-up, then the hub's next batch)."""
        seen: list[str] = []
        while len(seen) < count:
            message = await self.next()
            if message.get("event") == "rows":
                seen += identifiers(message)
        return seen

    async def close(self):
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader


async def open_stream(client, url) -> Stream:
    response = await client.get(url)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache" and response["X-Accel-Buffering"] == "no"
    opened = Stream(response)
    assert (await opened.next()) == {"retry": str(stream_views.RECONNECT_MILLISECONDS)}
    return opened


def run(scenario):
    async def closing_every_stream():
        try:
            await scenario()
        finally:
            while Stream.opened:
                await Stream.opened.pop().close()

    asyncio.run(closing_every_stream())


def test_the_stream_opens_with_the_latest_50_events_then_pushes_new_ones(queue):
    add(60)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/queues/emails/stream/events/")
        first = await opened.next()
        assert first["event"] == "rows"
        assert identifiers(first) == [f"item-{i}" for i in range(10, 60)]
        await sync_to_async(add)(2, prefix="new")
        assert await opened.shown(2) == ["new-0", "new-1"]
        await opened.close()

    run(scenario)


def test_a_stream_resumes_after_the_last_event_it_showed(queue):
    user = viewer()
    add(3)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/queues/emails/stream/events/")
        position = (await opened.next())["id"]
        await opened.close()
        await sync_to_async(add)(4, prefix="while-away")
        url = f"/queues/emails/stream/events/?after={position}"
        resumed = await open_stream(client, url)
        assert await resumed.shown(4) == [f"while-away-{i}" for i in range(4)]
        await resumed.close()
        # The browser's own reconnect sends Last-Event-ID instead.
        response = await client.get("/queues/emails/stream/events/",
                                    headers={"Last-Event-ID": position})
        by_header = Stream(response)
        await by_header.next()
        assert await by_header.shown(4) == [f"while-away-{i}" for i in range(4)]
        await by_header.close()

    run(scenario)


def test_a_position_past_every_id_handed_out_starts_the_stream_afresh(queue):
    # A forged header or a database restored from a backup: resumed there, the stream would
    # stay silent until the ids caught up with it.
    user = viewer()
    add(3)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        response = await client.get("/queues/emails/stream/events/",
                                    headers={"Last-Event-ID": str(2**63 - 1)})
        opened = Stream(response)
        assert "retry" in await opened.next()
        assert identifiers(await opened.next()) == [f"item-{i}" for i in range(3)]
        await sync_to_async(add)(1, prefix="new")
        assert await opened.shown(1) == ["new-0"]
        await opened.close()

    run(scenario)


def test_the_stream_shows_only_events_matching_its_filters(queue):
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(
            client, "/queues/emails/stream/events/?account=beta&event=cancelled")
        assert identifiers(await opened.next()) == []

        def happen():
            items = add(2) + add(2, account="beta", prefix="b")
            lifecycle.apply("cancel", [item.pk for item in items], actor="admin")

        await sync_to_async(happen)()
        assert await opened.shown(2) == ["b-0", "b-1"]
        await opened.close()

    run(scenario)


def cap_rows(settings, rows):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "STREAM_ROWS_PER_SECOND": rows}


def burst_of(n, prefix="burst"):
    """`n` enqueued events in one transaction, so that the hub reads them in one batch."""
    enqueue_many("emails", [{"account": "acme", "identifier": f"{prefix}-{i:02d}"}
                            for i in range(n)])
    return ItemEvent.objects.order_by("-id").values_list("id", flat=True).first()


def test_a_burst_past_the_row_cap_arrives_as_rows_then_one_summary_with_exact_counts(
        queue, settings):
    cap_rows(settings, 5)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/queues/emails/stream/events/")
        await opened.next()  # the backlog, empty
        newest = await sync_to_async(burst_of)(40)
        rows = await opened.next()
        assert identifiers(rows) == [f"burst-{i:02d}" for i in range(5)]
        assert "data-summary" not in rows["data"]
        summary = await opened.next()
        assert summary["event"] == "rows" and identifiers(summary) == []
        assert 'data-count="35"' in summary["data"]
        assert "35 events not shown in the last second</strong>: 35 enqueued." in summary["data"]
        assert Cursor.parse(rows["id"]).last < newest == Cursor.parse(summary["id"]).last
        await opened.close()

        # Resuming from the rows, as a page that lost its connection before the summary: the
        # counted events are caught up (the newest as rows, the others counted), none twice.
        again = Stream(await client.get("/queues/emails/stream/events/",
                                        headers={"Last-Event-ID": rows["id"]}))
        await again.next()
        caught_up = await again.next()
        assert identifiers(caught_up) == [f"burst-{i:02d}" for i in range(35, 40)]
        assert 'data-count="30"' in caught_up["data"]
        assert "30 events not shown while this page was disconnected" in caught_up["data"]
        assert Cursor.parse(caught_up["id"]).last == Cursor.parse(summary["id"]).last
        await again.close()

        # Resuming after the summary: nothing again, nothing lost.
        await sync_to_async(add)(3, prefix="after")
        resumed = Stream(await client.get("/queues/emails/stream/events/",
                                          headers={"Last-Event-ID": summary["id"]}))
        await resumed.next()
        caught_up = await resumed.next()
        assert identifiers(caught_up) == ["after-0", "after-1", "after-2"]
        assert "data-summary" not in caught_up["data"]
        await resumed.close()

    run(scenario)


def test_below_the_row_cap_the_stream_sends_every_row_and_no_summary(queue, settings):
    cap_rows(settings, 50)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/queues/emails/stream/events/")
        await opened.next()
        await sync_to_async(burst_of)(50)
        assert identifiers(await opened.next()) == [f"burst-{i:02d}" for i in range(50)]
        with pytest.raises(TimeoutError):
            await opened.next(timeout=stream.SUMMARY_SECONDS + 0.5)
        await opened.close()

    run(scenario)


def test_an_idle_stream_sends_heartbeats(queue, monkeypatch):
    monkeypatch.setattr(stream_views, "HEARTBEAT_SECONDS", 0.2)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/stream/events/")
        await opened.next()
        assert (await opened.next(timeout=2)) == {"comment": "heartbeat"}
        await opened.close()

    run(scenario)


def test_open_streams_are_capped_per_user_and_a_closed_one_frees_its_slot(queue, monkeypatch):
    monkeypatch.setattr(stream_views, "MAX_STREAMS_PER_USER", 2)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        first = await open_stream(client, "/stream/events/")
        second = await open_stream(client, "/stream/events/")
        refused = await client.get("/stream/events/")
        assert refused.status_code == 429
        await first.close()
        assert stream.slots.open_for(user.pk) == 1
        third = await open_stream(client, "/stream/events/")
        await second.close()
        await third.close()
        assert stream.slots.open_for(user.pk) == 0
        assert not stream.hub().subscriptions

    run(scenario)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_under_uvicorn_a_stream_whose_client_hangs_up_frees_its_slot():
    client = Client()
    client.force_login(viewer())
    port = processes.free_port()
    server = processes.start_web(port, env={"DEBUG": "false"})

    def open_stream():
        session = requests.Session()
        session.cookies.set("sessionid", client.cookies["sessionid"].value)
        response = session.get(f"http://127.0.0.1:{port}/stream/events/", stream=True,
                               timeout=10)
        if response.status_code == 200:
            assert response.raw.read(6) == b"retry:"  # running, the connection kept open
        return session, response

    try:
        streams = [open_stream() for _ in range(stream_views.MAX_STREAMS_PER_USER)]
        assert [response.status_code for _, response in streams] == [200] * len(streams)
        assert open_stream()[1].status_code == 429
        for session, response in streams:  # the TCP connections close: tabs closed
            response.close()
            session.close()
        # Every slot comes back: the server ended the streams whose clients left.
        reopened, deadline = 0, time.monotonic() + 10
        while reopened < len(streams) and time.monotonic() < deadline:
            if open_stream()[1].status_code == 200:
                reopened += 1
            else:
                time.sleep(0.2)
        assert reopened == len(streams)
    finally:
        processes.stop([server])


def test_the_stream_needs_a_signed_in_viewer(queue):
    nobody = User.objects.create_user("nobody", password="pw-for-tests-1")

    async def scenario():
        client = AsyncClient()
        assert (await client.get("/stream/events/")).status_code == 401
        await client.aforce_login(nobody)
        assert (await client.get("/stream/events/")).status_code == 403
        await client.aforce_login(await sync_to_async(viewer)())
        assert (await client.get("/queues/nope/stream/events/")).status_code == 404
        assert (await client.get("/stream/events/?after=garbage")).status_code == 400

    run(scenario)


def test_under_asgi_the_page_streams(queue):
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        page = (await client.get("/queues/emails/stream/")).content.decode()
        assert 'data-mode="sse"' in page and "WSGI" not in page
        assert 'data-events-url="/queues/emails/stream/events/"' in page

    run(scenario)


def test_under_wsgi_the_page_polls_and_says_so(queue):
    add(2)
    client = Client()
    client.force_login(viewer())
    page = client.get("/queues/emails/stream/?account=acme").content.decode()
    assert 'data-mode="poll"' in page and "runs under WSGI" in page
    assert page.index("item-1") < page.index("item-0")  # newest first
    position = re.search(r'data-position="([^"]*)"', page).group(1)
    add(1, prefix="polled")
    rows = client.get(f"/queues/emails/stream/rows/?account=acme&after={position}")
    assert re.findall(r">(polled-\d)<", rows.content.decode()) == ["polled-0"]
    after = rows["X-Stream-Position"]
    assert client.get(f"/queues/emails/stream/rows/?after={after}").content == b""


def test_a_poll_past_the_row_cap_shows_the_newest_rows_and_counts_the_others(queue, settings):
    cap_rows(settings, 1)  # a poll covers POLL_SECONDS: 2 rows
    client = Client()
    client.force_login(viewer())
    position = stream.start_cursor().encode()
    newest = burst_of(5)
    rows = client.get(f"/queues/emails/stream/rows/?after={position}").content.decode()
    assert re.findall(r">(burst-\d+)<", rows) == ["burst-03", "burst-04"]
    assert rows.index("data-summary") < rows.index("burst-03")  # older: below once inserted
    assert 'data-count="3"' in rows and "3 events not shown since the last check" in rows
    # The link lists the items those events moved: the queue's items updated in those seconds.
    link = re.search(r'href="(/queues/emails/\?[^"]+)"', rows).group(1).replace("&amp;", "&")
    listed = client.get(link).content.decode()
    assert all(f"burst-{i:02d}" in listed for i in range(3))
    after = client.get(f"/queues/emails/stream/rows/?after={position}")["X-Stream-Position"]
    assert Cursor.parse(after).last == newest


def test_an_open_stream_ends_when_its_reader_signs_out_or_loses_the_role(queue, monkeypatch):
    """The role was checked once, at the open: a stream kept showing new items after its
    reader logged out or was deactivated."""
    from django.contrib.auth.models import Group

    monkeypatch.setattr(stream_views, "ACCESS_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(stream_views, "HEARTBEAT_SECONDS", 0.1)
    user = viewer()

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(user)
        opened = await open_stream(client, "/stream/events/")
        await opened.next()
        assert (await opened.next(timeout=2)) == {"comment": "heartbeat"}
        await sync_to_async(user.groups.remove)(await Group.objects.aget(name="Viewer"))
        while (message := await opened.next(timeout=2)).get("event") != "ended":
            assert message == {"comment": "heartbeat"}
        assert "Signed out" in message["data"]
        await opened.close()

        await sync_to_async(user.groups.add)(await Group.objects.aget(name="Viewer"))
        second = await open_stream(client, "/stream/events/")
        await second.next()
        await client.alogout()
        while (message := await second.next(timeout=2)).get("event") != "ended":
            pass
        await second.close()

    run(scenario)


def test_a_line_break_in_a_reason_reads_as_a_space_in_its_row():
    """Rows are one line each; the break was dropped, and "ended\ndata" read "endeddata"."""
    row = stream_views.render_rows([event(9, reason="ended\ndata")], {1: "emails"},
                                   show_queue=False)
    assert "\n" not in row and "ended data" in row
