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
