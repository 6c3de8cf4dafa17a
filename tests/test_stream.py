"""The live stream: reading events in order (queues.engine.stream) and the SSE view over Django's
async test client. The views run in a real event loop with the per-process hub reading on its
own thread and connection, so these tests commit (transaction=True)."""

import asyncio
import contextlib
import re
import threading
import time
import zoneinfo
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import AsyncClient, Client
from django.utils import timezone

from queues import enqueue
from queues.engine import lifecycle, stream
from queues.engine.stream import Batch, Cursor, Filters
from queues.models import ItemEvent
from queues.web import stream as stream_views
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 10  # seconds a test waits for a pushed message before failing


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def add(n, *, account="acme", prefix="item", queue_key="emails"):
    return [enqueue(queue_key, account=account, identifier=f"{prefix}-{i}") for i in range(n)]


def event(event_id, **fields):
    values = {"id": event_id, "item_id": event_id, "queue_id": 1, "account": "acme",
              "identifier": f"item-{event_id}", "transition": "enqueued", "from_status": "",
              "to_status": "queued", "attempt": 0, "at": None, "reason": ""} | fields
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
                                  "10-5~3:1", "10-4~11:1", f"{10**12}-1~{10**12}:1"])
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


def test_missed_is_what_the_page_has_not_shown_newest_kept(queue):
    add(2)
    page = stream.start_cursor()
    add(5, prefix="later")
    hub = stream.start_cursor()
    events, more = stream.missed(Filters(), page, hub, limit=3)
    assert [e.identifier for e in events] == ["later-2", "later-3", "later-4"] and more
    events, more = stream.missed(Filters(), page, hub)
    assert len(events) == 5 and not more


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
    assert (f'<td><time datetime="{at.isoformat()}">{local:%Y-%m-%d %H:%M:%S %Z} '
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
