"""`manage.py bench migrations`: the newest migrations timed backwards and forwards."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from queues.bench import scenarios

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_bench_migrations_times_the_newest_migrations_both_ways(tmp_path, monkeypatch):
    """Three: a rollback past 0020 (the alert rules' table) must not break post_migrate."""
    from django.db.migrations.recorder import MigrationRecorder

    monkeypatch.setattr(scenarios, "RESULTS_DIR", tmp_path)
    call_command("bench", "migrations", "--count", "3", stdout=StringIO())
    figures = [name for name, _, _ in
               json.loads((tmp_path / "migrations.json").read_text())["figures"]]
    newest = sorted(MigrationRecorder.Migration.objects.filter(app="queues")
                    .values_list("name", flat=True))[-3:]
    assert figures == [f"{name} backwards" for name in reversed(newest)] + [
        figure for name in newest
        for figure in (f"{name} forwards", f"{name} forwards: longest wait of a write")]
