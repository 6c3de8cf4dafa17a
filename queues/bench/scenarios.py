"""`manage.py bench`: scenarios that measure QueueAdmin at scale and report figures.

Each scenario returns a Report; the command prints it as a table and writes it as JSON under
var/bench/ so docs/benchmarks.md can quote the latest figures.
"""

import json
import math
import platform
import random
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from queues.bench import processes, seeding
from queues.engine import account_stats, counters, fairness, history, lifecycle, selector
from queues.models import (
    IN_FLIGHT_STATUSES,
    READY_STATUSES,
    AccountStat,
    ErrorGroupHour,
    Item,
    ItemEvent,
    MetricHour,
    MetricMinute,
    Queue,
    SelectorRound,
)

RESULTS_DIR = settings.BASE_DIR / "var" / "bench"


@dataclass
class Report:
    scenario: str
    parameters: dict
    figures: list[tuple[str, float, str]] = field(default_factory=list)
    # What the figures do not say by themselves (what is compared with what), printed below them.
    notes: list[str] = field(default_factory=list)
    # False for a bench that never touches the database (the planner): no server settings.
    on_database: bool = True

    def add(self, name: str, value: float, unit: str):
        self.figures.append((name, round(value, 3), unit))

    def as_table(self) -> str:
        width = max(len(name) for name, _, _ in self.figures) if self.figures else 10
        lines = [f"bench {self.scenario} ({connection.vendor}; "
                 + ", ".join(f"{k}={v}" for k, v in self.parameters.items()) + ")"]
        lines += [f"  {name:<{width}}  {value:>14,.3f}  {unit}" for name, value, unit in
                  self.figures]
        lines += [f"  note: {note}" for note in self.notes]
        server = server_settings() if self.on_database else {}
        if server:
            lines.append("  server: " + ", ".join(f"{k}={v}" for k, v in server.items()))
        if server.get("autovacuum") == "off":
            lines.append("  note: autovacuum is off on this server, as in no production: the "
                         "visibility map stays stale, so exact counts read the heap, and dead "
                         "rows pile up. Turn it on before quoting these figures.")
        return "\n".join(lines)

    def write_json(self, directory: Path | None = None) -> Path:
        directory = directory or RESULTS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.scenario}.json"
        data = asdict(self) | {
            "database": connection.vendor,
            "measured_at": timezone.now().isoformat(),
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
            "server": server_settings() if self.on_database else {},
        }
        path.write_text(json.dumps(data, indent=2))
        return path


SERVER_SETTINGS = ("autovacuum", "shared_buffers", "max_wal_size", "checkpoint_timeout", "jit")


def server_settings() -> dict[str, str]:
    """The PostgreSQL settings the figures depend on most; a CI server may run without
    autovacuum, which makes every count slower than in production."""
    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) "
                       "ORDER BY name", [list(SERVER_SETTINGS)])
        return dict(cursor.fetchall())


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def bench_queue(key: str, **settings_) -> Queue:
    queue, _ = Queue.objects.update_or_create(
        key=key, defaults={"name": key.replace("-", " ").title(), **settings_}
    )
    return queue


def run_seed(*, items: int, accounts: int, queues: int, log=print) -> Report:
    targets = [bench_queue(f"bench-{i}") for i in range(queues)]
    result = seeding.seed(items=items, accounts=accounts, queues=targets, log=log)
    report = Report("seed", {"items": items, "accounts": accounts, "queues": queues})
    for name, seconds in result.seconds.items():
        report.add(f"{name} time", seconds, "s")
    report.add("total time (wall clock)", result.wall_seconds, "s")
    report.add("items per second", items / result.wall_seconds, "items/s")
    for name, rows in result.rows.items():
        report.add(f"{name} rows", rows, "rows")
    return report


def run_enqueue(*, items: int, batch: int, accounts: int) -> Report:
    """Items per second through enqueue_many, batch by batch, as producers call it."""
    queue = bench_queue("bench-enqueue")
    run = f"e{int(time.time() * 1000):x}"
    latencies = []
    started = time.perf_counter()
    for offset in range(0, items, batch):
        rows = [
            {"account": f"acct-{(n * 7919) % accounts:05d}", "identifier": f"{run}-{n}",
             "payload": {"order": n, "amount_cents": n % 100000}}
            for n in range(offset, min(items, offset + batch))
        ]
        t0 = time.perf_counter()
        lifecycle.enqueue_many(queue.key, rows, actor="bench")
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    report = Report("enqueue", {"items": items, "batch": batch, "accounts": accounts})
    report.add("throughput", items / elapsed, "items/s")
    report.add("batch latency p50", statistics.median(latencies) * 1000, "ms")
    report.add("batch latency p95", percentile(latencies, 0.95) * 1000, "ms")
    report.add("total time", elapsed, "s")
    return report


# --- selector ----------------------------------------------------------------------------------

SELECTOR_DATASETS = {
    # name: (items, accounts)
    "1m-items-10k-accounts": (1_000_000, 10_000),
    "100k-items-40-accounts": (100_000, 40),
    "10k-items-1k-accounts": (10_000, 1_000),
}


# What a timed queue is set to: batches of 60, nothing holding the selector back.
# Clusters just started reach their pace in a few seconds; that is not measured.
WORKING_WARM_UP_SECONDS = 5
DEFAULT_CONCURRENCY = Queue._meta.get_field("concurrency").default
SELECTOR_SETTINGS = {"batch_size": 60, "concurrency": 10_000_000, "rate_limit_per_minute": None,
                     "paused": False}


