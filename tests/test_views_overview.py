"""Overview `/`: every queue with counts from the counters, per-minute chart, timings, badges."""

import pytest

from queues.engine import alerts
from queues.models import AlertRule, CounterDelta, StatusCount
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


def test_overview_lists_every_queue_with_counts_per_status(role_client):
    queue = QueueFactory(key="emails", name="Emails")
    items_in_status(queue, "queued", 3)
    items_in_status(queue, "complete", 2)
    QueueFactory(key="reports")
    response = role_client("Viewer").get("/")
    summaries = {s.queue.key: s for s in response.context["summaries"]}
    assert summaries["emails"].counts["queued"] == 3
    assert summaries["emails"].counts["complete"] == 2
    assert sum(summaries["emails"].completed) == 2
    assert summaries["emails"].oldest_waiting is not None
    assert summaries["reports"].counts["queued"] == 0
    assert b"Emails" in response.content and b'role="img"' in response.content


def test_counts_come_from_the_counters_not_from_the_items(role_client):
    queue = QueueFactory(key="emails")
    StatusCount.objects.create(queue=queue, status="queued", count=2_500_000)
    CounterDelta.objects.create(queue=queue, status="queued", delta=5,
                                minute="2026-01-01T00:00Z")
    response = role_client("Viewer").get("/")
    assert b"2,500,005" in response.content


def test_paused_and_alert_badges_of_the_firing_alerts(role_client):
    queue = QueueFactory(key="emails", paused=True)
    AlertRule.objects.filter(queue=queue, kind__in=["dead_letters", "depth", "failures"]).update(
        threshold=1)
    items_in_status(queue, "failed", 2)
    items_in_status(queue, "queued", 2)
    client = role_client("Viewer")
    assert "badge-alert" not in client.get("/").content.decode()  # until they are evaluated
    alerts.evaluate()
    content = client.get("/").content.decode()
    assert "Paused" in content
    # The condition, not the evaluator's figure, which stood beside the row's live one.
    assert "dead letters over 1<" in content
    assert "depth over 1<" in content
    assert "failures in the last hour over 1<" in content
    assert "(over 1)" not in content


def test_queue_list_filters_by_text_and_alerts(role_client):
    QueueFactory(key="emails")
    noisy = QueueFactory(key="webhooks")
    AlertRule.objects.filter(queue=noisy, kind="dead_letters").update(threshold=0)
    items_in_status(noisy, "failed", 1)
    alerts.evaluate()
    client = role_client("Viewer")
    keys = [s.queue.key for s in client.get("/?q=mail").context["summaries"]]
    assert keys == ["emails"]
    keys = [s.queue.key for s in client.get("/?show=alerting").context["summaries"]]
    assert keys == ["webhooks"]


