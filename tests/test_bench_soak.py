"""`manage.py bench soak` for a minute on a small seeded queue: real web server and clusters,
memory sampled, the trickle run, the export streamed whole, every page answered."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from queues.bench import scenarios, soak

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_bench_soak_samples_memory_runs_the_trickle_and_streams_the_export(
        tmp_path, monkeypatch, settings):
    monkeypatch.setattr(scenarios, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(soak, "SAMPLE_SECONDS", 10)
    Group.objects.get_or_create(name="Viewer")  # transactional tests flush the migration's
    call_command("bench", "seed", "--items", "3000", "--accounts", "30", "--queues", "1",
                 stdout=StringIO())
    call_command("bench", "soak", "--minutes", "0.6", stdout=StringIO())
    figures = {name: value for name, value, _ in
               json.loads((tmp_path / "soak.json").read_text())["figures"]}
    assert figures["export: rows"] == 3000
    assert figures["export: web RSS peak while streaming"] >= figures["export: web RSS before"]
    assert figures["page errors"] == 0 and figures["pages opened"] > 10
    assert figures["items completed during the soak"] > 100
    assert figures["web RSS at the end"] > 20
    assert figures["clusters (all processes) RSS at the end"] > 50


def test_processes_are_found_with_what_they_forked():
    import os

    assert os.getpid() in soak.descendants(os.getpid())
    assert soak.rss_kb(os.getpid()) > 0
