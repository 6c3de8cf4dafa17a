"""Item browser `/queues/<key>/`: filters in the URL, keyset pages, counts, retry estimates."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from queues import enqueue
from queues.engine.handlers import TASK_HANDLER
from queues.models import Item
from queues.web import queries
from tests.factories import (
    AccountPolicyFactory,
    QueueFactory,
    analyzed_before_new_queues,
    enqueued,
    failures_finished_in_reverse_order,
    index_entries_read,
    items_in_status,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def identifiers(response):
    return [item.identifier for item in response.context["page"].items]


def walk(client, query: str, heading: str) -> list[str]:
    """The identifiers of every page of the list, followed by its "Older" positions; each page
    says its order in the heading."""
    seen, url = [], f"/queues/emails/?{query}"
    while url:
        response = client.get(url)
        assert heading in response.content.decode()
        seen += identifiers(response)
        cursor = response.context["page"].next_cursor
        url = f"/queues/emails/?{query}&before={cursor}" if cursor else None
    return seen


def test_newest_first_with_every_column(role_client, queue):
    items_in_status(queue, "retry", 1, prefix="old")
    enqueued(queue, 1, prefix="new")
    response = role_client("Viewer").get("/queues/emails/")
    assert identifiers(response) == ["new-0", "old-0"]
    html = response.content.decode()
    for column in ("Identifier", "Account", "Status", "Attempts", "Current Error",
                   "Retry (Estimated)", "Created", "Updated"):
        assert f">{column}</th>" in html
    assert "Scheduled for Retry" in html and "temporary trouble" in html
    assert "<time datetime=" in html and 'title="' in html


def test_each_row_links_its_item_and_its_account_under_any_script_prefix(role_client, queue):
    from django.urls import get_script_prefix, set_script_prefix

    [item] = enqueued(queue, 1, account="acme & co")
    client = role_client("Viewer")
    html = client.get("/queues/emails/").content.decode()
    assert f'<a href="/items/{item.pk}/">item-0</a>' in html
    assert '<a href="/queues/emails/?account=acme%20%26%20co">' in html
    # Behind a proxy at /ops/ (the item URL is reversed once per prefix, then the id put in).
    before = get_script_prefix()
    set_script_prefix("/ops/")  # what the WSGI and ASGI handlers do from SCRIPT_NAME
    try:
        html = client.get("/queues/emails/").content.decode()
    finally:
        set_script_prefix(before)
    assert f'<a href="/ops/items/{item.pk}/">item-0</a>' in html
    assert '<a href="/ops/queues/emails/?account=acme%20%26%20co">' in html


def test_the_queue_page_counts_its_items_by_status_above_everything_else(role_client, queue):
    items_in_status(queue, "failed", 2, prefix="dead")
    items_in_status(queue, "retry", 1, prefix="again")
    enqueued(queue, 3, prefix="new")
    html = role_client("Viewer").get("/queues/emails/").content.decode()
    strip = html[html.index('id="queue-counts"'):html.index("</section>", html.index(
        'id="queue-counts"'))]
    assert "3 queued</a>" in strip and "1 scheduled for retry</a>" in strip
    assert "2 dead letters</a>" in strip and "0 in flight" in strip
    assert html.index('id="queue-counts"') < html.index('id="item-filters"')


def test_filter_by_several_statuses(role_client, queue):
    items_in_status(queue, "retry", 2, prefix="r")
    items_in_status(queue, "failed", 1, prefix="f")
    items_in_status(queue, "complete", 1, prefix="c")
    response = role_client("Viewer").get("/queues/emails/?status=retry&status=failed")
    assert sorted(identifiers(response)) == ["f-0", "r-0", "r-1"]
    assert response.context["page"].total == "3"


def test_filter_by_account_identifier_and_error(role_client, queue):
    items_in_status(queue, "retry", 2, prefix="inv", account="tenant-1")
    items_in_status(queue, "failed", 1, prefix="inv-f", account="tenant-2")
    enqueued(queue, 1, prefix="other", account="tenant-1")
    client = role_client("Viewer")
    assert sorted(identifiers(client.get("/queues/emails/?account=tenant-1&identifier=inv"))) \
        == ["inv-0", "inv-1"]
    assert identifiers(client.get("/queues/emails/?error=bad+inp")) == ["inv-f-0"]


def test_filter_by_created_time_presets_and_range(role_client, queue):
    old, new = enqueued(queue, 2)
    Item.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    client = role_client("Viewer")
    assert identifiers(client.get("/queues/emails/?period=24h")) == [new.identifier]
    assert identifiers(client.get("/queues/emails/?period=7d")) == [new.identifier,
                                                                    old.identifier]
    since = (timezone.now() - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    until = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = client.get(f"/queues/emails/?period=custom&created_from={since}"
                          f"&created_to={until}")
    assert identifiers(response) == [old.identifier]


def test_bad_filters_are_refused_with_a_message(role_client, queue):
    client = role_client("Viewer")
    response = client.get("/queues/emails/?status=bogus&before=nonsense")
    assert response.status_code == 400
    assert b"Check the filters" in response.content
    # Digits to str.isdigit that int() refuses.
    assert client.get("/queues/emails/?before=\u00b2-1").status_code == 400
    # An id past bigint, which the database would refuse instead of finding nothing.
    assert client.get(f"/queues/emails/?before=1-{2**63}").status_code == 400
    response = client.get("/queues/emails/?period=custom&created_from=2026-01-02T00:00"
                          "&created_to=2026-01-01T00:00", HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and b"Must be after From" in response.content


def test_keyset_pages_walk_every_item_once(role_client, queue, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 4)
    enqueued(queue, 7, prefix="a")  # one enqueue: all seven share created_at
    items_in_status(queue, "retry", 3, prefix="b")
    client = role_client("Viewer")
    seen, url = [], "/queues/emails/"
    while url:
        response = client.get(url)
        assert "OFFSET" not in str(response.context["page"])
        seen += identifiers(response)
        cursor = response.context["page"].next_cursor
        url = f"/queues/emails/?before={cursor}" if cursor else None
    assert len(seen) == 10 and len(set(seen)) == 10


def walk_back(client, query: str, cursor: str) -> list[list[str]]:
    """The pages from the one before `cursor` back to the list's first, by their "Newer"
    links, each page in the list's order."""
    pages, url = [], f"/queues/emails/?{query}&after={cursor}"
    while url:
        page = client.get(url).context["page"]
        pages.append([item.identifier for item in page.items])
        url = f"/queues/emails/?{query}&after={page.newer_cursor}" if page.newer_cursor else None
    return pages


