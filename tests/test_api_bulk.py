"""Bulk operations, dead letters and pause/resume through the token API (parity with the
dashboard), each response checked against the OpenAPI description."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from queues.engine import bulk, lifecycle, tokens
from queues.models import AuditEntry, BulkOperation, GlobalPause, Item, Queue, Status
from tests.factories import QueueFactory, items_in_status
from tests.test_api_openapi import check

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


@pytest.fixture
def document(client):
    return client.get("/api/v1/openapi.json").json()


@pytest.fixture
def call(client, queue):
    secret = tokens.create("ops-bot", queue_keys=["emails"], scopes=tokens.SCOPES)[1]

    def call(method, path, body=None, *, token=secret):
        data = json.dumps(body).encode() if body is not None else b""
        return client.generic(method, f"/api/v1{path}", data, content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {token}")

    return call


def week():
    now = timezone.now()
    return {"created_from": (now - timedelta(days=7)).isoformat(),
            "created_to": (now + timedelta(minutes=1)).isoformat()}


def test_preview_then_confirm_runs_a_bulk_retry(call, queue, document):
    items_in_status(queue, "failed", 3)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()})
    check(document, "/queues/{key}/bulk/preview", "post", preview)
    assert preview.status_code == 200 and preview.json()["eligible"] == 3
    assert preview.json()["live_again_counted"] is True
    started = call("POST", "/queues/emails/bulk", preview.json()["confirmation"])
    check(document, "/queues/{key}/bulk", "post", started)
    assert started.status_code == 202
    operation_id = started.json()["id"]
    bulk.run(operation_id)
    detail = call("GET", f"/bulk/{operation_id}")
    check(document, "/bulk/{pk}", "get", detail)
    assert (detail.json()["state"], detail.json()["changed"]) == ("done", 3)
    assert AuditEntry.objects.get(action="bulk.retry").actor_name == "token:ops-bot"


def test_a_changed_snapshot_answers_409_with_a_fresh_preview(call, queue, document):
    failed = items_in_status(queue, "failed", 3)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()}).json()
    lifecycle.apply("requeue", [failed[0].pk], actor="someone")
    response = call("POST", "/queues/emails/bulk", preview["confirmation"])
    check(document, "/queues/{key}/bulk", "post", response)
    assert response.status_code == 409
    assert response.json()["error"]["preview"]["eligible"] == 2
    assert not BulkOperation.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "explode", "statuses": ["failed"]}, "kind"),
    ({"kind": "retry", "statuses": ["failed"], "created_from": "2026-01-01T00:00:00",
      "created_to": "2026-01-02T00:00:00Z"}, "created_from"),
    ({"kind": "retry", "statuses": ["failed"], "created_from": "2026-01-02T00:00:00Z",
      "created_to": "2026-01-01T00:00:00Z"}, "created_to"),
    ({"kind": "retry", "statuses": "failed"}, "statuses"),
    ({"kind": "retry", "ids": ["1"]}, "ids"),
    ({"kind": "retry", "ids": [True]}, "ids"),
    ({"kind": "retry", "statuses": ["failed"], "where": "1=1"}, "where"),
    ({"kind": ["retry"], "statuses": ["failed"]}, "kind"),
    ({"kind": {"a": 1}, "statuses": ["failed"]}, "kind"),
    ({"kind": "retry", "statuses": ["failed"], "payload_filter": "a = 1e400"}, "payload"),
    ({"kind": "retry", "statuses": ["failed"], "payload_filter": "a = NaN"}, None),
])
def test_a_bad_bulk_request_answers_422_naming_the_field(call, queue, document, body, field):
    response = call("POST", "/queues/emails/bulk/preview", {**week(), **body}
                    if "created_from" not in body else body)
    check(document, "/queues/{key}/bulk/preview", "post", response)
    if field is None:  # NaN is a word here, not a number: the payload field "a" = "NaN"
        assert response.status_code == 200, response.content
        return
    assert response.status_code == 422, response.content
    assert field in response.json()["error"]["fields"]


def test_a_range_given_as_from_and_to_is_faulted_by_those_names(call, queue):
    response = call("POST", "/queues/emails/bulk/preview", {
        "kind": "retry", "statuses": ["failed"], "from": "2026-01-02T00:00:00Z",
        "to": "2026-01-01T00:00:00Z"})
    assert response.status_code == 422
    assert response.json()["error"]["fields"] == {"to": "must be after the start of the range"}


def test_an_altered_confirmation_is_refused(call, queue):
    items_in_status(queue, "failed", 1)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()}).json()
    forged = {**preview["confirmation"], "frozen": preview["confirmation"]["frozen"] + "x"}
    assert call("POST", "/queues/emails/bulk", forged).status_code == 422
    assert not BulkOperation.objects.exists()


def test_a_selection_and_a_dead_letter_replay_through_the_api(call, queue):
    items = items_in_status(queue, "failed", 3)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "replay", "ids": [items[0].pk, items[1].pk]}).json()
    assert preview["eligible"] == 2
    operation = call("POST", "/queues/emails/bulk", preview["confirmation"]).json()
    bulk.run(operation["id"])
    assert Item.objects.filter(status=Status.QUEUED).count() == 2


def test_stop_through_the_api(call, queue, document):
    items_in_status(queue, "queued", 2)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "cancel", "statuses": ["queued"], **week()}).json()
    operation = call("POST", "/queues/emails/bulk", preview["confirmation"]).json()
    stopped = call("POST", f"/bulk/{operation['id']}/stop")
    check(document, "/bulk/{pk}/stop", "post", stopped)
    assert stopped.json()["state"] == "stopping"


def test_bulk_outside_the_tokens_scope_answers_404_like_nothing_there(call, queue):
    other = QueueFactory(key="billing")
    items_in_status(other, "failed", 1)
    response = call("POST", "/queues/billing/bulk/preview",
                    {"kind": "retry", "statuses": ["failed"], **week()})
    assert response.status_code == 404
    admin_secret = tokens.create("all", all_queues=True, scopes=tokens.SCOPES)[1]
    preview = call("POST", "/queues/billing/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()}, token=admin_secret)
    operation = call("POST", "/queues/billing/bulk", preview.json()["confirmation"],
                     token=admin_secret).json()
    assert call("GET", f"/bulk/{operation['id']}").status_code == 404


def test_pause_and_resume_a_queue_and_an_account(call, queue, document):
    paused = call("POST", "/queues/emails/pause")
    check(document, "/queues/{key}/{action}", "post", paused)
    assert paused.json()["paused"] is True and paused.json()["paused_by"] == "token:ops-bot"
    assert Queue.objects.get(key="emails").paused
    call("POST", "/queues/emails/resume")
    assert not Queue.objects.get(key="emails").paused
    account = call("POST", "/queues/emails/accounts/pause", {"account": "acme"})
    check(document, "/queues/{key}/accounts/{action}", "post", account)
    assert account.json()["paused"] is True
    bad = call("POST", "/queues/emails/accounts/pause", {"account": ""})
    assert bad.status_code == 422
    for account in ("evil\u202etxt", "a\nb"):
        bad = call("POST", "/queues/emails/accounts/pause", {"account": account})
        assert bad.json()["error"]["fields"]["account"].startswith("must be printable")


def test_pausing_everything_needs_a_token_for_all_queues(call, queue, document):
    refused = call("POST", "/pause-all")
    assert refused.status_code == 403
    assert not GlobalPause.objects.exists()
    secret = tokens.create("ops", all_queues=True, scopes=tokens.SCOPES)[1]
    response = call("POST", "/pause-all", token=secret)
    check(document, "/{action}-all", "post", response)
    assert response.json()["paused"] is True


def failed_an_hour_ago_enqueued_days_ago(queue):
    [item] = items_in_status(queue, "failed", 1)
    now = timezone.now()
    Item.objects.filter(pk=item.pk).update(created_at=now - timedelta(days=3),
                                           finished_at=now - timedelta(hours=1))
    return item


def test_a_retry_ranges_from_and_to_over_failure_time_by_default(call, queue, document):
    item = failed_an_hour_ago_enqueued_days_ago(queue)
    now = timezone.now()
    body = {"kind": "retry", "statuses": ["failed"],
            "from": (now - timedelta(hours=24)).isoformat(), "to": now.isoformat()}
    preview = call("POST", "/queues/emails/bulk/preview", body)
    check(document, "/queues/{key}/bulk/preview", "post", preview)
    assert (preview.json()["sample"], preview.json()["filter"]["clock"]) == ([item.pk], "finished")
    by_enqueue = call("POST", "/queues/emails/bulk/preview", {**body, "clock": "enqueued"})
    assert by_enqueue.json()["eligible"] == 0


def test_created_from_and_to_stay_a_range_over_the_enqueued_clock(call, queue):
    failed_an_hour_ago_enqueued_days_ago(queue)
    now = timezone.now()
    preview = call("POST", "/queues/emails/bulk/preview", {
        "kind": "retry", "statuses": ["failed"],
        "created_from": (now - timedelta(hours=24)).isoformat(), "created_to": now.isoformat()})
    assert (preview.json()["eligible"], preview.json()["filter"]["clock"]) == (0, "enqueued")


@pytest.mark.parametrize(("extra", "field"), [
    ({"clock": "yesterday", "from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"},
     "clock"),
    ({"from": "2026-01-01T00:00:00Z", "created_to": "2026-01-02T00:00:00Z"}, "from"),
    ({"clock": "finished", "created_from": "2026-01-01T00:00:00Z",
      "created_to": "2026-01-02T00:00:00Z"}, "clock"),
])
def test_it_refuses_a_range_whose_clock_is_unclear(call, queue, extra, field):
    response = call("POST", "/queues/emails/bulk/preview",
                    {"kind": "retry", "statuses": ["failed"], **extra})
    assert response.status_code == 422
    assert field in response.json()["error"]["fields"]
    assert not BulkOperation.objects.exists()


def test_a_bulk_request_may_select_an_error_group(call, queue):
    items = items_in_status(queue, "failed", 3)
    for item, error in zip(items, ["TimeoutError: read 1 s", "TimeoutError: read 22 s",
                                   "KeyError: 'x'"], strict=True):
        Item.objects.filter(pk=item.pk).update(last_error=error)
    preview = call("POST", "/queues/emails/bulk/preview", {
        "kind": "retry", "statuses": ["failed"], "error_group": "TimeoutError: read <n> s",
        **week()})
    assert preview.json()["eligible"] == 2


def test_a_confirmation_starts_one_operation_however_often_it_is_sent(call, queue, document):
    items_in_status(queue, "failed", 2)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()}).json()
    first = call("POST", "/queues/emails/bulk", preview["confirmation"])
    again = call("POST", "/queues/emails/bulk", preview["confirmation"])
    assert (first.status_code, again.status_code) == (202, 200)
    check(document, "/queues/{key}/bulk", "post", again)
    assert again.json()["id"] == first.json()["id"]
    assert BulkOperation.objects.count() == 1


def test_a_confirmation_expires_after_15_minutes(call, queue, document, monkeypatch):
    items_in_status(queue, "failed", 1)
    preview = call("POST", "/queues/emails/bulk/preview",
                   {"kind": "retry", "statuses": ["failed"], **week()}).json()
    monkeypatch.setattr(bulk, "CONFIRMATION_SECONDS", -1)
    response = call("POST", "/queues/emails/bulk", preview["confirmation"])
    assert response.status_code == 410
    check(document, "/queues/{key}/bulk", "post", response)
    assert not BulkOperation.objects.exists()


def test_a_token_acts_only_within_its_scopes(client, queue):
    items_in_status(queue, "failed", 2)

    def call_with(scopes, method, path, body=None):
        secret = tokens.create(f"t-{'-'.join(scopes)}", queue_keys=["emails"], scopes=scopes)[1]
        return client.generic(method, f"/api/v1{path}", json.dumps(body or {}).encode(),
                              content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {secret}")

    retry = {"kind": "retry", "statuses": ["failed"], **week()}
    purge = {"kind": "purge", **week()}
    assert call_with(["enqueue"], "POST", "/queues/emails/bulk/preview", retry).status_code == 403
    assert call_with(["enqueue"], "POST", "/queues/emails/pause").status_code == 403
    assert call_with(["operate"], "POST", "/queues/emails/bulk/preview", retry).status_code == 200
    assert call_with(["operate"], "POST", "/queues/emails/bulk/preview", purge).status_code == 403
    assert call_with(["purge"], "POST", "/queues/emails/bulk/preview", purge).status_code == 200
    assert call_with(["operate"], "POST", "/queues/emails/items",
                     {"account": "a", "identifier": "x"}).status_code == 403
    assert not BulkOperation.objects.exists() and not Queue.objects.get(key="emails").paused


def test_a_purge_only_token_reads_no_item_or_queue_and_follows_only_purges(client, queue):
    """Reading comes with enqueue or operate: a purge-only token read unmasked payloads."""
    [item] = items_in_status(queue, "failed", 1)
    operations = {kind: BulkOperation.objects.create(
        queue=queue, kind=kind, filter={}, state="done", actor_name="ops", expected=0,
        created_at=timezone.now()) for kind in
        ("purge", "retry")}

    def get(scopes, path):
        secret = tokens.create(f"r-{'-'.join(scopes)}", queue_keys=["emails"],
                               scopes=scopes)[1]
        return client.get(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code

    for path in (f"/items/{item.pk}", "/queues"):
        assert get(["purge"], path) == 403
        assert get(["enqueue"], path) == 200 and get(["operate"], path) == 200
    assert get(["purge"], f"/bulk/{operations['purge'].pk}") == 200
    assert get(["purge"], f"/bulk/{operations['retry'].pk}") == 403
    assert get(["operate"], f"/bulk/{operations['retry'].pk}") == 200
    assert get(["operate"], f"/bulk/{operations['purge'].pk}") == 403


def test_tokens_made_before_scopes_keep_enqueue_and_operate_and_are_flagged():
    import importlib

    from django.apps import apps

    token, _ = tokens.create("old", all_queues=True, scopes=tokens.SCOPES)
    migration = importlib.import_module("queues.migrations.0014_token_scopes")
    migration.existing_tokens_enqueue_and_operate(apps, None)
    token.refresh_from_db()
    assert (token.scopes, token.needs_review) == (["enqueue", "operate"], True)


def test_new_tokens_enqueue_only_unless_given_more():
    assert tokens.create("new", all_queues=True)[0].scopes == ["enqueue"]
    with pytest.raises(tokens.TokenError):
        tokens.create("bad", all_queues=True, scopes=["everything"])


def test_a_selection_with_a_time_range_is_refused_not_half_read(call, queue):
    [item] = items_in_status(queue, "failed", 1)
    response = call("POST", "/queues/emails/bulk/preview", {
        "kind": "retry", "ids": [item.pk], "created_to": "2024-01-01T12:99:00Z"})
    assert response.status_code == 422
    assert "created_to" in response.json()["error"]["fields"]