def run_selector(*, datasets: list[str], rounds: int, fairness_rounds: int,
                 queues: list[str] = (), working_clusters: int = 0,
                 working_seconds: float = 60, log=print) -> Report:
    """Round latency on real data, and fairness of plan_batch against the seed's algorithm.
    `queues`: keys of queues already seeded (say by `bench seed --items 10000000`), timed as
    they are instead of the data sets, which get queues of their own. `working_clusters`: that
    many django-q2 clusters work through each queue's backlog for `working_seconds` instead,
    and the figures are the rounds their selector ran meanwhile."""
    report = Report("selector", {"datasets": ",".join(datasets), "queues": ",".join(queues),
                                 "rounds": rounds, "fairness_rounds": fairness_rounds,
                                 "working_clusters": working_clusters,
                                 "working_seconds": working_seconds})
    targets = []
    for key in queues:
        queue = Queue.objects.filter(key=key).first()
        if queue is None or not Item.objects.filter(queue=queue).exists():
            raise ValueError(f"queue {key!r} does not exist or holds no items: seed it first")
        targets.append((key, queue))
    for name in datasets:
        items, accounts = SELECTOR_DATASETS[name]
        queue = bench_queue(f"bench-sel-{name}", **SELECTOR_SETTINGS)
        if not Item.objects.filter(queue=queue).exists():
            log(f"seeding {name} ...")
            seeding.seed(items=items, accounts=accounts, queues=[queue])
        targets.append((name, queue))
    for name, queue in targets:
        _vacuum_items()
        with timing_settings(queue):
            if working_clusters:
                latencies, ended = _rounds_while_working(queue, working_clusters,
                                                         working_seconds)
                report.add(f"{name}: rounds the clusters ran", len(latencies), "rounds")
                report.add(f"{name}: attempts the clusters ended", ended, "items/s")
            else:
                latencies = _time_rounds(queue, rounds)
        log(f"{name}: round p50 {percentile(latencies, 0.5):.1f} ms, "
            f"p95 {percentile(latencies, 0.95):.1f} ms")
        report.add(f"{name}: round p50", percentile(latencies, 0.5), "ms")
        report.add(f"{name}: round p95", percentile(latencies, 0.95), "ms")
        ready = _ready_per_account(queue)
        for label, plan in (("ours", fairness.plan_batch), ("seed", seed_plan_batch)):
            figures = simulate_fairness(plan, ready, queue.batch_size, fairness_rounds)
            for figure, (value, unit) in figures.items():
                report.add(f"{name}: {label} {figure}", value, unit)
    return report


@contextmanager
def timing_settings(queue: Queue):
    """The queue set as SELECTOR_SETTINGS while its rounds are timed, and put back after. A
    freshly seeded queue holds its default concurrency's worth of dispatched and running items
    that no cluster holds, so at its own settings every round would find it full."""
    fields = list(SELECTOR_SETTINGS)
    kept = Queue.objects.filter(pk=queue.pk).values(*fields).get()
    Queue.objects.filter(pk=queue.pk).update(**SELECTOR_SETTINGS)
    queue.refresh_from_db(fields=fields)
    try:
        yield queue
    finally:
        Queue.objects.filter(pk=queue.pk).update(**kept)
        queue.refresh_from_db(fields=fields)


def _time_rounds(queue: Queue, rounds: int) -> list[float]:
    """Milliseconds per selector round (demand, plan, claim, dispatch, cursor, task row). Each
    round's items are put back to ready afterwards, untimed, so every round sees the same
    backlog; the bench's worker tasks are deleted at the end. Rounds that take nothing time
    only the check that the queue is full, paused or empty: that is refused, not reported."""
    from django_q.models import OrmQ

    first_task = OrmQ.objects.order_by("-id").values_list("id", flat=True).first() or 0
    latencies, taken = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        result = selector.run_round(queue)
        latencies.append((time.perf_counter() - started) * 1000)
        taken += len(result.item_ids)
        lifecycle.apply("cancel", result.item_ids, actor="bench")
        lifecycle.apply("requeue", result.item_ids, actor="bench")
        counters.rollup()  # the sweeper's job in production
    OrmQ.objects.filter(id__gt=first_task).delete()
    if rounds and not taken:
        raise RuntimeError(f"the selector's rounds on {queue.key!r} took no items (the queue is "
                           f"full, paused or holds nothing ready): their times would say nothing")
    return latencies


def _rounds_while_working(queue: Queue, clusters: int, seconds: float) -> tuple[list[float],
                                                                                float]:
    """Real clusters (DEBUG off) work through the queue's backlog for `seconds`, every other
    queue paused; returns the durations their selector recorded for the rounds that took
    items in that window, and the attempts that ended per second. The queue gets the default
    concurrency's 100 free slots beside the seed's dispatched and running items, which no
    cluster holds and which would otherwise fill it."""
    others = list(Queue.objects.filter(paused=False).exclude(pk=queue.pk)
                  .values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)
    held = Item.objects.filter(queue=queue, status__in=IN_FLIGHT_STATUSES).count()
    Queue.objects.filter(pk=queue.pk).update(concurrency=held + DEFAULT_CONCURRENCY)
    running = []
    try:
        running = processes.start_clusters(clusters, env={"DEBUG": "false"})
        time.sleep(WORKING_WARM_UP_SECONDS)
        start = timezone.now()
        time.sleep(seconds)
        end = timezone.now()
    finally:
        processes.stop_clusters(running)
        Queue.objects.filter(pk__in=others).update(paused=False)
        Queue.objects.filter(pk=queue.pk).update(concurrency=SELECTOR_SETTINGS["concurrency"])
    durations = list(SelectorRound.objects.filter(
        queue=queue, started_at__gte=start, started_at__lt=end, taken__gt=0)
        .values_list("duration_ms", flat=True))
    ended = ItemEvent.objects.filter(
        queue_id=queue.pk, at__gte=start, at__lt=end,
        transition__in=("completed", "retry_scheduled", "failed")).count()
    return durations, ended / (end - start).total_seconds()


