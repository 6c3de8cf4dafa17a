"""`manage.py bench peers`: the same work through QueueAdmin and through the peers a Django team
would otherwise pick, each configured for throughput as its own documentation recommends, with
the same number of worker processes, interleaved over several runs.

Two workloads: no-op tasks (each only notes that it ran) and the realistic work of `bench
workload` (`workload.draw_work`, replayed identically). Systems:

- QueueAdmin at its defaults (concurrency 100), and with its queue uncapped (1,000,000);
- bare django-q2 with the ORM broker (queueadmin/settings_bare_django_q2.py), one `async_task`
  per task: django-q2 has no batch enqueue (`async_iter` calls `async_task` once per item);
- procrastinate through its Django integration (queueadmin/settings_peer_procrastinate.py),
  enqueued with `batch_defer`, one `procrastinate worker` process per worker process;
- django-tasks-db, django.tasks' database backend (queueadmin/settings_peer_tasks_db.py), one
  `enqueue` per task (django.tasks has no batch API), one `db_worker` process per worker process.

procrastinate and django-tasks-db each run on a database of their own, named after the bench's
(`<name>_procrastinate`, `<name>_tasks_db`), created and migrated here with the peer's settings.
Every task that returns appends a line to a completions file of its measurement, so completions
are counted outside each system; failures are counted from each system's own records. A
measurement is timed from the first enqueue until `share` of the tasks (first attempts for
QueueAdmin) ended.
"""

import json
import math
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from queues.bench import processes
from queues.bench import workload as bench_workload
from queues.bench.scenarios import Report
from queues.models import Attempt, Queue

WORKLOADS = ("no-op", "realistic")
SYSTEMS = {
    "queueadmin": "QueueAdmin, default concurrency 100",
    "queueadmin-uncapped": "QueueAdmin, concurrency 1,000,000",
    "django-q2": "bare django-q2, async_task per task",
    "procrastinate": "procrastinate, batch_defer",
    "tasks-db": "django-tasks-db, enqueue per task",
}
PEER_SETTINGS = {
    "procrastinate": "queueadmin.settings_peer_procrastinate",
    "tasks-db": "queueadmin.settings_peer_tasks_db",
}
PEER_DATABASE_SUFFIX = {"procrastinate": "procrastinate", "tasks-db": "tasks_db"}
# procrastinate's "Execute multiple jobs at the same time" runs `worker --concurrency=30`; its
# sync tasks run in threads (asgiref's sync_to_async), so sleeping work overlaps within a process.
PROCRASTINATE_CONCURRENCY = 30
# db_worker polls every second by default; a tenth of a second keeps an idle worker from
# sleeping through a backlog without polling in a busy loop.
DB_WORKER_INTERVAL = 0.1
WORKER_COMMANDS = {
    "procrastinate": ["procrastinate", "worker", f"--concurrency={PROCRASTINATE_CONCURRENCY}"],
    # --no-reload: its documentation advises against the autoreloader (the default under DEBUG)
    # in production; -v 0 drops its line per task, as the product's settings drop django-q2's.
    "tasks-db": ["db_worker", f"--interval={DB_WORKER_INTERVAL}", "--no-reload", "-v", "0"],
}
PEER_TABLES = {
    "procrastinate": "TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE",
    "tasks-db": "TRUNCATE django_tasks_database_dbtaskresult",
}
PEER_FAILED = {
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'",
    "tasks-db": "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'FAILED'",
}
BARE_FUNC = "queues.bench.workload.bare_work"
NOTES = [
    "QueueAdmin is the only one of these systems that is fair across accounts: its selector "
    "shares every queue's capacity among the tenants with work; the peers run tasks in "
    "arrival order.",
    "Not like for like: QueueAdmin enqueues 1,000 items per call and runs up to 60 items per "
    "django-q2 task (one thread each); procrastinate enqueues with batch_defer (1,000 per call), "
    "bare django-q2 and django-tasks-db one task per call, as neither has a batch API.",
]


@dataclass
class Measured:
    rate: float
    returned: int  # counted in the completions file
    failed: int  # counted in the system's own records


def run_peers(*, items: int, clusters: int, runs: int, accounts: int, systems: list[str],
              share: float, log=print) -> Report:
    workers = settings.Q_CLUSTER["workers"]
    report = Report("peers", {"items": items, "clusters": clusters,
                              "worker processes": clusters * workers, "runs": runs,
                              "accounts": accounts, "finished share": share,
                              "systems": ",".join(systems)})
    report.notes.extend(NOTES)
    scratch = Path(tempfile.mkdtemp(prefix="queueadmin-peers-"))
    work = {"no-op": [{"ms": 0, "fail": ""}] * items, "realistic": bench_workload.draw_work(items)}
    for name, tasks in work.items():
        (scratch / f"{name}.json").write_text(json.dumps(tasks))
    for peer in PEER_SETTINGS.keys() & set(systems):
        _prepare_database(peer, log)
    others = list(Queue.objects.filter(paused=False).values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)
    measured: dict[tuple[str, str], list[Measured]] = {}
    run_id = f"p{int(time.time()):x}"
    try:
        for run in range(runs):
            # Each run starts with another system, so none always runs on the freshest machine.
            order = systems[run % len(systems):] + systems[:run % len(systems)]
            for workload in WORKLOADS:
                for system in order:
                    completions = scratch / f"{run}-{workload}-{system}.txt"
                    completions.touch()
                    result = _measure(system, work[workload], scratch / f"{workload}.json",
                                      completions, clusters=clusters,
                                      processes_count=clusters * workers, accounts=accounts,
                                      share=share, key=f"{run_id}-{run}-{workload}-{system}",
                                      log=log)
                    log(f"run {run + 1}, {workload}, {system}: {result.rate:.1f} tasks/s, "
                        f"{result.returned} returned, {result.failed} failed")
                    measured.setdefault((workload, system), []).append(result)
    finally:
        Queue.objects.filter(pk__in=others).update(paused=False)
    for workload in WORKLOADS:
        for system in systems:
            results = measured[(workload, system)]
            rates = [r.rate for r in results]
            label = f"{workload}: {SYSTEMS[system]}"
            report.add(f"{label}, min", min(rates), "tasks/s")
            report.add(f"{label}, median", statistics.median(rates), "tasks/s")
            report.add(f"{label}, max", max(rates), "tasks/s")
            report.add(f"{label}, fewest returned in a run", min(r.returned for r in results),
                       "tasks")
            report.add(f"{label}, most failed in a run", max(r.failed for r in results), "tasks")
    return report


