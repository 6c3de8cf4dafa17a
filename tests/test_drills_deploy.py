"""Fault drills for a scaled-out deployment, with real processes on PostgreSQL: a cluster killed
mid-batch beside a healthy one, PostgreSQL restarted while items flow (on a throwaway cluster
of its own), a worker frozen past the stale threshold, and clusters starting after missed
schedule ticks. Each drill writes its counts to var/drills/<name>.json for docs/reliability.md.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import requests
from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from django_q.models import OrmQ, Schedule, Task

from queues import enqueue_many
from queues.bench import processes
from queues.engine import selector, sweeper
from queues.engine.schedules import SCHEDULES
from queues.models import Attempt, Item, ItemEvent, Queue, Status, SweepRun
from queues.ops.health import SELECTOR_SCHEDULE
from tests.factories import QueueFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TERMINAL = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
RESULTS = Path(settings.BASE_DIR) / "var" / "drills"


def put(queue, n, prefix="drill"):
    for offset in range(0, n, 1000):
        enqueue_many(queue.key, [{"account": f"acct-{i % 7}", "identifier": f"{prefix}-{i}"}
                                 for i in range(offset, min(n, offset + 1000))])


def wait_for(condition, seconds, what="condition", state=None):
    """`state`, if given, says where things stood when the wait ran out: a drill that fails
    once in many runs can then be read from its CI log."""
    assert processes.wait_for(condition, seconds), (
        f"timed out waiting for {what}" + (f"; {state()}" if state else ""))


def history(queue) -> dict[int, list[str]]:
    """Each item's transitions, in order."""
    found: dict[int, list[str]] = {}
    for item_id, transition in ItemEvent.objects.filter(queue_id=queue.pk).order_by(
            "id").values_list("item_id", "transition"):
        found.setdefault(item_id, []).append(transition)
    return found


def report(name: str, **figures):
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(figures, indent=2, default=str))
    return figures


def tally(queue) -> dict:
    statuses = dict(Item.objects.filter(queue=queue).values_list("status")
                    .annotate(n=Count("id")))
    completions = Counter(ItemEvent.objects.filter(queue_id=queue.pk, transition="completed")
                          .values_list("item_id", flat=True))
    return {"enqueued": sum(statuses.values()), "completed": statuses.get(Status.COMPLETE, 0),
            "dead_lettered": statuses.get(Status.FAILED, 0),
            "duplicated": sum(1 for n in completions.values() if n > 1)}


def sweep_until_terminal(queue, seconds):
    """The sweeper's schedule, every 2 s as test-short thresholds need."""
    deadline = time.monotonic() + seconds
    while Item.objects.filter(queue=queue).exclude(status__in=TERMINAL).exists():
        assert time.monotonic() < deadline, "items still not terminal"
        sweeper.run(seconds=5)
        time.sleep(2)


# --- 1. kill -9 one of two clusters --------------------------------------------------------------

def test_kill_9_one_of_two_clusters_mid_batch_the_other_carries_on_and_lost_items_are_rescued():
    items = 300
    queue = QueueFactory(key="drill", handler="demo", batch_size=20, concurrency=60,
                         backoff_seconds=[1], dispatch_timeout=timedelta(seconds=15),
                         stale_threshold=timedelta(seconds=15),
                         handler_options={"min_ms": 1000, "max_ms": 1000, "retry_rate": 0,
                                          "permanent_rate": 0})
    put(queue, items)
    # The doomed cluster starts alone, so the batches seen running are surely its own; the
    # survivor starts just before the kill (a busy machine once let the survivor take every
    # batch while the doomed cluster was still starting, and the kill lost nothing).
    doomed = processes.start_manage("qcluster")
    selector_loop = processes.start_manage("select", "--queue", queue.key, "--loop",
                                           "--interval", "0.05")
    survivor = None
    try:
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.RUNNING).count() >= 20,
                 120, "the doomed cluster running batches")
        survivor = processes.start_manage("qcluster")
        processes.stop([doomed], signal.SIGKILL)
        done_at_kill = Item.objects.filter(queue=queue, status=Status.COMPLETE).count()
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.COMPLETE).count()
                 >= done_at_kill + 40, 120, "the surviving cluster to carry on")
        sweep_until_terminal(queue, 180)
    finally:
        processes.stop([p for p in (doomed, survivor, selector_loop) if p is not None])
    lost = Attempt.objects.filter(item__queue=queue, outcome="lost").count()
    figures = report("kill-one-of-two-clusters", **tally(queue), lost_attempts_rescued=lost)
    assert lost > 0
    assert figures == {"enqueued": items, "completed": items, "dead_lettered": 0,
                       "duplicated": 0, "lost_attempts_rescued": lost}


