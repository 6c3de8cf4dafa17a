"""Input that readers could not read, or that would break a framed output, is refused at every
door or encoded on the way out (issue 20, first classes)."""

import importlib
import json
import logging
import re
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone

from queues import enqueue
from queues.engine import bulk, lifecycle, tokens
from queues.engine.payloads import PayloadFilterError
from queues.engine.payloads import parse as parse_payload_filter
from queues.engine.worker import _storable
from queues.models import AccountPolicy, Item, ItemEvent, is_queue_key, key_validator
from queues.ops.logs import JsonFormatter, PlainFormatter
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


@pytest.mark.parametrize("text", ["acme ", " acme", "acme\u034f", "acme\ufe0f", "acme\u3164",
                                  "\u115facme", "acme\u2800", "acme\U000e0100"])
@pytest.mark.parametrize("field", ["account", "identifier"])
def test_no_account_or_identifier_looks_like_another(client, queue, field, text):
    """A space at either end or a character that prints as nothing would show as "acme" on
    every page while naming another tenant; the forms would act on "acme"."""
    values = {"account": "acme", "identifier": "x", field: text}
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", **values)
    assert "printable" in refused.value.fields[field]
    secret = tokens.create("p", queue_keys=["emails"])[1]
    response = client.post("/api/v1/queues/emails/items", values,
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 422 and field in response.json()["error"]["fields"]
    assert not Item.objects.exists()


def test_a_dashboard_action_on_a_padded_account_is_refused_not_applied_to_another(role_client,
                                                                                  queue):
    enqueue("emails", account="victim", identifier="v-1")
    response = role_client("Admin").post("/tenant/erase/", {"account": "victim "})
    assert response.status_code == 400
    assert Item.objects.filter(account="victim").exists()
    response = role_client("Operator").post("/queues/emails/accounts/pause/",
                                            {"account": "victim "})
    assert response.status_code == 422
    assert not AccountPolicy.objects.exists()


def test_the_admin_refuses_an_account_policy_with_a_padded_account(role_client, queue):
    response = role_client("Admin").post("/django-admin/queues/accountpolicy/add/", {
        "queue": queue.pk, "account": "acme ", "weight": 1, "max_in_flight": 0})
    assert response.status_code == 200 and "printable text" in response.content.decode()
    assert not AccountPolicy.objects.exists()


def test_an_account_is_measured_as_stored(client, queue):
    """Composing (NFC) makes U+1D160 three characters: checked before, 200 of them reached the
    database as 600 and failed there instead of being refused."""
    long = "\U0001d160" * 200
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", account=long, identifier="x")
    assert "at most" in refused.value.fields["account"]
    secret = tokens.create("p", queue_keys=["emails"], scopes=[tokens.OPERATE])[1]
    response = client.post("/api/v1/queues/emails/accounts/pause", {"account": long},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 422


def test_a_queue_key_ends_without_a_line_break():
    with pytest.raises(ValidationError):
        key_validator("emails\n")
    assert not is_queue_key("emails\n")


def test_a_number_read_back_from_the_api_is_accepted_again(client, queue):
    """PostgreSQL writes numbers without an exponent (1e-300 in 302 characters): what it gives
    back must be a number the API takes."""
    secret = tokens.create("p", queue_keys=["emails"], scopes=["enqueue"])[1]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    body = b'{"account": "acme", "identifier": "x", "payload": {"a": 1e-300, "b": 12345.5}}'
    created = client.generic("POST", "/api/v1/queues/emails/items", body,
                             content_type="application/json", **headers)
    assert created.status_code == 201
    read = client.get(f"/api/v1/items/{created.json()['id']}", **headers)
    payload = re.search(r'"payload":\s*(\{[^}]*\})', read.content.decode()).group(1)
    again = client.generic("POST", "/api/v1/queues/emails/items",
                           ('{"account": "acme", "identifier": "y", "payload": ' + payload
                            + "}").encode(), content_type="application/json", **headers)
    assert again.status_code == 201, again.content
    assert Item.objects.get(identifier="y").payload == {"a": 1e-300, "b": 12345.5}


def test_a_number_beyond_the_safe_range_is_refused_from_python_too(queue):
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", account="acme", identifier="x", payload={"a": 1e20})
    assert "out of range" in refused.value.fields["payload"]


def test_a_negative_zero_is_refused_from_python_and_the_payload_filter(queue):
    with pytest.raises(lifecycle.EnqueueError) as refused:
        enqueue("emails", account="acme", identifier="x", payload={"t": [1, -0.0]})
    assert "negative zero" in refused.value.fields["payload"]
    with pytest.raises(PayloadFilterError, match="negative zero"):
        parse_payload_filter("t=-0.0")
    assert not Item.objects.exists()


def test_a_handler_result_holding_a_negative_zero_is_kept():
    assert _storable({"delta": -0.0}) == {"delta": -0.0}


def test_log_lines_carry_no_terminal_controls_or_line_separators():
    forged = "boom\x1b[2J\x1b[1;31mCRITICAL\x0bx\x0cy\x1cz\x85n\u2028l\u2029p\x9b"
    record = logging.LogRecord("queues", logging.WARNING, "", 0, "item %s failed", (forged,),
                               None)
    plain = PlainFormatter("%(levelname)s %(message)s").format(record)
    as_json = JsonFormatter().format(record)
    for line in (plain, as_json):
        assert len(line.splitlines()) == 1
        assert not any(c in line for c in "\x1b\x0b\x0c\x1c\x85\u2028\u2029\x9b")
    assert json.loads(as_json)["message"] == f"item {forged} failed"
    try:
        raise RuntimeError(forged)
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert "\x1b" not in PlainFormatter("%(message)s").format(record)


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
    ("0.1", True), ("1.10", True), ("2.5e-3", True), ("0.0", True), ("1e-300", True),
    ("9007199254740991.0", True), ("0.1000000000000000055511151231257827", False),
    ("123456789.123456789", False), ("1e-400", False),
    # PostgreSQL would give them back as integers of every digit, out of the API's range.
    ("1e20", False), ("-1.5e300", False),
    # PostgreSQL's numbers have no negative zero: they would read back as 0.
    ("-0.0", False), ("-0e3", False)])
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
