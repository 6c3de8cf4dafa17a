"""Worker clusters' heartbeats, written by the clusters themselves into ClusterHeartbeat.

django-q2 has no heartbeat hook. So a `manage.py qcluster` process (QueuesConfig.ready calls
`start_in_cluster`) starts a thread that upserts its row every BEAT_SECONDS; the row is keyed
host:pid of that qcluster process, the one an operator sees and signals. Its workers are forked
grandchildren: they report the task they run through shared memory created before the forks,
from django-q2's pre_execute and post_execute_in_worker signals, so "what it is running" costs
no database write per task.
"""

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

from queues.engine import lease
from queues.engine.schedules import SCHEDULES
from queues.models import ClusterHeartbeat

log = logging.getLogger(__name__)
BEAT_SECONDS = 10.0
# Missing three beats (and then some, for a busy database) makes a cluster stale.
STALE_AFTER = timedelta(seconds=45)
# The sweeper deletes clusters silent this long: stopped for good, or replaced.
PRUNE_AFTER = timedelta(days=1)
TASK_NAME_BYTES = 120
SPARE_SLOTS = 8  # room for workers reincarnated while a dead one's slot is not yet cleared
# How long a SIGTERM handler looks for the sentinel dying of the same signal (it takes a few ms).
SENTINEL_WAIT_SECONDS = 0.5
SCHEDULE_NAMES = {spec["func"]: spec["name"] for spec in SCHEDULES}


class Slot(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int), ("since", ctypes.c_double),
                ("task", ctypes.c_char * TASK_NAME_BYTES)]


_main_pid: int | None = None
_slots = None
_stopping = None  # shared with the cluster's workers: when the cluster was told to stop
_thread: threading.Thread | None = None


def cluster_id(host: str, pid: int) -> str:
    return f"{host[:90]}:{pid}"


def is_qcluster(argv: list[str]) -> bool:
    return len(argv) > 1 and argv[1] == "qcluster"


def start_in_cluster():
    """Prepare the heartbeat of this qcluster process. The thread starts only after the process
    forks django-q2's sentinel: forking a process while another thread may hold a lock (a
    database socket mid-query, say) can leave the child stuck."""
    global _main_pid, _slots, _stopping
    from django_q.conf import Conf
    from django_q.signals import post_execute_in_worker, pre_execute

    _main_pid = os.getpid()
    context = multiprocessing.get_context("fork")
    _slots = context.Array(Slot, Conf.WORKERS + SPARE_SLOTS)
    _stopping = context.Value(ctypes.c_double, 0.0)
    pre_execute.connect(_task_started, dispatch_uid="queueadmin-heartbeat-start")
    post_execute_in_worker.connect(_task_finished, dispatch_uid="queueadmin-heartbeat-finish")
    os.register_at_fork(after_in_parent=_start_thread_once)


def _start_thread_once():
    global _thread
    # The sentinel inherits this fork handler; only the qcluster process itself beats.
    if os.getpid() != _main_pid or _thread is not None:
        return
    # django-q2 installed its handlers before forking the sentinel; ours run first.
    for signum in (signal.SIGTERM, signal.SIGINT):
        _mark_stopping_on(signum)
    _thread = threading.Thread(target=_beat_forever, name="queueadmin-heartbeat", daemon=True)
    _thread.start()


def _mark_stopping_on(signum: int):
    """On SIGTERM or SIGINT the workers learn that the cluster is stopping (stopping_since), so
    their batches release what they have not started and the selector loop hands over, before
    django-q2 waits for them to end."""
    original = signal.getsignal(signum)

    def handler(number, frame):
        if _stopping.value == 0:
            _stopping.value = time.time()
        sentinel = getattr(getattr(original, "__self__", None), "sentinel", None)
        if number == signal.SIGTERM and sentinel is not None and _died_with(sentinel):
            _hand_back_and_exit()
        if callable(original):
            original(number, frame)

    signal.signal(signum, handler)


def _died_with(sentinel, wait: float = SENTINEL_WAIT_SECONDS) -> bool:
    """Whether django-q2's sentinel died of the same SIGTERM: sent to the whole process group
    (systemd's default kill mode, `kill -TERM -<pgid>`), it reaches the sentinel and workers
    too, which keep SIGTERM's default action and end at once."""
    deadline = time.monotonic() + wait
    while not _gone(sentinel):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _gone(process) -> bool:
    """The main thread may have reaped the sentinel in the very wait the signal interrupted
    (joining it at exit): multiprocessing then still calls it alive, so ask the kernel."""
    if not process.is_alive():
        return True
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        return True
    return False


def _hand_back_and_exit():
    """The sentinel and the workers are gone: django-q2's own stop would wait forever to wake
    the dead sentinel (the main process hung, beating, its items running on no one). What the
    cluster held goes back now: not started, queued again; running, a retry with the attempt
    counted. Then the process ends."""
    from queues.engine import lifecycle

    try:
        changed, _ = lifecycle.hand_back([this_cluster()], "was stopped with its workers",
                                         "this cluster")
        log.warning("cluster %s stopped with its workers by one SIGTERM to the process group; "
                    "handed back %s", this_cluster(), dict(changed))
    except Exception:  # the process ends whatever happens; the rescue of silent clusters follows
        log.exception("cluster %s could not hand back its items", this_cluster())
    finally:
        os._exit(0)


