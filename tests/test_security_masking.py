"""Sensitive payload keys are masked for Viewers on the item page; Operators and Admins see all."""

import pytest

from queues import enqueue
from queues.web.masking import MASK, mask_payload
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db
PAYLOAD = {"to": "ada@example.com", "Password": "hunter2-secret",
           "nested": [{"API_KEY": "k-123456"}, {"note": "token"}], "auth": {"token": {"a": 1}}}


def test_values_of_sensitive_keys_are_masked_at_any_depth_and_any_case():
    masked = mask_payload(PAYLOAD, ["password", "api_key", "token"])
    assert masked == {"to": "ada@example.com", "Password": MASK,
                      "nested": [{"API_KEY": MASK}, {"note": "token"}], "auth": {"token": MASK}}
    assert PAYLOAD["Password"] == "hunter2-secret"  # the item's own payload is untouched


def test_no_sensitive_keys_means_nothing_is_masked():
    assert mask_payload(PAYLOAD, []) == PAYLOAD
    assert mask_payload("just a string", ["password"]) == "just a string"


@pytest.fixture
def item():
    QueueFactory(key="mail", sensitive_keys=["password", "api_key", "token"])
    return enqueue("mail", account="acme", identifier="m-1", payload=PAYLOAD)


def test_viewer_sees_masked_values_on_the_item_page(role_client, item):
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "hunter2-secret" not in html and "k-123456" not in html
    assert MASK in html and "ada@example.com" in html
    assert "hidden from Viewers" in html


@pytest.mark.parametrize("role", ["Operator", "Admin"])
def test_operators_and_admins_see_the_whole_payload(role_client, item, role):
    html = role_client(role).get(f"/items/{item.pk}/").content.decode()
    assert "hunter2-secret" in html and "k-123456" in html and MASK not in html


@pytest.mark.parametrize("key", ["db_password", "apiKey", "API-KEY", "X-Auth-Token",
                                 "clientSecret", "Authorization", "user.password_hash"])
def test_sensitive_keys_are_matched_by_meaning_not_exact_name(key):
    masked = mask_payload({key: "s3cr3t", "note": {"nested_apiKey": "k"}, "name": "ada"},
                          ["password", "secret", "token", "api_key", "authorization"])
    assert masked[key] == MASK and masked["note"]["nested_apiKey"] == MASK
    assert masked["name"] == "ada"


@pytest.mark.parametrize("path", ["/queues/mail/", "/queues/mail/export.csv"])
def test_a_viewer_cannot_filter_by_a_masked_value_to_confirm_it(role_client, item, path):
    """Filtering `password = guess` answered whether the guess was right, one request each."""
    for guess in ("wrong", "hunter2-secret"):
        response = role_client("Viewer").get(path, {"payload": f"Password = {guess}"})
        assert response.status_code == 400
        assert "sensitive keys" in response.content.decode()
    listing = role_client("Operator").get("/queues/mail/", {"payload": "Password = hunter2-secret"})
    assert [i.identifier for i in listing.context["page"].items] == ["m-1"]


def test_the_audit_log_masks_a_sensitive_payload_filter_for_viewers(role_client, item):
    from queues.engine import audit

    audit.record("ops", "bulk.cancel", queue_key="mail", target="bulk operation 1",
                 filter={"payload": 'password = "hunter2-secret"', "account": "acme"})
    for path in ("/audit/", "/audit/export/"):
        viewer = role_client("Viewer").get(path).content.decode() if path == "/audit/" else (
            b"".join(role_client("Viewer").get(path).streaming_content).decode())
        assert "hunter2-secret" not in viewer and MASK in viewer, path
    operator = role_client("Operator").get("/audit/").content.decode()
    assert "hunter2-secret" in operator
