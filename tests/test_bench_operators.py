"""`bench operators` smoke run, so that the load test cannot rot: a few locust users (real
sign-ins, pages, one live stream) on uvicorn while 2 real clusters work, with every figure
reported and no request failed."""

import importlib.util
import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from queues.bench import scenarios as bench
from queues.models import Queue


# Never imported here: locust patches the standard library with gevent when imported.
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs .[bench]")
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_few_dashboard_users_while_two_clusters_work(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    Group.objects.get_or_create(name="Viewer")  # transactional tests flush the migration's
    other = Queue.objects.create(key="other", name="Other")
    out = StringIO()
    call_command("bench", "operators", "--users", "3", "--streams", "1", "--seconds", "12",
                 "--items", "20000", "--spawn-rate", "3", stdout=out)
    report = json.loads((tmp_path / "operators.json").read_text())
    figures = {name: value for name, value, _ in report["figures"]}
    assert report["parameters"]["users"] == 3
    assert figures["errors"] == 0 and figures["error rate"] == 0, out.getvalue()
    assert figures["requests"] >= 3  # one request per user every 5 s
    assert figures["overview (page): requests"] + figures[
        "overview (5 s refresh, htmx): requests"] >= 2
    assert figures["overview (page): p95"] > 0
    assert figures["stream: rows received (all streams)"] > 0
    # Each summary row counts at least one event the stream did not show as a row.
    assert figures["stream: events counted in those summaries"] >= figures[
        "stream: summary rows received (all streams)"]
    for window in ("with users", "without users (both quiet windows)"):
        assert figures[f"throughput {window}"] > 0, out.getvalue()
    for group in ("web", "cluster 1", "cluster 2", "PostgreSQL backends", "locust"):
        assert figures[f"CPU, users window: {group}"] > 0, group
    assert "throughput lost to the users" in figures
    other.refresh_from_db()
    assert other.paused is False
