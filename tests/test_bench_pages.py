"""`manage.py bench pages` on a small queue: every page answers, figures are reported."""

import pytest
from django.db import connection

from queues.bench import scenarios as bench
from queues.models import ApiToken, AuditEntry, MetricMinute, SelectorRound
from queues.web import queries
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db


def test_bench_pages_reports_time_and_queries_of_every_page(settings, monkeypatch):
    settings.ALLOWED_HOSTS = ["localhost"]
    queue = QueueFactory(key="bench-pages")
    enqueued(queue, 120)  # 50 pages deep needs more than 49 pages of items
    items_in_status(queue, "failed", 2)
    items_in_status(queue, "complete", 3)
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    if connection.vendor == "postgresql":
        # Statistics an earlier test left (CI runs without autovacuum) can make the planner
        # read this small table through an index; fresh ones make its heap fetches exact.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE queues_item")
    report = bench.run_pages(queue_key="bench-pages", requests=2, log=lambda _: None)
    names = [name for name, _, _ in report.figures]
    # Figures of the set-up, three of each bulk preview (four on PostgreSQL: its heap fetches),
    # three of each page, the export's first byte, three of each of the API's two reads, three
    # of the overview with every queue busy, three of each page by share of service.
    previews = 8 if connection.vendor == "postgresql" else 6
    assert len(names) == 4 + previews + (21 + 9) * 3 + 1 + 2 * 3 + 3 + 2 * 3
    assert "dead letters p95" in names and "/metrics (every queue) SQL queries" in names
    assert "alerts (every queue's rules) p95" in names and "live stream page p95" in names
    assert "bulk preview (cancel queued, 30 d) p95" in names
    assert "bulk preview (retry failed, 30 d) p95" in names
    assert "bulk preview (retry failed, 30 d), first" in names
    assert "CSV export, first byte p95" in names
    assert "overview, every queue busy p95" in names
    assert "API: queue list (every queue) p95" in names and "API: item (failed item) p95" in names
    assert not ApiToken.objects.exists() and not AuditEntry.objects.exists()  # rolled back
    # Its busy minutes were rolled back.
    assert not MetricMinute.objects.filter(completed=6_000).exists()
    assert "account ranking refresh (one queue) p50" in names
    assert "accounts by oldest wait, page 2 (keyset) p95" in names
    assert "accounts by share of service, page 2 (keyset) p95" in names
    assert not SelectorRound.objects.exists()  # the rounds it served by were rolled back
    assert "50 pages deep (keyset) p95" in names and "errors view SQL queries" in names
    assert "errors view, 7 d trends p95" in names
    assert "payload field (order = n) p95" in names
    assert "chart: share of accounts, 30 d p95" in names
    assert "history backfill (one queue, 30 days of events)" in names
    figures = {n: v for n, v, _ in report.figures}
    assert all(value > 0 for name, value in figures.items() if "heap fetches" not in name)
    assert figures["bulk preview (cancel queued): items eligible"] == 120
    assert figures["bulk preview (retry failed): items eligible"] == 2
    if connection.vendor == "postgresql":  # a table this small is read without an index
        assert figures["bulk preview (cancel queued): heap fetches of its count"] == 0
