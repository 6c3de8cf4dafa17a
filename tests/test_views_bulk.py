import re

import pytest
from django.core import signing

from queues.engine import bulk, lifecycle
from queues.models import AuditEntry, BulkOperation, Item, Status
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db
PREVIEW = {"kind": "retry", "status": ["failed"], "period": "7d", "preview": "1"}


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def confirmation(response) -> dict:
    html = response.content.decode()
    return {name: re.search(rf'name="{name}" value="([^"]*)"', html).group(1)
            for name in ("frozen", "filter_hash", "expected")}


def test_an_operator_previews_eligible_and_ineligible_counts(role_client, queue):
    items_in_status(queue, "failed", 3)
    items_in_status(queue, "queued", 2, prefix="q")
    # Queued items never finished: only a range over when items were enqueued reaches them.
    response = role_client("Operator").get(
        "/queues/emails/bulk/", {**PREVIEW, "status": ["failed", "queued"], "clock": "enqueued"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Eligible</dt><dd>3" in html
    assert "queued items cannot be retried" in html.lower()
    assert 'name="frozen"' in html and not BulkOperation.objects.exists()


def test_a_big_retry_preview_says_live_identifiers_are_left_to_the_operation(
        role_client, queue, monkeypatch):
    items_in_status(queue, "failed", 3)
    html = role_client("Operator").get("/queues/emails/bulk/", PREVIEW).content.decode()
    assert "not counted ahead" not in html
    monkeypatch.setattr(bulk, "LIVE_AGAIN_CHECK_MAX", 2)
    html = role_client("Operator").get("/queues/emails/bulk/", PREVIEW).content.decode()
    assert "Over 2 eligible items, those whose identifier is live again" in html
    assert "Eligible</dt><dd>3" in html


def test_a_preview_with_a_bad_range_answers_422_and_writes_nothing(role_client, queue):
    response = role_client("Operator").get("/queues/emails/bulk/", {
        **PREVIEW, "period": "custom", "created_from": "2026-01-02T00:00",
        "created_to": "2026-01-01T00:00"})
    assert response.status_code == 422
    assert "Must be after From" in response.content.decode()
    assert not BulkOperation.objects.exists()


def test_a_viewer_sees_no_bulk_form_and_cannot_start(role_client, queue):
    items_in_status(queue, "failed", 1)
    client = role_client("Viewer")
    page = client.get("/queues/emails/bulk/", PREVIEW)
    assert page.status_code == 200
    assert "bulk-form" not in page.content.decode()
    assert client.post("/queues/emails/bulk/start/", {}).status_code == 403


def test_confirming_starts_the_operation_and_shows_its_progress(
        role_client, queue, django_capture_on_commit_callbacks):
    items_in_status(queue, "failed", 3)
    client = role_client("Operator")
    preview = client.get("/queues/emails/bulk/", PREVIEW)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/queues/emails/bulk/start/", confirmation(preview))
    operation = BulkOperation.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/queues/emails/bulk/{operation.pk}/"
    bulk.run(operation.pk)
    progress = client.get(response["Location"], HTTP_HX_REQUEST="true")
    assert "Done" in progress.content.decode()
    assert "hx-trigger" not in progress.content.decode()  # finished: polling stops
    assert Item.objects.filter(status=Status.QUEUED).count() == 3
    assert AuditEntry.objects.filter(action="bulk.retry", actor_name="operator-user").exists()


def test_confirming_a_changed_snapshot_answers_409_with_the_fresh_counts(role_client, queue):
    failed = items_in_status(queue, "failed", 3)
    client = role_client("Operator")
    preview = client.get("/queues/emails/bulk/", PREVIEW)
    lifecycle.apply("requeue", [failed[0].pk], actor="someone else")
    response = client.post("/queues/emails/bulk/start/", confirmation(preview),
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert "Eligible</dt><dd>2" in response.content.decode()
    assert not BulkOperation.objects.exists()


def test_an_altered_confirmation_is_refused(role_client, queue):
    items_in_status(queue, "failed", 3)
    client = role_client("Operator")
    fields = confirmation(client.get("/queues/emails/bulk/", PREVIEW))
    frozen = signing.loads(fields["frozen"], salt=bulk.SIGNING_SALT)
    frozen["statuses"] = ["failed", "complete"]
    tampered = fields | {"frozen": signing.dumps(frozen, salt="another salt")}
    assert client.post("/queues/emails/bulk/start/", tampered).status_code == 400
    assert not BulkOperation.objects.exists()


def test_a_confirmation_for_another_queue_is_refused(role_client, queue):
    items_in_status(queue, "failed", 1)
    QueueFactory(key="billing")
    client = role_client("Operator")
    fields = confirmation(client.get("/queues/emails/bulk/", PREVIEW))
    assert client.post("/queues/billing/bulk/start/", fields).status_code == 400


def test_stop_button_stops_a_running_operation(role_client, queue):
    items_in_status(queue, "queued", 3)
    client = role_client("Operator")
    preview = client.get("/queues/emails/bulk/", {**PREVIEW, "kind": "cancel",
                                                  "status": ["queued"]})
    client.post("/queues/emails/bulk/start/", confirmation(preview))
    operation = BulkOperation.objects.get()
    response = client.post(f"/queues/emails/bulk/{operation.pk}/stop/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    operation.refresh_from_db()
    assert operation.state == "stopping"
    assert not bulk.step(operation.pk)
    operation.refresh_from_db()
    assert operation.state == "stopped"


def test_the_bulk_page_refuses_get_for_start_and_stop(role_client, queue):
    client = role_client("Operator")
    assert client.get("/queues/emails/bulk/start/").status_code == 405
    assert client.get("/queues/emails/bulk/1/stop/").status_code == 405


def test_payload_like_text_in_the_filter_is_escaped(role_client, queue):
    items_in_status(queue, "failed", 1)
    response = role_client("Operator").get(
        "/queues/emails/bulk/", {**PREVIEW, "error": '<script>alert(1)</script>'})
    assert "<script>alert(1)</script>" not in response.content.decode()


def test_an_operator_retries_a_selection_from_the_item_browser(role_client, queue):
    items = items_in_status(queue, "failed", 4)
    client = role_client("Operator")
    page = client.get("/queues/emails/").content.decode()
    assert 'form="selection-form"' in page
    chosen = [items[0].pk, items[2].pk]
    preview = client.get("/queues/emails/bulk/", {"kind": "retry", "ids": chosen,
                                                  "preview": "1"})
    assert preview.status_code == 200
    html = preview.content.decode()
    assert "2 selected items" in html
    # The selection is the filter: no status, time or text field stands beside it, ignored.
    assert 'name="status"' not in html and 'name="period"' not in html
    assert 'name="account"' not in html and html.count('name="ids"') == 2
    fields = confirmation(preview)
    client.post("/queues/emails/bulk/start/", fields)
    operation = BulkOperation.objects.get()
    while bulk.step(operation.pk):
        pass
    assert sorted(Item.objects.filter(status=Status.QUEUED).values_list("pk", flat=True)) == \
        sorted(chosen)


@pytest.mark.parametrize("ids", [["1", "x"], ["1", str(2**63)], ["0"], ["-4"]])
def test_a_selection_that_is_not_ids_answers_422(role_client, queue, ids):
    response = role_client("Operator").get("/queues/emails/bulk/", {
        "kind": "retry", "ids": ids, "preview": "1"})
    assert response.status_code == 422
    assert b"The selection is not a list of item ids." in response.content


def test_only_admins_may_purge_dead_letters(role_client, queue):
    items_in_status(queue, "failed", 2)
    purge = {"kind": "purge", "period": "7d", "preview": "1"}
    assert role_client("Operator").get("/queues/emails/bulk/", purge).status_code == 403
    admin = role_client("Admin")
    preview = admin.get("/queues/emails/bulk/", purge)
    assert preview.status_code == 200
    fields = confirmation(preview)
    operator = role_client("Operator")
    assert operator.post("/queues/emails/bulk/start/", fields).status_code == 403
    assert not BulkOperation.objects.exists()


def test_the_dead_letters_page_filters_and_offers_replay_and_purge(role_client, queue):
    items_in_status(queue, "failed", 3)
    admin = role_client("Admin")
    html = admin.get("/dead-letters/", {"queue": "emails", "reason": "permanent"}).content.decode()
    assert "Replay all matching" in html and "Delete all matching for good (purge)" in html
    assert html.count('form="selection-form"') == 3
    viewer_html = role_client("Viewer").get("/dead-letters/", {"queue": "emails"}).content.decode()
    assert "Replay all matching" not in viewer_html and 'form="selection-form"' not in viewer_html


def test_dead_letters_show_their_total_and_replay_what_the_list_shows(role_client, queue):
    items_in_status(queue, "failed", 3)
    QueueFactory(key="other")
    client = role_client("Operator")
    response = client.get("/dead-letters/", {"queue": "emails"})
    html = response.content.decode()
    assert "3 open dead letters on emails" in html
    assert '<option value="other">other</option>' in html  # a queue picker, not a text field
    link = re.search(r'href="([^"]*kind=replay[^"]*)"', html).group(1).replace("&amp;", "&")
    assert "period=all" in link  # "Any time" stays any time
    preview = client.get(link).context["preview"]
    assert preview.eligible == 3


def test_a_running_operation_shows_its_percentage_and_estimated_end(role_client, queue):
    from datetime import timedelta

    from django.utils import timezone

    started = timezone.now() - timedelta(seconds=30)
    operation = BulkOperation.objects.create(
        queue=queue, kind="retry", actor_name="ops", filter=bulk.BulkFilter.build(
            queue, "retry", ["failed"], started - timedelta(days=1), started).as_json(),
        filter_hash="0" * 64, expected=400, changed=100, created_at=started,
        last_step_at=started + timedelta(seconds=10))
    assert operation.percent_done == 25
    # 100 items in 10 s: the other 300 take about 30 s more.
    end = operation.estimated_end(timezone.now())
    assert timedelta(seconds=29) < end - timezone.now() <= timedelta(seconds=30)
    html = role_client("Viewer").get(f"/queues/emails/bulk/{operation.pk}/").content.decode()
    assert "25%" in html and "ends about" in html
    assert "Range over</dt><dd>Finished time" in html


def test_the_range_fields_name_the_operators_time_zone(role_client, queue):
    client = role_client("Operator")
    client.post("/preferences/", {"time_zone": "Europe/Berlin", "theme": "system"})
    html = client.get("/queues/emails/bulk/").content.decode()
    assert "From (Europe/Berlin)" in html and "To (Europe/Berlin)" in html
    assert "(UTC)" not in html


@pytest.mark.parametrize("period", ["1h", "all"])
def test_dates_typed_beside_a_preset_are_refused_not_dropped(role_client, queue, period):
    response = role_client("Operator").get("/queues/emails/bulk/", {
        **PREVIEW, "period": period, "created_from": "2026-01-01T10:00",
        "created_to": "2026-01-01T11:00"})
    assert response.status_code == 422
    assert "Choose From / to to use the dates you typed" in response.content.decode()


def test_a_time_that_does_not_exist_in_the_zone_is_said_once(role_client, queue):
    client = role_client("Operator")
    client.post("/preferences/", {"time_zone": "Europe/Berlin", "theme": "system"})
    response = client.get("/queues/emails/bulk/", {
        **PREVIEW, "period": "custom", "created_from": "2026-03-29T02:30",
        "created_to": "2026-03-29T05:00"})
    html = response.content.decode()
    assert response.status_code == 422
    assert "couldn’t be interpreted in time zone Europe/Berlin" in html
    assert "Required for a custom range" not in html


def test_any_time_is_said_as_such_not_as_a_range_from_the_year_2000(role_client, queue):
    items_in_status(queue, "failed", 2)
    client = role_client("Operator")
    preview = client.get("/queues/emails/bulk/", {**PREVIEW, "period": "all"})
    html = preview.content.decode()
    assert "Retry failed items finished at any time, as of" in html
    assert "2000-01-01" not in html
    response = client.post("/queues/emails/bulk/start/", confirmation(preview))
    page = client.get(response["Location"]).content.decode()
    assert "Any time up to the snapshot" in page and "2000-01-01" not in page


def test_the_preview_names_statuses_as_a_sentence_says_them(role_client, queue):
    items_in_status(queue, "retry", 1)
    html = role_client("Operator").get("/queues/emails/bulk/", {
        "kind": "cancel", "status": ["queued", "retry"], "period": "all", "preview": "1",
        "clock": "enqueued"}).content.decode()
    assert "Cancel queued or retrying items enqueued at any time" in html


def test_a_selection_with_nothing_to_act_on_says_so_without_a_range(role_client, queue):
    """"Widen the time range" was said of a selection, which has none."""
    [item] = items_in_status(queue, "failed", 1)
    html = role_client("Operator").get("/queues/emails/bulk/", {
        "kind": "cancel", "ids": [item.pk], "preview": "1"}).content.decode()
    assert ("Nothing to cancel: none of the selected items is queued, dispatched or retrying."
            in html)
    assert "Widen the time range" not in html


def test_a_link_without_preview_fills_the_form_in_without_marking_anything_invalid(
        role_client, queue):
    html = role_client("Operator").get(
        f"/queues/{queue.key}/bulk/", {"kind": "retry", "status": ["failed", "cancelled"],
                                       "account": "acme"}).content.decode()
    assert 'aria-invalid' not in html
    assert re.search(r'<input type="radio" name="kind" value="retry"[^>]* checked', html)
    assert re.search(r'value="failed"[^>]* checked', html)
    assert re.search(r'value="cancelled"[^>]* checked', html)
    assert re.search(r'name="account" value="acme"', html)


def test_a_refused_preview_names_each_field_by_the_id_its_widget_points_to(role_client, queue):
    html = role_client("Operator").get(
        f"/queues/{queue.key}/bulk/", {"kind": "retry", "preview": "1", "period": "custom"},
    ).content.decode()
    field = re.search(r'<input type="datetime-local" name="created_from"[^>]*>', html).group()
    assert 'aria-invalid="true"' in field and "id_created_from_error" in field
    assert re.search(r'<li id="id_created_from_error">From', html)
