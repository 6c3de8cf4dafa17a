"""Errors view: failures grouped by type and normalised message."""

import pytest

from queues.engine.errors import normalise_error
from queues.models import Item
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


def test_messages_differing_only_in_ids_and_numbers_group_together():
    a = normalise_error("ValueError: invoice 'INV-17' has no line items\nTraceback ...")
    b = normalise_error("ValueError: invoice 'INV-99' has no line items")
    assert a == b == ("ValueError", "ValueError: invoice '…' has no line items")
    assert normalise_error("HTTP 503 Service Unavailable")[0] == "HTTP <n>"
    assert normalise_error("")[1] == "(no message)"


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
