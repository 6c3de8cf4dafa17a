"""Search by identifier across queues: exact, then prefix."""

import pytest

from tests.factories import QueueFactory, enqueued

pytestmark = pytest.mark.django_db


def test_exact_match_across_queues_first(role_client):
    enqueued(QueueFactory(key="emails"), 2, prefix="order")
    enqueued(QueueFactory(key="reports"), 1, prefix="order")
    response = role_client("Viewer").get("/search/?q=order-0")
    assert response.context["exact"] is True
    assert sorted(i.queue.key for i in response.context["results"]) == ["emails", "reports"]


def test_prefix_when_nothing_matches_exactly(role_client):
    enqueued(QueueFactory(key="emails"), 3, prefix="order")
    response = role_client("Viewer").get("/search/?q=order-")
    assert response.context["exact"] is False
    assert [i.identifier for i in response.context["results"]] == ["order-0", "order-1",
                                                                    "order-2"]
    assert b"starting with" in response.content


def test_nothing_found(role_client):
    QueueFactory(key="emails")
    assert b"Nothing found" in role_client("Viewer").get("/search/?q=zzz").content


def test_it_says_when_more_items_start_so_than_it_lists(role_client):
    from queues.web.pages import LIST_SIZE
    enqueued(QueueFactory(key="emails"), LIST_SIZE + 1, prefix="order")
    response = role_client("Viewer").get("/search/?q=order-")
    html = response.content.decode()
    assert len(response.context["results"]) == LIST_SIZE
    assert f"{LIST_SIZE} of the items starting with “order-”" in html
    assert "a longer start of the identifier narrows them" in html
    fewer = role_client("Viewer").get("/search/?q=order-1").content.decode()
    assert "More items match" not in fewer and "of the items" not in fewer


def test_an_account_is_found_on_every_queue_it_has_items_or_a_pause_on(role_client):
    from queues.engine import pausing
    emails, reports = QueueFactory(key="emails"), QueueFactory(key="reports")
    enqueued(emails, 2, account="acme-corp")
    pausing.set_account_paused(reports, "acme-corp", True, actor="admin")
    enqueued(QueueFactory(key="exports"), 1, account="someone-else")

    response = role_client("Operator").get("/search/?q=acme-corp")

    html = response.content.decode()
    assert [(q.key, q.account_paused) for q in response.context["account_queues"]] == [
        ("emails", False), ("reports", True)]
    assert "Account “acme-corp” on 2 queues" in html
    assert "/queues/emails/?account=acme-corp" in html
    assert "Nothing found" not in html
    assert 'aria-label="Resume account acme-corp"' in html


def test_a_viewer_finds_an_account_without_pause_buttons_or_its_data_link(role_client):
    enqueued(QueueFactory(key="emails"), 1, account="acme-corp")

    html = role_client("Viewer").get("/search/?q=acme-corp").content.decode()

    assert "Account “acme-corp” on 1 queue" in html
    assert "Pause account" not in html and "/tenant/" not in html


def test_search_finds_an_identifier_and_account_however_the_accents_were_composed(role_client):
    enqueued(QueueFactory(key="emails"), 1, account="café", prefix="crème")

    response = role_client("Viewer").get("/search/?q=cre\u0300me-0")
    assert [i.identifier for i in response.context["results"]] == ["crème-0"]
    response = role_client("Viewer").get("/search/?q=cafe\u0301")
    assert [q.key for q in response.context["account_queues"]] == ["emails"]