# --- 2. PostgreSQL restarted while items flow ----------------------------------------------------

class ThrowawayPostgres:
    """A PostgreSQL cluster of its own (initdb on another port), stopped and started at will."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="queueadmin-drill-pg-"))
        self.data = self.dir / "data"
        self.port = processes.free_port()
        shutil.chown(self.dir, "postgres", "postgres")
        self._as_postgres(PG_BIN / "initdb", "-D", self.data, "-U", "postgres",
                          "--auth=trust", "-E", "UTF8")
        self.start()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *command):
        runner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*runner, *map(str, command)], check=True,  # noqa: S603
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self):
        self._as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-w", "-l", self.dir / "log",
                          "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
                          "start")

    def stop(self):
        self._as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-w", "-m", "fast", "stop")

    def remove(self):
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, sql: str, params=()):
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []


class StreamWatcher(threading.Thread):
    """A signed-in viewer of a queue's live stream, as the page's script is: it follows the
    server-sent events and, when the connection ends, reconnects after the last position it
    was given. Collects the event ids of the rows it receives."""

    def __init__(self, base_url: str, queue_key: str):
        super().__init__(daemon=True)
        self.base_url, self.queue_key = base_url, queue_key
        self.received: list[int] = []
        self.reconnects = 0
        self.stopping = threading.Event()
        self.http = requests.Session()

    def sign_in(self):
        login = f"{self.base_url}/accounts/login/"
        self.http.get(login, timeout=10)
        self.http.post(login, timeout=10, headers={"Referer": login}, data={
            "username": "watcher", "password": "drill-password-1",
            "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})

    def run(self):
        position = None
        url = f"{self.base_url}/queues/{self.queue_key}/stream/events/"
        while not self.stopping.is_set():
            try:
                params = {"after": position} if position else {}
                with self.http.get(url, params=params, stream=True, timeout=(5, 30)) as response:
                    for line in response.iter_lines(decode_unicode=True):
                        if self.stopping.is_set():
                            return
                        if line.startswith("id: "):
                            position = line[4:]
                        elif line.startswith("data: "):
                            self.received += [int(n) for n in re.findall(
                                r'data-event="(\d+)"', line)]
            except requests.RequestException:
                pass
            self.reconnects += 1
            time.sleep(1)


@pytest.fixture
def throwaway_postgres():
    pg = ThrowawayPostgres()
    try:
        yield pg
    finally:
        pg.remove()


SETUP = """
from django.contrib.auth.models import Group, User
from queues.engine import tokens
from queues.models import Queue
User.objects.create_user("watcher", password="drill-password-1").groups.add(
    Group.objects.get(name="Viewer"))
Queue.objects.create(key="flow", name="flow", handler="demo", batch_size=20,
                     handler_options={"min_ms": 20, "max_ms": 50, "retry_rate": 0,
                                      "permanent_rate": 0})
