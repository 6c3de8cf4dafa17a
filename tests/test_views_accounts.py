"""Accounts view: per-account backlog, in flight, service share, flags, the selector's cursor."""

import pytest

from queues import enqueue
from queues.engine import selector
from queues.models import SelectorState
from queues.web import queries
from tests.factories import AccountPolicyFactory, QueueFactory, enqueued, items_in_status

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


def test_accounts_are_paged_by_key(role_client, monkeypatch):

    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    queue = QueueFactory(key="emails")
    for account in ("a", "b", "c"):
        enqueued(queue, 1, account=account, prefix=account)
    client = role_client("Viewer")
    first = client.get("/queues/emails/accounts/").context["page"]
    assert [r.account for r in first.rows] == ["a", "b"] and first.next_after == "b"
    second = client.get("/queues/emails/accounts/?after=b").context["page"]
    assert [r.account for r in second.rows] == ["c"] and second.next_after == ""


def test_an_account_at_its_ready_limit_is_shown(role_client):
    from queues.models import AccountPolicy

    queue = QueueFactory(key="limits")
    AccountPolicy.objects.create(queue=queue, account="noisy", max_ready=2)
    enqueue("limits", account="noisy", identifier="n1")
    enqueue("limits", account="noisy", identifier="n2")
    enqueue("limits", account="quiet", identifier="q1")
    html = role_client("Viewer").get("/queues/limits/accounts/").content.decode()
    assert html.count("At ready limit") == 1
