"""/metrics: Prometheus text from the counters and recent records, behind a bearer token or an
allow-listed network."""

import ipaddress
from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from queues.engine import heartbeat, selector
from queues.models import BulkOperation, SweepRun
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db
TOKEN = "m" * 40


def metrics_settings(settings, *, token="", networks=()):
    settings.QUEUEADMIN = settings.QUEUEADMIN | {
        "METRICS_TOKEN": token,
        "METRICS_ALLOWED_NETWORKS": [ipaddress.ip_network(n) for n in networks]}


def samples(response) -> dict:
    text = response.content.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(client):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    return samples(response)


@pytest.fixture
def token(settings):
    metrics_settings(settings, token=TOKEN)


def test_metrics_report_items_per_queue_and_status_and_dead_letters(client, token):
    queue = QueueFactory(key="emails")
    enqueued(queue, 3)
    items_in_status(queue, "failed", 2)
    items_in_status(queue, "complete", 1)
    values = scrape(client)
    assert values[("queueadmin_items", (("queue", "emails"), ("status", "queued")))] == 3
    assert values[("queueadmin_items", (("queue", "emails"), ("status", "failed")))] == 2
    assert values[("queueadmin_items", (("queue", "emails"), ("status", "running")))] == 0
    assert values[("queueadmin_dead_letters", (("queue", "emails"),))] == 2


def outcomes(values) -> dict:
    return {dict(labels)["outcome"]: v for (name, labels), v in values.items()
            if name == "queueadmin_outcomes_last_5m"}


def test_outcomes_count_the_5_whole_minutes_before_the_current_one(client, token):
    """The minute under way made the window 5 to 6 minutes long (372 retries for 237)."""
    from datetime import timedelta

    from django.db.models import F

    from queues.models import CounterDelta

    queue = QueueFactory(key="emails")
    items_in_status(queue, "complete", 4)
    CounterDelta.objects.update(minute=F("minute") - timedelta(minutes=6))  # out of the window
    items_in_status(queue, "failed", 2)
    CounterDelta.objects.filter(status="failed").update(minute=F("minute") - timedelta(minutes=1))
    items_in_status(queue, "complete", 1)  # this minute: not yet
    counted = outcomes(scrape(client))
    assert counted["complete"] == 0 and counted["failed"] == 2


def test_metrics_report_the_oldest_ready_age_and_selector_round_durations(client, token):
    queue = QueueFactory(key="emails")
    enqueued(queue, 2, run_at=timezone.now() - timedelta(minutes=10))
    from queues.models import Item
    Item.objects.update(created_at=timezone.now() - timedelta(minutes=10))
    values = scrape(client)
    assert values[("queueadmin_oldest_ready_age_seconds", (("queue", "emails"),))] >= 600
    selector.run_round(queue)
    values = scrape(client)
    assert values[("queueadmin_selector_rounds_last_5m", (("queue", "emails"),))] == 1
    p95 = ("queueadmin_selector_round_duration_seconds", (("quantile", "0.95"),
                                                          ("queue", "emails")))
    assert 0 < values[p95] < 5
    assert values[("queueadmin_oldest_ready_age_seconds", (("queue", "emails"),))] == 0


def test_metrics_report_sweeper_actions_bulk_operations_and_clusters(client, token):
    queue = QueueFactory(key="emails")
    now = timezone.now()
    SweepRun.objects.create(started_at=now, finished_at=now,
                            counts={"running items lost, retried": 3})
    SweepRun.objects.create(started_at=now, finished_at=now,
                            counts={"running items lost, retried": 2})
    BulkOperation.objects.create(queue=queue, kind="retry", actor_name="op", filter={},
                                 filter_hash="x", expected=10, created_at=now)
    heartbeat.beat(host="w1", pid=1, workers=4, started_at=now, running=[])
    values = scrape(client)
    assert values[("queueadmin_sweeper_actions_last_hour",
                   (("action", "running items lost, retried"),))] == 5
    assert values[("queueadmin_sweeper_last_run_timestamp_seconds", ())] == pytest.approx(
        now.timestamp())
    assert values[("queueadmin_bulk_operations_running", (("kind", "retry"),))] == 1
    assert values[("queueadmin_bulk_operations_running", (("kind", "cancel"),))] == 0
    assert values[("queueadmin_clusters", (("state", "alive"),))] == 1
    assert values[("queueadmin_cluster_heartbeat_age_seconds", ())] < 5


def test_metrics_never_count_the_items_table(client, token):
    queue = QueueFactory(key="emails")
    enqueued(queue, 5)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    item_counts = [q["sql"] for q in queries.captured_queries
                   if "COUNT(" in q["sql"].upper() and '"queues_item"' in q["sql"]]
    assert item_counts == []
    assert len(queries.captured_queries) <= 12


def test_metrics_refuse_a_missing_or_wrong_token(client, token):
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer " + "x" * 40)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_metrics_admit_an_allowed_network_without_a_token(client, settings):
    metrics_settings(settings, networks=["127.0.0.0/8"])
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.9").status_code == 403


def test_metrics_are_disabled_without_a_token_or_a_network(client, settings):
    metrics_settings(settings)
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 403
    assert b"QUEUEADMIN_METRICS_TOKEN" in response.content


@override_settings(ALLOWED_HOSTS=["queues.example.com"])
def test_metrics_answer_a_scraper_that_addresses_the_machine_by_ip(client, token):
    response = client.get("/metrics", HTTP_HOST="10.0.0.5:8000",
                          HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")


def test_metrics_answer_503_when_the_database_is_unreachable(client, token):
    with mock.patch("queues.ops.metrics.counters.status_counts",
                    side_effect=OperationalError("down")):
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
