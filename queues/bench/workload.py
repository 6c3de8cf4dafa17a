"""`manage.py bench workload`: QueueAdmin on realistic work at its default settings, against
bare django-q2 in the same run.

The work is drawn once and replayed in every phase: handler times from a long-tailed
(log-normal) distribution with a median of 50 ms and a few items past half the task timeout,
5% of items failing retryably on their first attempt and 1% permanently. Every handler run that
returns appends a line to a completions file, so executions are counted independently of what
the database recorded. Phases, each on a queue of its own with the default settings:

1. a freshly started pair of clusters: seconds until the waiting item is dispatched;
2. an idle queue fed one item every 0.25 s for a few minutes (tick boundaries included):
   enqueue-to-dispatch and enqueue-to-start percentiles;
3. a backlog at the default concurrency (100), then 4. at a concurrency of 1,000,000: items
   per second until 99% of first attempts have ended (the tail would only measure itself),
   the pair interleaved `--runs` times (3) and reported as min, median and max;
5. a backlog with one cluster killed (kill -9) when 30% are done: how long the queue stood
   still, when the killed cluster's items were rescued, then every item driven to its end
   (retries come back after the default 2-minute backoff): lost items and handler executions
   repeated after completion, both of which must be 0;
6. bare django-q2 (queueadmin/settings_bare_django_q2.py: poll 0.1 s, results not saved, same
   clusters and workers), one task per item doing the same work.
"""

import math
import random
import signal
import socket
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from django.db.models import Min
from django.utils import timezone

from queues.bench import processes
from queues.bench.scenarios import Report, bench_queue, percentile
from queues.engine import handlers, lifecycle
from queues.models import Attempt, Item, ItemEvent, Queue, Status

TERMINAL = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)
IN_FLIGHT = (Status.DISPATCHED, Status.RUNNING)
BARE_SETTINGS = "queueadmin.settings_bare_django_q2"
MEDIAN_MS = 50
SIGMA = 1.0
LONGEST_USUAL_MS = 30_000
TAIL_RATE = 0.001
TAIL_MS = (155_000, 170_000)  # past half the default task timeout of 300 s
RETRY_RATE = 0.05
PERMANENT_RATE = 0.01
FINISHED_SHARE = 0.99
TRICKLE_SECONDS = 0.25
KILL_AT_SHARE = 0.3


def draw_work(count: int, seed: int = 17) -> list[dict]:
    rng = random.Random(seed)
    work = []
    for _ in range(count):
        if rng.random() < TAIL_RATE:
            ms = rng.uniform(*TAIL_MS)
        else:
            ms = min(rng.lognormvariate(math.log(MEDIAN_MS), SIGMA), LONGEST_USUAL_MS)
        roll = rng.random()
        fail = ("always" if roll < PERMANENT_RATE
                else "first" if roll < PERMANENT_RATE + RETRY_RATE else "")
        work.append({"ms": round(ms, 1), "fail": fail})
    return work


def bare_work(number: int, work: dict, completions_file: str):
    """The bare django-q2 peer's task: the same work as the workload handler."""
    handlers.run_work(work, 1)
    handlers.note_completion(completions_file, f"bare-{number}", 1)


def run_workload(*, items: int, clusters: int, accounts: int, trickle_seconds: float,
                 drain_timeout: float, runs: int = 3, log=print) -> Report:
    report = Report("workload", {"items": items, "clusters": clusters, "accounts": accounts,
                                 "trickle_seconds": trickle_seconds, "runs": runs})
    work = draw_work(items)
    tail = sum(1 for w in work if w["ms"] >= TAIL_MS[0])
    log(f"work: {items} items, median {percentile([w['ms'] for w in work], 0.5):.0f} ms, "
        f"p99 {percentile([w['ms'] for w in work], 0.99):.0f} ms, {tail} past "
        f"{TAIL_MS[0] // 1000} s")
    others = list(Queue.objects.filter(paused=False).values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)
    completions = Path(tempfile.mkdtemp(prefix="queueadmin-workload-")) / "completions.txt"
    completions.touch()
    run = f"w{int(time.time()):x}"
    try:
        _fresh_start_and_trickle(report, run, clusters, accounts, trickle_seconds, completions,
                                 log)
        _ratio(report, run, work, clusters, accounts, runs, completions, log)
        _kill_drill(report, _queue(f"{run}-kill", completions, None), work, clusters, accounts,
                    drain_timeout, log)
        after_recorded, before_recorded = _repeated(completions)
        report.add("handler executions repeated after their completion was recorded",
                   after_recorded, "executions")
        report.add("kill -9: handler returned, cluster killed before recording it, run again",
                   before_recorded, "executions")
        report.add("bare django-q2 throughput", _bare(work, clusters, completions, log),
                   "tasks/s")
    finally:
        Queue.objects.filter(pk__in=others).update(paused=False)
    return report