@pytest.mark.parametrize("query", ["", "status=failed&period=24h", "payload=k%3D1"])
def test_newer_pages_walk_back_to_the_first_page_as_the_older_ones_came(
        role_client, queue, monkeypatch, query):
    monkeypatch.setattr(queries, "PAGE_SIZE", 3)
    failures_finished_in_reverse_order(queue)
    # Found by the payload's own index, sorted whatever their statuses; one enqueue, so
    # all eight tie on their enqueue time.
    items_in_status(queue, "queued", 8, prefix="p", payload={"k": 1})
    client = role_client("Viewer")
    forwards, url = [], f"/queues/emails/?{query}"
    while url:
        response = client.get(url)
        page = response.context["page"]
        forwards.append(([i.identifier for i in page.items], page))
        # "← Newer" from every page but the first; "Newest" beside it.
        assert ("← Newer" in response.content.decode()) == (len(forwards) > 1)
        url = f"/queues/emails/?{query}&before={page.next_cursor}" if page.next_cursor else None
    assert len(forwards) >= 3
    back = walk_back(client, query, forwards[-1][1].newer_cursor)
    assert back == [identifiers for identifiers, _ in forwards[-2::-1]]
    # A page reached by "← Newer" links to older ones again.
    response = client.get(f"/queues/emails/?{query}&after={forwards[-1][1].newer_cursor}")
    assert "Older →" in response.content.decode()


def test_a_page_cannot_be_both_older_and_newer_than_others(role_client, queue, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 3)
    failures_finished_in_reverse_order(queue)
    client = role_client("Viewer")
    cursor = client.get("/queues/emails/").context["page"].next_cursor
    response = client.get(f"/queues/emails/?before={cursor}&after={cursor}")
    assert response.status_code == 400 and b"either older or newer" in response.content
    assert client.get("/queues/emails/?after=x").status_code == 400


