"""queues.bench.scenarios: the seed port, the fairness simulation and the selector scenario."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queues.bench import scenarios as bench
from queues.engine.fairness import plan_batch
from queues.models import Item, ItemEvent, Status


def test_the_seed_port_hangs_where_the_original_loops_forever():
    with pytest.raises(bench.SeedHang):
        bench.seed_plan_batch({f"a{i}": 20 for i in range(7)}, 60, None)


def test_the_seed_port_only_looks_past_its_cursor():
    taken, cursor = bench.seed_plan_batch({"a": 100, "b": 100, "c": 1}, 60, "b")
    assert (taken, cursor) == ({"c": 1}, None)


def test_the_seed_port_takes_one_each_from_the_first_sixty_accounts():
    demand = {f"a{i:03d}": 5 for i in range(100)}
    taken, cursor = bench.seed_plan_batch(demand, 60, None)
    assert len(taken) == 60 and set(taken.values()) == {1}
    assert cursor == "a059"


def test_simulation_of_plan_batch_is_fair_and_fills_every_batch():
    ready = {f"acct-{i:04d}": 50 + i % 7 for i in range(300)}
    figures = bench.simulate_fairness(plan_batch, ready, 60, 40)
    assert figures["batch fill (min)"][0] == 1.0
    assert figures["worst wait"][0] <= 5
    assert figures["Jain index (worst window)"][0] >= 0.99


def test_simulation_reports_where_the_seed_hangs():
    figures = bench.simulate_fairness(bench.seed_plan_batch, {f"a{i}": 20 for i in range(7)},
                                      60, 10)
    assert figures == {"hangs at round": (0, "round (its loop never ends)")}


def test_bench_planner_times_plan_batch_per_backlog(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    out = StringIO()
    call_command("bench", "planner", "--accounts", "50", "--accounts", "1200", "--runs", "3",
                 stdout=out)
    assert "1,200 accounts x 1,000,000 items: p95" in out.getvalue()
    report = json.loads((tmp_path / "planner.json").read_text())
    assert report["parameters"] == {"accounts": "50,1200", "batch_size": 60, "runs": 3}
    assert [name for name, _, _ in report["figures"]] == [
        f"{accounts} accounts{case}: {figure}"
        for accounts in ("50", "1,200")
        for case in (" x 1,000,000 items", ", random demand and weight")
        for figure in ("p50", "p95")
    ]
    assert all(value >= 0 and unit == "ms" for _, value, unit in report["figures"])


def test_bench_planner_refuses_an_empty_batch():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("bench", "planner", "--batch", "0")


@pytest.mark.django_db(transaction=True)
def test_bench_selector_times_rounds_and_puts_the_backlog_back(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    out = StringIO()
    call_command("bench", "selector", "--dataset", "10k-items-1k-accounts", "--rounds", "3",
                 "--fairness-rounds", "20", stdout=out)
    assert "10k-items-1k-accounts: round p95" in out.getvalue()
    figures = {name for name, _, _ in json.loads((tmp_path / "selector.json").read_text())[
        "figures"]}
    assert "10k-items-1k-accounts: ours Jain index (worst window)" in figures
    touched = ItemEvent.objects.filter(actor="bench", transition="requeued")
    assert touched.count() == 3 * 60
    assert set(Item.objects.filter(pk__in=touched.values("item_id")).values_list(
        "status", flat=True)) == {Status.QUEUED}


@pytest.mark.django_db(transaction=True)
def test_bench_selector_times_an_already_seeded_queue_without_seeding_another(tmp_path,
                                                                               monkeypatch):
    from queues.bench import seeding
    from queues.models import Queue

    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    queues = [bench.bench_queue("bench-0"), bench.bench_queue("bench-1")]
    seeding.seed(items=3000, accounts=200, queues=queues)
    Queue.objects.filter(key="bench-1").update(concurrency=5, paused=True)
    out = StringIO()
    call_command("bench", "selector", "--queue", "bench-1", "--rounds", "2",
                 "--fairness-rounds", "10", stdout=out)
    assert "bench-1: round p95" in out.getvalue()
    report = json.loads((tmp_path / "selector.json").read_text())
    assert report["parameters"]["queues"] == "bench-1"
    assert report["parameters"]["datasets"] == ""
    assert {name.split(":")[0] for name, _, _ in report["figures"]} == {"bench-1"}
    assert set(Queue.objects.values_list("key", flat=True)) == {"bench-0", "bench-1"}
    # Timed at the bench's settings (the seeded in-flight items would fill 5 slots), then the
    # operator's settings are put back.
    queue = Queue.objects.get(key="bench-1")
    assert (queue.concurrency, queue.paused) == (5, True)
    assert ItemEvent.objects.filter(actor="bench", transition="requeued",
                                    queue_id=queue.pk).count() == 2 * 60


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bench_selector_reports_the_rounds_real_clusters_ran_working_through_the_backlog(
        tmp_path, monkeypatch):
    from queues.bench import seeding
    from queues.models import Queue

    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(bench, "WORKING_WARM_UP_SECONDS", 3)
    queues = [bench.bench_queue("bench-0"), bench.bench_queue("bench-1")]
    seeding.seed(items=6000, accounts=200, queues=queues)
    started = timezone.now()
    out = StringIO()
    call_command("bench", "selector", "--queue", "bench-1", "--fairness-rounds", "10",
                 "--working-clusters", "1", "--working-seconds", "4", stdout=out)
    figures = {name: value for name, value, _ in json.loads(
        (tmp_path / "selector.json").read_text())["figures"]}
    assert figures["bench-1: attempts the clusters ended"] > 0
    assert figures["bench-1: rounds the clusters ran"] > 0
    assert figures["bench-1: round p95"] >= figures["bench-1: round p50"] > 0
    assert Queue.objects.get(key="bench-1").concurrency == bench.DEFAULT_CONCURRENCY  # put back
    # The other queue was paused for the clusters and is working again.
    assert not Queue.objects.get(key="bench-0").paused
    bench_0 = Queue.objects.get(key="bench-0")
    assert not ItemEvent.objects.filter(queue_id=bench_0.pk, transition="dispatched",
                                        at__gte=started).exists()


# Transactional: on PostgreSQL the seed commits on connections of its own, which a test
# transaction would not roll back.
@pytest.mark.django_db(transaction=True)
def test_timed_rounds_that_take_nothing_are_refused_not_reported():
    from queues.bench import seeding

    queue = bench.bench_queue("bench-0", concurrency=1)
    seeding.seed(items=500, accounts=20, queues=[queue])
    assert Item.objects.filter(queue=queue, status__in=("dispatched", "running")).exists()
    with pytest.raises(RuntimeError, match="took no items"):
        bench._time_rounds(queue, 3)


@pytest.mark.django_db
def test_bench_selector_refuses_a_queue_that_was_not_seeded():
    with pytest.raises(CommandError, match="seed it first"):
        call_command("bench", "selector", "--queue", "nope", "--rounds", "1")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bench_throughput_runs_items_through_real_worker_clusters(tmp_path, monkeypatch):
    from queues.models import Queue

    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    other = Queue.objects.create(key="other", name="Other")
    out = StringIO()
    call_command("bench", "throughput", "--items", "300", "--clusters", "1",
                 "--bare-items", "5", "--timeout", "120", stdout=out)
    assert "300 items complete" in out.getvalue()
    assert "5 bare tasks done" in out.getvalue()
    queue = Queue.objects.get(key="bench-throughput")
    assert Item.objects.filter(queue=queue, status=Status.COMPLETE).count() == 300
    assert ItemEvent.objects.filter(queue_id=queue.pk, transition="completed").count() == 300
    other.refresh_from_db()
    assert other.paused is False


@pytest.mark.django_db
def test_a_report_names_the_postgresql_settings_it_ran_with_and_warns_when_autovacuum_is_off(
        monkeypatch):
    report = bench.Report("pages", {"queue": "q"})
    report.add("overview p95", 12.5, "ms")
    monkeypatch.setattr(bench, "server_settings", lambda: {"autovacuum": "off",
                                                           "shared_buffers": "128MB"})
    table = report.as_table()
    assert "server: autovacuum=off, shared_buffers=128MB" in table
    assert "autovacuum is off on this server" in table
    monkeypatch.setattr(bench, "server_settings", lambda: {"autovacuum": "on"})
    assert "autovacuum is off" not in report.as_table()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_server_settings_are_read_from_postgresql():
    assert set(bench.server_settings()) == set(bench.SERVER_SETTINGS)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bench_bulk_retries_and_cancels_in_a_child_process_while_timing_the_selector(
        tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    call_command("bench", "selector", "--dataset", "10k-items-1k-accounts", "--rounds", "1",
                 "--fairness-rounds", "5", stdout=StringIO())
    call_command("bench", "bulk", "--items", "300", "--selector-rounds", "3",
                 "--selector-queue", "bench-sel-10k-items-1k-accounts", stdout=StringIO())
    figures = {name: value for name, value, _ in json.loads(
        (tmp_path / "bulk.json").read_text())["figures"]}
    assert figures["retry: items changed"] == figures["cancel: items changed"] == 300
    assert figures["retry: preview"] > 0 and figures["selector round p95 idle"] > 0
    assert figures["retry: preview of one account's failures"] > 0
    assert figures["overview right after: p95 of the next"] > 0
    assert not Item.objects.filter(queue__key__startswith="bench-bulk-").exists()


@pytest.mark.postgres
@pytest.mark.django_db
def test_bench_bulk_names_the_selector_data_set_it_needs():
    with pytest.raises(RuntimeError, match="bench selector --dataset 1m-items-10k-accounts"):
        call_command("bench", "bulk", "--items", "1")
