"""The audit log page: read-only for every role, newest first with keyset pages, filters parsed
by a form (actor, action, queue, a time range of at most 366 days), CSV export with the same
filter, and entries kept by the sweeper."""

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from queues.engine import audit, sweeper
from queues.models import AuditEntry
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


def entry(action="item.retry", actor="ada", queue_key="emails", days_ago=0, target="item 1"):
    made = audit.record(actor, action, queue_key=queue_key, target=target)
    if days_ago:
        AuditEntry.objects.filter(pk=made.pk).update(at=timezone.now() - timedelta(days=days_ago))
    return made


@pytest.mark.parametrize("role", ["Viewer", "Operator", "Admin"])
def test_every_role_reads_the_log_and_nobody_can_change_it(role_client, role):
    entry()
    client = role_client(role)
    assert client.get("/audit/").status_code == 200
    assert client.post("/audit/").status_code == 405
    assert client.post("/audit/export/").status_code == 405
    if role == "Admin":  # not registered in Django's admin site, so no edit or delete there
        assert client.get("/django-admin/queues/auditentry/").status_code == 404


def test_newest_first_with_keyset_pages(role_client):
    for n in range(55):
        entry(target=f"item {n}")
    client = role_client("Viewer")
    first = client.get("/audit/").context
    assert [e.target for e in first["entries"][:2]] == ["item 54", "item 53"]
    assert len(first["entries"]) == 50
    second = client.get("/audit/", {"before": first["page"].older}).context
    assert [e.target for e in second["entries"]] == [f"item {n}" for n in range(4, -1, -1)]
    assert second["page"].older is None
    # "← Newer" walks back to the first page, whole.
    back = client.get("/audit/", {"after": second["page"].newer})
    assert [e.target for e in back.context["entries"]] == [
        e.target for e in first["entries"]]
    assert back.context["page"].newer is None and "← Newer" not in back.content.decode()
    assert "Older →" in back.content.decode()
    assert client.get("/audit/", {"after": 2**63}).status_code == 400


def test_filters_by_actor_action_prefix_queue_and_time(role_client):
    entry("item.retry", "ada", "emails")
    entry("bulk.cancel", "bob", "emails")
    entry("item.cancel", "ada", "billing", days_ago=10)
    client = role_client("Viewer")

    def actions(**query):
        return [e.action for e in client.get("/audit/", query).context["entries"]]

    assert actions(actor="ada") == ["item.cancel", "item.retry"]
    assert actions(action="item.") == ["item.cancel", "item.retry"]
    assert actions(queue="emails") == ["bulk.cancel", "item.retry"]
    since = (timezone.now() - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    assert actions(since=since) == ["bulk.cancel", "item.retry"]
    until = (timezone.now() - timedelta(days=5)).strftime("%Y-%m-%dT%H:%M")
    assert actions(until=until) == ["item.cancel"]


@pytest.mark.parametrize("query, message", [
    ({"since": "2024-01-01T00:00", "until": "2025-06-01T00:00"}, "at most 366 days"),
    ({"since": "2024-01-02T00:00", "until": "2024-01-01T00:00"}, "Must be after From"),
    ({"actor": "x" * 151}, "at most 150 characters"),
    ({"since": "yesterday"}, "Enter a valid date/time"),
])
def test_a_bad_filter_is_a_form_error_not_a_query(role_client, query, message):
    response = role_client("Viewer").get("/audit/", query)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert role_client("Viewer").get("/audit/export/", query).status_code == 400


def test_unknown_query_parameters_are_ignored(role_client):
    entry()
    response = role_client("Viewer").get("/audit/", {"actor_name__startswith": "zzz",
                                                     "order_by": "-target"})
    assert response.status_code == 200 and len(response.context["entries"]) == 1


def test_export_is_csv_with_the_page_filter_and_neutralised_formulas(role_client):
    entry("item.retry", "ada", target="=HYPERLINK(\"http://evil\")")
    entry("item.cancel", "bob")
    response = role_client("Viewer").get("/audit/export/", {"actor": "ada"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    assert rows[0] == ["id", "at", "actor", "action", "queue", "target", "filter", "counts"]
    assert len(rows) == 2 and rows[1][2] == "ada"
    assert rows[1][5] == "'=HYPERLINK(\"http://evil\")"


def test_export_is_bounded(role_client, monkeypatch):
    from queues.web import audit as audit_views

    monkeypatch.setattr(audit_views, "EXPORT_MAX_ROWS", 3)
    monkeypatch.setattr(audit_views, "EXPORT_CHUNK", 2)
    for _ in range(5):
        entry()
    response = role_client("Viewer").get("/audit/export/")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    assert len(rows) == 1 + 3 + 1 and "stopped at 3 rows" in rows[-1][0]
    monkeypatch.setattr(audit_views, "EXPORT_MAX_ROWS", 5)
    response = role_client("Viewer").get("/audit/export/")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    assert len(rows) == 1 + 5  # exactly the cap: nothing was left out, so no notice


def test_sweeper_keeps_audit_entries_older_than_every_retention():
    QueueFactory(key="emails", retention_days=60)
    old = entry(days_ago=400)
    sweeper.step()
    assert AuditEntry.objects.filter(pk=old.pk).exists()


def test_dashboard_mutations_are_audited(role_client):
    queue = QueueFactory(key="emails")
    client = role_client("Operator")
    client.post("/activity/selector/", {"queue": queue.key})
    client.post("/activity/sweeper/")
    assert set(AuditEntry.objects.values_list("action", flat=True)) == {
        "selector.run", "sweeper.run"}
    assert set(AuditEntry.objects.values_list("actor_name", flat=True)) == {"operator-user"}


def test_user_and_role_edits_in_the_admin_site_are_audited(role_client):
    from django.contrib.auth.models import User

    client = role_client("Admin")
    response = client.post("/django-admin/auth/group/add/", {"name": "Auditors"})
    assert response.status_code == 302
    response = client.post("/django-admin/auth/user/add/", {
        "username": "newbie", "password1": "a-long-password-1",
        "password2": "a-long-password-1", "usable_password": "true"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    newbie = User.objects.get(username="newbie")
    response = client.post(f"/django-admin/auth/user/{newbie.pk}/password/", {
        "password1": "another-password-2", "password2": "another-password-2",
        "usable_password": "true"})
    assert response.status_code == 302
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "target"))
    assert entries == [("admin.add", "group:Auditors"), ("admin.add", "user:newbie"),
                       ("admin.password", "user:newbie")]


def test_targets_link_to_what_they_name_and_filters_read_as_words(role_client):
    from queues.engine import bulk

    queue = QueueFactory(key="emails")
    now = timezone.now()
    bulk_filter = bulk.BulkFilter.build(queue, "retry", ["failed"], now - timedelta(days=1), now,
                                        account="acme", payload="customer.id = 42")
    audit.record("ada", "bulk.retry", queue_key="emails", target="bulk operation 7",
                 filter=bulk_filter.as_json())
    entry(target="item 12 (inv-12)")
    html = role_client("Viewer").get("/audit/").content.decode()
    assert '<a href="/items/12/">item 12 (inv-12)</a>' in html
    assert '<a href="/queues/emails/bulk/7/">bulk operation 7</a>' in html
    assert "<li>range over: finished</li>" in html and "<li>account: acme</li>" in html
    assert "<li>payload field: customer.id = 42</li>" in html and '"statuses"' not in html
