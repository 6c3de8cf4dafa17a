"""Security baseline: login, roles, CSRF/CSP headers, Django's admin site for Admins, audit of
admin edits, and the per-user time zone."""

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from queues.models import AuditEntry, Queue
from queues.permissions import ROLES
from tests.factories import QueueFactory

DASHBOARD_PAGES = ["/", "/queues/q/", "/queues/q/errors/", "/queues/q/accounts/", "/search/",
                   "/activity/", "/audit/", "/dead-letters/", "/preferences/"]
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def queue():
    return QueueFactory(key="q")


def test_migration_creates_the_three_roles():
    assert set(Group.objects.filter(name__in=ROLES).values_list("name", flat=True)) == set(ROLES)


@pytest.mark.parametrize("url", DASHBOARD_PAGES)
def test_every_page_sends_anonymous_users_to_the_login_page(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_htmx_request_of_a_signed_out_user_redirects_the_whole_page(client):
    response = client.get("/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/")
    assert response["HX-Redirect"].startswith("/accounts/login/")


def test_login_with_password_then_overview(client):
    user = User.objects.create_user("ada", password="a-long-password-1")
    user.groups.add(Group.objects.get(name="Viewer"))
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post("/accounts/login/", {"username": "ada",
                                                "password": "a-long-password-1"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_logout_is_a_post_only(role_client):
    client = role_client("Viewer")
    assert client.get("/accounts/logout/").status_code == 405
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_a_user_without_a_role_is_refused(client):
    client.force_login(User.objects.create_user("nobody"))
    response = client.get("/")
    assert response.status_code == 403
    assert b"Viewer role" in response.content


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", DASHBOARD_PAGES)
def test_every_role_reads_every_page(role_client, role, url):
    assert role_client(role).get(url).status_code == 200


def test_viewer_cannot_post_actions(role_client):
    client = role_client("Viewer")
    assert client.post("/activity/sweeper/").status_code == 403
    assert client.post("/items/1/retry/").status_code == 403


def test_mutations_need_the_csrf_token(role_client):
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(role_client("Operator").user)
    assert csrf_client.post("/activity/sweeper/").status_code == 403


def test_pages_carry_a_csp_without_inline_scripts_and_htmx_config(role_client):
    response = role_client("Viewer").get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy
    html = response.content.decode()
    assert '"allowEval": false' in html and "hx-headers" in html and "X-CSRFToken" in html
    assert "<script>" not in html and "django_htmx/htmx-2.min.js" in html


@pytest.mark.parametrize("role, status", [("Viewer", 403), ("Operator", 403), ("Admin", 200)])
def test_django_admin_site_is_for_admins(role_client, role, status):
    response = role_client(role).get("/django-admin/queues/queue/", follow=True)
    assert response.status_code == status


def test_admin_editing_queue_settings_is_audited(role_client, queue):
    client = role_client("Admin")
    form = client.get(f"/django-admin/queues/queue/{queue.pk}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None}
    data.update({"key": "q", "name": "Renamed", "backoff_seconds": "[120, 600]",
                 "handler_options": "{}", "sensitive_keys": '["password"]',
                 "dispatch_timeout": "00:05:00",
                 "stale_threshold": "02:00:00", "policies-TOTAL_FORMS": "0",
                 "policies-INITIAL_FORMS": "0"})
    response = client.post(f"/django-admin/queues/queue/{queue.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Queue.objects.get(pk=queue.pk).name == "Renamed"
    entry = AuditEntry.objects.get(action="admin.change")
    assert entry.actor_name == "admin-user" and entry.queue_key == "q"
    assert "name" in entry.filter["fields"]


def test_time_zone_choice_changes_how_times_are_shown(role_client):
    client = role_client("Viewer")
    response = client.post("/preferences/", {"time_zone": "Asia/Tokyo", "theme": "system"})
    assert response.status_code == 302
    assert b"JST" in client.get("/").content
    # Kept for the next login too.
    client.logout()
    client.force_login(User.objects.get(username="viewer-user"))
    assert b"JST" in client.get("/").content


def test_unknown_time_zone_is_refused(role_client):
    assert role_client("Viewer").post("/preferences/", {"time_zone": "Mars/Base"}).status_code \
        == 400
