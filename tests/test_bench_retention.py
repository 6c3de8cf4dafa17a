"""`manage.py bench retention` on a small seeded queue: retention catches up, the figures say how
long it took and what its longest statement cost, and the queues' retention is put back."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from queues.bench import retention, scenarios
from queues.models import FINISHED_STATUSES, Item, ItemEvent, Queue

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_bench_retention_prunes_what_is_past_retention_and_restores_the_setting(
        tmp_path, monkeypatch):
    monkeypatch.setattr(retention, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(scenarios, "RESULTS_DIR", tmp_path)
    call_command("bench", "seed", "--items", "6000", "--accounts", "50", "--queues", "2",
                 stdout=StringIO())
    finished = Item.objects.filter(status__in=FINISHED_STATUSES).count()
    assert finished > 1000
    out = StringIO()
    started = timezone.now()
    call_command("bench", "retention", "--minutes", "2", "--selector-rounds", "3", stdout=out)
    figures = {name: value for name, value, _ in
               json.loads((tmp_path / "retention.json").read_text())["figures"]}
    # The seed spreads finished items over 30 days: nearly all are past a day's retention.
    assert 0.9 * finished <= figures["items pruned"] == finished - Item.objects.filter(
        status__in=FINISHED_STATUSES).count()
    assert figures["time to catch up"] > 0 and figures["longest statement (client side)"] > 0
    # The rounds were timed on a queue that had room: a freshly seeded queue is full of
    # in-flight items no cluster holds. Its own settings are put back after.
    assert figures["selector round p95 idle"] > 0
    assert figures["selector round p95 during retention"] > 0
    assert ItemEvent.objects.filter(actor="bench", transition="requeued").exists()
    assert Queue.objects.get(key="bench-1").concurrency == scenarios.DEFAULT_CONCURRENCY
    # 28 days of the seed's events were wholly past a day: dropped, not deleted row by row.
    assert figures["event partitions dropped whole"] >= 28
    assert figures["events deleted row by row"] > 0
    for table in ("queues_item", "queues_itemevent", "queues_attempt"):
        assert figures[f"{table} size before"] > 0
    # An event that expired while the run went on may lie behind the pass over the event ids
    # when its item expires: it waits for the next run's pass. None that had expired already.
    assert not ItemEvent.objects.exclude(item_id__in=Item.objects.values("id")).filter(
        at__lt=started - timedelta(days=1)).exists()
    assert set(Queue.objects.values_list("retention_days", flat=True)) == {60}


def test_bench_retention_names_a_missing_queue():
    with pytest.raises(CommandError, match="bench seed"):
        call_command("bench", "retention", "--queue", "nowhere")

