"""`manage.py bench stream` end to end on a small scale (a uvicorn child process needs a
database it can open too: PostgreSQL's test database)."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from queues.bench import scenarios as bench


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bench_stream_delivers_every_event_once_to_every_client(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    Group.objects.get_or_create(name="Viewer")  # transactional tests flush the migration's
    out = StringIO()
    call_command("bench", "stream", "--events", "40", "--clients", "3", "--rate", "100",
                 "--idle-seconds", "1", stdout=out)
    assert "40 events" in out.getvalue() and "0 missing, 0 duplicates" in out.getvalue()
    figures = {name: value for name, value, _ in
               json.loads((tmp_path / "stream.json").read_text())["figures"]}
    assert 0 < figures["commit to client p50"] <= figures["commit to client p95"]
    assert figures["queries added by 3 clients, busy"] >= 0
