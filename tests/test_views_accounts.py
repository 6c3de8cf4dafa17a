"""Accounts view: per-account backlog, in flight, service share, flags, the selector's cursor;
ordered by account (live) or by the sweeper's ranking (backlog, oldest wait, share)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from queues import enqueue
from queues.engine import account_stats, selector
from queues.models import SelectorRound, SelectorState
from queues.web import queries
from tests.factories import (
    AccountPolicyFactory,
    QueueFactory,
    analyzed_before_new_queues,
    enqueued,
    index_entries_read,
    items_in_status,
)

pytestmark = pytest.mark.django_db


def test_accounts_view_shows_the_fairness_picture(role_client):
    queue = QueueFactory(key="emails", batch_size=4)
    enqueued(queue, 5, account="big", prefix="b")
    enqueued(queue, 1, account="small", prefix="s")
    items_in_status(queue, "running", 1, account="small")
    AccountPolicyFactory(queue=queue, account="small", weight=3, max_in_flight=1)
    AccountPolicyFactory(queue=queue, account="big", paused=True)
    selector.run_round(queue)  # "small" is at its cap and "big" paused: nothing to take
    enqueued(queue, 2, account="free", prefix="f")
    selector.run_round(queue)
    response = role_client("Viewer").get("/queues/emails/accounts/")
    page = response.context["page"]
    rows = {row.account: row for row in page.rows}
    assert list(rows) == ["big", "small"]  # "free" had all its items taken
    assert (rows["big"].backlog, rows["big"].paused) == (5, True)
    assert (rows["small"].in_flight, rows["small"].at_cap, rows["small"].weight) == (1, True, 3)
    assert page.top_served == [("free", 2, 1.0)] and page.rounds == 1
    assert page.cursor == SelectorState.objects.get(queue=queue).cursor
    html = response.content.decode()
    assert "At cap" in html and "Paused" in html and 'class="share"' in html


def test_each_account_row_links_its_items_and_its_pause_form_under_any_script_prefix(
        role_client):
    from django.urls import get_script_prefix, set_script_prefix

    queue = QueueFactory(key="emails")
    enqueued(queue, 1, account="big & co")
    AccountPolicyFactory(queue=queue, account="paused one", paused=True)
    enqueued(queue, 1, account="paused one", prefix="p")
    client = role_client("Operator")
    pages = {}
    before = get_script_prefix()
    for prefix in ("/", "/ops/"):  # the URLs are reversed once per prefix and remembered
        set_script_prefix(prefix)  # what the WSGI and ASGI handlers do from SCRIPT_NAME
        try:
            pages[prefix] = client.get("/queues/emails/accounts/").content.decode()
        finally:
            set_script_prefix(before)
    for prefix, html in pages.items():
        assert f'<a href="{prefix}queues/emails/?account=big%20%26%20co">' in html
        assert f'action="{prefix}queues/emails/accounts/pause/"' in html
        assert f'action="{prefix}queues/emails/accounts/resume/"' in html


def test_accounts_are_paged_by_key(role_client, monkeypatch):

    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    for account in ("a", "b", "c"):
        enqueued(queue, 1, account=account, prefix=account)
    client = role_client("Viewer")
    first = client.get("/queues/emails/accounts/").context["page"]
    assert [r.account for r in first.rows] == ["a", "b"] and first.next_query == "after=b"
    second = client.get("/queues/emails/accounts/?after=b").context["page"]
    assert [r.account for r in second.rows] == ["c"] and second.next_query == ""


def test_an_account_at_its_ready_limit_is_shown(role_client):
    from queues.models import AccountPolicy

    queue = QueueFactory(key="limits")
    AccountPolicy.objects.create(queue=queue, account="noisy", max_ready=2)
    enqueue("limits", account="noisy", identifier="n1")
    enqueue("limits", account="noisy", identifier="n2")
    enqueue("limits", account="quiet", identifier="q1")
    html = role_client("Viewer").get("/queues/limits/accounts/").content.decode()
    assert html.count("At ready limit") == 1


# --- orders ------------------------------------------------------------------------------------

def walk(client, url):
    """Every page of an order, following its "Next accounts" position: accounts per page."""
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        page = response.context["page"]
        pages.append([row.account for row in page.rows])
        url = f"/queues/emails/accounts/?{page.next_query}" if page.next_query else ""
    return pages


@pytest.fixture
def backlogs(monkeypatch):
    """Five accounts whose backlogs tie across a page boundary of two, ranked as a sweep
    ranks them."""
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    for account, n in (("a", 1), ("b", 3), ("c", 2), ("d", 2), ("e", 2)):
        enqueued(queue, n, account=account, prefix=account)
    account_stats.refresh(queue)
    return queue


def test_it_sorts_accounts_by_backlog_in_keyset_pages(role_client, backlogs):
    pages = walk(role_client("Viewer"), "/queues/emails/accounts/?sort=backlog")
    assert pages == [["b", "c"], ["d", "e"], ["a"]]


def test_it_sorts_accounts_by_oldest_wait_in_keyset_pages(role_client, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    now = timezone.now()
    for account, hours_ago in (("a", 1), ("b", 5), ("c", 3), ("d", -1), ("e", 3)):
        enqueued(queue, 1, account=account, prefix=account,
                 run_at=(now - timedelta(hours=hours_ago)).replace(microsecond=123456))
    account_stats.refresh(queue)
    pages = walk(role_client("Viewer"), "/queues/emails/accounts/?sort=wait")
    assert pages == [["b", "c"], ["e", "a"], ["d"]]  # "d" has nothing due yet


def test_it_sorts_accounts_by_share_of_recent_service(role_client, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    for account in "abcd":
        enqueued(queue, 1, account=account, prefix=account)
    SelectorRound.objects.create(queue=queue, started_at=timezone.now(), duration_ms=1, taken=9,
                                 accounts=3, allocation={"c": 5, "a": 3, "d": 1})
    client = role_client("Viewer")
    assert walk(client, "/queues/emails/accounts/?sort=share") == [["c", "a"], ["d", "b"]]
    page = client.get("/queues/emails/accounts/?sort=share").context["page"]
    assert [(row.served, round(row.share, 2)) for row in page.rows] == [(5, 0.56), (3, 0.33)]


def test_the_order_by_share_is_live_not_the_sweepers_ranking(role_client):
    """The sweeper ranks every five minutes; the shares beside the order are live, so an order
    from the ranking looked unsorted on a busy queue."""
    queue = QueueFactory(key="emails")
    for account in "abc":
        enqueued(queue, 1, account=account, prefix=account)
    SelectorRound.objects.create(queue=queue, started_at=timezone.now(), duration_ms=1, taken=3,
                                 accounts=1, allocation={"a": 3})
    account_stats.refresh(queue)
    SelectorRound.objects.create(queue=queue, started_at=timezone.now(), duration_ms=1, taken=9,
                                 accounts=1, allocation={"c": 9})
    response = role_client("Viewer").get("/queues/emails/accounts/?sort=share")
    rows = response.context["page"].rows
    assert [(row.account, row.served) for row in rows] == [("c", 9), ("a", 3), ("b", 0)]
    assert "Ordered by share of service in the last 2 selector rounds, live" in (
        response.content.decode())


def test_the_order_by_share_goes_on_by_key_past_the_served_accounts_skipping_them(
        role_client, monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    for account in "abcdef":
        enqueued(queue, 1, account=account, prefix=account)
    # "z" was served and has nothing left: it still had its share of the rounds.
    SelectorRound.objects.create(queue=queue, started_at=timezone.now(), duration_ms=1, taken=4,
                                 accounts=3, allocation={"b": 1, "d": 1, "z": 2})
    pages = walk(role_client("Viewer"), "/queues/emails/accounts/?sort=share")
    assert pages == [["z", "b"], ["d", "a"], ["c", "e"], ["f"]]


def test_a_sorted_page_shows_live_figures_in_the_ranked_order_and_says_how_old_it_is(
        role_client, backlogs):
    enqueued(backlogs, 5, account="a", prefix="more")  # after the ranking
    response = role_client("Viewer").get("/queues/emails/accounts/?sort=backlog")
    page = response.context["page"]
    assert [(row.account, row.backlog) for row in page.rows] == [("b", 3), ("c", 2)]
    # The ranking's time, shown as every time is (`when`: absolute with its zone, and relative).
    ranked_at = page.ranked_at.isoformat()
    assert re.search(f'Ordered by backlog as of <time datetime="{re.escape(ranked_at)}">'
                     r'[^<]+ UTC <span class="muted"', response.content.decode())


def test_an_account_with_a_backlog_but_no_ranking_yet_is_in_the_key_order_only(role_client):
    queue = QueueFactory(key="emails")
    enqueued(queue, 1, account="new")
    client = role_client("Viewer")
    response = client.get("/queues/emails/accounts/?sort=backlog")
    assert response.context["page"].rows == []
    assert "Not ranked yet" in response.content.decode()
    assert [r.account for r in client.get("/queues/emails/accounts/").context["page"].rows] == [
        "new"]


def test_the_headers_are_sort_links_and_the_current_order_is_marked(role_client, backlogs):
    html = role_client("Viewer").get("/queues/emails/accounts/?sort=wait").content.decode()
    for key in ("backlog", "share", "wait"):
        url = f"/queues/emails/accounts/?sort={key}"
        assert f'href="{url}" hx-get="{url}"' in html
    assert 'href="/queues/emails/accounts/" hx-get="/queues/emails/accounts/"' in html
    assert re.findall(r'<th scope="col"[^>]*aria-sort="(\w+)"><a [^>]*>([^<]+)</a>', html) == [
        ("descending", "Oldest wait")]
    plain = role_client("Viewer").get("/queues/emails/accounts/").content.decode()
    assert re.findall(r'aria-sort="(\w+)"><a [^>]*>([^<]+)</a>', plain) == [
        ("ascending", "Account")]


def test_an_htmx_request_gets_the_table_fragment_with_its_next_link(role_client, backlogs):
    response = role_client("Viewer").get("/queues/emails/accounts/?sort=backlog",
                                         HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="account-table"') and "<html" not in html
    next_url = "/queues/emails/accounts/?" + response.context["page"].next_query
    assert f'href="{next_url.replace("&", "&amp;")}"' in html and 'rel="next"' in html


@pytest.mark.parametrize("query", ["sort=oldest", "sort=Backlog", "sort=%00"])
def test_an_unknown_order_is_a_form_error_not_a_crash(role_client, backlogs, query):
    response = role_client("Viewer").get(f"/queues/emails/accounts/?{query}")
    assert response.status_code == 400
    assert "Order: The list has no order" in response.content.decode()


def test_a_tampered_or_foreign_page_position_is_refused_with_a_message(role_client, backlogs):
    client = role_client("Viewer")
    good = client.get("/queues/emails/accounts/?sort=backlog").context["page"].next_query
    cursor = good.partition("cursor=")[2]
    tampered = cursor.replace("b", "c", 1) if "b" in cursor else "x" + cursor
    for query in (f"sort=backlog&cursor={tampered}", f"sort=share&cursor={cursor}",
                  f"cursor={cursor}", "sort=wait&cursor=garbage", "sort=wait&cursor=%C3%A9:x"):
        response = client.get(f"/queues/emails/accounts/?{query}")
        assert response.status_code == 400, query
        html = response.content.decode()
        assert "Page position: Not a page of this list" in html, query
        assert "First page of the list" in html
    assert client.get(f"/queues/emails/accounts/?{good}").status_code == 200


def test_live_figures_stop_counting_past_the_limit_and_say_so(role_client, monkeypatch):
    monkeypatch.setattr(queries, "LIVE_LIMIT", 3)
    queue = QueueFactory(key="emails")
    enqueued(queue, 5, account="big", prefix="b", run_at=timezone.now() - timedelta(hours=1))
    enqueued(queue, 3, account="small", prefix="s")
    account_stats.refresh(queue)
    enqueued(queue, 1, account="big", prefix="later")
    client = role_client("Viewer")
    for url in ("/queues/emails/accounts/", "/queues/emails/accounts/?sort=backlog"):
        response = client.get(url)
        rows = {row.account: row for row in response.context["page"].rows}
        assert (rows["big"].backlog, rows["big"].capped, rows["big"].ranked_backlog) == (
            3, True, 5)
        assert (rows["small"].backlog, rows["small"].capped) == (3, False)
        html = response.content.decode()
        assert '3+ <span class="muted">(5 at the ranking)</span>' in html
        assert "more than 3 items ready or in flight" in html


def test_in_flight_stops_counting_past_the_limit_but_a_cap_above_it_is_read_whole(
        role_client, monkeypatch):
    monkeypatch.setattr(queries, "LIVE_LIMIT", 3)
    queue = QueueFactory(key="emails")
    for account in ("busy", "capped", "quiet"):
        enqueued(queue, 1, account=account, prefix=account)
    items_in_status(queue, "running", 5, account="busy")
    items_in_status(queue, "dispatched", 2, account="busy")
    items_in_status(queue, "running", 5, account="capped")
    items_in_status(queue, "running", 1, account="quiet")
    AccountPolicyFactory(queue=queue, account="capped", max_in_flight=5)
    response = role_client("Viewer").get("/queues/emails/accounts/")
    rows = {row.account: row for row in response.context["page"].rows}
    assert (rows["busy"].in_flight, rows["busy"].in_flight_capped) == (3, True)
    assert (rows["capped"].in_flight, rows["capped"].in_flight_capped,
            rows["capped"].at_cap) == (5, False, True)
    assert (rows["quiet"].in_flight, rows["quiet"].in_flight_capped) == (1, False)
    html = response.content.decode()
    assert re.search(r'<td class="num">3\+</td>', html)
    assert "more than 3 items ready or in flight" in html


@pytest.mark.postgres
@pytest.mark.parametrize("status, known", [("queued", 0), ("queued", 1000),
                                           ("cancelled", 5000)])
def test_the_accounts_of_a_queue_the_statistics_do_not_know_are_counted_from_their_own_items(
        role_client, status, known):
    # As in a database that has run for a while: its statistics know other queues' items (or
    # none), never this queue's.
    analyzed_before_new_queues(status, known)
    queue = QueueFactory(key="emails")
    for account in range(20):
        for batch in range(2):
            enqueued(queue, 250, account=f"acct-{account:02d}", prefix=f"{account}-{batch}")

    before = index_entries_read("item_ready_due_idx", "item_ready_idx")
    page = role_client("Viewer").get("/queues/emails/accounts/").context["page"]
    assert len(page.rows) == 20
    # Each account's first LIVE_LIMIT + 1 items (4,020 in all) and a step of the account scan
    # per account, not the queue's 10,000 ready items once per account.
    assert index_entries_read("item_ready_due_idx", "item_ready_idx") - before < 3 * 4020