def _measure(system, work, work_file, completions, *, clusters, processes_count, accounts,
             share, key, log) -> Measured:
    if system in ("queueadmin", "queueadmin-uncapped"):
        queue = bench_workload._queue(key, completions,
                                      1_000_000 if system == "queueadmin-uncapped" else None)
        try:
            rate = bench_workload._backlog(queue, work, clusters, accounts, log, share=share)
        finally:
            _clear_broker()
        failed = Attempt.objects.filter(item__queue=queue, number=1).exclude(
            outcome="complete").count()
        return Measured(rate, _returned(completions), failed)
    if system == "django-q2":
        from django_q.models import Task

        before = timezone.now()
        try:
            rate = bench_workload._bare(work, clusters, completions, log, share=share)
        finally:
            _clear_broker()
        failed = Task.objects.filter(func=BARE_FUNC, success=False, started__gte=before).count()
        return Measured(rate, _returned(completions), failed)
    return _peer(system, work_file, len(work), completions, processes_count, share, log)


def _peer(peer, work_file, count, completions, processes_count, share, log) -> Measured:
    url = _peer_url(peer)
    env = {"DJANGO_SETTINGS_MODULE": PEER_SETTINGS[peer], "DATABASE_URL": url}
    with _connect(url) as db:
        db.execute(PEER_TABLES[peer])
        output = (completions.parent / f"{peer}.log").open("ab")
        since = timezone.now()
        running = [processes.start_manage(*WORKER_COMMANDS[peer], env=env, log=output)
                   for _ in range(processes_count)]
        try:
            if not processes.wait_for(lambda: _ready(db, peer, since) >= processes_count, 60):
                raise RuntimeError(f"{peer}: {processes_count} workers did not start (see "
                                   f"{output.name})")
            started = json.loads(processes.run_manage(
                "peer_enqueue", peer, str(work_file), str(completions), env=env
            ).splitlines()[-1])["started"]
            target = math.ceil(share * count)

            def ended() -> int:
                return _returned(completions) + _failed(db, peer)

            done = processes.wait_for(lambda: ended() >= target, 900, interval=0.1)
            elapsed = time.time() - started
        finally:
            # The measurement is over: the tables are emptied before the next one, and a
            # graceful stop would wait for the realistic work's longest tasks.
            processes.stop(running, signal.SIGKILL)
            output.close()
        if not done:
            raise RuntimeError(f"{peer}: {ended()} of {target} tasks ended in 900 s")
        log(f"{peer}: {target} tasks in {elapsed:.1f} s")
        return Measured(target / elapsed, _returned(completions), _failed(db, peer))


def _ready(db, peer, since) -> int:
    """Worker processes ready to take tasks: procrastinate registers its workers in a table;
    a db_worker keeps its (persistent) connection once it has polled."""
    if peer == "procrastinate":
        return db.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0]
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid() AND backend_start >= %s",
                      [since]).fetchone()[0]


def _failed(db, peer) -> int:
    return db.execute(PEER_FAILED[peer]).fetchone()[0]


def _returned(completions: Path) -> int:
    """First attempts that returned, from the completions file ("item attempt" lines)."""
    return sum(1 for line in completions.read_text().splitlines() if line.endswith(" 1"))


def _clear_broker():
    """Nothing one django-q2 system left queued (a batch, a selector tick, a bare task) may run
    in the next system's workers; the bench's other queues are paused meanwhile."""
    from django_q.models import OrmQ

    OrmQ.objects.all().delete()


def _peer_url(peer: str) -> str:
    name = connection.settings_dict["NAME"]
    return processes.database_url().rsplit("/", 1)[0] + f"/{_peer_database(peer, name)}"


def _peer_database(peer: str, name: str) -> str:
    return f"{name}_{PEER_DATABASE_SUFFIX[peer]}"[:63]


def _connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True, application_name="queueadmin-bench-peers")


def _prepare_database(peer: str, log):
    """The peer's own database, created when missing and migrated with the peer's settings."""
    from psycopg import sql

    name = _peer_database(peer, connection.settings_dict["NAME"])
    with _connect(_peer_url(peer).rsplit("/", 1)[0] + "/postgres") as server:
        if not server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log(f"created database {name} for {peer}")
    processes.run_manage("migrate", "--noinput", "-v", "0",
                         env={"DJANGO_SETTINGS_MODULE": PEER_SETTINGS[peer],
                              "DATABASE_URL": _peer_url(peer)})
