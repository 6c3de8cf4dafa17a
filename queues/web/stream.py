"""The live stream pages: a table of item events that grows at the top as they happen.

Under an ASGI server (uvicorn) the page holds a server-sent-events connection to `stream_events`,
an async view fed by the per-process hub in queues.engine.stream. Under WSGI a request cannot
stay open without holding a worker thread, so the page polls `stream_rows` every 2 seconds
instead and says so. Either way the page keeps its position (a queues.engine.stream.Cursor) in a
data attribute and sends it back, so that a reconnect, a server restart or a poll shows nothing
twice and skips nothing. Past QUEUEADMIN["STREAM_ROWS_PER_SECOND"] rows a second the other events
arrive as a summary row that counts them by transition and links to where they can be read.
"""

import re
import time
import zoneinfo
from collections import Counter, OrderedDict
from datetime import timedelta
from importlib import import_module
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django import forms
from django.conf import settings
from django.contrib.auth import SESSION_KEY as SESSION_USER_KEY
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET

from queues.conf import setting
from queues.engine import stream
from queues.engine.stream import Cursor, Filters, Summary
from queues.models import MAX_ACCOUNT_LENGTH, Queue, Status
from queues.permissions import VIEWER, has_role, render_page, viewer_required
from queues.templatetags.queueadmin import when
from queues.web.forms import CanonicalField
from queues.web.middleware import SESSION_KEY

HEARTBEAT_SECONDS = 15.0  # a comment line this often keeps proxies from closing an idle stream
# An open stream asks this often whether its reader is still signed in and still a Viewer: a
# logout, an expired session, a deactivation or a role taken away ends it.
ACCESS_CHECK_SECONDS = 15.0
MAX_STREAMS_PER_USER = 6  # a few tabs; more is a leak or abuse, and each holds a socket
RECONNECT_MILLISECONDS = 2000
POSITION_EVERY_SECONDS = 1.0  # position-only messages when a filter hides every new event
ROW_CAP = 500  # rows kept in the page; older ones are removed as new ones arrive
PAUSE_BUFFER = 1000  # rows held while paused; beyond it the oldest are dropped and counted
POLL_SECONDS = 2
# What a summary row's events are "not shown" over.
LIVE_SPAN = "in the last second" if stream.SUMMARY_SECONDS == 1 else \
    f"in the last {stream.SUMMARY_SECONDS:g} seconds"
AWAY_SPAN = "while this page was disconnected"
POLL_SPAN = "since the last check"
RENDERED_ROWS = 20_000  # rendered rows kept for the other open streams
_rendered: OrderedDict[tuple[int, bool, str], str] = OrderedDict()
EVENT_LABELS = {
    "enqueued": "Enqueued",
    "dispatched": "Dispatched",
    "started": "Started",
    "completed": "Completed",
    "retry_scheduled": "Retry scheduled",
    "failed": "Failed",
    "lost": "Worker lost",
    "cancelled": "Cancelled",
    "requeued": "Requeued",
    "run_now": "Run now",
}


class StreamFilterForm(forms.Form):
    account = CanonicalField(required=False, max_length=MAX_ACCOUNT_LENGTH)
    status = forms.MultipleChoiceField(required=False, choices=Status.choices,
                                       widget=forms.CheckboxSelectMultiple)
    event = forms.MultipleChoiceField(required=False, choices=list(EVENT_LABELS.items()),
                                      label="Event type", widget=forms.CheckboxSelectMultiple)

    def filters(self, queue: Queue | None) -> Filters:
        data = self.cleaned_data
        return Filters(queue_id=queue.pk if queue else None, account=data["account"],
                       statuses=frozenset(data["status"]), transitions=frozenset(data["event"]))


def _url(name: str, queue: Queue | None) -> str:
    if queue:
        return reverse(f"queues:{name}", args=[queue.key])
    return reverse(f"queues:{name.replace('queue_', 'all_')}")


def _queue_keys() -> dict[int, str]:
    return dict(Queue.objects.values_list("pk", "key"))


def render_rows(events: list[stream.StreamEvent], queue_keys: dict[int, str],
                show_queue: bool) -> str:
    """Escaped table rows, oldest first, one per line. Each row is rendered once per process
    and display variant: every open stream shows the same new events. The time, shown as on
    every page (`when`: absolute in the user's zone, and relative to now), is part of the
    variant, so a row kept from earlier never says "now" of an event long past."""
    now = timezone.now()
    rows = []
    for event in events:
        shown_at = when(event.at, now)
        key = (event.id, show_queue, shown_at)
        row = _rendered.get(key)
        if row is None:
            row = render_to_string("queues/_stream_row.html", {
                "event": event, "label": EVENT_LABELS.get(event.transition, event.transition),
                "queue_key": queue_keys.get(event.queue_id, ""), "show_queue": show_queue,
                "shown_at": shown_at,
            }).replace("\n", " ")
            _rendered[key] = row
            if len(_rendered) > RENDERED_ROWS:
                _rendered.popitem(last=False)
        rows.append(row)
    return "\n".join(rows)


