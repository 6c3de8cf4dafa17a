"""`manage.py bench migrations`: the newest migrations timed backwards and forwards."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from queues.bench import scenarios

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_bench_migrations_times_the_newest_migrations_both_ways(tmp_path, monkeypatch):
    from django.db.migrations.recorder import MigrationRecorder

    monkeypatch.setattr(scenarios, "RESULTS_DIR", tmp_path)
    call_command("bench", "migrations", "--count", "2", stdout=StringIO())
    figures = [name for name, _, _ in
               json.loads((tmp_path / "migrations.json").read_text())["figures"]]
    newest = sorted(MigrationRecorder.Migration.objects.filter(app="queues")
                    .values_list("name", flat=True))[-2:]
    assert figures == [f"{newest[1]} backwards", f"{newest[0]} backwards",
                       f"{newest[0]} forwards", f"{newest[1]} forwards"]