def test_failures_of_the_last_day_list_the_latest_finished_first_page_by_page(
        role_client, queue, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 3)
    expected = failures_finished_in_reverse_order(queue)
    assert walk(role_client("Viewer"), "status=failed&period=24h",
                heading="latest finished first") == expected


def test_failures_of_any_time_list_the_newest_enqueued_first(role_client, queue, monkeypatch):
    # Without a range nothing bounds the finish time, which only ended items have.
    monkeypatch.setattr(queries, "PAGE_SIZE", 3)
    failures_finished_in_reverse_order(queue)
    assert walk(role_client("Viewer"), "status=failed", heading="newest first") == [
        "old-0", "f-6", "f-5", "f-4", "f-3", "f-2", "f-1", "f-0"]


def test_a_page_position_from_a_list_in_another_order_is_refused(role_client, queue,
                                                                  monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 3)
    failures_finished_in_reverse_order(queue)
    client = role_client("Viewer")
    cursor = client.get("/queues/emails/?status=failed&period=24h").context["page"].next_cursor
    response = client.get(f"/queues/emails/?period=24h&before={cursor}")
    assert response.status_code == 400
    assert b"Not a page position of this list" in response.content
    # The same range on the enqueue clock goes by enqueue time, the newest first: the old
    # failure was enqueued last.
    response = client.get("/queues/emails/?status=failed&period=24h&clock=enqueued")
    assert identifiers(response) == ["old-0", "f-6", "f-5"]
    assert "newest first" in response.content.decode()


def test_counts_are_exact_up_to_the_limit_then_plus(role_client, queue, monkeypatch):
    monkeypatch.setattr(queries, "EXACT_COUNT_LIMIT", 3)
    enqueued(queue, 5, account="big")
    client = role_client("Viewer")
    assert client.get("/queues/emails/?account=big").context["page"].total == "3+"
    assert client.get("/queues/emails/?account=big&identifier=item-1").context["page"].total \
        == "1"
    # Unfiltered totals come from the counters, exact.
    assert client.get("/queues/emails/").context["page"].total == "5"


def test_delayed_items_say_until_when(role_client, queue):
    enqueue("emails", account="a", identifier="later",
            run_at=timezone.now() + timedelta(hours=3))
    assert b"Delayed until" in role_client("Viewer").get("/queues/emails/").content


def test_retry_estimate_says_what_holds_an_item(role_client, queue):
    items_in_status(queue, "retry", 1, account="capped")
    AccountPolicyFactory(queue=queue, account="capped", max_in_flight=1)
    items_in_status(queue, "running", 1, account="capped")
    items_in_status(queue, "retry", 1, account="stopped")
    AccountPolicyFactory(queue=queue, account="stopped", paused=True)
    html = role_client("Viewer").get("/queues/emails/").content.decode()
    assert "account at cap" in html and "account paused" in html
    queue.paused = True
    queue.save()
    assert "queue paused" in role_client("Viewer").get("/queues/emails/").content.decode()


