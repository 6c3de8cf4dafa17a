"""/healthz: public JSON for load balancers; 200 while the database answers (degraded when the
workers, selector or sweeper fell behind), 503 when it does not."""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.utils import timezone
from django_q.models import Schedule

from queues.engine import heartbeat
from queues.models import ClusterHeartbeat, SweepRun
from queues.ops.health import SELECTOR_SCHEDULE

pytestmark = pytest.mark.django_db


def healthy_now():
    now = timezone.now()
    heartbeat.beat(host="w1", pid=10, workers=4, started_at=now, running=[])
    Schedule.objects.filter(name=SELECTOR_SCHEDULE).update(next_run=now + timedelta(seconds=30))
    SweepRun.objects.create(started_at=now, finished_at=now, counts={})


def test_healthz_is_public_json_and_ok_when_clusters_selector_and_sweeper_are_recent(client):
    healthy_now()
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    assert body["status"] == "ok" and body["problems"] == []
    assert body["database"] == "ok"
    assert body["clusters"]["alive"] == 1
    assert body["clusters"]["newest_heartbeat_age_seconds"] < 5
    assert body["sweeper"]["last_run_age_seconds"] < 5
    assert body["selector"]["schedule_overdue_seconds"] == 0


def test_healthz_is_degraded_but_200_without_a_recent_cluster_heartbeat(client):
    healthy_now()
    ClusterHeartbeat.objects.update(beat_at=timezone.now() - timedelta(minutes=5))
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["clusters"]["alive"] == 0
    assert any("heartbeat" in problem for problem in body["problems"])


def test_healthz_reports_an_overdue_selector_schedule_and_a_late_sweeper(client):
    healthy_now()
    Schedule.objects.filter(name=SELECTOR_SCHEDULE).update(
        next_run=timezone.now() - timedelta(minutes=10))
    SweepRun.objects.update(started_at=timezone.now() - timedelta(hours=1),
                            finished_at=timezone.now() - timedelta(hours=1))
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["selector"]["schedule_overdue_seconds"] >= 600
    assert body["sweeper"]["last_run_age_seconds"] >= 3600
    assert len(body["problems"]) == 2


def test_healthz_waits_for_a_new_clusters_first_sweep_before_calling_the_sweeper_late(client):
    healthy_now()
    SweepRun.objects.all().delete()
    assert client.get("/healthz").json()["status"] == "ok"
    ClusterHeartbeat.objects.update(started_at=timezone.now() - timedelta(minutes=20))
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["problems"] == ["the sweeper has not run in the last 15 minutes"]
    assert body["sweeper"]["last_run_age_seconds"] is None


def test_healthz_answers_503_not_500_when_the_database_is_unreachable(client):
    with mock.patch("queues.ops.health.report", side_effect=OperationalError("connection refused")):
        response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "unreachable"}
    assert response["Retry-After"] == "5"


@pytest.mark.parametrize("host", ["10.1.2.3:8000", "unlisted.example"])
def test_healthz_answers_probes_by_any_host_name_or_address(client, host):
    healthy_now()
    assert client.get("/healthz", HTTP_HOST=host).status_code == 200


def test_healthz_refuses_writes(client):
    assert client.post("/healthz").status_code == 405


def test_workers_page_lists_every_cluster_and_marks_stale_ones(role_client):
    now = timezone.now()
    heartbeat.beat(host="alpha", pid=11, workers=4, started_at=now,
                   running=[{"pid": 12, "task": "emails batch of 60",
                             "since": now.isoformat()}])
    heartbeat.beat(host="beta", pid=21, workers=8, started_at=now, running=[])
    ClusterHeartbeat.objects.filter(host="beta").update(beat_at=now - timedelta(minutes=3))
    response = role_client("Viewer").get("/workers/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "alpha:11" in html and "beta:21" in html
    assert "emails batch of 60" in html
    assert html.count("badge-failed") == 1 and "Stale" in html
    assert "1 of 2 clusters alive" in html
    assert 'href="/workers/"' in html  # linked from the navigation


def test_workers_page_needs_a_login(client):
    response = client.get("/workers/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_workers_page_refreshes_only_its_table_for_htmx(role_client):
    response = role_client("Viewer").get("/workers/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert 'id="workers-table"' in html and "<nav" not in html
