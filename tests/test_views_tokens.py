"""API tokens in the dashboard: Admins only; the secret is shown once on the create response and
is never stored, redirected or kept in the session; scope and revocation take effect on the API."""

import json

import pytest

from queues.models import ApiToken, AuditEntry
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def queues():
    return QueueFactory(key="emails"), QueueFactory(key="billing")


def create(client, **data):
    return client.post("/tokens/create/", {"name": "producer", **data})


def enqueue(client, secret, queue_key):
    return client.post(f"/api/v1/queues/{queue_key}/items", json.dumps(
        {"account": "acme", "identifier": "x-1"}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}")


@pytest.mark.parametrize("role", ["Viewer", "Operator"])
def test_tokens_are_for_admins_only(role_client, role):
    client = role_client(role)
    assert client.get("/tokens/").status_code == 403
    assert create(client, all_queues="on").status_code == 403
    assert not ApiToken.objects.exists()
    assert b"API tokens" not in client.get("/").content


def test_admin_sees_the_nav_link_and_the_form(role_client):
    client = role_client("Admin")
    assert b'href="/tokens/"' in client.get("/").content
    page = client.get("/tokens/")
    assert page.status_code == 200 and b"New token" in page.content


def test_created_token_secret_is_shown_once_and_only_its_digest_is_stored(role_client, client):
    admin = role_client("Admin")
    response = create(admin, queues=["emails"])
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    secret = response.context["secret"]
    assert secret.startswith("qa_") and secret.encode() in response.content
    token = ApiToken.objects.get()
    assert token.name == "producer" and secret not in (token.digest, token.prefix)
    assert token.created_by == admin.user
    # Nowhere to find it again: not in the list, the session or the messages.
    listing = admin.get("/tokens/").content.decode()
    assert secret not in listing and token.prefix in listing
    assert secret not in str(dict(admin.session.items()))
    # It works on the API, for its queue only.
    assert enqueue(client, secret, "emails").status_code == 201
    assert enqueue(client, secret, "billing").status_code == 404  # as if it did not exist


@pytest.mark.parametrize("data", [{}, {"all_queues": "on", "queues": ["emails"]},
                                  {"queues": ["nope"]}, {"name": "x" * 101, "all_queues": "on"},
                                  {"name": "adm\u202enimda", "all_queues": "on"},
                                  {"name": "a\nb", "all_queues": "on"}])
def test_an_unclear_scope_or_bad_name_is_refused_with_the_form(role_client, data):
    response = role_client("Admin").post("/tokens/create/", {"name": "producer"} | data)
    assert response.status_code == 400
    assert not ApiToken.objects.exists()


def test_revoke_refuses_the_api_at_once_and_shows_revoked(role_client, client):
    admin = role_client("Admin")
    secret = create(admin, all_queues="on").context["secret"]
    token = ApiToken.objects.get()
    assert enqueue(client, secret, "billing").status_code == 201
    response = admin.post(f"/tokens/{token.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == "/tokens/"
    assert enqueue(client, secret, "emails").status_code == 401
    listing = admin.get("/tokens/").content.decode()
    assert "revoked" in listing and "never" not in listing  # last use shown


def test_revoke_through_htmx_redirects_the_page(role_client):
    admin = role_client("Admin")
    create(admin, all_queues="on")
    token = ApiToken.objects.get()
    response = admin.post(f"/tokens/{token.pk}/revoke/", HTTP_HX_REQUEST="true")
    assert response["HX-Redirect"] == "/tokens/"


def test_create_and_revoke_are_audited_with_the_admin_as_actor(role_client):
    admin = role_client("Admin")
    create(admin, queues=["emails", "billing"])
    admin.post(f"/tokens/{ApiToken.objects.get().pk}/revoke/")
    entries = list(AuditEntry.objects.order_by("id").values_list("actor_name", "action"))
    assert entries == [("admin-user", "token.create"), ("admin-user", "token.revoke")]
    assert AuditEntry.objects.get(action="token.create").filter == {
        "queues": ["billing", "emails"], "scopes": ["enqueue"]}