def _vacuum_items():
    """As autovacuum keeps up in production: the dead row versions that seeding and earlier
    runs left (every timed round puts its items back, three versions each) would otherwise be
    measured, and autovacuum would start in the middle of the timing."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM (ANALYZE) {Item._meta.db_table}")


def _ready_per_account(queue: Queue) -> dict[str, int]:
    # Bench set-up only: one aggregate over the ready set to feed the pure simulation.
    return dict(
        Item.objects.filter(queue=queue, status__in=READY_STATUSES)
        .values("account").annotate(n=Count("id")).values_list("account", "n")
    )


class SeedHang(Exception):
    pass


def seed_plan_batch(demand, batch_size, cursor):
    """The seed's allocation, ported faithfully (instasite build service), with its loop
    stopped where the original spins forever."""
    users = [[a, n] for a, n in sorted(demand.items()) if n > 0 and (cursor is None or a > cursor)]
    total = sum(n for _, n in users)
    taken: dict[str, int] = {}
    if not total:
        return taken, cursor  # the original keeps its cursor: accounts before it wait forever
    if total <= batch_size:
        return {a: n for a, n in users}, None
    if len(users) < batch_size:
        count = 0
        while count != batch_size and users:
            share = (batch_size - count) // len(users)
            if share == 0:
                raise SeedHang(f"{len(users)} accounts left and {batch_size - count} slots")
            for user in list(users):
                grant = min(user[1], share)
                taken[user[0]] = taken.get(user[0], 0) + grant
                count += grant
                user[1] -= grant
                if user[1] == 0:
                    users.remove(user)
        return taken, None
    return {a: 1 for a, _ in users[:batch_size]}, users[batch_size - 1][0]


def simulate_fairness(plan, ready: dict[str, int], batch_size: int, rounds: int) -> dict:
    """Rounds of `plan` under a continuous backlog (every account's ready items are replaced as
    they are served, so its demand stays what it is now). Reports Jain's index of the service
    per sliding window of ceil(accounts / batch) rounds (the worst window), the worst wait in
    rounds between two services of an account, and how full batches are."""
    demand = {a: min(n, batch_size) for a, n in ready.items() if n > 0}
    window = math.ceil(len(demand) / batch_size)
    history: list[dict[str, int]] = []
    fills: list[float] = []
    last_served = dict.fromkeys(demand, -1)
    worst_wait = 0
    cursor = None
    figures = {}
    for round_number in range(rounds):
        try:
            taken, cursor = plan(demand, batch_size, cursor)
        except SeedHang:
            figures["hangs at round"] = (round_number, "round (its loop never ends)")
            break
        fills.append(sum(taken.values()) / min(batch_size, sum(demand.values())))
        for account in taken:
            worst_wait = max(worst_wait, round_number - last_served[account] - 1)
            last_served[account] = round_number
        history.append(taken)
    if history:
        # Accounts never served at all wait for the whole run.
        never = [a for a, last in last_served.items() if last < 0]
        if never:
            worst_wait = max(worst_wait, len(history))
        jain = _worst_jain(history, demand, window)
        if jain is not None:
            # A window of ceil(A/B) rounds has up to B-1 slots more than accounts, so some
            # accounts are served twice in it: integrality caps this figure below 1.
            figures["Jain index (worst window)"] = (jain, "index")
        figures["Jain index (whole run)"] = (
            _worst_jain(history, demand, len(history)), "index")
        figures["worst wait"] = (worst_wait, f"rounds (bound {window})")
        figures["batch fill (min)"] = (min(fills), "ratio")
    return figures


def _worst_jain(history: list[dict[str, int]], accounts, window: int) -> float | None:
    """Slides the window one round at a time, updating the sums incrementally: O(batch) per
    step instead of O(accounts * window). None when no whole window was played."""
    if not accounts or len(history) < window:
        return None
    counts = dict.fromkeys(accounts, 0)
    total = squares = 0

    def add(taken: dict[str, int], sign: int):
        nonlocal total, squares
        for account, n in taken.items():
            if account in counts:
                before = counts[account]
                counts[account] = before + sign * n
                total += sign * n
                squares += counts[account] ** 2 - before ** 2

    worst = None
    for index, taken in enumerate(history):
        add(taken, +1)
        if index >= window:
            add(history[index - window], -1)
        if index >= window - 1 and total:
            jain = total * total / (len(counts) * squares)
            worst = jain if worst is None else min(worst, jain)
    return worst


# --- planner -----------------------------------------------------------------------------------

PLANNER_ACCOUNTS = (10_000, 100_000)
PLANNER_DEMAND = 1_000_000  # ready items per account: water levels far above any batch


def run_planner(*, accounts: list[int], batch_size: int, runs: int) -> Report:
    """plan_batch alone (pure Python, no database) on backlogs beyond the seeded data sets, the
    cursor in the middle of the ring: every account with PLANNER_DEMAND ready items, then
    random demands up to PLANNER_DEMAND with random weights 1 to 5."""
    report = Report("planner", {"accounts": ",".join(map(str, accounts)),
                                "batch_size": batch_size, "runs": runs}, on_database=False)
    rng = random.Random(0)  # the same backlogs in every run of the bench
    for count in accounts:
        names = [f"acct-{n:06d}" for n in range(count)]
        cases = {
            f"{count:,} accounts x {PLANNER_DEMAND:,} items": (
                dict.fromkeys(names, PLANNER_DEMAND), None),
            f"{count:,} accounts, random demand and weight": (
                {a: rng.randint(1, PLANNER_DEMAND) for a in names},
                {a: rng.randint(1, 5) for a in names}),
        }
        for name, (demand, weights) in cases.items():
            latencies = []
            for _ in range(runs):
                started = time.perf_counter()
                fairness.plan_batch(demand, batch_size, names[count // 2], weights)
                latencies.append((time.perf_counter() - started) * 1000)
            report.add(f"{name}: p50", percentile(latencies, 0.5), "ms")
            report.add(f"{name}: p95", percentile(latencies, 0.95), "ms")
    return report


# --- throughput --------------------------------------------------------------------------------

def bare_noop(n):
    """The bare django-q2 path's task: one broker task per item, doing nothing."""
    return n


def run_throughput(*, items: int, accounts: int, clusters: int, bare_items: int,
                   timeout: float, log=print) -> Report:
    """End to end with real processes: items enqueued, a selector loop and `clusters` django-q2
    clusters running the noop handler, until every item is complete; then the bare django-q2
    path (one async_task per item) through the same clusters."""
    from django_q.models import OrmQ
    from django_q.status import Stat
    from django_q.tasks import async_task

    report = Report("throughput", {"items": items, "accounts": accounts, "clusters": clusters,
                                   "bare_items": bare_items})
    queue = bench_queue("bench-throughput", handler="noop", batch_size=60,
                        concurrency=100_000, rate_limit_per_minute=None, paused=False)
    others = list(Queue.objects.exclude(pk=queue.pk).filter(paused=False)
                  .values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)  # the clusters' tick skips them
    run = f"t{int(time.time() * 1000):x}"
    started_processes = []
    try:
        started_processes = start_clusters(clusters)
        if not processes.wait_for(lambda: len(Stat.get_all()) >= clusters, 60):
            raise RuntimeError("the worker clusters did not start within a minute")
        before = counters.status_counts([queue.pk])[queue.pk]["complete"]
        # Timed from the first enqueue, with the clusters up: producers and workers overlap.
        started = time.perf_counter()
        for offset in range(0, items, 1000):
            lifecycle.enqueue_many(queue.key, [
                {"account": f"acct-{(n * 7919) % accounts:05d}", "identifier": f"{run}-{n}"}
                for n in range(offset, min(items, offset + 1000))
            ], actor="bench")
        report.add("enqueue", items / (time.perf_counter() - started), "items/s")
        done = processes.wait_for(lambda: counters.status_counts([queue.pk])[queue.pk]["complete"]
                         - before >= items, timeout)
        elapsed = time.perf_counter() - started
        log(f"{items} items {'complete' if done else 'NOT complete'} in {elapsed:.1f} s")
        report.add("queueadmin end to end", items / elapsed if done else 0, "items/s")
        report.add("queueadmin time to drain", elapsed, "s")

        first = OrmQ.objects.order_by("-id").values_list("id", flat=True).first() or 0
        started = time.perf_counter()
        for n in range(bare_items):
            async_task("queues.bench.scenarios.bare_noop", n)
        enqueued = time.perf_counter() - started
        done = processes.wait_for(lambda: not OrmQ.objects.filter(id__gt=first).exists(), timeout)
        elapsed = time.perf_counter() - started
        log(f"{bare_items} bare tasks {'done' if done else 'NOT done'} in {elapsed:.1f} s")
        report.add("bare django-q2 enqueue", bare_items / enqueued, "tasks/s")
        report.add("bare django-q2 end to end", bare_items / elapsed if done else 0, "tasks/s")
    finally:
        processes.stop(started_processes)
        Queue.objects.filter(pk__in=others).update(paused=False)
    return report


