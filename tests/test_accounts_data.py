"""One tenant's data on every queue: counts, export, erasure (a privacy request)."""

import json

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command

from queues.engine import accounts, counters
from queues.models import Attempt, AuditEntry, DeadLetter, Item, ItemEvent, Status
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    emails, billing = QueueFactory(key="emails"), QueueFactory(key="billing")
    items_in_status(emails, "failed", 2, account="acme")
    items_in_status(emails, "queued", 2, account="acme")
    items_in_status(billing, "complete", 1, account="acme")
    items_in_status(billing, "running", 1, account="acme")
    items_in_status(emails, "failed", 1, account="other")
    return emails, billing


def test_the_footprint_counts_the_account_on_every_queue(tenant):
    found = accounts.footprint("acme")
    assert found["items in total"] == (6, True) and found["items permanent failure"] == (2, True)
    assert found["dead letters"] == (2, True) and found["events"].n > 6
    assert found["attempts"] == (Attempt.objects.filter(item__account="acme").count(), True)
    assert "items cancelled" not in found


def test_the_footprint_stops_counting_past_its_limit(tenant, monkeypatch):
    monkeypatch.setattr(accounts, "COUNT_LIMIT", 1)
    monkeypatch.setattr(accounts, "ATTEMPTS_COUNTED_ITEMS", 5)
    found = accounts.footprint("acme")
    assert found["items queued"] == (1, False) and found["items complete"] == (1, True)
    assert str(found["items queued"]) == "1+" and str(found["items complete"]) == "1"
    assert found["items in total"] == (4, False) and str(found["items in total"]) == "4+"
    assert found["attempts"] == (None, True) and str(found["attempts"]) == "not counted"


def test_the_export_holds_every_item_and_its_history(tenant):
    lines = [json.loads(line) for line in accounts.export_lines("acme")]
    kinds = [line["kind"] for line in lines]
    assert kinds.count("item") == 6 and kinds.count("dead letter") == 2
    assert kinds.count("attempt") == Attempt.objects.filter(item__account="acme").count()
    assert {line["account"] for line in lines if line["kind"] == "item"} == {"acme"}
    # Times as ISO 8601, as every other export writes them.
    assert all("T" in line["created_at"] for line in lines if line["kind"] == "item")


def test_each_exported_record_stays_on_one_line_whatever_the_text_holds(tenant):
    item = Item.objects.filter(account="acme").first()
    item.last_error = "split\u2028here\u2029and\x85there"
    item.save(update_fields=["last_error"])
    lines = "".join(accounts.export_lines("acme")).splitlines()
    records = [json.loads(line) for line in lines]
    assert item.last_error in {r["last_error"] for r in records if r["kind"] == "item"}


def test_erasure_takes_everything_but_running_items_and_keeps_the_counters_true(tenant):
    erased = accounts.erase("acme", actor="admin")
    assert erased["items"] == 5 and erased["running, left to finish"] == 1
    assert list(Item.objects.filter(account="acme").values_list("status", flat=True)) == [
        Status.RUNNING]
    assert not DeadLetter.objects.filter(account="acme").exists()
    assert Item.objects.filter(account="other").count() == 1
    counts = counters.status_counts()
    for queue_id, by_status in counts.items():
        for status, n in by_status.items():
            assert n == Item.objects.filter(queue_id=queue_id, status=status).count()
    assert AuditEntry.objects.get(action="account.erase").target == "account acme"
    assert ItemEvent.objects.filter(account="acme").count() == ItemEvent.objects.filter(
        item_id__in=Item.objects.filter(account="acme").values("id")).count()


def test_admins_see_export_and_erase_an_account_from_the_dashboard(role_client, tenant):
    admin = role_client("Admin")
    page = admin.get("/tenant/", {"account": "acme"}).content.decode()
    assert "Items in total" in page and "Erase all of it for good" in page
    export = admin.get("/tenant/export/", {"account": "acme"})
    assert export["Content-Disposition"] == 'attachment; filename="acme.jsonl"'
    assert sum(1 for _ in export.streaming_content) > 6
    erased = admin.post("/tenant/erase/", {"account": "acme"})
    assert erased.status_code == 200 and "Erased" in erased.content.decode()
    assert AuditEntry.objects.filter(action__in=["account.export", "account.erase"]).count() == 2
    assert role_client("Operator").get("/tenant/", {"account": "acme"}).status_code == 403


def test_the_command_exports_and_erases(tenant, capsys):
    call_command("account_data", "acme", "--export")
    assert capsys.readouterr().out.count('"kind": "item"') == 6
    call_command("account_data", "acme", "--erase", "--yes")
    assert Item.objects.filter(account="acme").count() == 1


@pytest.fixture
def padded_tenant():
    """An account an earlier release stored with a space at its end, beside the one it reads
    like; the doors refuse such a name now, so it is written as that release did."""
    emails = QueueFactory(key="emails")
    items_in_status(emails, "failed", 2, account="acme-then")
    items_in_status(emails, "failed", 1, account="acme")
    for model in apps.get_app_config("queues").get_models():
        if "account" in {field.name for field in model._meta.fields}:
            model.objects.filter(account="acme-then").update(account="acme ")
    return emails


def test_a_padded_account_an_earlier_release_stored_is_shown_and_erased_alone(role_client,
                                                                              padded_tenant):
    admin = role_client("Admin")
    page = admin.get("/tenant/", {"account": "acme "})
    assert page.status_code == 200
    assert "with a space at its start or end" in page.content.decode()
    export = admin.get("/tenant/export/", {"account": "acme "})
    assert {json.loads(line)["account"] for line in export.streaming_content
            if json.loads(line)["kind"] == "item"} == {"acme "}
    assert admin.post("/tenant/erase/", {"account": "acme "}).status_code == 200
    assert list(Item.objects.values_list("account", flat=True)) == ["acme"]
    assert "with a space" not in admin.get("/tenant/", {"account": "acme"}).content.decode()


def test_a_padded_account_holding_no_data_is_refused(role_client, padded_tenant):
    admin = role_client("Admin")
    for account in ("acme  ", " acme", "other ", "acme\x1b "):
        assert admin.post("/tenant/erase/", {"account": account}).status_code == 400
    assert Item.objects.count() == 3


def test_the_command_erases_a_padded_account_an_earlier_release_stored(padded_tenant):
    call_command("account_data", "acme ", "--erase", "--yes")
    assert list(Item.objects.values_list("account", flat=True)) == ["acme"]
    with pytest.raises(CommandError, match="printable"):
        call_command("account_data", "acme ", "--erase", "--yes")


def test_a_padded_account_an_earlier_release_stored_can_be_paused_alone(role_client, client,
                                                                        padded_tenant):
    from queues.engine import selector, tokens
    from queues.models import AccountPolicy

    operator = role_client("Operator")
    assert operator.post("/queues/emails/accounts/pause/", {"account": "acme "}).status_code == 302
    secret = tokens.create("p", queue_keys=["emails"], scopes=[tokens.OPERATE])[1]
    response = client.post("/api/v1/queues/emails/accounts/pause", {"account": "acme "},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200 and response.json()["paused"] is True
    assert list(AccountPolicy.objects.values_list("account", "paused")) == [("acme ", True)]
    refused = client.post("/api/v1/queues/emails/accounts/pause", {"account": "other "},
                          content_type="application/json",
                          HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert refused.status_code == 422
    # The selector holds back only the padded account's items.
    Item.objects.update(status=Status.QUEUED, finished_at=None)
    assert set(selector.run_round(padded_tenant).taken) == {"acme"}
