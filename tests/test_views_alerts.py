"""The alerts page /alerts/: rules per queue and open and recent firings for every role;
acknowledge and mute for Operators, rule edits for Admins, each audited; CSRF on every POST;
bad input answered 4xx with nothing written."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from queues.models import AlertFiring, AlertRule, AuditEntry
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


@pytest.fixture
def depth(queue):
    return AlertRule.objects.get(queue=queue, kind="depth")


@pytest.fixture
def firing(depth):
    return AlertFiring.objects.create(rule=depth, started_at=timezone.now(), value=12_345,
                                      threshold=10_000, notices=1,
                                      delivery={"email": "sent", "webhook": "failed: HTTP 503"})


def edit(client, rule, headers=None, **changes):
    data = {"threshold": rule.threshold, "enabled": "on", "channels": ["email", "webhook"],
            "emails": "", **changes}
    return client.post(f"/alerts/rules/{rule.pk}/", data, headers=headers)


def test_every_role_sees_the_firings_the_installations_rules_and_a_line_per_queue(
        role_client, depth, firing):
    response = role_client("Viewer").get("/alerts/")
    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="alerts-installation"' in html and "No worker cluster beating" in html
    assert "depth 12,345 (over 10,000)" in html
    assert "webhook: failed: HTTP 503" in html
    # The queue's rules are a line of counts, its firing alert linked to its rule's row.
    assert 'href="/alerts/?queue=emails">emails</a>' in html
    assert f'id="rule-{depth.pk}"' not in html
    assert f'href="/alerts/?queue=emails#rule-{depth.pk}"' in html
    # A Viewer sees no control.
    assert "Acknowledge</button>" not in html and "Mute</button>" not in html
    assert "Save</button>" not in html
    assert 'href="/alerts/" aria-current="page"' in html


def test_a_queues_page_shows_its_rules_and_only_its_firings(role_client, depth, firing):
    other = QueueFactory(key="reports")
    AlertFiring.objects.create(rule=AlertRule.objects.get(queue=other, kind="depth"),
                               started_at=timezone.now(), value=777, threshold=10)
    html = role_client("Viewer").get("/alerts/?queue=emails").content.decode()
    assert 'id="alerts-emails"' in html and f'id="rule-{depth.pk}"' in html
    assert "Dead letters" in html and "Run time p95" in html
    assert "depth 12,345 (over 10,000)" in html and "depth 777" not in html
    assert "No worker cluster beating" not in html
    fragment = role_client("Viewer").get("/alerts/?queue=reports", HTTP_HX_REQUEST="true")
    assert "depth 777" in fragment.content.decode()
    assert "depth 12,345" not in fragment.content.decode()


def test_the_line_per_queue_counts_firing_muted_and_disabled_rules(role_client, depth, firing):
    AlertRule.objects.filter(queue=depth.queue, kind="failures").update(enabled=False)
    AlertRule.objects.filter(queue=depth.queue, kind__in=["depth", "run_time"]).update(
        muted_until=timezone.now() + timedelta(hours=1))
    html = role_client("Viewer").get("/alerts/").content.decode()
    line = html[html.index('href="/alerts/?queue=emails">emails</a></th>'):].split("</tr>")[0]
    line = line.split("</th>", 1)[1]
    counts = [re.sub("<[^>]+>", "", cell).strip() for cell in line.split("</td>")[:-1]]
    assert counts == ["5", "1", "2", "1"], line


def test_an_unknown_queue_is_a_400_that_says_so(role_client):
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = role_client("Viewer").get("/alerts/?queue=nope", **headers)
        assert response.status_code == 400
        assert "Select a valid choice" in response.content.decode()


def test_with_many_firing_the_page_of_every_queue_lists_the_newest(role_client, queue):
    from queues.web import alerts as alerts_view
    queues = [QueueFactory(key=f"q{n:02d}") for n in range(alerts_view.FIRINGS_LISTED // 4 + 1)]
    now = timezone.now()
    firings = [AlertFiring(rule=rule, started_at=now - timedelta(minutes=n), value=1,
                           threshold=0)
               for n, rule in enumerate(AlertRule.objects.filter(queue__in=queues)
                                        .exclude(kind="oldest_wait").order_by("pk"))]
    AlertFiring.objects.bulk_create(firings)
    html = role_client("Viewer").get("/alerts/", HTTP_HX_REQUEST="true").content.decode()
    more = len(firings) - alerts_view.FIRINGS_LISTED
    assert html.count("Acknowledged</th>") == 1 and html.count('class="badge badge-alert"') == \
        alerts_view.FIRINGS_LISTED
    assert f"And {more} more firing" in html
    newest = html.index(f"#rule-{firings[0].rule_id}")
    assert f"#rule-{firings[-1].rule_id}\"" not in html and newest > 0


def test_htmx_refresh_returns_only_the_firings(role_client, firing):
    html = role_client("Viewer").get("/alerts/", HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<section id="alert-firings"') and "<html" not in html
    assert "depth 12,345" in html and "Rules</h2>" not in html


def test_viewers_cannot_act_and_nothing_is_written(role_client, depth, firing):
    client = role_client("Viewer")
    assert client.post(f"/alerts/firings/{firing.pk}/acknowledge/").status_code == 403
    assert client.post(f"/alerts/rules/{depth.pk}/mute/", {"duration": "1h"}
                       ).status_code == 403
    assert edit(client, depth, threshold=5).status_code == 403
    firing.refresh_from_db()
    depth.refresh_from_db()
    assert (firing.acknowledged_at, depth.muted_until, depth.threshold) == (None, None, 10_000)
    assert not AuditEntry.objects.exists()


def test_an_operator_acknowledges_a_firing_audited(role_client, firing):
    client = role_client("Operator")
    response = client.post(f"/alerts/firings/{firing.pk}/acknowledge/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "by operator-user" in response.content.decode()
    assert "Acknowledged" in response["HX-Trigger"]
    firing.refresh_from_db()
    assert firing.acknowledged_by == "operator-user" and firing.acknowledged_at is not None
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_name, entry.queue_key) == (
        "alert.acknowledge", "operator-user", "emails")
    again = client.post(f"/alerts/firings/{firing.pk}/acknowledge/", HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and AuditEntry.objects.count() == 1


def test_an_operator_mutes_a_rule_until_a_time_and_unmutes_it(role_client, depth):
    client = role_client("Operator")
    before = timezone.now()
    response = client.post(f"/alerts/rules/{depth.pk}/mute/", {"duration": "4h"},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith(f'<tr id="rule-{depth.pk}"')
    assert "Muted until" in response.content.decode() and "by operator-user" in \
        response.content.decode()
    depth.refresh_from_db()
    assert before + timedelta(hours=4) <= depth.muted_until <= timezone.now() + timedelta(hours=4)
    assert depth.muted_by == "operator-user"
    assert client.post(f"/alerts/rules/{depth.pk}/unmute/").status_code == 302
    depth.refresh_from_db()
    assert (depth.muted_until, depth.muted_by) == (None, "")
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == [
        "alert.mute", "alert.unmute"]


def test_a_bad_mute_duration_is_a_form_error_and_writes_nothing(role_client, depth):
    response = role_client("Operator").post(f"/alerts/rules/{depth.pk}/mute/",
                                            {"duration": "forever"})
    assert response.status_code == 422
    depth.refresh_from_db()
    assert depth.muted_until is None and not AuditEntry.objects.exists()


def test_operators_cannot_edit_rules_admins_do_audited(role_client, depth):
    assert edit(role_client("Operator"), depth, threshold=5).status_code == 403
    client = role_client("Admin")
    response = edit(client, depth, threshold=500, channels=["email"],
                    emails="dev@example.com, oncall@example.com")
    assert response.status_code == 302  # without htmx: back to the page, at the rule's row
    assert response["Location"] == f"/alerts/?queue=emails#rule-{depth.pk}"
    depth.refresh_from_db()
    assert (depth.threshold, depth.channels, depth.emails) == (
        500, ["email"], ["dev@example.com", "oncall@example.com"])
    entry = AuditEntry.objects.get()
    assert entry.action == "alert.rule" and sorted(entry.filter["fields"]) == [
        "channels", "emails", "threshold"]


def test_an_admin_edit_by_htmx_answers_with_the_rule_row(role_client, queue):
    failures = AlertRule.objects.get(queue=queue, kind="failures")
    response = role_client("Admin").post(
        f"/alerts/rules/{failures.pk}/",
        {"threshold": "5", "window_minutes": "30", "channels": ["webhook"]},
        HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<tr id="rule-{failures.pk}"') and "Disabled" in html
    failures.refresh_from_db()
    assert (failures.threshold, failures.window, failures.enabled) == (
        5, timedelta(minutes=30), False)


@pytest.mark.parametrize("changes, message", [
    ({"threshold": "-1"}, "Threshold"),
    ({"threshold": "lots"}, "Threshold"),
    ({"threshold": ""}, "Threshold"),
    ({"channels": ["sms"]}, "Channels"),
    ({"emails": "ops@example.com, <script>alert(1)</script>"}, "is not an e-mail address"),
])
def test_bad_rule_input_is_a_4xx_form_error_and_writes_nothing(role_client, depth, changes,
                                                               message):
    for headers in ({}, {"HX-Request": "true"}):
        response = edit(role_client("Admin"), depth, headers, **changes)
        html = response.content.decode()
        assert response.status_code == 422 and message in html
        assert "<script>alert(1)" not in html
    depth.refresh_from_db()
    assert depth.threshold == 10_000 and depth.emails == []
    assert not AuditEntry.objects.exists()


def test_a_windowed_rule_needs_its_window(role_client, queue):
    failures = AlertRule.objects.get(queue=queue, kind="failures")
    response = edit(role_client("Admin"), failures, window_minutes="")
    assert response.status_code == 422 and "measured over a window" in response.content.decode()
    response = edit(role_client("Admin"), failures, window_minutes="99999")
    assert response.status_code == 422


def test_every_post_needs_the_csrf_token(depth, firing):
    user = User.objects.create_user("csrf-admin", password="pw-for-tests-1")
    user.groups.add(Group.objects.get(name="Admin"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    posts = [(f"/alerts/firings/{firing.pk}/acknowledge/", {}),
             (f"/alerts/rules/{depth.pk}/mute/", {"duration": "1h"}),
             (f"/alerts/rules/{depth.pk}/", {"threshold": "1", "enabled": "on"})]
    for url, data in posts:
        assert client.post(url, data).status_code == 403
    assert not AuditEntry.objects.exists()
    client.get("/alerts/")
    token = client.cookies["csrftoken"].value
    for url, data in posts:
        assert client.post(url, data, HTTP_X_CSRFTOKEN=token).status_code == 302
    assert AuditEntry.objects.count() == 3


def test_gets_only_and_posts_only(role_client, depth, firing):
    client = role_client("Admin")
    assert client.post("/alerts/").status_code == 405
    assert client.get(f"/alerts/rules/{depth.pk}/").status_code == 405
    assert client.get(f"/alerts/firings/{firing.pk}/acknowledge/").status_code == 405
    assert client.post("/alerts/firings/999999/acknowledge/").status_code == 404


def test_recorded_names_are_escaped(role_client, depth, firing):
    AlertRule.objects.filter(pk=depth.pk).update(
        muted_until=timezone.now() + timedelta(hours=1), muted_by="<script>alert(1)</script>")
    AlertFiring.objects.filter(pk=firing.pk).update(acknowledged_at=timezone.now(),
                                                    acknowledged_by="<b>x</b>")
    html = role_client("Viewer").get("/alerts/?queue=emails").content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