def start_clusters(clusters: int, env: dict | None = None,
                   log=None):
    """`clusters` django-q2 clusters as deployed: each starts the selector loop, which its
    schedule keeps going; no selector beside them."""
    return [processes.start_manage("qcluster", env=env, log=log) for _ in range(clusters)]


# --- api ---------------------------------------------------------------------------------------

def run_api(*, batched_items: int, single_items: int, clients: int, server_workers: int,
            log=print) -> Report:
    """Items/s accepted over real HTTP: uvicorn processes on this database, `clients` threads
    posting batches of 1000, then single items, each over a kept-alive connection."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    from queues.engine import tokens

    report = Report("api", {"batched_items": batched_items, "single_items": single_items,
                            "clients": clients, "server_workers": server_workers})
    queue = bench_queue("bench-api", paused=True)  # measured here: the accepting, not the running
    token, secret = tokens.create(f"bench-{time.time_ns()}", queue_keys=[queue.key],
                                  actor="bench")
    port = processes.free_port()
    server = processes.start_web(port, workers=server_workers, env={"DEBUG": "false"})
    url = f"http://127.0.0.1:{port}/api/v1/queues/{queue.key}/items"
    run = f"a{int(time.time() * 1000):x}"
    local = threading.local()

    def post(body) -> float:
        if not hasattr(local, "session"):
            local.session = requests.Session()
            local.session.headers["Authorization"] = f"Bearer {secret}"
        t0 = time.perf_counter()
        response = local.session.post(url, json=body, timeout=60)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"the API answered {response.status_code}: {response.text[:200]}")
        return time.perf_counter() - t0

    def item(n: int) -> dict:
        return {"account": f"acct-{(n * 7919) % 1000:04d}", "identifier": f"{run}-{n}",
                "payload": {"order": n, "amount_cents": n % 100000}}

    def measure(name: str, bodies: list, items: int):
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            latencies = list(pool.map(post, bodies))
        elapsed = time.perf_counter() - started
        log(f"{name}: {items} items in {elapsed:.1f} s")
        report.add(f"{name} throughput", items / elapsed, "items/s")
        report.add(f"{name} request p50", statistics.median(latencies) * 1000, "ms")
        report.add(f"{name} request p95", percentile(latencies, 0.95) * 1000, "ms")

    try:
        post(item(-1))  # warm-up: connections, imports, the token's first use
        measure("batches of 1000", [
            {"items": [item(n) for n in range(offset, min(batched_items, offset + 1000))]}
            for offset in range(0, batched_items, 1000)], batched_items)
        measure("one at a time", [item(batched_items + n) for n in range(single_items)],
                single_items)
    finally:
        processes.stop([server])
        tokens.revoke(token, actor="bench")
    return report


# --- pages -------------------------------------------------------------------------------------

def run_pages(*, queue_key: str, requests: int, log=print) -> Report:
    """Server time of the dashboard pages on a seeded queue: each page requested through
    Django's full request path (middleware, session, view, template; no network) by a signed-in
    Viewer. Reports p50/p95 per page and the SQL statements each page ran."""
    from django.test import override_settings

    from queues.ops.startup import freeze_what_lives_forever
    from queues.web import queries

    freeze_what_lives_forever()  # as the web process does before its first request
    queue = Queue.objects.get(key=queue_key)
    client = _viewer_client()
    now = timezone.now()
    deep = ""
    for _ in range(49):  # the cursor of page 50, walked as a person clicking "Older" would
        data = {"status": [], "cursor": queries.parse_cursor(deep) if deep else None}
        deep = queries.item_page(queue, data, now).next_cursor
    failed, failed_identifier, failed_account = (
        Item.objects.filter(queue=queue, status="failed").order_by("-created_at", "-id")
        .values_list("pk", "identifier", "account").first())
    order = (Item.objects.filter(queue=queue, status="failed").order_by("-created_at", "-id")
             .values_list("payload__order", flat=True).first())
    # The sweeper's account ranking, which the sorted accounts views read: once per sweep.
    refreshes = []
    for _ in range(3):
        started = time.perf_counter()
        ranked = account_stats.refresh(queue)
        refreshes.append((time.perf_counter() - started) * 1000)
    by_wait = queries.accounts_page(queue, {"sort": "wait"}, now).next_query or "sort=wait"
    # The charts and the errors page's trends read the history rollup, which `bench seed`
    # writes; a database seeded before it (or before its error groups) existed gets it here.
    backfill = None
    if not (MetricHour.objects.filter(queue=queue).exists()
            and ErrorGroupHour.objects.filter(queue=queue).exists()):
        started = time.perf_counter()
        history.backfill([queue.pk])
        backfill = time.perf_counter() - started
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        history.run()
        runs.append((time.perf_counter() - started) * 1000)
    base = f"/queues/{queue.key}/"
    pages = {
        "overview": "/",
        "item browser, first page": base,
        "filtered (failed, last 24 h)": f"{base}?status=failed&period=24h",
        "50 pages deep (keyset)": f"{base}?before={deep}",
        "payload field (order = n)": f"{base}?payload=order+%3D+{order}",
        "item detail (failed item)": f"/items/{failed}/",
        "errors view": f"{base}errors/",
        "errors view, 7 d trends": f"{base}errors/?trend=7d",
        "accounts view": f"{base}accounts/",
        "accounts by backlog": f"{base}accounts/?sort=backlog",
        "accounts by oldest wait, page 2 (keyset)": f"{base}accounts/?{by_wait}",
        "dead letters": "/dead-letters/",
        "audit log": "/audit/",
        "alerts (every queue's rules)": "/alerts/",
        "workers": "/workers/",
        "selector and sweeper": "/activity/",
        "live stream page": f"{base}stream/",
        "bulk page": f"{base}bulk/",
        "search by identifier (every queue)": f"/search/?q={failed_identifier}",
        "search by account (every queue)": f"/search/?q={quote(failed_account)}",
        "/metrics (every queue)": "/metrics",
    }
    # The chart fragments the pages load (htmx), from the minutes (24 h) and the hours (7, 30 d).
    on_queue = f"{base}history/"
    fragments = {
        "chart: throughput, 24 h": f"{on_queue}throughput/?range=24h",
        "chart: failures, 24 h": f"{on_queue}failures/?range=24h",
        "chart: depth, 24 h": f"{on_queue}depth/?range=24h",
        "chart: wait time, 24 h": f"{on_queue}wait/?range=24h",
        "chart: run time, 7 d": f"{on_queue}run/?range=7d",
        "chart: throughput, 30 d": f"{on_queue}throughput/?range=30d",
        "chart: wait time, 30 d": f"{on_queue}wait/?range=30d",
        "chart: share of accounts, 30 d": f"{on_queue}accounts/?range=30d",
        "chart: throughput of every queue, 24 h": "/history/throughput/?range=24h",
    }
    report = Report("pages", {"queue": queue_key, "requests": requests,
                              "items": sum(counters.status_counts([queue.pk])[queue.pk]
                                           .values())})
    report.add("account ranking refresh (one queue) p50", percentile(refreshes, 0.5), "ms")
    report.add("accounts ranked", ranked, "accounts")
    report.add("history run (scheduled step, no new events) p50", percentile(runs, 0.5), "ms")
    if backfill is not None:
        report.add("history backfill (one queue, 30 days of events)", backfill, "s")
    log(f"account ranking refresh: p50 {percentile(refreshes, 0.5):.1f} ms, {ranked:,} "
        "accounts")
    htmx = {"HTTP_HX_REQUEST": "true"}
    _time_bulk_preview(report, queue, requests, log)
    with override_settings(QUEUEADMIN={**settings.QUEUEADMIN, "METRICS_TOKEN": "bench-pages"}):
        _time_pages(report, client, [(n, u, {"HTTP_AUTHORIZATION": "Bearer bench-pages"})
                                     for n, u in pages.items()]
                    + [(n, u, htmx) for n, u in fragments.items()], requests, log)
        _time_first_byte(report, client, f"{base}export.csv", requests, log)
    _time_api_reads(report, client, failed, requests, log)
    _time_busy_overview(report, client, requests, log)
    _time_accounts_by_share(report, client, queue, requests, log)
    return report


def _time_api_reads(report: Report, client, item_id: int, requests: int, log):
    """The JSON API's reads as a client holding a token sees them: the list of every queue
    with its counts, and one item. The token is made in a transaction rolled back after the
    timing, so it leaves no token and no audit entry."""
    from queues.engine import tokens

    with transaction.atomic():
        _, secret = tokens.create("bench-pages", all_queues=True, actor="bench")
        bearer = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
        _time_pages(report, client, [
            ("API: queue list (every queue)", "/api/v1/queues", bearer),
            ("API: item (failed item)", f"/api/v1/items/{item_id}", bearer)], requests, log)
        transaction.set_rollback(True)


def _time_accounts_by_share(report: Report, client, queue: Queue, requests: int, log):
    """The accounts page by share of service as the busiest queue sees it. The seed records no
    selector round, so 20 rounds of 1,000 items over 500 accounts each (the most accounts 20
    rounds of the largest batches can serve, 10,000 here) are written in a transaction rolled
    back after the timing."""
    from queues.web import queries

    accounts = list(AccountStat.objects.filter(queue=queue).order_by("account")
                    .values_list("account", flat=True))
    if not accounts:
        return
    now = timezone.now()
    with transaction.atomic():
        SelectorRound.objects.bulk_create(
            SelectorRound(queue=queue, started_at=now - timedelta(seconds=round_number),
                          duration_ms=10, taken=1000, accounts=500,
                          allocation={accounts[(round_number * 500 + n) % len(accounts)]: 2
                                      for n in range(500)})
            for round_number in range(20))
        second = queries.accounts_page(queue, {"sort": "share"}, now).next_query
        log(f"accounts by share: 20 rounds over {min(len(accounts), 10_000):,} accounts")
        base = f"/queues/{queue.key}/accounts/"
        _time_pages(report, client, [
            ("accounts by share of service (20 rounds of 1,000 items)", f"{base}?sort=share", {}),
            ("accounts by share of service, page 2 (keyset)", f"{base}?{second}", {})],
            requests, log)
        transaction.set_rollback(True)


def _time_busy_overview(report: Report, client, requests: int, log):
    """The overview as an installation whose every queue works sees it: the seed's newest
    items finished about an hour ago, so the minutes behind its wait and run times are empty.
    Here every queue gets a full history for those minutes (6,000 items a minute, waiting
    about a second and running about 60 ms), in a transaction rolled back after the timing."""
    from queues.web.queries import TIMING_WINDOW

    last = timezone.now().replace(second=0, microsecond=0)
    minutes = [last - timedelta(minutes=n + 1)
               for n in range(int(TIMING_WINDOW / history.MINUTE))]
    buckets = {"wait_09": 1_000, "wait_10": 4_000, "wait_11": 1_000,
               "run_05": 1_000, "run_06": 4_000, "run_07": 1_000}
    with transaction.atomic():
        queue_ids = list(Queue.objects.values_list("pk", flat=True))
        MetricMinute.objects.filter(account="", start__in=minutes).delete()
        MetricMinute.objects.bulk_create(
            MetricMinute(queue_id=queue_id, account="", start=minute, completed=6_000, **buckets)
            for queue_id in queue_ids for minute in minutes)
        log(f"every queue busy: {len(queue_ids) * len(minutes):,} minutes of history written")
        _time_pages(report, client, [("overview, every queue busy", "/", {})], requests, log)
        transaction.set_rollback(True)


def _time_pages(report: Report, client, pages: list[tuple[str, str, dict]], requests: int,
                log):
    from django.test.utils import CaptureQueriesContext

    for name, url, headers in pages:
        for _ in range(3):  # warm the caches and the connection
            assert client.get(url, **headers).status_code == 200, url
        timings = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(url, **headers)
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, url
        with CaptureQueriesContext(connection) as queries:
            client.get(url, **headers)
        report.add(f"{name} p50", percentile(timings, 0.5), "ms")
        report.add(f"{name} p95", percentile(timings, 0.95), "ms")
        report.add(f"{name} SQL queries", len(queries), "queries")
        log(f"{name}: p50 {percentile(timings, 0.5):.1f} ms, "
            f"p95 {percentile(timings, 0.95):.1f} ms, {len(queries)} queries")


def _time_first_byte(report: Report, client, url: str, requests: int, log):
    """The CSV export's first chunk (header and the first 1,000 rows): what an operator waits
    for before the download starts; the rest streams."""
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        next(iter(response.streaming_content))
        timings.append((time.perf_counter() - started) * 1000)
        # Not closed: closing a response ends the request, whose signal closes this thread's
        # database connection; the generator of the unread rest is simply dropped.
    report.add("CSV export, first byte p95", percentile(timings, 0.95), "ms")
    log(f"CSV export first byte: p50 {percentile(timings, 0.5):.1f} ms, "
        f"p95 {percentile(timings, 0.95):.1f} ms")


def _time_bulk_preview(report: Report, queue: Queue, requests: int, log):
    """The previews the bulk page asks for (the frozen snapshot and its counts): a cancel of
    every queued item of the last 30 days, and the headline task, a retry of every item that
    failed in the last 30 days. Each count is exact, so it reads the heap page of every row
    whose page changed since the last vacuum: the heap fetches are reported beside the time."""
    from queues.engine import bulk

    now = timezone.now()
    for name, kind, status in (("cancel queued", "cancel", "queued"),
                               ("retry failed", "retry", "failed")):
        bulk_filter = bulk.BulkFilter.build(queue, kind, [status], now - timedelta(days=30),
                                            now)
        timings, eligible = [], 0
        # The first reads pages no page view had read yet; it is reported on its own, and the
        # p95 is of warm previews as every page's is.
        for _ in range(1 + max(3, requests // 5)):
            started = time.perf_counter()
            eligible = bulk.preview(bulk_filter).eligible
            timings.append((time.perf_counter() - started) * 1000)
        first, timings = timings[0], timings[1:]
        fetches = _heap_fetches(bulk_filter.frozen(now).items([status]))
        report.add(f"bulk preview ({name}, 30 d), first", first, "ms")
        report.add(f"bulk preview ({name}, 30 d) p95", percentile(timings, 0.95), "ms")
        report.add(f"bulk preview ({name}): items eligible", eligible, "items")
        if fetches is not None:
            report.add(f"bulk preview ({name}): heap fetches of its count", fetches, "pages")
        log(f"bulk preview ({name}) of {eligible:,} items: first {first:.1f} ms, p95 "
            f"{percentile(timings, 0.95):.1f} ms, heap fetches {fetches}")


def _heap_fetches(queryset) -> int | None:
    """How many heap pages an index-only count of `queryset` visited (PostgreSQL): pages the
    visibility map does not mark all-visible, that is, changed since the last vacuum."""
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.values("id").order_by().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM ({sql}) AS q",
                       params)
        plan = cursor.fetchone()[0]
    plan = plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"]
    return _sum_of(plan, "Heap Fetches")


def _sum_of(plan: dict, key: str) -> int:
    return plan.get(key, 0) + sum(_sum_of(child, key) for child in plan.get("Plans", []))


# --- bulk --------------------------------------------------------------------------------------

def _bulk_backlog(queue: Queue, status: str, items: int, days: int, accounts: int = 1000):
    """`items` items in `status` of `accounts` accounts, enqueued over the last `days` days
    (bench set-up only: one INSERT ... SELECT, then the queue's counters set from an exact
    count)."""
    from queues.models import StatusCount

    run = f"b{int(time.time() * 1000):x}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Item._meta.db_table} (queue_id, account, identifier, payload, "
            "priority, status, previous_status, attempts, run_at, last_error, created_at, "
            "updated_at, finished_at) "
            "SELECT %s, 'acct-' || lpad((n %% %s)::text, 4, '0'), %s || '-' || n, '{}', 0, %s, "
            "'', 1, now(), CASE WHEN %s = 'failed' THEN 'partner answered 503' ELSE '' END, "
            "now() - (n::float / %s) * make_interval(days => %s), now(), "
            "CASE WHEN %s = 'failed' THEN now() ELSE NULL END "
            "FROM generate_series(1, %s) AS n",
            [queue.pk, accounts, run, status, status, items, days, status, items])
        # As autovacuum would soon: the planner must know the new rows are there.
        cursor.execute(f"ANALYZE {Item._meta.db_table}")
    for status_, count in counters.exact_counts([queue.pk])[queue.pk].items():
        StatusCount.objects.update_or_create(queue=queue, status=status_,
                                             defaults={"count": count})


def run_bulk_steps(operation_id: int, out_path: str):
    """In a child process, as a django-q2 worker would run them: every step of a bulk
    operation, one after another; writes each step's milliseconds to `out_path` as JSON."""
    from queues.engine import bulk

    steps = []
    while True:
        t0 = time.perf_counter()
        go_on = bulk.step(operation_id)
        steps.append((time.perf_counter() - t0) * 1000)
        if not go_on:
            break
    bulk.after_last_step(operation_id)
    Path(out_path).write_text(json.dumps(steps))