print(tokens.create("drill", queue_keys=["flow"])[1])
"""


def test_postgresql_restart_api_answers_503_then_everything_recovers_without_a_restart(
        throwaway_postgres):
    pg = throwaway_postgres
    env = {"DATABASE_URL": pg.url}
    processes.run_manage("migrate", "--noinput", env=env)
    secret = processes.run_manage("shell", "-c", SETUP, env=env).splitlines()[-1]
    # Ticks start at the clusters' first scheduler pass, not a minute later.
    pg.query("UPDATE django_q_schedule SET next_run = now()")
    port = processes.free_port()
    # The watcher checks every event's own row through the restart (about 200 a second), so the
    # server shows every row; tests/test_stream.py covers the row cap's summaries.
    web = processes.start_web(port, env=env | {"QUEUEADMIN_STREAM_ROWS_PER_SECOND": "100000"})
    clusters = [processes.start_manage("qcluster", env=env) for _ in range(2)]
    accepted, answers, stop = [], Counter(), threading.Event()
    watcher = StreamWatcher(f"http://127.0.0.1:{port}", "flow")
    watcher.sign_in()
    watcher.start()
    restarted_at = {}

    def produce():
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {secret}"
        n = 0
        while not stop.is_set():
            batch = [{"account": f"acct-{(n + i) % 5}", "identifier": f"flow-{n + i}"}
                     for i in range(10)]
            try:
                response = session.post(f"http://127.0.0.1:{port}/api/v1/queues/flow/items",
                                        json={"items": batch}, timeout=15)
                answers[response.status_code] += 1
                if response.status_code in (200, 201):
                    accepted.extend(item["identifier"] for item in batch)
            except requests.RequestException:
                answers["no answer"] += 1
            n += 10
            time.sleep(0.2)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        producer.start()

        def completed():
            return pg.query("SELECT count(*) FROM queues_item WHERE status = 'complete'")[0][0]

        wait_for(lambda: completed() >= 100, 90, "items flowing before the restart")
        pg.stop()
        time.sleep(6)
        pg.start()
        restarted_at["time"] = timezone.now()
        time.sleep(8)
        stop.set()
        producer.join(30)
        total = len(accepted)
        wait_for(lambda: completed() >= total, 120, "every accepted item to complete")
        last_event = pg.query("SELECT max(id) FROM queues_itemevent")[0][0]
        wait_for(lambda: last_event in watcher.received, 30, "the stream to show the last event")

        def beats_after_the_restart():
            return pg.query("SELECT count(*) FROM queues_clusterheartbeat "
                            "WHERE beat_at > %s", [restarted_at["time"]])[0][0]

        # A cluster beats every 10 s, and the items may all be done sooner than that.
        wait_for(lambda: beats_after_the_restart() >= 2, 30, "both clusters beating again")
        beats_after = beats_after_the_restart()

        def schedules_run_since_the_restart():
            return pg.query("SELECT count(*) FROM django_q_schedule WHERE next_run > %s "
                            "AND name LIKE 'queueadmin:%%'", [restarted_at["time"]])[0][0]

        # The scheduler ticks every ~30 s and the selector's schedule is a minute apart.
        wait_for(lambda: schedules_run_since_the_restart() >= 1, 100,
                 "a schedule to run after the restart")
        schedules_after = schedules_run_since_the_restart()
        # The clusters stop first: a task started by that schedule, or a worker handing back
        # its batch on shutdown, writes events, and the web process must still be up to stream
        # them. Then every stored event has had its chance to be shown.
        processes.stop(clusters)
        events = {n for (n,) in pg.query("SELECT id FROM queues_itemevent")}
        processes.wait_for(lambda: events <= set(watcher.received), 30)
    finally:
        stop.set()
        watcher.stopping.set()
        processes.stop([web, *clusters])
    rows = pg.query("SELECT i.identifier, i.status, (SELECT count(*) FROM queues_itemevent e "
                    "WHERE e.item_id = i.id AND e.transition = 'completed') FROM queues_item i")
    stored = {identifier: (status, n) for identifier, status, n in rows}
    figures = report(
        "postgresql-restart", enqueued=len(stored), accepted_by_the_api=len(accepted),
        completed=sum(1 for status, _ in stored.values() if status == Status.COMPLETE),
        dead_lettered=sum(1 for status, _ in stored.values() if status == Status.FAILED),
        duplicated=sum(1 for _, n in stored.values() if n > 1),
        lost=sum(1 for identifier in accepted if identifier not in stored),
        api_answers=dict(answers), clusters_beating_after_restart=beats_after,
        schedules_run_after_restart=schedules_after)
    assert answers[503] > 0 and answers[500] == 0
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["completed"] == figures["enqueued"] >= figures["accepted_by_the_api"]
    assert beats_after == 2 and schedules_after >= 1
    # The stream went on through the restart: every event of the queue once, none twice.
    stream = report("postgresql-restart-stream", events=len(events),
                    shown=len(set(watcher.received)),
                    shown_twice=len(watcher.received) - len(set(watcher.received)),
                    missing=len(events - set(watcher.received)),
                    reconnects=watcher.reconnects)
    assert stream["shown_twice"] == 0 and stream["missing"] == 0


# --- 3. a frozen worker's late completion --------------------------------------------------------

def test_a_worker_frozen_past_the_stale_threshold_has_its_late_completion_refused():
    items = 5
    queue = QueueFactory(key="drill", handler="demo", batch_size=items, concurrency=100,
                         backoff_seconds=[0], dispatch_timeout=timedelta(seconds=30),
                         stale_threshold=timedelta(seconds=2),
                         handler_options={"min_ms": 3000, "max_ms": 3000, "retry_rate": 0,
                                          "permanent_rate": 0})
    put(queue, items)
    cluster = processes.start_manage("qcluster")
    second = None
    try:
        selector.run_round(queue)
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.RUNNING).count() == items,
                 30, "the batch to start")
        os.killpg(cluster.pid, signal.SIGSTOP)
        time.sleep(3)  # past the stale threshold
        rescued = sweeper.run(seconds=5)
        assert rescued.get("running items lost, retried") == items
        # Back to a real threshold: the scheduled sweeper must not take attempt 2 (3 s) as lost.
        Queue.objects.filter(pk=queue.pk).update(stale_threshold=timedelta(minutes=15))
        os.killpg(cluster.pid, signal.SIGCONT)
        # The frozen handlers' sleep is over: their attempt-1 completions arrive now, late.
        time.sleep(3)
        # The selector loop may have dispatched the retries again by now: count attempt 1.
        refused_late = items - Attempt.objects.filter(item__queue=queue, number=1,
                                                      outcome="complete").count()
        # A healthy cluster beside the thawed one, as in production: the retries must complete
        # once, whichever cluster takes them. (The thawed batch itself may take a retry back
        # while its attempt 1 still runs: both attempts are tracked apart.)
        second = processes.start_manage("qcluster")
        selector.run_round(queue)
        # 3 s of work each; the margin is for a loaded machine (CI shares two cores).
        wait_for(lambda: Item.objects.filter(queue=queue, status=Status.COMPLETE).count() == items,
                 90, "the second attempts", state=lambda: history(queue))
    finally:
        os.killpg(cluster.pid, signal.SIGCONT)
        processes.stop([cluster, *([second] if second else [])])
    outcomes = {}
    for item_id, number, outcome in Attempt.objects.filter(item__queue=queue).order_by(
            "item_id", "number").values_list("item_id", "number", "outcome"):
        outcomes.setdefault(item_id, []).append((number, outcome))
    figures = report("frozen-worker", **tally(queue), late_completions_refused=refused_late)
    assert refused_late == items
    assert set(map(tuple, outcomes.values())) == {((1, "lost"), (2, "complete"))}
    assert figures["completed"] == items and figures["duplicated"] == 0


# --- 4. missed schedule ticks ---------------------------------------------------------------------

def test_clusters_back_after_an_hour_down_run_each_schedule_once_not_once_per_missed_tick():
    QueueFactory(key="drill")
    hour_ago = timezone.now() - timedelta(hours=1)
    assert Schedule.objects.filter(name__startswith="queueadmin:").update(
        next_run=hour_ago) == len(SCHEDULES)
    cluster = processes.start_manage("qcluster")
    try:
        # django-q2's scheduler first runs about 30 s after the cluster starts.
        wait_for(lambda: SweepRun.objects.exists(), 75, "the sweeper's schedule")
        time.sleep(5)
        sweeps = SweepRun.objects.count()
        # Ticks of the schedule (grouped by its name); the one a cluster starts with is not.
        selector_tasks = (
            sum(1 for queued in OrmQ.objects.all() if queued.group() == SELECTOR_SCHEDULE)
            + Task.objects.filter(group=SELECTOR_SCHEDULE).count())
        next_runs = dict(Schedule.objects.filter(name__startswith="queueadmin:")
                         .values_list("name", "next_run"))
        now = timezone.now()
    finally:
        processes.stop([cluster])
    figures = report("missed-schedule-ticks", missed_selector_ticks=60, missed_sweeper_ticks=12,
                     sweeper_runs=sweeps, selector_tasks=selector_tasks,
                     next_runs_from_now={name: (run - now).total_seconds()
                                         for name, run in next_runs.items()},
                     enqueued=0, completed=0, dead_lettered=0, duplicated=0)
    # One tick for the 60 missed ones; a busy machine may reach the next minute's tick too.
    assert figures["sweeper_runs"] == 1 and figures["selector_tasks"] in (1, 2)
    # The schedules' next runs moved past the missed ticks (within the next interval).
    assert all(-60 < seconds <= 300 for seconds in figures["next_runs_from_now"].values())
    assert Queue.objects.count() == 1
