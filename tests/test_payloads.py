"""Finding items by a payload field: `customer.id = 42`, the same items on both databases."""

import pytest
from django.db import connection

from queues import enqueue_many
from queues.engine import bulk, payloads
from queues.models import Item, Status
from queues.web import queries
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db
PAYLOADS = {
    "n-42": {"order": 42, "customer": {"id": 7}},
    "s-42": {"order": "42", "customer": {"id": 8}},
    "n-43": {"order": 43, "customer": {"id": 7}, "contains": "x"},
    "null": {"order": None},
    "none": {},
    "text": {"note": "call back tomorrow"},
}


@pytest.fixture
def queue():
    queue = QueueFactory(key="orders")
    enqueue_many("orders", [{"account": "acme", "identifier": name, "payload": payload}
                            for name, payload in PAYLOADS.items()])
    return queue


def matching(text):
    condition = payloads.parse(text)
    return set(condition.apply(Item.objects.all()).values_list("identifier", flat=True))


@pytest.mark.parametrize(("text", "expected"), [
    ("order = 42", {"n-42"}),
    ('order = "42"', {"s-42"}),
    ("customer.id = 7", {"n-42", "n-43"}),
    ("order = null", {"null"}),
    ("note = call back tomorrow", {"text"}),
    ("contains = x", {"n-43"}),  # a key named like a lookup stays a key
    ("missing = 1", set()),
    ("note = NaN", set()),  # not a JSON number: the word, as any other text
])
def test_a_payload_field_selects_the_same_items_on_either_database(queue, text, expected):
    assert matching(text) == expected


def test_a_payload_field_finds_items_in_every_status(queue):
    # On PostgreSQL the payload index holds items at rest only: the in-flight ones must come
    # from the in-flight index, or they would vanish from a search while they run.
    for status in Status.values:
        items_in_status(queue, status, prefix=status, payload={"ticket": 9})
    assert matching("ticket = 9") == {f"{status}-0" for status in Status.values}


@pytest.mark.postgres
def test_a_payload_search_reads_the_payload_index_not_the_queue(queue):
    items_in_status(queue, "running", prefix="running", payload={"ticket": 9})
    found = payloads.parse("ticket = 9").apply(Item.objects.all())
    with connection.cursor() as cursor:
        # A table of seven rows is best read whole or in index order whatever the indexes: the
        # plan with neither is the test.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        sql, params = found.query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Bitmap Index Scan on item_payload_at_rest_gin" in plan
    assert "Bitmap Index Scan on item_in_flight_" in plan  # either in-flight index


@pytest.mark.parametrize("text", ["order", "a..b = 1", "a b = 1", "order = [1, 2]",
                                  "x = {\"a\": 1}", ".".join("k" * 9) + " = 1",
                                  # Nothing stored holds them; the database cannot compare them.
                                  "a = 1e400", "a = -1e400", "a = 99999999999999999999",
                                  'a = "x\\u0000y"', "a = x\x00y"])
def test_it_refuses_what_it_cannot_express(text):
    with pytest.raises(payloads.PayloadFilterError):
        payloads.parse(text)


def test_the_item_list_filters_by_payload_and_says_what_is_wrong(role_client, queue):
    client = role_client("Viewer")
    listing = client.get("/queues/orders/", {"payload": "customer.id = 7"})
    assert {i.identifier for i in listing.context["page"].items} == {"n-42", "n-43"}
    assert listing.context["page"].total == "2"
    refused = client.get("/queues/orders/", {"payload": "customer id"})
    assert refused.status_code == 400
    assert "Payload field: Write a payload field as path = value" in refused.content.decode()


def test_a_payload_list_pages_newest_first_through_the_statuses_asked_for(role_client, queue,
                                                                          monkeypatch):
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    for status in ("failed", "running", "queued"):
        items_in_status(queue, status, 2, prefix=status, payload={"customer": {"id": 7}})
    client = role_client("Viewer")
    query = "payload=customer.id+%3D+7&status=failed&status=queued&clock=enqueued"
    seen, url = [], f"/queues/orders/?{query}"
    while url:
        page = client.get(url).context["page"]
        seen += [item.identifier for item in page.items]
        url = f"/queues/orders/?{query}&before={page.next_cursor}" if page.next_cursor else None
    assert seen == ["queued-1", "queued-0", "failed-1", "failed-0", "n-43", "n-42"]


def test_a_bulk_cancel_carries_the_payload_field(role_client, queue):
    client = role_client("Operator")
    listing = client.get("/queues/orders/", {"payload": "customer.id = 7"})
    preview = client.get(f"/queues/orders/bulk/?{listing.context['cancel_query']}"
                         ).context["preview"]
    assert (preview.matching, preview.eligible, preview.filter.payload) == (
        2, 2, "customer.id = 7")
    assert {i.identifier for i in preview.sample} == {"n-42", "n-43"}


def test_a_bulk_filter_refuses_a_bad_payload_field(queue):
    with pytest.raises(bulk.BulkError) as refused:
        bulk.BulkFilter.build(queue, "cancel", ["queued"],
                              *bulk.selection_range(), payload="nope")
    assert "payload" in refused.value.fields
