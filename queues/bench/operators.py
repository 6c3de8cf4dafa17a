"""`manage.py bench operators`: many people on the dashboard while 2 clusters work.

uvicorn (DEBUG off) and `clusters` django-q2 clusters run on this database, working through a
backlog of the `workload` handler's realistic work at the default queue settings. The measured
run has three windows on the same backlog, one after the other:

1. quiet, `seconds / 2`: the clusters alone (the web server up, nobody on it);
2. users, `seconds`: locust (headless, a process of its own, queues/bench/locustfile.py) with
   `users` dashboard users, `streams` of them also holding the queue's live stream open; its
   ramp-up and sign-ins happen before this window and are not measured;
3. quiet again, `seconds / 2`.

Throughput is the attempts that ended (completed, retry scheduled, failed) per second in each
window, from the items' events; the quiet figure is both quiet windows together, so a drift of
the backlog over the run weighs on both sides alike. CPU seconds of every process group (web
server, each cluster with its worker processes, the PostgreSQL backends of this database, locust,
this process) come from /proc/<pid>/stat, sampled twice a second, per window.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from queues.bench import processes
from queues.bench.scenarios import Report, _vacuum_items, bench_queue
from queues.bench.workload import TAIL_MS, _enqueue, draw_work
from queues.models import READY_STATUSES, Item, ItemEvent, Queue

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
TICK_SECONDS = 5  # one request per user this often; every third is another page (15 s)
WARM_UP_SECONDS = 10  # after the clusters start, before the first window (shorter runs: less)
ACCOUNTS = 50
ENDED = ("completed", "retry_scheduled", "failed")
PASSWORD = "bench-operators-pw-1"  # noqa: S105 (users of a bench database, made by the bench)
GOAL_SLOWDOWN = 0.20
CPU_GROUPS = ("web", "cluster 1", "cluster 2", "PostgreSQL backends", "locust", "bench driver")


# --- CPU from /proc ----------------------------------------------------------------------------

class CpuSampler:
    """CPU time of process groups from /proc: a group is every process of a session (our
    children start in sessions of their own, so a cluster's worker processes are in its group),
    the PostgreSQL backends whose title names `database`, and this process. Processes that end
    between samples keep their last sample; the lost part is at most one interval each."""

    def __init__(self, sessions: dict[int, str], database: str, interval: float = 0.5):
        self.sessions = sessions
        self.database = database
        self.interval = interval
        self.seen: dict[int, tuple[str, int]] = {}
        self.marks: dict[str, tuple[dict, float, float, tuple]] = {}
        self.tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._backend = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) ")

    def start(self):
        self._sample()
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def _label(self, pid: int, session: int) -> str | None:
        if pid == os.getpid():
            return "bench driver"
        if session in self.sessions:
            return self.sessions[session]
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        match = self._backend.match(title)
        if match and match.group(1) == self.database:
            return "PostgreSQL backends"
        return None

    def _sample(self):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            session, ticks = int(fields[3]), int(fields[11]) + int(fields[12])
            with self._lock:
                known = self.seen.get(pid)
                label = known[0] if known else self._label(pid, session)
                if label is not None:
                    self.seen[pid] = (label, ticks)

    def mark(self, name: str):
        """Remember every group's CPU time now, with the machine's busy time and load."""
        self._sample()
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = sum(map(int, cpu)) - int(cpu[3]) - int(cpu[4])  # less idle and iowait
        with self._lock:
            self.marks[name] = (dict(self.seen), time.monotonic(), busy / self.tick,
                                os.getloadavg())

    def between(self, *windows: str) -> tuple[dict[str, float], float, float]:
        """CPU seconds per group, the machine's busy CPU seconds and the wall seconds, summed
        over the windows named (each has a "NAME start" and a "NAME end" mark)."""
        groups = dict.fromkeys(CPU_GROUPS, 0.0)
        busy = wall = 0.0
        for name in windows:
            before, t0, busy0, _ = self.marks[f"{name} start"]
            after, t1, busy1, _ = self.marks[f"{name} end"]
            for pid, (label, ticks) in after.items():
                base = before.get(pid, (label, 0))[1]
                groups[label] = groups.get(label, 0.0) + (ticks - base) / self.tick
            busy += busy1 - busy0
            wall += t1 - t0
        return groups, busy, wall


# --- locust ------------------------------------------------------------------------------------

def read_locust_stats(path: Path) -> list[dict]:
    import csv

    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _locust_command() -> list[str]:
    found = shutil.which("locust", path=str(Path(sys.executable).parent)) or \
        shutil.which("locust")
    if found is None:
        raise RuntimeError("locust is not installed: pip install '.[bench]'")
    return [found]


# --- the scenario ------------------------------------------------------------------------------

def _users(count: int) -> list[str]:
    """`count` Viewer users with one password, hashed once (hashing 50 times would take the
    machine for half a minute)."""
    from django.contrib.auth.hashers import make_password
    from django.contrib.auth.models import Group, User

    from queues.permissions import VIEWER

    viewers = Group.objects.get(name=VIEWER)
    encoded = make_password(PASSWORD)
    names = [f"bench-operator-{n:03d}" for n in range(count)]
    for name in names:
        user, _ = User.objects.update_or_create(username=name, defaults={
            "password": encoded, "is_active": True})
        user.groups.add(viewers)
    return names


def _pages(queue: Queue, work: list[dict]) -> list[tuple[str, list[str]]]:
    """The other pages a user opens, by name, each with the URLs it may be (one is picked)."""
    base = f"/queues/{queue.key}/"
    wanted = ([f"item-{n}" for n, w in enumerate(work) if w["fail"] == "always"][:20]
              + [f"item-{n}" for n in range(0, min(len(work), 2000), 100)])
    ids = list(Item.objects.filter(queue=queue, identifier__in=wanted)
               .values_list("pk", flat=True))
    return [
        ("queue page", [base]),
        ("queue page, failed in 24 h", [f"{base}?status=failed&period=24h"]),
        ("queue page, running", [f"{base}?status=running"]),
        ("queue page, one account", [f"{base}?account=tenant-{n:03d}" for n in range(ACCOUNTS)]),
        ("item page", [f"/items/{pk}/" for pk in ids]),
        ("queue errors", [f"{base}errors/"]),
        ("accounts", [f"{base}accounts/"]),
        ("accounts by backlog", [f"{base}accounts/?sort=backlog"]),
        ("dead letters", ["/dead-letters/"]),
        ("audit", ["/audit/"]),
    ]


def _ended(queue: Queue, start, end) -> int:
    return ItemEvent.objects.filter(queue_id=queue.pk, transition__in=ENDED, at__gte=start,
                                    at__lt=end).count()


def run_operators(*, users: int, streams: int, seconds: float, items: int, clusters: int = 2,
                  spawn_rate: float = 2, log=print) -> Report:
    if connection.vendor != "postgresql":
        raise RuntimeError("bench operators needs PostgreSQL (the live stream listens to it)")
    report = Report("operators", {"users": users, "streams": streams, "seconds": seconds,
                                  "items": items, "clusters": clusters})
    # The realistic work without its 155-170 s tail: over a run of minutes those items would
    # pile up at 0.1% of a few hundred items/s and hold most of the concurrency of 100 by the
    # end, so the windows would measure the pile, not the users.
    work = [w if w["ms"] < TAIL_MS[0] else {**w, "ms": 50.0} for w in draw_work(items)]
    run = f"o{int(time.time()):x}"
    others = list(Queue.objects.filter(paused=False).values_list("pk", flat=True))
    Queue.objects.filter(pk__in=others).update(paused=True)
    scratch = Path(tempfile.mkdtemp(prefix="queueadmin-operators-"))
    (scratch / "completions.txt").touch()
    queue = bench_queue(f"operators-{run}", handler="workload", paused=True,
                        handler_options={"completions_file": str(scratch / "completions.txt")})
    started = time.perf_counter()
    _enqueue(queue, work, ACCOUNTS)
    log(f"{items:,} items enqueued in {time.perf_counter() - started:.1f} s")
    # As autovacuum would soon on a machine where it keeps up: without statistics of the new
    # rows the planner takes the queue for nearly empty, and the overview's oldest-waiting
    # query walks every ready item of the queue (about 200 ms per request at 200,000 ready
    # items; seen in a run on a machine whose autovacuum workers were busy elsewhere).
    _vacuum_items()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {ItemEvent._meta.db_table}")
    plan = {"queue": queue.key, "usernames": _users(users), "password": PASSWORD,
            "streams": streams, "seconds": seconds, "tick_seconds": TICK_SECONDS,
            "pages": _pages(queue, work), "ready_file": str(scratch / "ready"),
            "stream_file": str(scratch / "streams.json")}
    (scratch / "plan.json").write_text(json.dumps(plan))
    Queue.objects.filter(pk=queue.pk).update(paused=False)

    port = processes.free_port()
    env = {"DEBUG": "false"}
    web = processes.start_web(port, env=env, log=(scratch / "web.log").open("w"))
    running = [web]
    locust = sampler = None
    windows: dict[str, tuple] = {}
    try:
        running += processes.start_clusters(clusters, env=env)
        sessions = {os.getsid(web.pid): "web"}
        sessions |= {os.getsid(p.pid): f"cluster {n}" for n, p in enumerate(running[1:], 1)}
        sampler = CpuSampler(sessions, connection.settings_dict["NAME"]).start()
        warm_up = min(WARM_UP_SECONDS, seconds / 4)
        log(f"web on port {port}, {clusters} clusters up; warming up {warm_up:.0f} s")
        time.sleep(warm_up)

        def window(name: str, length: float):
            sampler.mark(f"{name} start")
            start = timezone.now()
            time.sleep(length)
            windows[name] = (start, timezone.now())
            sampler.mark(f"{name} end")

        window("quiet before", seconds / 2)
        log(f"quiet window: {_ended(queue, *windows['quiet before']):,} attempts ended; "
            f"starting {users} users")
        locust_log = (scratch / "locust.log").open("w")
        locust = subprocess.Popen(  # noqa: S603 (our own interpreter's locust, fixed arguments)
            [*_locust_command(), "-f", str(LOCUSTFILE), "--headless", "--users", str(users),
             "--spawn-rate", str(spawn_rate), "--host", f"http://127.0.0.1:{port}",
             "--csv", str(scratch / "locust"), "--only-summary", "--exit-code-on-error", "0",
             "--stop-timeout", "5"],
            env=os.environ | {"QUEUEADMIN_LOAD_PLAN": str(scratch / "plan.json")},
            stdout=locust_log, stderr=subprocess.STDOUT, start_new_session=True)
        sampler.sessions[os.getsid(locust.pid)] = "locust"
        ramp = time.perf_counter()
        if not processes.wait_for(lambda: (scratch / "ready").exists()
                                  or locust.poll() is not None, 120 + users / spawn_rate * 4):
            raise RuntimeError(f"the users did not all sign in; see {scratch / 'locust.log'}")
        if locust.poll() is not None:
            raise RuntimeError(f"locust ended early; see {scratch / 'locust.log'}")
        log(f"{users} users signed in after {time.perf_counter() - ramp:.1f} s; measuring "
            f"{seconds:.0f} s")
        window("users", seconds)
        locust.wait(timeout=120)
        time.sleep(2)  # the streams' connections close
        window("quiet after", seconds / 2)
        still_ready = Item.objects.filter(queue=queue, status__in=READY_STATUSES).count()
    finally:
        if sampler is not None:
            sampler.stop()
        if locust is not None and locust.poll() is None:
            processes.stop([locust])
        processes.stop_clusters(running[1:])
        processes.stop([web])
        Queue.objects.filter(pk=queue.pk).update(paused=True)
        Queue.objects.filter(pk__in=others).update(paused=False)

    # --- figures -------------------------------------------------------------------------------
    rows = read_locust_stats(scratch / "locust_stats.csv")
    total = next(row for row in rows if row["Name"] == "Aggregated")
    requests_, failures = int(total["Request Count"]), int(total["Failure Count"])
    report.add("requests", requests_, "requests")
    report.add("request rate", float(total["Requests/s"]), "requests/s")
    report.add("error rate", failures / requests_ if requests_ else 0, "ratio")
    report.add("errors", failures, "requests")
    for row in rows:
        if row["Name"] == "Aggregated" or row["Name"].startswith("sign in") or \
                not int(row["Request Count"]):
            continue
        name = row["Name"]
        report.add(f"{name}: p50", float(row["50%"]), "ms")
        report.add(f"{name}: p95", float(row["95%"]), "ms")
        report.add(f"{name}: requests", int(row["Request Count"]), "requests")
    stream_counts = json.loads((scratch / "streams.json").read_text()) \
        if (scratch / "streams.json").exists() else {}
    report.add("stream: rows received (all streams)", stream_counts.get("rows received", 0),
               "rows")
    report.add("stream: summary rows received (all streams)",
               stream_counts.get("summary rows received", 0), "rows")
    report.add("stream: events counted in those summaries",
               stream_counts.get("events in summaries", 0), "events")
    report.add("stream: ended by the server (reconnected)",
               stream_counts.get("ended by the server", 0), "streams")

    rates = {}
    for name, (start, end) in windows.items():
        rates[name] = _ended(queue, start, end) / (end - start).total_seconds()
    quiet = ((rates["quiet before"] * seconds / 2 + rates["quiet after"] * seconds / 2)
             / seconds)
    report.add("throughput without users (both quiet windows)", quiet, "items/s")
    report.add("throughput without users, before", rates["quiet before"], "items/s")
    report.add("throughput without users, after", rates["quiet after"], "items/s")
    report.add("throughput with users", rates["users"], "items/s")
    slowdown = 1 - rates["users"] / quiet if quiet else 0
    report.add("throughput lost to the users", slowdown, "ratio")
    report.add("items still ready at the end", still_ready, "items")

    for label, names in (("users", ["users"]), ("quiet", ["quiet before", "quiet after"]),
                         ("quiet before", ["quiet before"]), ("quiet after", ["quiet after"])):
        groups, busy, wall = sampler.between(*names)
        for group, cpu in groups.items():
            report.add(f"CPU, {label} window: {group}", cpu, "s")
        report.add(f"CPU, {label} window: whole machine (busy)", busy, "s")
        report.add(f"CPU, {label} window: available (cores x wall)",
                   (os.cpu_count() or 1) * wall, "s")
    for name in ("quiet before start", "users start", "users end"):
        report.add(f"load average (1 min) at {name}", sampler.marks[name][3][0], "load")

    report.notes.append(
        f"throughput = attempts ended per second in each window; the goal is at most "
        f"{GOAL_SLOWDOWN:.0%} lower with the users: "
        + ("met" if slowdown <= GOAL_SLOWDOWN else "NOT met"))
    if not still_ready:
        report.notes.append("the backlog ran dry before the end: the throughput figures are "
                            "lower bounds; run with more --items")
    report.notes.append(f"locust CSV and log: {scratch}")
    if failures:
        report.notes.append(f"{failures} requests failed: see {scratch / 'locust_failures.csv'}")
    log(f"users: {requests_:,} requests, {failures} failed; throughput {rates['users']:.0f} "
        f"items/s with users against {quiet:.0f} without")
    if settings.DEBUG:
        report.notes.append("DEBUG was on in this process (the web and cluster processes ran "
                            "with DEBUG=false)")
    return report