def test_hostile_identifiers_and_errors_are_escaped(role_client, queue):
    items = items_in_status(queue, "retry", 1, prefix="<img src=x onerror=alert(1)>")
    Item.objects.filter(pk=items[0].pk).update(last_error="<script>boom()</script>\nline 2")
    html = role_client("Viewer").get("/queues/emails/").content.decode()
    assert "<img src=x" not in html and "<script>boom" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_htmx_request_returns_the_list_fragment(role_client, queue):
    enqueued(queue, 1)
    html = role_client("Viewer").get("/queues/emails/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="item-list"' in html and "<html" not in html


def test_query_count_is_constant(role_client, queue, django_assert_max_num_queries):
    items_in_status(queue, "retry", 20)
    client = role_client("Viewer")
    client.get("/queues/emails/")
    # Overdue, so that the estimate also reads the global pause and the queue's in-flight count.
    Item.objects.update(run_at=timezone.now() - timedelta(minutes=5))
    # Ten of the page's own (the status counts strip one of them), whether a second factor is
    # due (queues.permissions), and on PostgreSQL the list's sorts turned off and, inside the
    # test's transaction, back on (queues.engine.db.sorts_off).
    with django_assert_max_num_queries(13 if connection.vendor == "postgresql" else 11):
        client.get("/queues/emails/?status=retry&status=failed&period=24h")


def test_unknown_queue_is_404(role_client):
    assert role_client("Viewer").get("/queues/nope/").status_code == 404


def failed(queue, prefix, enqueued_ago, failed_ago, n=1):
    items = items_in_status(queue, "failed", n, prefix=prefix)
    now = timezone.now()
    Item.objects.filter(pk__in=[i.pk for i in items]).update(
        created_at=now - enqueued_ago, finished_at=now - failed_ago)


def test_a_list_of_failed_items_ranges_over_when_they_failed(role_client, queue):
    failed(queue, "recent-failure", timedelta(days=3), timedelta(hours=1))
    failed(queue, "old-failure", timedelta(days=3), timedelta(days=2))
    response = role_client("Viewer").get(
        "/queues/emails/", {"status": "failed", "period": "24h"})
    assert identifiers(response) == ["recent-failure-0"]
    by_enqueue = role_client("Viewer").get(
        "/queues/emails/", {"status": "failed", "period": "24h", "clock": "enqueued"})
    assert identifiers(by_enqueue) == []


def test_retry_all_matching_opens_the_preview_of_exactly_this_list(role_client, queue):
    failed(queue, "order", timedelta(days=3), timedelta(hours=1), n=3)
    failed(queue, "invoice", timedelta(days=3), timedelta(hours=2))
    failed(queue, "order-old", timedelta(days=3), timedelta(days=2))
    client = role_client("Operator")
    listing = client.get("/queues/emails/", {"status": "failed", "period": "24h",
                                             "identifier": "order"})
    assert listing.context["page"].total == "3"
    query = listing.context["retry_query"]
    assert listing.context["cancel_query"] is None  # failed items cannot be cancelled
    assert "Retry all 3 matching" in listing.content.decode()
    # Over retry and failed items, the count is not what a retry would change.
    mixed = client.get("/queues/emails/", {"status": ["failed", "retry"], "period": "7d"})
    assert "Retry those that can be retried…" in mixed.content.decode()
    assert "Retry all" not in mixed.content.decode()
    preview = client.get(f"/queues/emails/bulk/?{query}").context["preview"]
    assert (preview.matching, preview.eligible, preview.filter.clock) == (3, 3, "finished")


@pytest.mark.parametrize("query", [
    {"period": "1h"},  # a preset: its end is open on the list, so in the bulk filter too
    {},  # any time: due in hours is still "any time"
    {"period": "custom", "created_from": (timezone.now() - timedelta(days=1)).strftime(
        "%Y-%m-%dT%H:%M")},  # a From with no To
])
def test_cancel_all_matching_by_next_run_time_changes_every_item_the_list_counted(
        role_client, queue, query):
    """The list counted items due later on the next-run clock; the bulk filter closed its range
    at now (or a minute after), and "Cancel all 753 matching" cancelled 522."""
    now = timezone.now()
    enqueued(queue, 2, prefix="due", run_at=now - timedelta(minutes=5))
    enqueued(queue, 3, prefix="later", run_at=now + timedelta(hours=3))
    client = role_client("Operator")
    listing = client.get("/queues/emails/", {"status": ["queued", "retry"],
                                             "clock": "next_run", **query})
    assert listing.context["page"].total == "5"
    bulk_page = client.get(f"/queues/emails/bulk/?{listing.context['cancel_query']}")
    preview = bulk_page.context["preview"]
    assert (preview.matching, preview.eligible) == (5, 5)
    assert " to " not in re.sub(r"\s+", " ", bulk_page.content.decode()).split(
        "items due to run")[1].split("as of")[0]


def test_an_unfiltered_list_carries_every_item_to_the_bulk_preview(role_client, queue):
    items_in_status(queue, "failed", 2)
    enqueued(queue, 3)
    client = role_client("Operator")
    listing = client.get("/queues/emails/")
    preview = client.get(f"/queues/emails/bulk/?{listing.context['retry_query']}"
                         ).context["preview"]
    assert (preview.matching, preview.eligible) == (5, 2)
    assert listing.context["page"].total == "5"


def test_a_viewer_is_offered_no_bulk_action(role_client, queue):
    items_in_status(queue, "failed", 1)
    response = role_client("Viewer").get("/queues/emails/")
    assert "retry_query" not in response.context and "matching…" not in response.content.decode()


def test_totals_of_a_thousand_and_more_read_as_plural(role_client, queue, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    enqueued(queue, 1000, prefix="a")
    enqueued(queue, 200, prefix="b")
    response = role_client("Viewer").get("/queues/emails/")
    assert "1,200 items" in response.content.decode()


def test_every_page_gives_an_overdue_item_the_same_estimate_and_reason(role_client, queue):
    [item] = items_in_status(queue, "retry", 1, prefix="late")
    Item.objects.filter(pk=item.pk).update(run_at=timezone.now() - timedelta(minutes=11))
    client = role_client("Viewer")
    listing = client.get("/queues/emails/").content.decode()
    detail = client.get(f"/items/{item.pk}/").content.decode()
    for html in (listing, detail):
        assert re.search(r">overdue 1[01] min</time> · backlog ahead", html)


def test_a_held_item_says_what_holds_it(role_client, queue):
    items_in_status(queue, "queued", 1, prefix="held")
    queue.paused = True
    queue.save()
    html = role_client("Viewer").get("/queues/emails/").content.decode()
    assert "held: queue paused" in html


def test_typed_dates_are_never_ignored(role_client, queue):
    client = role_client("Viewer")
    enqueued(queue, 1, prefix="now")
    under_any_time = client.get("/queues/emails/", {"created_from": "2001-01-01T00:00",
                                                    "created_to": "2001-01-02T00:00"})
    assert under_any_time.status_code == 200 and identifiers(under_any_time) == []
    with_a_preset = client.get("/queues/emails/", {"period": "24h",
                                                   "created_from": "2001-01-01T00:00"})
    assert with_a_preset.status_code == 400
    assert "Time: Choose From / to to use the dates you typed" in with_a_preset.content.decode()


def test_filter_by_task_and_act_on_exactly_its_items(role_client):
    jobs = QueueFactory(key="jobs", handler=TASK_HANDLER)
    items_in_status(jobs, "failed", 2, prefix="charge", task_path="billing.tasks.charge")
    items_in_status(jobs, "failed", 1, prefix="refund", task_path="billing.tasks.refund")
    client = role_client("Operator")
    listing = client.get("/queues/jobs/", {"task": "billing.tasks.charge"})
    assert sorted(identifiers(listing)) == ["charge-0", "charge-1"]
    assert listing.context["page"].total == "2"
    preview = client.get(f"/queues/jobs/bulk/?{listing.context['retry_query']}"
                         ).context["preview"]
    assert (preview.filter.task, preview.eligible) == ("billing.tasks.charge", 2)


@pytest.mark.parametrize("task", ["charge", "billing tasks", "billing..charge", "1billing.x"])
def test_a_task_filter_that_is_not_a_module_path_is_refused(role_client, queue, task):
    response = role_client("Viewer").get("/queues/emails/", {"task": task})
    assert response.status_code == 400
    assert "Name a task by its module path" in response.content.decode()


def test_a_list_of_failed_items_offers_no_cancel_of_a_selection(role_client, queue):
    failed(queue, "order", timedelta(days=3), timedelta(hours=1))
    html = role_client("Operator").get("/queues/emails/", {"status": "failed"}).content.decode()
    assert "Retry selected…" in html and "Cancel selected…" not in html


@pytest.mark.postgres
def test_the_first_page_of_a_queue_the_statistics_do_not_know_reads_a_page_not_the_queue(
        role_client):
    # Statistics that saw only another queue's finished items: the new queue is "one row".
    analyzed_before_new_queues()
    queue = QueueFactory(key="emails")
    for batch in range(4):
        enqueued(queue, 500, account=f"acct-{batch}", prefix=f"new-{batch}")

    before = index_entries_read()
    response = role_client("Viewer").get("/queues/emails/")
    assert len(response.context["page"].items) == 50
    # A page and a look past it per status, not the queue's 2,000 queued items sorted.
    assert index_entries_read() - before < 500
