"""The dead letters page `/dead-letters/`: open dead letters, the latest first, page by page."""

import pytest

from queues.models import DeadLetter
from queues.web import pages
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


def identifiers(response):
    return [letter.item.identifier for letter in response.context["letters"]]


def test_pages_walk_older_then_back_newer_to_the_first(role_client, monkeypatch):
    monkeypatch.setattr(pages, "LIST_SIZE", 3)
    items_in_status(QueueFactory(key="emails"), "failed", 7, prefix="f")
    assert DeadLetter.objects.count() == 7
    client = role_client("Viewer")
    forwards, query = [], {}
    while query is not None:
        response = client.get("/dead-letters/", query)
        forwards.append(identifiers(response))
        older = response.context["page"].older
        query = {"before": older} if older else None
    assert sum(forwards, []) == [f"f-{n}" for n in range(6, -1, -1)]
    assert [len(page) for page in forwards] == [3, 3, 1]
    newer = response.context["page"].newer
    backwards = []
    while newer:
        response = client.get("/dead-letters/", {"after": newer})
        backwards.append(identifiers(response))
        newer = response.context["page"].newer
    assert backwards == forwards[-2::-1]
    html = response.content.decode()
    assert "← Newer" not in html and "Older →" in html


def test_a_page_position_past_any_id_is_refused_not_a_database_error(role_client):
    client = role_client("Viewer")
    assert client.get("/dead-letters/", {"after": 2**63}).status_code == 400
    assert client.get("/dead-letters/", {"before": "x"}).status_code == 400


def test_a_mistyped_filter_is_refused_rather_than_listing_every_dead_letter(role_client):
    items_in_status(QueueFactory(key="emails"), "failed", 2, prefix="f")
    response = role_client("Viewer").get("/dead-letters/", {"queue": "emial"})
    assert response.status_code == 400 and response.context["letters"] == []
    assert "Queue: Select a valid choice" in response.content.decode()
