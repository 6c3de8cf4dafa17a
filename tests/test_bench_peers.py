"""`bench peers` smoke run, so that the comparison with the peers cannot rot: every system (real
clusters and workers of each peer, their own databases and migrations) runs both workloads on a
few hundred tasks to the last one, counted outside the systems in the completions files."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from queues.bench import peers as bench_peers
from queues.bench import scenarios as bench
from queues.bench import workload as bench_workload

ITEMS = 200


@pytest.fixture
def peer_databases():
    yield
    from psycopg import sql

    name = connection.settings_dict["NAME"]
    server = bench_peers.processes.database_url().rsplit("/", 1)[0] + "/postgres"
    with bench_peers._connect(server) as db:
        for peer in bench_peers.PEER_SETTINGS:
            db.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(bench_peers._peer_database(peer, name))))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_every_system_runs_every_task_of_both_workloads(tmp_path, monkeypatch, peer_databases):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    work = bench_workload.draw_work(ITEMS)
    assert max(w["ms"] for w in work) < bench_workload.TAIL_MS[0]  # no 155 s task in a smoke run
    failing = sum(1 for w in work if w["fail"])
    out = StringIO()
    call_command("bench", "peers", "--items", str(ITEMS), "--clusters", "1", "--runs", "1",
                 "--finished-share", "1", stdout=out)
    figures = {name: value for name, value, _ in
               json.loads((tmp_path / "peers.json").read_text())["figures"]}
    for system, label in bench_peers.SYSTEMS.items():
        assert figures[f"no-op: {label}, fewest returned in a run"] == ITEMS, system
        assert figures[f"no-op: {label}, most failed in a run"] == 0, system
        assert figures[f"realistic: {label}, fewest returned in a run"] == ITEMS - failing, system
        assert figures[f"realistic: {label}, most failed in a run"] == failing, system
        for workload in bench_peers.WORKLOADS:
            assert figures[f"{workload}: {label}, median"] > 0, system
    assert "the only one of these systems that is fair across accounts" in out.getvalue()