def test_htmx_refresh_returns_only_the_live_table(role_client):
    QueueFactory(key="emails")
    response = role_client("Viewer").get("/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith("{%") is False and "<html" not in html
    assert 'id="queue-table"' in html and "queueadmin:tick from:body" in html
    assert "data-connection" in html and "updated" in html


# On PostgreSQL the timings turn bitmap scans off for their statement: SET LOCAL in a
# transaction of its own (a savepoint inside the test's), three statements more.
OVERVIEW_QUERIES = 11


def test_query_count_does_not_grow_with_items(role_client, django_assert_max_num_queries):
    queue = QueueFactory(key="emails")
    items_in_status(queue, "complete", 30)
    client = role_client("Viewer")
    client.get("/")
    # session + user + role + second factor, open alerts, counters, minutes, oldest, timings,
    # global pause
    with django_assert_max_num_queries(OVERVIEW_QUERIES):
        client.get("/")


def test_query_count_does_not_grow_with_queues(role_client, django_assert_num_queries):
    client = role_client("Viewer")
    for n in range(2):
        items_in_status(QueueFactory(key=f"q{n}"), "complete", 2)
    client.get("/")
    with django_assert_num_queries(OVERVIEW_QUERIES):
        client.get("/")
    for n in range(2, 6):
        items_in_status(QueueFactory(key=f"q{n}"), "complete", 2)
    with django_assert_num_queries(OVERVIEW_QUERIES):
        client.get("/")


def test_hostile_queue_names_are_escaped(role_client):
    QueueFactory(key="evil", name="<script>alert(1)</script>")
    content = role_client("Viewer").get("/").content.decode()
    assert "<script>alert(1)" not in content and "&lt;script&gt;" in content


def test_the_overview_sorts_the_busiest_or_most_troubled_queue_first(role_client):
    for key, failed in (("a-quiet", 0), ("b-broken", 3), ("c-some", 1)):
        queue = QueueFactory(key=key)
        if failed:
            items_in_status(queue, "failed", failed)
    client = role_client("Viewer")
    keys = [s.queue.key for s in client.get("/", {"sort": "dead"}).context["summaries"]]
    assert keys == ["b-broken", "c-some", "a-quiet"]
    assert [s.queue.key for s in client.get("/").context["summaries"]] == [
        "a-quiet", "b-broken", "c-some"]


def test_wait_and_run_times_sum_the_histograms_of_each_queues_last_15_minutes():
    from datetime import timedelta

    from django.utils import timezone

    from queues.models import MetricMinute
    from queues.web import queries

    now = timezone.now()
    emails, reports, idle = (QueueFactory(key=k) for k in ("emails", "reports", "idle"))
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=3)
    MetricMinute.objects.create(queue=emails, start=minute, completed=4,
                                wait_10=3, wait_12=1, run_05=2, run_08=2)
    # The top accounts' rows repeat part of the queue's, and older minutes are left out.
    MetricMinute.objects.create(queue=emails, account="acme", start=minute, wait_20=9, run_20=9)
    MetricMinute.objects.create(queue=emails, start=minute - timedelta(minutes=15), wait_20=9,
                                run_20=9)
    MetricMinute.objects.create(queue=reports, start=minute, enqueued=5)  # nothing finished
    timings = queries._timings([emails.pk, reports.pk, idle.pk], now)
    assert set(timings) == {emails.pk}
    wait, run = timings[emails.pk]
    # Placed linearly inside the buckets [0.512 s, 1.024 s) and [2.048 s, 4.096 s).
    assert wait == pytest.approx((0.512 + 0.512 * 2 / 3, 2.048 + 2.048 * 0.8))
    assert run == pytest.approx((0.032, 0.128 + 0.128 * 0.9))


def test_wait_and_run_times_of_items_finished_through_the_lifecycle_once_rolled_up(
        role_client):
    from datetime import timedelta

    from django.utils import timezone

    from queues.engine import history

    queue = QueueFactory(key="emails")
    items_in_status(queue, "complete", 3)
    viewer = role_client("Viewer")
    assert viewer.get("/").context["summaries"][0].run is None  # not rolled up yet
    history.backfill([queue.pk], now=timezone.now() + timedelta(minutes=1))
    summary = viewer.get("/").context["summaries"][0]
    # The factory's items wait and run for milliseconds.
    assert 0 <= summary.wait[0] <= summary.wait[1] < 1
    assert 0 <= summary.run[0] <= summary.run[1] < 1
    assert b"the items finished in the last 15 minutes" in viewer.get("/").content


def test_the_per_minute_chart_draws_a_bar_per_busy_minute_and_escapes_the_label():
    from queues.templatetags.queueadmin import outcome_chart

    svg = str(outcome_chart([0, 4, 2], [0, 0, 1], "<q>"))
    assert svg.count("<rect") == 3
    assert '<rect class="ok" x="3" y="0.0" width="2" height="20.0"/>' in svg
    assert '<rect class="ok" x="6" y="10.0" width="2" height="10.0"/>' in svg
    assert '<rect class="bad" x="6" y="20.0" width="2" height="5.0"/>' in svg
    assert "<q>" not in svg
    assert "&lt;q&gt;: 6 completed and 1 failed attempts (retried or failed for good)" in svg
