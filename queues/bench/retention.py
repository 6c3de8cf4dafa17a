"""`manage.py bench retention`: the sweeper's retention catching up on a seeded database.

Every queue's retention is shortened (to a day by default: the seed spreads finished items over
30 days, so nearly all of them are past it), then the sweeper's steps run back to back in a
child process, as its 5-minute schedule runs them, until nothing is left or time is up. The
child times every statement it sends and asks PostgreSQL to log any over 200 ms
(log_min_duration_statement); this process times selector rounds on a seeded queue meanwhile
and, before, the same rounds idle. Table sizes are read before and after.
"""

import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from django.db import connection
from django.db.models import Count

from queues.bench import processes
from queues.bench.scenarios import (
    RESULTS_DIR,
    Report,
    _time_rounds,
    _vacuum_items,
    percentile,
    timing_settings,
)
from queues.models import FINISHED_STATUSES, Attempt, DeadLetter, Item, ItemEvent, Queue

SLOW_STATEMENT_MS = 200
TABLES = (Item, ItemEvent, Attempt, DeadLetter)
CHILD_SCRIPT = ("import sys, django; django.setup(); from queues.bench import retention; "
                "retention.prune_until_done(float(sys.argv[1]), sys.argv[2])")


def prune_until_done(minutes: float, out_path: str):
    """In a child process: sweeper steps until nothing is left past retention or `minutes`
    pass; writes each step's milliseconds, every statement's milliseconds over 50 and the
    longest, and what the steps changed."""
    from queues.engine import sweeper

    with connection.cursor() as cursor:
        cursor.execute("SET log_min_duration_statement = %s", [SLOW_STATEMENT_MS])
    statements: list[float] = []

    def timed(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            statements.append((time.perf_counter() - started) * 1000)

    steps, changed = [], {}
    deadline = time.monotonic() + minutes * 60
    with connection.execute_wrapper(timed):
        while time.monotonic() < deadline:
            started = time.perf_counter()
            counts, more = sweeper.step()
            steps.append((time.perf_counter() - started) * 1000)
            for name, n in counts.items():
                changed[name] = changed.get(name, 0) + n
            if not more:
                break
    Path(out_path).write_text(json.dumps({
        "steps": steps, "changed": changed, "statements": len(statements),
        "longest_statement": max(statements, default=0.0),
        "statements_over_200ms": sum(1 for ms in statements if ms > SLOW_STATEMENT_MS),
        "finished": time.monotonic() < deadline}))


def run_retention(*, retention_days: int, minutes: float, selector_queue: str,
                  selector_rounds: int, log=print) -> Report:
    if connection.vendor != "postgresql":
        raise RuntimeError("bench retention needs PostgreSQL (it reads table sizes and the "
                           "server's slow-statement log)")
    report = Report("retention", {"retention_days": retention_days, "minutes": minutes})
    sel_queue = Queue.objects.filter(key=selector_queue).first()
    if sel_queue is None:
        raise RuntimeError(f"no queue {selector_queue!r}: run `bench seed` first")
    finished = dict(Item.objects.filter(status__in=FINISHED_STATUSES).values_list("status")
                    .annotate(n=Count("id")).values_list("status", "n"))
    report.add("items", Item.objects.count(), "items")
    report.add("finished items", sum(finished.values()), "items")
    for model in TABLES:
        report.add(f"{model._meta.db_table} size before", _size_mb(model), "MB")
    _vacuum_items()
    log_size = _server_log_size()
    with timing_settings(sel_queue):
        idle = _time_rounds(sel_queue, selector_rounds)
        report.add("selector round p50 idle", statistics.median(idle), "ms")
        report.add("selector round p95 idle", percentile(idle, 0.95), "ms")
        elapsed, during, slowest, child, out = _prune_timing_rounds(sel_queue, retention_days,
                                                                    minutes)
    if child.returncode != 0:
        raise RuntimeError(f"the sweeper steps failed (exit {child.returncode})")
    result = json.loads(out.read_text())
    pruned = result["changed"].get("items pruned", 0)
    log(f"retention: {pruned} items pruned in {elapsed:.0f} s, {len(result['steps'])} steps")
    report.add("items pruned", pruned, "items")
    report.add("events deleted row by row", result["changed"].get("item events pruned", 0),
               "events")
    report.add("event partitions dropped whole",
               result["changed"].get("event partitions dropped", 0), "partitions")
    report.add("attempts deleted row by row", result["changed"].get("attempts pruned", 0),
               "attempts")
    report.add("attempt partitions dropped whole",
               result["changed"].get("attempt partitions dropped", 0), "partitions")
    report.add("time to catch up" if result["finished"] else "time (limit reached)",
               elapsed, "s")
    report.add("items pruned per second", pruned / elapsed, "items/s")
    report.add("sweeper step p50 (every queue once)", statistics.median(result["steps"]), "ms")
    report.add("longest statement (client side)", result["longest_statement"], "ms")
    report.add("statements over 200 ms (client side)", result["statements_over_200ms"], "")
    slow_logged = _slow_statements_logged(log_size)
    if slow_logged is not None:
        report.add("statements over 200 ms (PostgreSQL's log)", slow_logged, "")
    if during:
        report.add("selector round p95 during retention", percentile(during, 0.95), "ms")
        report.add("selector round max during retention", max(during), "ms")
        # When, so that the server's log can say what the database was doing meanwhile.
        report.notes.append("slowest selector rounds during retention (ms, in 5 rounds from): " +
                            ", ".join(f"{ms:.0f} at {at:%H:%M:%S} UTC" for ms, at in slowest))
    for model in TABLES:
        report.add(f"{model._meta.db_table} size after (before vacuum)", _size_mb(model), "MB")
    report.notes.append("Deleted rows free their space for reuse after autovacuum; the "
                        "files shrink only with VACUUM FULL or pg_repack.")
    return report


def _prune_timing_rounds(sel_queue: Queue, retention_days: int, minutes: float):
    """Runs the sweeper's steps in a child process with every queue's retention shortened,
    timing selector rounds here until the child ends; the retention is put back, and the child
    stopped if the timing fails."""
    kept = dict(Queue.objects.values_list("pk", "retention_days"))
    Queue.objects.update(retention_days=retention_days)
    out = RESULTS_DIR / "retention-steps.json"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    child = None
    try:
        child = processes.start(["-c", CHILD_SCRIPT, str(minutes), str(out)],
                                {"DJANGO_SETTINGS_MODULE": "queueadmin.settings",
                                 "DEBUG": "false"})
        during: list[float] = []
        slowest: list[tuple[float, datetime]] = []
        while child.poll() is None:
            at = datetime.now(UTC)
            rounds = _time_rounds(sel_queue, 5)
            during.extend(rounds)
            slowest = sorted([*slowest, (max(rounds), at)], reverse=True)[:3]
        elapsed = time.perf_counter() - started
    finally:
        if child is not None and child.poll() is None:
            processes.stop([child])
        for pk, days in kept.items():
            Queue.objects.filter(pk=pk).update(retention_days=days)
    return elapsed, during, slowest, child, out


def _size_mb(model) -> float:
    with connection.cursor() as cursor:
        # A partitioned table's own size is 0: its partitions hold the rows. A plain table
        # has no partition tree.
        cursor.execute("SELECT COALESCE((SELECT SUM(pg_total_relation_size(relid)) FROM "
                       "pg_partition_tree(%s)), pg_total_relation_size(%s))::bigint",
                       [model._meta.db_table] * 2)
        return cursor.fetchone()[0] / 2**20


# Debian's PostgreSQL writes its log here (logging_collector off, stderr redirected).
SERVER_LOG = Path("/var/log/postgresql/postgresql-15-main.log")


def _server_log_size() -> int | None:
    try:
        return SERVER_LOG.stat().st_size
    except OSError:
        return None


def _slow_statements_logged(since_size: int | None) -> int | None:
    """Lines PostgreSQL logged for statements past log_min_duration_statement in this
    database since `since_size`; None where the log cannot be read."""
    if since_size is None:
        return None
    database = connection.settings_dict["NAME"]
    with SERVER_LOG.open(errors="replace") as server_log:
        server_log.seek(since_size)
        return sum(1 for line in server_log if f"@{database} " in line and "duration:" in line)
