"""Real processes beside this one (web server, worker clusters, selector loop) on the database
this process uses: for benchmarks, fault drills and end-to-end tests."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import quote

from django.conf import settings
from django.db import connection

MANAGE = str(settings.BASE_DIR / "manage.py")


def database_url() -> str:
    """This process's database (under tests, the test database) as a DATABASE_URL."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        return (f"postgres://{quote(db['USER'] or '')}:{quote(db['PASSWORD'] or '')}@"
                f"{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}")
    return f"sqlite:///{db['NAME']}"


def start(command: list[str], env: dict | None = None, log=None) -> subprocess.Popen:
    """Start our own interpreter with fixed arguments in its own session, so that the process
    and whatever it forks stop (or die) together."""
    full_env = os.environ | {"DATABASE_URL": database_url()} | (env or {})
    output = log if log is not None else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, *command], env=full_env,  # noqa: S603
                            stdout=output, stderr=subprocess.STDOUT if log else output,
                            start_new_session=True)


def start_manage(*args: str, env: dict | None = None, log=None) -> subprocess.Popen:
    return start([MANAGE, *args], env, log)


def run_manage(*args: str, env: dict | None = None) -> str:
    """Run a management command in a child process to completion; returns its output."""
    full_env = os.environ | {"DATABASE_URL": database_url()} | (env or {})
    return subprocess.run([sys.executable, MANAGE, *args], env=full_env,  # noqa: S603
                          check=True, capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_web(port: int, *, workers: int = 1, env: dict | None = None,
              log=None) -> subprocess.Popen:
    """uvicorn serving the ASGI app, as in production; returns once it accepts connections."""
    process = start(["-m", "uvicorn", "queueadmin.asgi:application", "--host", "127.0.0.1",
                     "--port", str(port), "--workers", str(workers), "--no-access-log"],
                    {"QUEUEADMIN_PROCESS": "web", **(env or {})}, log)
    if not wait_for(lambda: _accepts(port) or process.poll() is not None, 30) or \
            process.poll() is not None:
        stop([process])
        raise RuntimeError(f"the web server on port {port} did not start")
    return process


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start_clusters(clusters: int, env: dict | None = None) -> list[subprocess.Popen]:
    """django-q2 clusters, returned once each has written its first heartbeat (at most 60 s)."""
    from django.utils import timezone

    from queues.models import ClusterHeartbeat

    before = timezone.now()
    running = [start_manage("qcluster", env=env) for _ in range(clusters)]
    wait_for(lambda: ClusterHeartbeat.objects.filter(
        started_at__gte=before).count() >= clusters, 60)
    return running


def stop(processes, sig=signal.SIGTERM):
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, sig)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a process that does not stop in time is killed
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stop_clusters(clusters, wait: float = 90):
    """Stop django-q2 clusters as `docker stop` does: SIGTERM to each main process only, so that
    it stops its workers within its shutdown grace; killed if it has not ended in `wait` s."""
    for cluster in clusters:
        if cluster.poll() is None:
            os.kill(cluster.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    for cluster in clusters:
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.wait(timeout=max(0.0, deadline - time.monotonic()))
    stop(clusters, signal.SIGKILL)  # whatever is left of a group, killed ones included


def wait_for(condition, timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False
