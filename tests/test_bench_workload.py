"""The parts of `bench workload` that decide what it measures: the work drawn and the count of
executions repeated after completion. The run itself is a benchmark, not a test."""

import pytest

from queues.bench import workload as bench_workload
from queues.bench.scenarios import percentile
from queues.engine import handlers, lifecycle
from queues.models import Status
from tests.factories import QueueFactory, items_in_status


def test_the_work_is_long_tailed_with_a_few_items_past_half_the_task_timeout():
    work = bench_workload.draw_work(20_000)
    durations = [w["ms"] for w in work]
    assert 40 <= percentile(durations, 0.5) <= 60
    assert percentile(durations, 0.99) > 8 * percentile(durations, 0.5)
    assert 5 <= sum(1 for ms in durations if ms > 150_000) <= 40
    fails = [w["fail"] for w in work]
    assert 0.04 < fails.count("first") / len(work) < 0.06
    assert 0.005 < fails.count("always") / len(work) < 0.015
    assert bench_workload.draw_work(50) == bench_workload.draw_work(50)  # replayed per phase


@pytest.mark.django_db
def test_repeated_runs_are_told_apart_by_whether_the_earlier_completion_was_recorded(tmp_path):
    queue = QueueFactory()
    [lost, recorded] = items_in_status(queue, Status.RUNNING, 2)
    lifecycle.finish(queue, [lifecycle.Outcome(recorded.pk, 1)], worker="w")
    path = tmp_path / "completions.txt"
    for item, attempt in ((lost.pk, 1), (lost.pk, 2), (recorded.pk, 1), (recorded.pk, 2),
                          (999, 1)):
        handlers.note_completion(str(path), item, attempt)
    handlers.note_completion(str(path), "bare-1", 1)
    handlers.note_completion(str(path), "bare-1", 1)
    assert bench_workload._repeated(path) == (1, 1)