STEPS_SCRIPT = ("import sys, django; django.setup(); from queues.bench import scenarios; "
                "scenarios.run_bulk_steps(int(sys.argv[1]), sys.argv[2])")
BULK_SELECTOR_QUEUE = "bench-sel-1m-items-10k-accounts"


def run_bulk(*, items: int, selector_rounds: int, selector_queue: str = BULK_SELECTOR_QUEUE,
             log=print) -> Report:
    """Bulk retry of `items` failed items in a 7-day range, then bulk cancel of `items` queued
    items, each run step by step in a child process; while they run, selector rounds on a
    selector data set (the 1M-item one unless told) are timed here and compared with its idle
    rounds."""
    if connection.vendor != "postgresql":
        raise RuntimeError("bench bulk needs PostgreSQL")
    report = Report("bulk", {"items": items, "selector_queue": selector_queue})
    sel_queue = Queue.objects.filter(key=selector_queue).first()
    if sel_queue is None:
        raise RuntimeError(f"no queue {selector_queue}: run `bench selector --dataset "
                           f"{selector_queue.removeprefix('bench-sel-')}` first")
    _vacuum_items()
    # The overview served once before, as a web process has: the request after the bulk runs
    # then times what they left in the tables, not the process's first page.
    viewer = _viewer_client()
    assert viewer.get("/").status_code == 200
    now = timezone.now()
    with timing_settings(sel_queue):
        idle = _time_rounds(sel_queue, selector_rounds)
        report.add("selector round p95 idle", percentile(idle, 0.95), "ms")
        operated = [_bulk_operation(report, kind, status, items, now, sel_queue, log)
                    for kind, status in (("retry", "failed"), ("cancel", "queued"))]
    report.add("retry: preview of one account's failures", _account_preview_ms(items, now), "ms")
    _time_overview_after(report, viewer, log)
    # Only after the overview is timed: deleting 100,000 retried (ready) items leaves their
    # entries dead at the head of the ready index, a walk no operator's action causes.
    Item.objects.filter(queue__in=operated).delete()
    return report


