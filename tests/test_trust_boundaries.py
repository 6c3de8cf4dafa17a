"""Input that readers could not read, or that would break a framed output, is refused at every
door or encoded on the way out (issue 20, first classes)."""

import importlib
import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone

from queues import enqueue
from queues.engine import bulk, lifecycle, tokens
from queues.models import Item, ItemEvent
from queues.ops.logs import PlainFormatter
from queues.web.stream import _sse
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


@pytest.mark.parametrize("run_at", [
    datetime(1, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
    datetime(2100, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)])
def test_python_enqueue_refuses_a_time_outside_1970_to_2100(queue, run_at):
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", account="acme", identifier="x", run_at=run_at)
    assert "1970" in refused.value.fields["run_at"]
    assert not Item.objects.exists()


@pytest.mark.parametrize("run_at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                                    "1969-12-31T23:59:59Z"])
def test_the_api_refuses_a_time_outside_1970_to_2100(client, queue, run_at):
    secret = tokens.create("p", queue_keys=["emails"])[1]
    response = client.post("/api/v1/queues/emails/items",
                           {"account": "acme", "identifier": "x", "run_at": run_at},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 422
    assert "1970" in response.json()["error"]["fields"]["run_at"]
    assert not Item.objects.exists()


def test_a_bulk_range_outside_the_bounds_is_refused(queue):
    with pytest.raises(bulk.BulkError) as refused:
        bulk.BulkFilter.build(queue, "retry", ["failed"], datetime(1, 1, 1, tzinfo=UTC),
                              timezone.now())
    assert "created_from" in refused.value.fields


def test_the_item_list_refuses_a_range_outside_the_bounds(role_client, queue):
    response = role_client("Viewer").get("/queues/emails/", {
        "period": "custom", "created_from": "1900-01-01T00:00"})
    assert response.status_code == 400
    assert "From: Must lie between 1970 and 2100." in response.content.decode()


def test_the_database_refuses_a_run_at_outside_the_bounds(queue):
    item = enqueue("emails", account="acme", identifier="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        Item.objects.filter(pk=item.pk).update(run_at=datetime(2200, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("text", ["a\nb", "a\rb", "a\u2028b", "a\x1bb", "a\x00b", "tab\there"])
@pytest.mark.parametrize("field", ["account", "identifier"])
def test_identifiers_and_accounts_are_printable_text(queue, field, text):
    values = {"account": "acme", "identifier": "x", field: text}
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", **values)
    assert "printable" in refused.value.fields[field]


def test_an_sse_event_cannot_be_ended_or_forged_by_its_data():
    framed = _sse("row", "<tr>evil\r\ndata: x\revent: notice\nid: 9\r\r</tr>")
    lines = framed.split("\n\n")[0].replace("\r\n", "\n").replace("\r", "\n").split("\n")
    assert lines[0] == "event: row"
    assert all(line.startswith("data: ") for line in lines[1:])
    assert framed.endswith("\n\n") and framed.count("\n\n") == 1


def test_a_plain_log_line_stays_one_line():
    record = logging.LogRecord("queues", logging.WARNING, "", 0, "item %s failed",
                               ("inv\n2026 INFO forged",), None)
    line = PlainFormatter("%(levelname)s %(message)s").format(record)
    assert "\n" not in line and "inv\\n2026 INFO forged" in line


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_migration_repairs_a_run_at_postgresql_wrote_but_python_cannot_read(queue):
    item = enqueue("emails", account="acme", identifier="unreadable")
    migration = importlib.import_module("queues.migrations.0012_readable_times_and_printable_text")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queues_item DROP CONSTRAINT item_run_at_in_bounds")
        try:
            cursor.execute("UPDATE queues_item SET run_at = '0001-01-01 00:00:00+14' "
                           "WHERE id = %s", [item.pk])
            with pytest.raises(DataError):  # what every reader met before the fix
                Item.objects.get(pk=item.pk)
            migration.repair_unreadable_run_at(apps, None)
        finally:
            cursor.execute("UPDATE queues_item SET run_at = now() WHERE run_at < '1970-01-01'")
            cursor.execute("ALTER TABLE queues_item ADD CONSTRAINT item_run_at_in_bounds CHECK "
                           "(run_at >= '1970-01-01' AND run_at < '2100-01-01')")
    repaired = Item.objects.get(pk=item.pk)
    assert abs(repaired.run_at - timezone.now()) < timedelta(minutes=1)
    event = ItemEvent.objects.get(item_id=item.pk, transition="repaired")
    assert "1970" in event.reason


def test_the_api_refuses_null_where_the_schema_says_integer(client, queue):
    secret = tokens.create("p", queue_keys=["emails"])[1]
    response = client.post("/api/v1/queues/emails/items",
                           {"account": "acme", "identifier": "x", "priority": None},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 422
    assert "priority" in response.json()["error"]["fields"]
    assert not Item.objects.exists()


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/queues/emails/items/", "/api/v1/"])
def test_unknown_api_paths_answer_a_json_404(client, method, path):
    response = client.generic(method, path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


def test_the_queue_settings_page_stays_small_with_thousands_of_account_policies(role_client,
                                                                                 queue):
    from queues.models import AccountPolicy

    AccountPolicy.objects.bulk_create(AccountPolicy(queue=queue, account=f"acct-{n}", paused=True)
                                      for n in range(2000))
    admin = role_client("Admin")
    page = admin.get(f"/django-admin/queues/queue/{queue.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200 and len(html) < 100_000
    assert "2000 account policies on this queue" in html
    listing = admin.get(f"/django-admin/queues/accountpolicy/?queue__id__exact={queue.pk}")
    rows = listing.content.decode().count('name="_selected_action"')
    assert (listing.status_code, rows) == (200, 50)


@pytest.mark.parametrize(("number", "accepted"), [
    ("0.1", True), ("1.10", True), ("2.5e-3", True), ("-0.0", True), ("1e300", True),
    ("0.1000000000000000055511151231257827", False), ("123456789.123456789", False),
    ("1e-400", False)])
def test_payload_numbers_are_stored_exactly_or_refused_naming_their_path(client, queue, number,
                                                                        accepted):
    secret = tokens.create("p", queue_keys=["emails"])[1]
    body = ('{"account": "acme", "identifier": "x", "payload": {"order": {"amount": '
            + number + "}}}").encode()
    response = client.generic("POST", "/api/v1/queues/emails/items", body,
                              content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {secret}")
    if accepted:
        assert response.status_code == 201
    else:
        assert response.status_code == 400
        assert "payload.order.amount" in response.json()["error"]["fields"]
        assert not Item.objects.exists()


def test_a_queue_at_its_ready_limit_refuses_more_with_429_and_counts_it(client, queue):
    from queues.models import Queue

    queue.max_ready = 3
    queue.save()
    enqueue("emails", account="acme", identifier="a")
    secret = tokens.create("p", queue_keys=["emails"])[1]
    batch = {"items": [{"account": "acme", "identifier": f"b{n}"} for n in range(3)]}
    response = client.post("/api/v1/queues/emails/items", batch,
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert (response.status_code, response["Retry-After"]) == (429, "60")
    assert response.json()["error"]["fields"] == {"queue": "at its ready limit"}
    assert Item.objects.count() == 1
    assert Queue.objects.get(pk=queue.pk).refused_over_limit == 1
    # Sending an existing item again adds nothing, so it passes even at the limit.
    enqueue("emails", account="acme", identifier="b0")
    enqueue("emails", account="acme", identifier="b1")
    assert enqueue("emails", account="acme", identifier="b1").created is False


def test_an_account_with_a_ready_limit_is_held_to_it(queue):
    from queues.models import AccountPolicy

    AccountPolicy.objects.create(queue=queue, account="noisy", max_ready=2)
    enqueue("emails", account="noisy", identifier="n1")
    enqueue("emails", account="noisy", identifier="n2")
    with pytest.raises(lifecycle.OverLimit) as refused:
        enqueue("emails", account="noisy", identifier="n3")
    assert refused.value.fields == {"account": "at its ready limit"}
    enqueue("emails", account="quiet", identifier="q1")  # other tenants go on
    assert Item.objects.filter(account="noisy").count() == 2