def stopping_since() -> float | None:
    """When (epoch seconds) this process's cluster was told to stop, or None."""
    if _stopping is None or _stopping.value == 0:
        return None
    return _stopping.value


def worker_id() -> str:
    """This thread of this process, as attempts and the selector lease name it."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


def this_cluster() -> str:
    """The cluster this process works for, as its heartbeat names it; outside a cluster (a test,
    a command) the process itself, which never beats and so is never declared silent."""
    return cluster_id(socket.gethostname(), _main_pid or os.getpid())


def _task_started(sender, func=None, task=None, **kwargs):
    task = task or {}
    # django-q2 names a scheduled task with random words ("delta-california-bluebird"): the
    # schedule's own name says what runs. A batch carries its queue's name.
    name = str(SCHEDULE_NAMES.get(str(task.get("func")))
               or task.get("name") or task.get("func") or "task")
    _set_slot(os.getpid(), name)


def _task_finished(sender, func=None, task=None, **kwargs):
    _set_slot(os.getpid(), None)


def _set_slot(pid: int, task: str | None):
    if _slots is None:
        return
    with _slots.get_lock():
        mine = next((s for s in _slots if s.pid == pid), None)
        if task is None:
            if mine is not None:
                mine.pid = 0
            return
        slot = mine or next((s for s in _slots if s.pid == 0), None)
        if slot is None:  # every slot taken by live workers: nothing sensible to show
            return
        slot.pid, slot.since = pid, time.time()
        slot.task = task.encode()[:TASK_NAME_BYTES - 1]


def running_tasks() -> list[dict]:
    """What this cluster's workers run now; slots of workers that died mid-task are freed."""
    if _slots is None:
        return []
    running = []
    with _slots.get_lock():
        for slot in _slots:
            if not slot.pid:
                continue
            if not _alive(slot.pid):
                slot.pid = 0
                continue
            since = datetime.fromtimestamp(slot.since, tz=UTC)
            running.append({"pid": slot.pid, "task": slot.task.decode(errors="replace"),
                            "since": since.isoformat()})
    return sorted(running, key=lambda r: r["since"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def beat(*, host: str, pid: int, workers: int, started_at: datetime,
         running: list[dict]) -> ClusterHeartbeat:
    """Upsert this cluster's row."""
    now = timezone.now()
    row, _ = ClusterHeartbeat.objects.update_or_create(
        cluster=cluster_id(host, pid),
        defaults={"host": host, "pid": pid, "workers": workers, "beat_at": now,
                  "running": running},
        create_defaults={"host": host, "pid": pid, "workers": workers, "beat_at": now,
                         "running": running, "started_at": started_at},
    )
    return row


def _beat_forever():
    from django_q.conf import Conf
    from django_q.tasks import async_task

    host, pid, started = socket.gethostname(), os.getpid(), timezone.now()
    failing, first = False, True
    while True:
        try:
            row = beat(host=host, pid=pid, workers=Conf.WORKERS, started_at=started,
                       running=running_tasks())
            if Conf.SCHEDULER and (first or lease.vacant()):
                # django-q2's scheduler first looks at the schedules 30 s after start, and its
                # next tick may be a minute away: a cluster that runs schedules starts the
                # selector loop itself when it starts (taking over from a running loop) and
                # when the loop's process died or ended with nobody to take over.
                async_task("queues.engine.selector.tick",
                           task_name="selector loop at cluster start" if first
                           else "selector loop restarted")
            if first or failing:
                log.info("cluster %s heartbeat %s", row.cluster,
                         "written again" if failing else "started")
            failing, first = False, False
        except Exception as exc:  # the beat must outlive any error, a database restart above all
            if not failing:
                log.warning("cluster heartbeat failed: %s", exc)
            failing = True
            connection.close()  # a broken connection is reopened by the next beat
        time.sleep(BEAT_SECONDS)


def is_stale(row: ClusterHeartbeat, now: datetime) -> bool:
    return now - row.beat_at > STALE_AFTER


def silent_clusters(now: datetime) -> dict[str, datetime]:
    """Clusters that missed their beats while the database was up, with their last beat: a
    database restart counts as a beat of every cluster, since none of them could write during
    it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_postmaster_start_time()")
            if cursor.fetchone()[0] > now - STALE_AFTER - timedelta(seconds=BEAT_SECONDS):
                return {}
    return dict(ClusterHeartbeat.objects.filter(beat_at__lt=now - STALE_AFTER)
                .values_list("cluster", "beat_at"))


def prune(now: datetime) -> int:
    """Rows of clusters silent for PRUNE_AFTER (the sweeper calls this)."""
    deleted, _ = ClusterHeartbeat.objects.filter(beat_at__lt=now - PRUNE_AFTER).delete()
    return deleted