def _ratio(report, run, work, clusters, accounts, runs, completions, log):
    """The default concurrency against an uncapped one, interleaved `runs` times: one pair of
    runs scattered from 0.77 to 0.95 on one machine in one hour, mostly in the uncapped run."""
    rates = {100: [], 1_000_000: []}
    for number in range(runs):
        for concurrency in rates:
            queue = _queue(f"{run}-{number}-c{concurrency}", completions,
                           None if concurrency == 100 else concurrency)
            rates[concurrency].append(_backlog(queue, work, clusters, accounts, log))
    for concurrency, label in ((100, "default concurrency 100"),
                               (1_000_000, "concurrency 1,000,000")):
        report.add(f"throughput, {label}, median", statistics.median(rates[concurrency]),
                   "items/s")
        report.add(f"throughput, {label}, min", min(rates[concurrency]), "items/s")
        report.add(f"throughput, {label}, max", max(rates[concurrency]), "items/s")
    report.add("default / 1,000,000 concurrency, medians",
               statistics.median(rates[100]) / statistics.median(rates[1_000_000]), "ratio")
    report.add("default / 1,000,000 concurrency, lowest of the runs' pairs",
               min(a / b for a, b in zip(rates[100], rates[1_000_000], strict=True)), "ratio")


def _queue(key: str, completions: Path, concurrency: int | None) -> Queue:
    """A queue with the default settings but its handler (and a concurrency, if given)."""
    fields = {"handler": "workload", "handler_options": {"completions_file": str(completions)},
              "paused": False}
    if concurrency is not None:
        fields["concurrency"] = concurrency
    return bench_queue(key[:64], **fields)


def _enqueue(queue: Queue, work: list[dict], accounts: int, prefix: str = "item"):
    for offset in range(0, len(work), lifecycle.BATCH_LIMIT):
        lifecycle.enqueue_many(queue.key, [
            {"account": f"tenant-{(offset + n) % accounts:03d}",
             "identifier": f"{prefix}-{offset + n}", "payload": w}
            for n, w in enumerate(work[offset:offset + lifecycle.BATCH_LIMIT])
        ], actor="bench")


def _first_attempts_ended(queue: Queue) -> int:
    return Attempt.objects.filter(item__queue=queue, number=1).count()


def _fresh_start_and_trickle(report, run, clusters, accounts, seconds, completions, log):
    queue = _queue(f"{run}-latency", completions, None)
    _enqueue(queue, [{"ms": 1, "fail": ""}], accounts, prefix="waiting")
    started = time.perf_counter()
    running = [processes.start_manage("qcluster") for _ in range(clusters)]
    try:
        processes.wait_for(lambda: Item.objects.filter(queue=queue).exclude(
            dispatched_at=None).exists(), 120, interval=0.05)
        report.add("fresh clusters: first dispatch after start", time.perf_counter() - started,
                   "s")
        log(f"trickle: one item every {TRICKLE_SECONDS} s for {seconds:.0f} s")
        rng = random.Random(5)
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            _enqueue(queue, [{"ms": round(rng.lognormvariate(math.log(MEDIAN_MS), SIGMA), 1),
                              "fail": ""}], accounts, prefix=f"trickle-{n}")
            n += 1
            time.sleep(TRICKLE_SECONDS)
        processes.wait_for(lambda: not Item.objects.filter(queue=queue).exclude(
            status__in=TERMINAL).exists(), 120)
    finally:
        processes.stop_clusters(running)
        Queue.objects.filter(pk=queue.pk).update(paused=True)
    created = dict(Item.objects.filter(queue=queue, identifier__startswith="trickle-")
                   .values_list("pk", "created_at"))
    for transition, label in (("dispatched", "dispatch"), ("started", "start")):
        firsts = dict(ItemEvent.objects.filter(item_id__in=created, transition=transition)
                      .values("item_id").annotate(at=Min("at")).values_list("item_id", "at"))
        waits = [(firsts[pk] - at).total_seconds() for pk, at in created.items() if pk in firsts]
        report.add(f"idle queue: enqueue to {label} p50", percentile(waits, 0.5), "s")
        report.add(f"idle queue: enqueue to {label} p99", percentile(waits, 0.99), "s")
        report.add(f"idle queue: enqueue to {label} max", max(waits), "s")


def _backlog(queue: Queue, work: list[dict], clusters: int, accounts: int, log,
             share: float = FINISHED_SHARE) -> float:
    """Items per second from the first enqueue, clusters up, until `share` of first attempts
    end (99% by default)."""
    running = processes.start_clusters(clusters)
    try:
        started = time.perf_counter()
        _enqueue(queue, work, accounts)
        target = math.ceil(share * len(work))
        processes.wait_for(lambda: _first_attempts_ended(queue) >= target, 900, interval=0.1)
        elapsed = time.perf_counter() - started
    finally:
        processes.stop_clusters(running)
        Queue.objects.filter(pk=queue.pk).update(paused=True)
    log(f"{queue.key}: {target} first attempts in {elapsed:.1f} s")
    return target / elapsed


