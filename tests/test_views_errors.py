"""Errors view: failures grouped by type and normalised message, each group with its trend."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queues.engine.errors import group_key, normalise_error
from queues.models import OTHER_ERROR_GROUP, ErrorGroupHour, Item, MetricHour
from queues.web.charts import DEFAULT_TREND, TREND_RANGES, window
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


def test_messages_differing_only_in_ids_and_numbers_group_together():
    a = normalise_error("ValueError: invoice 'INV-17' has no line items\nTraceback ...")
    b = normalise_error("ValueError: invoice 'INV-99' has no line items")
    assert a == b == ("ValueError", "ValueError: invoice '…' has no line items")
    assert normalise_error("HTTP 503 Service Unavailable")[0] == "HTTP <n>"
    assert normalise_error("")[1] == "(no message)"
    assert normalise_error("ConnectionError: session s1a2ddad3-4 closed") == (
        "ConnectionError", "ConnectionError: session <id> closed")
    assert normalise_error("Win32Error: utf-8 codec on x86_64")[1] == (
        "Win<n>Error: utf-<n> codec on x<n>_<n>")


def test_errors_view_counts_groups_with_accounts_and_a_link(role_client):
    queue = QueueFactory(key="emails")
    items = (items_in_status(queue, "retry", 3, account="a")
             + items_in_status(queue, "failed", 2, account="b"))
    for n, item in enumerate(items[:4]):
        Item.objects.filter(pk=item.pk).update(last_error=f"TimeoutError: read {n}.5 s")
    Item.objects.filter(pk=items[4].pk).update(last_error="<script>x</script>")
    response = role_client("Viewer").get("/queues/emails/errors/")
    groups = response.context["groups"]
    assert [(g.kind, g.count, len(g.accounts)) for g in groups] == [("TimeoutError", 4, 2),
                                                                    ("Error", 1, 1)]
    html = response.content.decode()
    assert "status=retry&amp;status=failed&amp;group=TimeoutError%3A%20read%20%3Cn%3E%20s" in html
    assert "<script>x" not in html


ERRORS = {
    "t1": "TimeoutError: read 12.5 s",
    "t2": "  TimeoutError: read 3 s\nTraceback (most recent call last): ...",
    "other-timeout": "TimeoutError: connect 3 s",
    "quoted": "KeyError: 'customer' [x] \\ ^ $ (y) 0xdeadbeef 123e4567-e89b-12d3-a456-426614174000",
    "quoted-too": 'KeyError: "order" [x] \\ ^ $ (y) 0x1f 00000000-0000-0000-0000-000000000000',
    "session": "ConnectionError: session s1a2ddad3-4 closed by peer",
    "session-too": "ConnectionError: session req_8fK2pQ9x closed by peer",
    "session-word": "ConnectionError: session shutting-down closed by peer",
    "session-short": "ConnectionError: session a1b2 closed by peer",
    "boom": "RuntimeError: boom",
    "boom-too": "RuntimeError: boom \t\r\nTraceback (most recent call last): ...",
    "boomerang": "RuntimeError: boomerang failed",
    "long": "ValueError: " + "x" * 400,
    "long-too": "ValueError: " + "x" * 400 + " and then something else",
}


@pytest.fixture
def failing(db):
    queue = QueueFactory(key="emails")
    items = items_in_status(queue, "failed", len(ERRORS))
    for item, (name, error) in zip(items, ERRORS.items(), strict=True):
        Item.objects.filter(pk=item.pk).update(identifier=name, last_error=error)
    return queue


@pytest.mark.parametrize(("error", "members"), [
    (ERRORS["t1"], {"t1", "t2"}),
    (ERRORS["quoted"], {"quoted", "quoted-too"}),
    (ERRORS["session"], {"session", "session-too"}),
    (ERRORS["session-word"], {"session-word"}),
    (ERRORS["boom"], {"boom", "boom-too"}),
    (ERRORS["boomerang"], {"boomerang"}),
    # A first line longer than the group keeps is grouped by its beginning.
    (ERRORS["long"], {"long", "long-too"}),
])
def test_an_error_group_selects_exactly_its_items_on_either_database(failing, error, members):
    from queues.engine.errors import group_pattern

    message = normalise_error(error)[1]
    matched = set(Item.objects.filter(last_error__regex=group_pattern(message))
                  .values_list("identifier", flat=True))
    assert matched == members
    assert {name for name, text in ERRORS.items() if normalise_error(text)[1] == message
            } == members


def test_an_error_group_opens_its_items_and_their_bulk_retry(role_client, failing):
    client = role_client("Operator")
    groups = client.get("/queues/emails/errors/").context["groups"]
    timeout = next(g for g in groups if g.message == "TimeoutError: read <n> s")
    listing = client.get("/queues/emails/", {"status": ["retry", "failed"],
                                             "group": timeout.message})
    assert {i.identifier for i in listing.context["page"].items} == {"t1", "t2"}
    preview = client.get(f"/queues/emails/bulk/?{listing.context['retry_query']}"
                         ).context["preview"]
    assert (preview.matching, preview.eligible) == (2, 2)


# --- each group's trend, from the error groups' history ------------------------------------------

def this_hour():
    """The last hour the page's trend shows: until the hour under way has a whole minute, the
    one before it (a test that took the clock's hour failed in the first minute of an hour)."""
    _, end = window(TREND_RANGES[DEFAULT_TREND], timezone.now())
    return end - timedelta(hours=1)


def failing_groups(queue, errors: list[str]):
    items = items_in_status(queue, "retry", len(errors))
    for item, error in zip(items, errors, strict=True):
        Item.objects.filter(pk=item.pk).update(last_error=error)


def history_of(queue, error: str, failures_by_hours_ago: dict[int, int]):
    kind, message = normalise_error(error)
    for hours_ago, failures in failures_by_hours_ago.items():
        ErrorGroupHour.objects.create(
            queue=queue, start=this_hour() - timedelta(hours=hours_ago),
            group_key=group_key(kind, message), kind=kind, message=message, failures=failures)


def test_the_errors_page_shows_each_groups_trend_with_its_numbers(role_client):
    queue = QueueFactory(key="emails")
    script = "<script>alert('x')</script>"
    failing_groups(queue, ["TimeoutError: read 3 s", "TimeoutError: read 4 s", script])
    history_of(queue, "TimeoutError: read 1 s", {3: 40, 0: 5, 30: 99})  # 30 h ago: not shown
    history_of(queue, script, {1: 1})
    ErrorGroupHour.objects.create(queue=queue, start=this_hour(), group_key=OTHER_ERROR_GROUP,
                                  failures=12)

    response = role_client("Viewer").get("/queues/emails/errors/")

    html = response.content.decode()
    peak = (this_hour() - timedelta(hours=3)).strftime("%H:%M")
    words = f"45 failures in 24 h, peak 40 per hour at {peak} UTC"
    assert f'role="img" aria-label="{words}"><title>{words}</title>' in html
    assert '<td class="num">45</td>' in html
    single = (this_hour() - timedelta(hours=1)).strftime("%H:%M")
    assert f'aria-label="1 failure in 24 h, peak 1 per hour at {single} UTC"' in html
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    timeout = next(g for g in response.context["groups"] if g.kind == "TimeoutError")
    assert timeout.trend.values[-4:] == [40, 0, 0, 5] and len(timeout.trend.values) == 24
    assert timeout.trend.bars.count("Z") == 2  # one bar per hour with failures
    assert "12 failures in the last 24 h were outside each hour's 50 largest groups" in html


def test_the_group_failing_most_in_the_trends_range_comes_first(role_client):
    """Ranked by the items read (the newest enqueued), an error failing right now on older
    items came last."""
    queue = QueueFactory(key="emails")
    failing_groups(queue, ["KeyError: 'old'"] * 3 + ["RetryableError: partner answered 503"])
    history_of(queue, "RetryableError: partner answered 503", {0: 2000, 1: 1500})
    history_of(queue, "KeyError: 'old'", {20: 3})
    groups = role_client("Viewer").get("/queues/emails/errors/").context["groups"]
    assert [(g.kind, g.count) for g in groups] == [("RetryableError", 1), ("KeyError", 3)]


def test_first_seen_is_when_the_history_first_counts_the_group_not_the_newest_items(
        role_client):
    """It was the oldest last failure among the newest items read: days after the group began."""
    queue = QueueFactory(key="emails")
    failing_groups(queue, ["TimeoutError: read 3 s"])
    history_of(queue, "TimeoutError: read 1 s", {24 * 5: 2, 2: 1})
    [group] = role_client("Viewer").get("/queues/emails/errors/").context["groups"]
    assert group.first_seen == this_hour() - timedelta(hours=24 * 5)


def test_the_trends_of_every_group_cost_the_same_few_queries(role_client):
    queue = QueueFactory(key="emails")
    client = role_client("Viewer")
    errors = [f"LookupError: no {chr(97 + n)}{chr(97 + n)}" for n in range(26)]
    for error in errors:
        history_of(queue, error, {2: 3})

    def queries_of_page() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            response = client.get("/queues/emails/errors/")
        assert response.status_code == 200
        return [query["sql"] for query in captured.captured_queries]

    failing_groups(queue, errors[:2])
    few = queries_of_page()
    failing_groups(queue, errors[2:])
    many = queries_of_page()

    assert len(many) == len(few) <= 20
    # One read of the trends, one of when each group first failed.
    assert sum(ErrorGroupHour._meta.db_table in sql for sql in many) == 2
    assert client.get("/queues/emails/errors/").content.decode().count('<svg class="trend') == 26


def test_the_trends_span_seven_days_on_request_and_keep_the_pages_other_choices(role_client):
    queue = QueueFactory(key="emails")
    failing_groups(queue, ["TimeoutError: read 3 s"])
    history_of(queue, "TimeoutError: read 3 s", {0: 2, 24 * 5: 7, 24 * 8: 100})

    response = role_client("Viewer").get("/queues/emails/errors/?range=1h&trend=7d")

    html = response.content.decode()
    trend = response.context["groups"][0].trend
    assert len(trend.values) == 28 and trend.total == 9
    assert "9 failures in 7 d, peak 7 per 6 h at " in trend.summary
    assert "Trend, 7 d" in html and '<td class="num">9</td>' in html
    assert 'href="/queues/emails/errors/?range=1h&amp;trend=24h">24 h</a>' in html
    assert 'trend=7d" aria-current="true">7 d</a>' in html


def test_without_history_the_page_says_so_instead_of_showing_no_failures(role_client):
    queue = QueueFactory(key="emails")
    failing_groups(queue, ["TimeoutError: read 3 s"])
    client = role_client("Viewer")

    html = client.get("/queues/emails/errors/").content.decode()
    assert "No failure history for this range yet" in html and "<svg class=\"trend" not in html

    MetricHour.objects.create(queue=queue, start=this_hour())  # the rollup ran: no failures
    html = client.get("/queues/emails/errors/").content.decode()
    assert 'aria-label="No failures in 24 h"' in html and '<td class="num">0</td>' in html


def test_a_typed_group_of_placeholders_side_by_side_answers_at_once(role_client, failing):
    """On SQLite, Python's backtracking `re` tried every split of the digits among 12 `<n>`
    in a row: minutes of a web process's only thread for one request."""
    import time

    Item.objects.filter(queue=failing, identifier="t1").update(
        last_error="HTTP " + "1" * 40 + " upstream said no")
    started = time.perf_counter()
    response = role_client("Viewer").get("/queues/emails/", {
        "status": "failed", "group": "HTTP " + "<n>" * 12 + " x"})
    assert response.status_code == 200
    assert time.perf_counter() - started < 2
    assert not response.context["page"].items
    listing = role_client("Viewer").get("/queues/emails/", {
        "status": "failed", "group": "HTTP <n> upstream said no"})
    assert [i.identifier for i in listing.context["page"].items] == ["t1"]
