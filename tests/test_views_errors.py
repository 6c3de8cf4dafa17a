"""Errors view: failures grouped by type and normalised message."""

import pytest

from queues.models import Item
from queues.web.queries import normalise_error
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
    assert "status=retry&amp;status=failed&amp;error=TimeoutError%3A%20read" in html
    assert "<script>x" not in html