def _time_overview_after(report: Report, client, log, requests: int = 20):
    """The overview right after the bulk runs, before vacuum: the entries of the items just
    retried and cancelled are dead in the indexes of their old statuses, which a first reader
    walks."""
    started = time.perf_counter()
    assert client.get("/").status_code == 200
    first = (time.perf_counter() - started) * 1000
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        assert client.get("/").status_code == 200
        timings.append((time.perf_counter() - started) * 1000)
    report.add("overview right after: first request", first, "ms")
    report.add("overview right after: p95 of the next", percentile(timings, 0.95), "ms")
    log(f"overview right after the bulk runs: first {first:.0f} ms, then p95 "
        f"{percentile(timings, 0.95):.1f} ms")


def _viewer_client():
    """Django's test client signed in as a Viewer: the dashboard's full request path (middleware,
    session, view, template), no network."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from queues.permissions import VIEWER

    user, _ = User.objects.get_or_create(username="bench-viewer")
    # Made by migration 0007; a test database flushed between tests no longer has it.
    user.groups.add(Group.objects.get_or_create(name=VIEWER)[0])
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    return client


def _bulk_operation(report: Report, kind: str, status: str, items: int, now, sel_queue: Queue,
                    log) -> Queue:
    """One bulk operation over `items` items in `status` of a queue of its own, previewed,
    started and run step by step in a child process while selector rounds are timed here;
    returns that queue, whose items the caller deletes."""
    from queues.engine import bulk

    queue = bench_queue(f"bench-bulk-{kind}", paused=True)
    Item.objects.filter(queue=queue).delete()
    _bulk_backlog(queue, status, items, days=6)
    started = time.perf_counter()
    bulk_filter = bulk.BulkFilter.build(queue, kind, [status], now - timedelta(days=7),
                                        timezone.now() + timedelta(minutes=1))
    preview = bulk.preview(bulk_filter)
    preview_ms = (time.perf_counter() - started) * 1000
    operation = bulk.start(preview.filter, expected=preview.eligible,
                           filter_hash=preview.filter.digest(), actor="bench")
    # The steps run in a child process, as in a worker; this one times selector rounds
    # meanwhile, so the two do not share an interpreter.
    out = RESULTS_DIR / f"bulk-{kind}-steps.json"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    child = processes.start(["-c", STEPS_SCRIPT, str(operation.pk), str(out)],
                            {"DJANGO_SETTINGS_MODULE": "queueadmin.settings",
                             "DEBUG": "false"})
    during: list[float] = []
    try:
        while child.poll() is None:
            during.extend(_time_rounds(sel_queue, 5))
    finally:
        if child.poll() is None:
            processes.stop([child])
    total = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"the bulk steps failed (exit {child.returncode})")
    steps = json.loads(out.read_text())
    operation.refresh_from_db()
    log(f"bulk {kind}: {operation.changed} changed in {total:.1f} s, {len(steps)} steps")
    report.add(f"{kind}: items changed", operation.changed, "items")
    report.add(f"{kind}: preview", preview_ms, "ms")
    report.add(f"{kind}: total time", total, "s")
    report.add(f"{kind}: longest step (one transaction)", max(steps), "ms")
    report.add(f"{kind}: step p50", statistics.median(steps), "ms")
    if during:
        report.add(f"{kind}: selector round p95 during", percentile(during, 0.95), "ms")
    return queue


def _account_preview_ms(items: int, now) -> float:
    """Median of 3 previews of a retry of `items` failures of one account, written a moment
    before (not yet vacuumed): the totals are per queue and status, so a filter by account
    counts its items in range one by one, the costliest preview there is."""
    from queues.engine import bulk

    queue = bench_queue("bench-bulk-account", paused=True)
    Item.objects.filter(queue=queue).delete()
    _bulk_backlog(queue, "failed", items, days=6, accounts=1)
    bulk_filter = bulk.BulkFilter.build(queue, "retry", ["failed"], now - timedelta(days=7),
                                        timezone.now() + timedelta(minutes=1),
                                        account="acct-0000")
    times = []
    for _ in range(3):
        started = time.perf_counter()
        preview = bulk.preview(bulk_filter)
        times.append((time.perf_counter() - started) * 1000)
    if preview.eligible != items:
        raise RuntimeError(f"the account's preview counted {preview.eligible} of {items} items")
    Item.objects.filter(queue=queue).delete()
    return statistics.median(times)


# --- stream ------------------------------------------------------------------------------------

# PostgreSQL publishes a backend's statistics up to 10 s after it goes idle.
STATS_DELAY = 11
STREAM_DRIVERS = 4  # threads committing transitions: one alone cannot reach 200/s on PostgreSQL


def _database_transactions() -> int | None:
    """Transactions the database has run (every autocommit query is one); None on SQLite, which
    keeps no such statistics. PostgreSQL publishes them with up to a second's delay."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                       "WHERE datname = current_database()")
        return cursor.fetchone()[0] - 1  # this query's own transaction is counted next time