def render_summary(summary: Summary, span: str, queue_key: str | None, account: str,
                   show_queue: bool) -> str:
    """One escaped table row saying how many events of which transitions were not shown, with a
    link to read them: the queue's items updated in those seconds, or the history of every
    queue for the all-queues stream."""
    labelled = Counter()
    for transition, count in summary.counts.items():
        labelled[EVENT_LABELS.get(transition, transition).lower()] += count
    if queue_key:
        start = timezone.localtime(summary.first_at).replace(microsecond=0)
        end = timezone.localtime(summary.last_at).replace(microsecond=0) + timedelta(seconds=1)
        query = {"clock": "updated", "period": "custom",
                 "created_from": start.strftime("%Y-%m-%dT%H:%M:%S"),
                 "created_to": end.strftime("%Y-%m-%dT%H:%M:%S")}
        if account:
            query["account"] = account
        link = reverse("queues:queue_items", args=[queue_key]) + "?" + urlencode(query)
        link_text = "items updated then"
    else:
        link, link_text = reverse("queues:history"), "the history of every queue"
    return render_to_string("queues/_stream_summary.html", {
        "count": summary.total, "total": f"{summary.total:,}", "plural": summary.total != 1,
        "span": span,
        "more": summary.more, "count_limit": f"{stream.COUNT_LIMIT:,}",
        "parts": [(f"{count:,}", label) for label, count in labelled.most_common()],
        "rows_per_second": setting("STREAM_ROWS_PER_SECOND"),
        "shown_at": when(summary.last_at), "columns": 6 if show_queue else 5,
        "link": link, "link_text": link_text,
    }).replace("\n", " ")


@require_GET
@viewer_required
def stream_page(request, key=None):
    queue = get_object_or_404(Queue, key=key) if key else None
    form = StreamFilterForm(request.GET)
    if not form.is_valid():
        return render_page(request, "queues/stream.html", {"queue": queue, "form": form},
                           status=400)
    live = isinstance(request, ASGIRequest)
    query = request.GET.urlencode()
    context = {
        "queue": queue, "form": form, "live": live,
        "events_url": _url("queue_stream_events", queue) + (f"?{query}" if query else ""),
        "rows_url": _url("queue_stream_rows", queue) + (f"?{query}" if query else ""),
        "row_cap": ROW_CAP, "pause_buffer": PAUSE_BUFFER, "poll_seconds": POLL_SECONDS,
        "clear_url": _url("queue_stream", queue),
    }
    if not live:
        # The stream sends its own backlog; a polling page starts with it instead.
        position = stream.start_cursor()
        newest_first = stream.backlog(form.filters(queue), position)[::-1]
        # Rendered by an autoescaping template.
        context["rows"] = mark_safe(render_rows(newest_first, _queue_keys(), queue is None))  # noqa: S308
        context["position"] = position.encode()
    return render_page(request, "queues/stream.html", context)


@require_GET
@viewer_required
def stream_rows(request, key=None):
    """Polling: the matching events after the page's position, and its next position."""
    queue = get_object_or_404(Queue, key=key) if key else None
    form = StreamFilterForm(request.GET)
    position = Cursor.parse(request.GET.get("after"))
    if not form.is_valid() or position is None:
        return HttpResponseBadRequest("Bad filters or position.")
    batch = stream.read(position)
    filters = form.filters(queue)
    events, summary = stream.newest(stream.filter_events(batch.events, filters),
                                    setting("STREAM_ROWS_PER_SECOND") * POLL_SECONDS)
    html = render_rows(events, _queue_keys(), queue is None) if events else ""
    if summary:
        html = "\n".join(filter(None, [render_summary(
            summary, POLL_SPAN, key, filters.account, queue is None), html]))
    response = HttpResponse(html)
    response["X-Stream-Position"] = batch.cursor.encode()
    response["Cache-Control"] = "no-store"
    return response


SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _sse(event: str, data: str, position: Cursor | None = None) -> str:
    lines = [f"id: {position.encode()}"] if position is not None else []
    lines.append(f"event: {event}")
    # CR, LF and CRLF each end an SSE line: every one of them in the data starts a new data
    # line, so no stored character can end the event or inject a field.
    lines += [f"data: {line}" for line in SSE_LINE_BREAK.split(data)]
    return "\n".join(lines) + "\n\n"


