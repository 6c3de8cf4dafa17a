"""`manage.py bench soak`: resident memory of the web process, the worker clusters and the
selector loop over a long run on a seeded database, and of the web process while it streams a
large export.

A uvicorn process (production settings: DEBUG off) and 2 django-q2 clusters run on this
database. This process enqueues a steady trickle of realistic work, and a signed-in Viewer
opens the dashboard's pages one after another over real HTTP, as a person leaving the overview
open and clicking around would. Every 30 s it reads the resident set size (VmRSS) of every
process: the web process, each cluster's sentinel and workers (the selector loop runs in one of
the workers, which django-q2 replaces after each task timeout). Growth is judged from minute
10 (imports, caches and connection pools are warm by then) to the end.
"""

import csv
import math
import random
import threading
import time
from pathlib import Path

from queues.bench import processes
from queues.bench.scenarios import Report, bench_queue, percentile, start_clusters
from queues.bench.workload import MEDIAN_MS, SIGMA
from queues.engine import lifecycle
from queues.models import Item, Queue, Status

SAMPLE_SECONDS = 30
WARM_MINUTES = 10
TRICKLE_PER_SECOND = 20
PAGE_GAP_SECONDS = 1.0


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    """The process and everything it forked, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _signed_in_session():
    import requests
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from queues.permissions import VIEWER

    user, _ = User.objects.get_or_create(username="bench-soak-viewer")
    user.groups.add(Group.objects.get(name=VIEWER))
    browser = Client()
    browser.force_login(user)
    session = requests.Session()
    session.cookies.set("sessionid", browser.cookies["sessionid"].value, domain="127.0.0.1")
    return session


def run_soak(*, minutes: float, export_queue: str, log=print) -> Report:
    report = Report("soak", {"minutes": minutes, "trickle_per_second": TRICKLE_PER_SECOND,
                             "export_queue": export_queue})
    exported = Queue.objects.filter(key=export_queue).first()
    if exported is None:
        raise RuntimeError(f"no queue {export_queue!r}: run `bench seed` first")
    queue = bench_queue("bench-soak", handler="workload", paused=False)
    others = list(Queue.objects.filter(paused=False).exclude(pk=queue.pk)
                  .values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)  # only the trickle runs
    port = processes.free_port()
    web = processes.start_web(port, env={"DEBUG": "false"})
    clusters = start_clusters(2, env={"DEBUG": "false"})
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    pages_ms: list[float] = []
    errors: list[str] = []
    try:
        session = _signed_in_session()
        threads = [threading.Thread(target=_trickle, args=(queue, stop), daemon=True),
                   threading.Thread(target=_browse, args=(session, base, exported, stop,
                                                          pages_ms, errors), daemon=True)]
        for thread in threads:
            thread.start()
        samples = _sample(web, clusters, minutes, log)
        stop.set()
        for thread in threads:
            thread.join(30)
        export = _export_peak(session, base, web, exported)
    finally:
        stop.set()
        processes.stop_clusters(clusters)
        processes.stop([web])
        Queue.objects.filter(pk__in=others).update(paused=False)
        Queue.objects.filter(pk=queue.pk).update(paused=True)
    warm = next(s for s in samples if s["minute"] >= min(WARM_MINUTES, samples[-1]["minute"]))
    last = samples[-1]
    for role in ("web", "clusters (all processes)", "largest cluster process"):
        report.add(f"{role} RSS at minute {warm['minute']:.0f}", warm[role] / 1024, "MB")
        report.add(f"{role} RSS at the end", last[role] / 1024, "MB")
        report.add(f"{role} growth after minute {warm['minute']:.0f}",
                   100 * (last[role] - warm[role]) / warm[role], "%")
    report.add("items completed during the soak", Item.objects.filter(
        queue=queue, status=Status.COMPLETE).count(), "items")
    report.add("pages opened", len(pages_ms), "requests")
    report.add("page errors", len(errors), "requests")
    if pages_ms:
        report.add("page p95 during the soak", percentile(pages_ms, 0.95), "ms")
    report.add("export: rows", export["rows"], "rows")
    report.add("export: seconds", export["seconds"], "s")
    report.add("export: web RSS before", export["before"] / 1024, "MB")
    report.add("export: web RSS peak while streaming", export["peak"] / 1024, "MB")
    report.notes.append("RSS samples every 30 s: " + ", ".join(
        f"{s['minute']:.0f} min web {s['web'] // 1024} MB / clusters "
        f"{s['clusters (all processes)'] // 1024} MB" for s in samples))
    if errors:
        report.notes.append("first page errors: " + "; ".join(errors[:5]))
    return report


def _sample(web, clusters, minutes: float, log) -> list[dict]:
    started = time.monotonic()
    samples = []
    while True:
        elapsed = (time.monotonic() - started) / 60
        cluster_rss = [rss_kb(pid) or 0 for cluster in clusters
                       for pid in descendants(cluster.pid)]
        sample = {"minute": elapsed, "web": sum(rss_kb(pid) or 0 for pid in descendants(web.pid)),
                  "clusters (all processes)": sum(cluster_rss),
                  "largest cluster process": max(cluster_rss, default=0)}
        samples.append(sample)
        log(f"{elapsed:5.1f} min: web {sample['web'] // 1024} MB, clusters "
            f"{sample['clusters (all processes)'] // 1024} MB")
        if elapsed >= minutes:
            return samples
        time.sleep(min(SAMPLE_SECONDS, max(1.0, (minutes - elapsed) * 60)))


def _trickle(queue: Queue, stop: threading.Event):
    from django.db import connection

    rng, n = random.Random(11), 0
    try:
        while not stop.is_set():
            work = [{"account": f"soak-{rng.randrange(200):03d}",
                     "identifier": f"soak-{time.time_ns()}-{i}",
                     "payload": {"ms": round(min(rng.lognormvariate(math.log(MEDIAN_MS), SIGMA),
                                                 2000), 1), "fail": ""}}
                    for i in range(TRICKLE_PER_SECOND)]
            lifecycle.enqueue_many(queue.key, work, actor="bench")
            n += len(work)
            stop.wait(1.0)
    finally:
        connection.close()


def _browse(session, base: str, queue: Queue, stop: threading.Event, pages_ms: list,
            errors: list):
    """A person with the dashboard open: the overview, then another page, one a second."""
    from django.db import connection

    failed = Item.objects.filter(queue=queue, status=Status.FAILED).values_list(
        "pk", flat=True).first()
    connection.close()
    paths = ["/", f"/queues/{queue.key}/", f"/queues/{queue.key}/?status=failed",
             f"/queues/{queue.key}/errors/", f"/queues/{queue.key}/accounts/", "/dead-letters/",
             "/audit/", "/workers/", *([f"/items/{failed}/"] if failed else [])]
    turn = 0
    while not stop.is_set():
        path = paths[turn % len(paths)] if turn % 2 else "/"
        turn += 1
        started = time.perf_counter()
        try:
            response = session.get(base + path, timeout=30)
            if response.status_code != 200:
                errors.append(f"{path}: {response.status_code}")
        except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
            errors.append(f"{path}: {exc}")
        pages_ms.append((time.perf_counter() - started) * 1000)
        stop.wait(PAGE_GAP_SECONDS)


def _export_peak(session, base: str, web, queue: Queue) -> dict:
    """Streams the queue's whole CSV export (up to its row limit) while sampling the web
    process's RSS every 50 ms."""
    pids = descendants(web.pid)
    before = sum(rss_kb(pid) or 0 for pid in pids)
    peak = [before]
    done = threading.Event()

    def watch():
        while not done.wait(0.05):
            peak.append(sum(rss_kb(pid) or 0 for pid in pids))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    with session.get(f"{base}/queues/{queue.key}/export.csv", stream=True,
                     timeout=600) as response:
        response.raise_for_status()
        # Records, not lines: an error or a payload may hold a newline inside its quoted cell.
        records = csv.reader(response.iter_lines(decode_unicode=True))
        rows = sum(1 for record in records if record and not record[0].startswith("# "))
    done.set()
    watcher.join()
    return {"rows": max(0, rows - 1), "seconds": time.perf_counter() - started,
            "before": before, "peak": max(peak)}