def _kill_drill(report, queue, work, clusters, accounts, drain_timeout, log):
    running = processes.start_clusters(max(2, clusters))
    by_cluster = {f"{socket.gethostname()[:90]}:{p.pid}": p for p in running}
    doomed = None
    try:
        _enqueue(queue, work, accounts)
        processes.wait_for(lambda: _first_attempts_ended(queue) >= KILL_AT_SHARE * len(work),
                           600, interval=0.1)
        # The cluster holding the most of the queue's items in flight.
        held_by = Counter(Item.objects.filter(queue=queue, status__in=IN_FLIGHT).exclude(
            cluster="").values_list("cluster", flat=True))
        doomed_cluster = max(by_cluster, key=lambda cluster: held_by[cluster])
        doomed = by_cluster[doomed_cluster]
        processes.stop([doomed], signal.SIGKILL)
        killed_at = timezone.now()
        held = Item.objects.filter(queue=queue, status__in=IN_FLIGHT, cluster=doomed_cluster)
        log(f"killed cluster {doomed_cluster} holding {held.count()} items")
        processes.wait_for(lambda: not held.exists(), 300)
        report.add("kill -9: killed cluster's items rescued after",
                   (timezone.now() - killed_at).total_seconds(), "s")
        processes.wait_for(lambda: not Item.objects.filter(queue=queue).exclude(
            status__in=TERMINAL).exists(), drain_timeout, interval=1)
    finally:
        processes.stop_clusters([p for p in running if p is not doomed])
        processes.stop([p for p in running if p is doomed], signal.SIGKILL)
        Queue.objects.filter(pk=queue.pk).update(paused=True)
    # While the backlog lasts (first attempts), the longest time nothing started.
    starts = sorted(ItemEvent.objects.filter(queue_id=queue.pk, transition="started", attempt=1,
                                             at__gte=killed_at).values_list("at", flat=True))
    gaps = [(b - a).total_seconds() for a, b in zip([killed_at, *starts], starts, strict=False)]
    report.add("kill -9: longest time the backlog stood still after the kill", max(gaps or [0]),
               "s")
    statuses = Counter(Item.objects.filter(queue=queue).values_list("status", flat=True))
    log(f"after the kill drill: {dict(statuses)}")
    report.add("kill -9: items lost (not ended)",
               sum(n for status, n in statuses.items() if status not in TERMINAL), "items")
    report.add("kill -9: items complete", statuses[Status.COMPLETE], "items")


def _repeated(completions: Path) -> tuple[int, int]:
    """Handler runs that returned for an item that had returned before: (after the earlier
    completion was recorded, which must never happen; in the instant between an earlier
    return and its recording, when kill -9 took the process: at-least-once, unavoidable)."""
    runs: dict[int, list[int]] = {}
    for line in completions.read_text().splitlines():
        if not line.startswith("bare-"):
            item, attempt = map(int, line.split())
            runs.setdefault(item, []).append(attempt)
    repeated = {item: sorted(attempts) for item, attempts in runs.items() if len(attempts) > 1}
    recorded = set(Attempt.objects.filter(item_id__in=repeated, outcome="complete")
                   .values_list("item_id", "number"))
    after = sum(1 for item, attempts in repeated.items()
                for earlier in attempts[:-1] if (item, earlier) in recorded)
    return after, sum(len(a) - 1 for a in repeated.values()) - after


def _bare(work: list[dict], clusters: int, completions: Path, log,
          share: float = FINISHED_SHARE) -> float:
    from django_q.models import Task
    from django_q.tasks import async_task

    running = processes.start_clusters(clusters, env={"DJANGO_SETTINGS_MODULE": BARE_SETTINGS})
    before = timezone.now()

    def ended() -> int:
        returned = sum(1 for line in completions.read_text().splitlines()
                       if line.startswith("bare-"))
        return returned + Task.objects.filter(func="queues.bench.workload.bare_work",
                                              success=False, started__gte=before).count()

    try:
        started = time.perf_counter()
        for number, task_work in enumerate(work):
            async_task("queues.bench.workload.bare_work", number, task_work, str(completions))
        target = math.ceil(share * len(work))
        processes.wait_for(lambda: ended() >= target, 900, interval=0.2)
        elapsed = time.perf_counter() - started
    finally:
        processes.stop_clusters(running)
    log(f"bare django-q2: {target} tasks in {elapsed:.1f} s")
    return target / elapsed