async def stream_events(request, key=None):
    """text/event-stream: the backlog (or what the page missed), then new events as they come."""
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET"})
    user = await request.auser()
    if not user.is_authenticated:
        return HttpResponse("Sign in to follow the stream.", status=401)
    if not await sync_to_async(has_role)(user, VIEWER):
        return HttpResponse("This needs the Viewer role.", status=403)
    if not isinstance(request, ASGIRequest):
        return HttpResponse("The live stream needs an ASGI server; the page polls instead.",
                            status=501)
    queue = None
    if key is not None:
        queue = await Queue.objects.filter(key=key).afirst()
        if queue is None:
            return HttpResponse("No such queue.", status=404)
    form = StreamFilterForm(request.GET)
    after = request.GET.get("after") or request.headers.get("Last-Event-ID")
    page = Cursor.parse(after) if after else None
    if not form.is_valid() or (after and page is None):
        return HttpResponseBadRequest("Bad filters or position.")
    time_zone = await request.session.aget(SESSION_KEY) or "UTC"
    queue_keys = await sync_to_async(_queue_keys)()
    if not stream.slots.acquire(user.pk, MAX_STREAMS_PER_USER):
        return HttpResponse(f"At most {MAX_STREAMS_PER_USER} open streams per user; close a "
                            "tab.", status=429)
    # The request's thread took a database connection for the session and user; hand it back
    # now, or every open stream would hold one (the web process's pool has 20).
    await sync_to_async(stream.close_connection)()
    events = _event_stream(user.pk, form.filters(queue), page, queue_keys, key, time_zone,
                           request.session.session_key)
    return StreamingHttpResponse(events, content_type="text/event-stream", headers={
        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _event_stream(user_id: int, filters: Filters, page: Cursor | None,
                        queue_keys: dict[int, str], queue_key: str | None, time_zone: str,
                        session_key: str | None):
    show_queue = queue_key is None
    rows_per_second = setting("STREAM_ROWS_PER_SECOND")
    hub = stream.hub()
    subscription = hub.join()
    try:
        hub_cursor = await subscription.started()
        read = sync_to_async(_read_and_close, thread_sensitive=False)
        if page is not None and page.last > hub_cursor.last and \
                page.last > (await read(stream.start_cursor)).last:
            # Past every id handed out (a forged header, a database restored from a backup):
            # the stream would stay silent until the ids caught up, so it starts afresh.
            page = None
        if page is None:
            events, summary = await read(stream.backlog, filters, hub_cursor), None
            position = hub_cursor
        else:
            events, summary = await read(stream.missed, filters, page, hub_cursor,
                                         rows_per_second)
            position = stream.resume_position(page, hub_cursor)

        async def rows(events, summary, span):
            unknown = {e.queue_id for e in events} - queue_keys.keys()
            if unknown:  # a queue created after the stream opened
                queue_keys.update(await read(_queue_keys))
            with timezone.override(_zone(time_zone)):
                html = render_rows(events, queue_keys, show_queue)
                if summary:  # its events came before the rows
                    html = "\n".join(filter(None, [render_summary(
                        summary, span, queue_key, filters.account, show_queue), html]))
            return html

        yield f"retry: {RECONNECT_MILLISECONDS}\n\n"
        yield _sse("rows", await rows(events, summary, AWAY_SPAN), position)
        cap = stream.RowCap(position, filters, rows_per_second)
        last_sent = last_checked = time.monotonic()
        sent_position = position
        while True:
            if time.monotonic() - last_checked >= ACCESS_CHECK_SECONDS:
                if not await read(_still_allowed, user_id, session_key):
                    yield _sse("ended", "Signed out: the stream has ended.")
                    return
                last_checked = time.monotonic()
            try:
                batches = await subscription.next(cap.wait(HEARTBEAT_SECONDS))
            except stream.Overflow:
                yield _sse("notice", "The stream fell behind; reconnecting.")
                return
            step = cap.take(batches)
            subscription.quiet_until = cap.due()
            now = time.monotonic()
            if step.rows or step.summary:
                yield _sse("rows", await rows(step.rows, step.summary, LIVE_SPAN), step.position)
            elif step.position != sent_position and now - last_sent >= POSITION_EVERY_SECONDS:
                yield _sse("position", step.position.encode())
            elif now - last_sent >= HEARTBEAT_SECONDS:
                yield ": heartbeat\n\n"
                last_sent = now
                continue
            else:
                continue
            last_sent, sent_position = now, step.position
    finally:
        hub.unsubscribe(subscription)
        stream.slots.release(user_id)


def _still_allowed(user_id: int, session_key: str | None) -> bool:
    """The reader's session still signs this user in (not logged out, not expired), and the
    user is still active with the Viewer role or above."""
    engine = import_module(settings.SESSION_ENGINE)
    data = engine.SessionStore(session_key).load() if session_key else {}
    if str(data.get(SESSION_USER_KEY)) != str(user_id):
        return False
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    return user is not None and has_role(user, VIEWER)


def _read_and_close(function, *args):
    """A catch-up read on a worker thread, its connection handed back at once."""
    try:
        return function(*args)
    finally:
        stream.close_connection()


def _zone(name: str):
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")