def run_stream(*, events: int, clients: int, rate: float, idle_seconds: float,
               log=print) -> Report:
    """Latency from the commit of a transition to its row arriving at `clients` SSE clients of
    a uvicorn process, while one transition per transaction is driven at `rate` per second
    (items enqueued, dispatched, started, completed: four events each). Also the database
    transactions per second the clients add, idle and busy (PostgreSQL only)."""
    import contextlib
    import re

    import requests
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from queues.models import ItemEvent
    from queues.permissions import VIEWER

    report = Report("stream", {"events": events, "clients": clients, "rate": rate})
    queue = bench_queue("bench-stream", paused=True)  # the driver moves its items itself
    viewers = Group.objects.get(name=VIEWER)
    cookies = []
    for n in range(clients):  # one user each: the per-user cap of open streams stays in force
        user, _ = User.objects.get_or_create(username=f"bench-stream-{n}")
        user.groups.add(viewers)
        browser = Client()
        browser.force_login(user)
        cookies.append(browser.cookies["sessionid"].value)
    items = max(1, events // 4)
    run = f"s{int(time.time() * 1000):x}"

    def drive() -> tuple[dict, float]:
        """Commits one transition per transaction at `rate` in all (DRIVERS threads, each on its
        own connection and at its share of the rate); returns the commit times by
        (item id, event name) and the rate achieved."""
        committed: dict[tuple[int, str], float] = {}
        started = time.perf_counter()

        def driver(offset: int):
            step = 0

            def pace():
                nonlocal step
                delay = started + (offset + step * STREAM_DRIVERS) / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                step += 1

            def apply(action: str, item_id: int, name: str, **kwargs):
                pace()
                lifecycle.apply(action, [item_id], actor="bench", **kwargs)
                committed[(item_id, name)] = time.perf_counter()

            try:
                for n in range(offset, items, STREAM_DRIVERS):
                    pace()
                    item = lifecycle.enqueue_many(queue.key, [
                        {"account": f"acct-{n % 50:02d}", "identifier": f"{run}-{n}"}],
                        actor="bench")[0]
                    committed[(item.pk, "enqueued")] = time.perf_counter()
                    apply("dispatch", item.pk, "dispatched")
                    apply("start", item.pk, "started", expected_attempts={item.pk: 1})
                    apply("complete", item.pk, "completed", expected_attempts={item.pk: 1})
            finally:
                connection.close()

        threads = [threading.Thread(target=driver, args=(n,)) for n in range(STREAM_DRIVERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return committed, len(committed) / (time.perf_counter() - started)

    # The driver alone first: its own transactions, subtracted from the busy figure below.
    time.sleep(STATS_DELAY)  # the set-up's queries are published first
    before = _database_transactions()
    drive()
    time.sleep(STATS_DELAY)
    driver_transactions = (_database_transactions() - before) if before is not None else None

    port = processes.free_port()
    # Every event's own row is timed, so the server shows every row: far above the rate, the
    # row cap never coalesces (bench operators measures what the cap saves).
    server = processes.start_web(port, env={
        "DEBUG": "false", "QUEUEADMIN_STREAM_ROWS_PER_SECOND": str(max(1000, int(rate * 10)))})
    url = f"http://127.0.0.1:{port}/queues/{queue.key}/stream/events/"
    arrivals: list[dict[int, list[float]]] = [{} for _ in range(clients)]
    connected = threading.Barrier(clients + 1)
    stop = threading.Event()
    row_id = re.compile(r'data-event="(\d+)"')

    def listen(index: int):
        with requests.Session() as session, contextlib.suppress(requests.RequestException):
            session.cookies.set("sessionid", cookies[index])
            with session.get(url, stream=True, timeout=(5, 60)) as response:
                response.raise_for_status()
                first = True
                for line in response.iter_lines(chunk_size=None, decode_unicode=True):
                    if first and line.startswith("event: rows"):
                        first = False
                        connected.wait()
                        continue
                    if line.startswith("data: "):
                        now = time.perf_counter()
                        for event_id in row_id.findall(line):
                            arrivals[index].setdefault(int(event_id), []).append(now)
                    if stop.is_set():
                        return

    threads = [threading.Thread(target=listen, args=(n,), daemon=True) for n in range(clients)]
    try:
        for thread in threads:
            thread.start()
        connected.wait(timeout=60)
        log(f"{clients} clients connected; idle for {idle_seconds:.0f} s")
        time.sleep(STATS_DELAY)  # the connections' own queries are not idle traffic
        before = _database_transactions()
        time.sleep(idle_seconds)
        idle = (_database_transactions() - before) / idle_seconds if before is not None else None
        first_event = ItemEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
        before = _database_transactions()
        started = time.perf_counter()
        committed, achieved = drive()
        busy_seconds = time.perf_counter() - started
        time.sleep(STATS_DELAY)  # the last rows arrive, and the statistics are published
        busy = None
        if before is not None:
            busy = (_database_transactions() - before - driver_transactions) / busy_seconds
        stop.set()
    finally:
        processes.stop([server])
    ids = {(item_id, transition): event_id for event_id, item_id, transition in
           ItemEvent.objects.filter(queue_id=queue.pk, id__gt=first_event)
           .values_list("id", "item_id", "transition")}
    latencies, missing, duplicates = [], 0, 0
    for received in arrivals:
        for key, commit_time in committed.items():
            times = received.get(ids[key], [])
            missing += not times
            duplicates += max(0, len(times) - 1)
            if times:
                latencies.append((times[0] - commit_time) * 1000)
    log(f"{len(committed)} events at {achieved:.0f}/s to {clients} clients: "
        f"{missing} missing, {duplicates} duplicates")
    report.add("transitions driven", achieved, "events/s")
    report.add("commit to client p50", percentile(latencies, 0.5), "ms")
    report.add("commit to client p95", percentile(latencies, 0.95), "ms")
    report.add("commit to client max", max(latencies), "ms")
    report.add("events missing at a client", missing, "events")
    report.add("events shown twice at a client", duplicates, "events")
    if idle is not None:
        report.add(f"queries added by {clients} clients, idle", idle, "queries/s")
        report.add(f"queries added by {clients} clients, busy", busy, "queries/s")
    return report
