"""Cluster heartbeats: written by the clusters themselves (a thread in each qcluster process,
tasks reported by its workers through shared memory), pruned by the sweeper after a day."""

import multiprocessing
import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.tasks import async_task

from queues.bench import processes
from queues.engine import heartbeat, sweeper
from queues.models import ClusterHeartbeat


@pytest.fixture
def slots(monkeypatch):
    array = multiprocessing.get_context("fork").Array(heartbeat.Slot, 3)
    monkeypatch.setattr(heartbeat, "_slots", array)
    return array


def test_a_worker_reports_the_task_it_runs_and_clears_it_when_done(slots):
    heartbeat._task_started("django_q", task={"name": "emails batch of 60"})
    running = heartbeat.running_tasks()
    assert [(r["pid"], r["task"]) for r in running] == [(os.getpid(), "emails batch of 60")]
    heartbeat._task_finished("django_q", task={"name": "emails batch of 60"})
    assert heartbeat.running_tasks() == []


def test_a_scheduled_task_is_named_by_its_schedule_not_django_q2s_random_words(slots):
    heartbeat._task_started("django_q", task={"name": "delta-california-bluebird-social",
                                              "func": "queues.engine.selector.tick"})
    assert [r["task"] for r in heartbeat.running_tasks()] == ["queueadmin: selector"]


def test_the_slot_of_a_worker_that_died_mid_task_is_freed(slots):
    child = multiprocessing.get_context("fork").Process(
        target=heartbeat._task_started, args=("django_q",), kwargs={"task": {"name": "doomed"}})
    child.start()
    child.join()
    assert child.exitcode == 0
    assert heartbeat.running_tasks() == []  # its pid is gone
    assert all(slot.pid == 0 for slot in slots)


def test_only_the_qcluster_command_beats():
    assert heartbeat.is_qcluster(["manage.py", "qcluster"])
    assert not heartbeat.is_qcluster(["manage.py", "runserver"])
    assert not heartbeat.is_qcluster(["uvicorn"])


@pytest.mark.django_db
def test_a_beat_upserts_one_row_per_cluster_keeping_its_start_time():
    started = timezone.now() - timedelta(hours=1)
    heartbeat.beat(host="w1", pid=42, workers=4, started_at=started, running=[])
    row = heartbeat.beat(host="w1", pid=42, workers=4, started_at=timezone.now(),
                         running=[{"pid": 43, "task": "t", "since": "x"}])
    assert ClusterHeartbeat.objects.count() == 1
    assert row.cluster == "w1:42" and row.started_at == started
    assert ClusterHeartbeat.objects.get().running[0]["task"] == "t"


@pytest.mark.django_db
def test_the_sweeper_prunes_clusters_silent_for_a_day():
    now = timezone.now()
    heartbeat.beat(host="old", pid=1, workers=4, started_at=now, running=[])
    heartbeat.beat(host="new", pid=2, workers=4, started_at=now, running=[])
    ClusterHeartbeat.objects.filter(host="old").update(beat_at=now - timedelta(days=2))
    counts = sweeper.run(seconds=5)
    assert list(ClusterHeartbeat.objects.values_list("host", flat=True)) == ["new"]
    assert counts["cluster heartbeats pruned"] == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_real_cluster_beats_with_its_pid_and_shows_the_task_its_worker_runs():
    cluster = processes.start_manage("qcluster", env={"QUEUEADMIN_WORKERS": "3"})
    try:
        assert processes.wait_for(
            lambda: ClusterHeartbeat.objects.filter(pid=cluster.pid).exists(), 30)
        row = ClusterHeartbeat.objects.get(pid=cluster.pid)
        assert row.workers == 3 and row.cluster.endswith(f":{cluster.pid}")
        async_task("time.sleep", 25, task_name="drill sleeper")
        assert processes.wait_for(lambda: any(
            task["task"] == "drill sleeper"
            for task in ClusterHeartbeat.objects.get(pid=cluster.pid).running), 40)
        first = ClusterHeartbeat.objects.get(pid=cluster.pid).beat_at
        time.sleep(heartbeat.BEAT_SECONDS + 1)
        assert ClusterHeartbeat.objects.get(pid=cluster.pid).beat_at > first
    finally:
        processes.stop([cluster])
