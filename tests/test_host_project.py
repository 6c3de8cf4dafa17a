"""The wheel is a complete Django app that mounts under any prefix in someone else's project.

From the outside, with nothing of this repository on the path: the wheel built from the
repository is installed (with uvicorn) into a fresh virtualenv, and the host project in
examples/hostproject/ (its own settings, users, login page and a `billing` app with a handler
and two django.tasks tasks, one async) runs on a throwaway PostgreSQL database. A real
`manage.py qcluster` runs the host's handler for items of two tenants and its tasks enqueued for
two tenants through Django's tasks framework (read back with get_result()), and stops on
SIGTERM; uvicorn serves the dashboard under /ops/queues/ and the JSON API under /ops/api/, and
headless Chromium signs in through the host's login page, follows the dashboard's links, watches
the live stream receive an event, runs a bulk retry and reads a task's item page, with every
link and request staying under the prefix (or on the host's static, login and admin paths).

Slow (about a minute: a wheel build, a pip install, child processes): one module, run once per
CI run on PostgreSQL.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[1]
HOST_DIR = REPO / "examples" / "hostproject"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PASSWORD = "host-project-pw-1"
QUEUE = "invoices"
PREFIX = "/ops/queues/"
API_PREFIX = "/ops/api/"
# Where pages may link and send requests: the app under its prefixes, static files, and the
# host's own login/logout and admin pages.
ALLOWED_PATHS = (PREFIX, API_PREFIX, "/static/", "/accounts/", "/admin/")
# Items the cluster runs: two tenants, and one payload the billing handler refuses for good.
ITEMS = [
    ("acme", "inv-acme-1", {"amount": 120}),
    ("globex", "inv-globex-1", {"amount": 75}),
    ("globex", "inv-globex-declined", {"amount": 9, "fail": True}),
]
EXPECTED_STATUSES = {"inv-acme-1": "complete", "inv-globex-1": "complete",
                     "inv-globex-declined": "failed"}
# Top-level names of the repository that are not the wheel's sources (build/ above all: stale
# files there would end up in a wheel built in place).
NOT_SOURCES = {".git", ".venv", "var", "build", "dist", "examples", "tests", "docs",
               ".hypothesis", ".pytest_cache", ".ruff_cache", "node_modules"}
WAIT_MS = 30_000
TASK_QUEUE = "billing-tasks"
# Enqueued through django.tasks inside the host: (name, tenant, task, arguments, keywords).
TASKS = [
    ("acme-invoice", "acme", "send_invoice", ["inv-acme-7"], {"amount": 120}),
    ("globex-rates", "globex", "refresh_rates", ["EUR"], {}),
    ("globex-empty-invoice", "globex", "send_invoice", ["inv-globex-0"], {"amount": 0}),
]
MAX_CRAWL_PAGES = 60


# --- Child processes ------------------------------------------------------------------------


def run(args: list, *, timeout: float, **kwargs) -> str:
    """A command that must succeed; its output goes into the failure message."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,  # noqa: S603
                            timeout=timeout, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout: float, interval: float = 0.5):
    """condition()'s first truthy value, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def stop_process(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM to the process itself (it stops its own children), SIGKILL to its whole process
    group if it has not ended in time. Returns the exit code (negative: the signal that
    ended it)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # still alive, so the group is still ours
    return process.wait(timeout=10)


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


# --- The wheel, the virtualenv and the database -------------------------------------------------


def build_wheel(tmp: Path) -> Path:
    """The wheel of the repository's sources as they are now, built from a copy so that the
    build writes nothing into the repository and picks up no leftovers of an earlier build."""
    sources = tmp / "sources"
    shutil.copytree(REPO, sources, ignore=lambda directory, names: [
        name for name in names
        if name == "__pycache__" or name.endswith(".egg-info")
        or (Path(directory) == REPO and name in NOT_SOURCES)])
    wheels = tmp / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-q", "-w", wheels, sources], timeout=180)
    (wheel,) = wheels.glob("queueadmin-*.whl")
    return wheel


def create_venv(tmp: Path, wheel: Path) -> Path:
    """A fresh virtualenv with the wheel (and its [postgres] extra) and uvicorn; its python."""
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], timeout=120)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q",
         f"{wheel}[postgres]", "uvicorn"], timeout=300)
    return python


def admin_connection():
    """Autocommit connection to the shared server's maintenance database, as the suite's."""
    import psycopg

    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                           user=db["USER"], password=db["PASSWORD"] or None, dbname="postgres",
                           autocommit=True)


class Host:
    """The host project run by the fresh virtualenv's python on its own database."""

    def __init__(self, python: Path, database: str, logs: Path):
        self.python, self.database, self.logs = python, database, logs
        db = connection.settings_dict
        # Nothing of the test process's configuration leaks in (DJANGO_SETTINGS_MODULE is the
        # repository's project, PYTHONPATH could name the repository): the host's own settings
        # from its own variables.
        inherited = {k: v for k, v in os.environ.items()
                     if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL",
                                  "VIRTUAL_ENV", "PYTHONHOME")
                     and not k.startswith(("QUEUEADMIN_", "HOST_"))}
        self.env = inherited | {
            "DJANGO_SETTINGS_MODULE": "hostproject.settings",
            "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(python.parent.parent),
            "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in examples/hostproject
            "HOST_DB_NAME": database,
            "HOST_DB_HOST": db["HOST"] or "127.0.0.1",
            "HOST_DB_PORT": str(db["PORT"] or 5432),
            "HOST_DB_USER": db["USER"] or "postgres",
            "HOST_DB_PASSWORD": db["PASSWORD"] or "",
            "HOST_SECRET_KEY": uuid.uuid4().hex * 2,
        }

    def manage(self, *args: str, timeout: float = 120) -> str:
        return run([self.python, "manage.py", *args], cwd=HOST_DIR, env=self.env,
                   timeout=timeout)

    def shell(self, code: str) -> str:
        return self.manage("shell", "-v", "0", "-c", code)

    def start(self, name: str, args: list, **env) -> tuple[subprocess.Popen, Path]:
        """A long-running child in its own process group, its output in a log file."""
        log = self.logs / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(  # noqa: S603
                [str(self.python), *args], cwd=HOST_DIR, env=self.env | env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return process, log

    def query(self, sql: str, params=()) -> list[tuple]:
        """Read the host's database directly (the test process's psycopg)."""
        import psycopg

        settings = self.env
        with psycopg.connect(host=settings["HOST_DB_HOST"], port=settings["HOST_DB_PORT"],
                             user=settings["HOST_DB_USER"], dbname=self.database,
                             password=settings["HOST_DB_PASSWORD"] or None) as db:
            return db.execute(sql, params).fetchall()

    def enqueue(self, items: list[tuple[str, str, dict]]) -> str:
        """queues.enqueue inside the host, as a host's own code would call it."""
        return self.shell(
            "import queues\n"
            f"for account, identifier, payload in {items!r}:\n"
            f"    queues.enqueue({QUEUE!r}, account=account, identifier=identifier,"
            " payload=payload)\n")

    def enqueue_tasks(self) -> dict[str, str]:
        """TASKS enqueued through Django's tasks framework inside the host, each inside a
        tenant() block; name -> TaskResult id."""
        return json.loads(self.shell(
            "import json\n"
            "from billing import tasks\n"
            "from queues.tasks_backend import tenant\n"
            "ids = {}\n"
            f"for name, account, task, args, kwargs in {TASKS!r}:\n"
            "    with tenant(account):\n"
            "        ids[name] = getattr(tasks, task).enqueue(*args, **kwargs).id\n"
            "print(json.dumps(ids))\n"))

    def task_results(self, ids: dict[str, str]) -> dict[str, dict]:
        """get_result() of each id inside the host, as JSON."""
        return json.loads(self.shell(
            "import json\n"
            "from django_tasks import default_task_backend\n"
            "out = {}\n"
            f"for name, result_id in {ids!r}.items():\n"
            "    result = default_task_backend.get_result(result_id)\n"
            "    out[name] = {'status': result.status, 'attempts': result.attempts,\n"
            "        'task': result.task.module_path, 'args': result.args,\n"
            "        'kwargs': result.kwargs, 'workers': len(result.worker_ids),\n"
            "        'timed': None not in (result.enqueued_at, result.started_at,\n"
            "                              result.finished_at),\n"
            "        'errors': [e.exception_class_path for e in result.errors],\n"
            "        'value': result.return_value if result.status == 'SUCCESSFUL' else None}\n"
            "print(json.dumps(out))\n"))

    def statuses(self, identifiers) -> dict[str, str]:
        return dict(self.query("SELECT identifier, status FROM queues_item "
                               "WHERE identifier = ANY(%s)", [list(identifiers)]))


# --- Fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host project migrated on a throwaway database, with its queue and users:
    olga (Operator) and adam (Admin)."""
    tmp = tmp_path_factory.mktemp("hostproject")
    python = create_venv(tmp, build_wheel(tmp))
    database = f"host_{uuid.uuid4().hex[:10]}"
    with admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        host = Host(python, database, tmp)
        host.manage("migrate", "--noinput", "-v", "0", timeout=180)
        host.manage("setup_demo_queue", "--key", QUEUE, "--name", "Invoices")
        host.shell(
            "from django.contrib.auth.models import Group, User\n"
            f"for name, role in [('olga', 'Operator'), ('adam', 'Admin')]:\n"
            f"    user = User.objects.create_user(name, password={PASSWORD!r})\n"
            "    user.groups.add(Group.objects.get(name=role))\n")
        yield host
    finally:
        with admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


class Cluster:
    def __init__(self, host: Host):
        self.process, self.log = host.start("qcluster", ["manage.py", "qcluster"])
        self.exit_code = None

    def stop(self, timeout: float = 60) -> int:
        if self.exit_code is None:
            self.exit_code = stop_process(self.process, timeout)
        return self.exit_code


@pytest.fixture(scope="module")
def cluster(host):
    """A real django-q2 cluster of the host (two workers), running until the module ends or a
    test stops it."""
    cluster = Cluster(host)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def processed(host, cluster):
    """ITEMS enqueued for two tenants and run to their end by the cluster: identifier ->
    status. A cluster starts the selector loop itself at start, so this takes seconds."""
    host.enqueue(ITEMS)

    def all_finished():
        statuses = host.statuses(EXPECTED_STATUSES)
        done = len(statuses) == len(ITEMS) and set(statuses.values()) <= {"complete", "failed"}
        return statuses if done else None

    statuses = wait_until(all_finished, timeout=90)
    assert statuses, (f"items not finished after 90 s: {host.statuses(EXPECTED_STATUSES)}\n"
                      f"--- qcluster log\n{tail(cluster.log)}")
    return statuses


@pytest.fixture(scope="module")
def tasks_run(host, cluster):
    """TASKS enqueued for two tenants through django.tasks and run to their end by the cluster:
    name -> TaskResult id."""
    ids = host.enqueue_tasks()

    def all_finished():
        statuses = host.statuses(ids.values())
        return len(statuses) == len(ids) and set(statuses.values()) <= {"complete", "failed"}

    assert wait_until(all_finished, timeout=90), (
        f"tasks not finished after 90 s: {host.statuses(ids.values())}\n"
        f"--- qcluster log\n{tail(cluster.log)}")
    return ids


@pytest.fixture(scope="module")
def server(host):
    """uvicorn serving the host's ASGI application, with DEBUG on so that the host serves the
    app's static files; its base URL."""
    port = free_port()
    process, log = host.start("uvicorn", [
        "-m", "uvicorn", "hostproject.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--no-access-log"], HOST_DEBUG="true")
    base = f"http://127.0.0.1:{port}"

    def accepting():
        if process.poll() is not None:
            return True
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        return False

    try:
        wait_until(accepting, timeout=30, interval=0.2)
        assert process.poll() is None, f"uvicorn exited:\n{tail(log)}"
        yield base
    finally:
        # An open stream would keep uvicorn waiting (pages are closed by then): a server that
        # does not stop soon is killed.
        stop_process(process, timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page_as(browser, server):
    """page_as("olga"): a browser page signed in through the host's login page. Every request
    a page makes is recorded (and every response, in `page_as.responses` as (status, path));
    the test fails if one leaves the allowed paths, answers 400 or worse, or a page has a
    script error."""
    contexts, requests, responses, problems = [], [], [], []

    def sign_in(username: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("request", lambda r: requests.append(r.url))
        page.on("response", lambda r: responses.append((r.status, path_of(r.url, server))))
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm's confirmation
        # The dashboard sends a stranger to the host's login page, and back after it.
        page.goto(f"{server}{PREFIX}")
        assert page.url.startswith(f"{server}/accounts/login/?next=/ops/queues/"), page.url
        assert page.title() == "Sign in · Billing", "not the host's own login page"
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{server}{PREFIX}")
        return page

    sign_in.responses = responses
    yield sign_in
    for context in contexts:
        context.close()
    own = [url for url in requests if url.startswith(server)]
    strays = [url for url in own if not path_of(url, server).startswith(ALLOWED_PATHS)
              # Chromium asks for a favicon on the host's login page, which names none.
              and path_of(url, server) != "/favicon.ico"]
    assert not strays, f"requests outside {ALLOWED_PATHS}: {strays}"
    foreign = [url for url in requests if not url.startswith((server, "data:", "blob:"))]
    assert not foreign, f"requests to other servers: {foreign}"
    problems += [f"{status} {path}" for status, path in responses
                 if status >= 400 and path != "/favicon.ico"]
    assert not problems, problems


def path_of(url: str, server: str) -> str:
    return url.removeprefix(server).split("?")[0].split("#")[0] or "/"


def links_of(page) -> list[str]:
    """Paths of the page's same-origin links, form targets, htmx URLs, scripts, stylesheets and
    stream URLs, resolved as the browser would."""
    return page.evaluate("""() => {
        const attributes = ["href", "action", "src", "hx-get", "hx-post", "data-events-url",
                            "data-rows-url"];
        const paths = [];
        for (const element of document.querySelectorAll("*")) {
            for (const name of attributes) {
                const value = element.getAttribute(name);
                if (value === null) continue;
                const url = new URL(value, document.baseURI);
                if (url.origin === location.origin) paths.push(url.pathname);
            }
        }
        return paths;
    }""")


def assert_links_under_prefix(page):
    paths = links_of(page)
    assert paths, f"no links found on {page.url}"
    strays = sorted({p for p in paths if not p.startswith(ALLOWED_PATHS)})
    assert not strays, f"{page.url} links outside {ALLOWED_PATHS}: {strays}"


def get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  (our own server)
        return response.status, response.headers.get("Content-Type", ""), response.read()


# --- Tests ----------------------------------------------------------------------------------


def test_the_host_imports_queues_from_the_wheel_not_the_repository(host):
    where = json.loads(host.shell(
        "import json, sys, queues, queues.handlers, billing.handlers, django\n"
        "from queues.engine import handlers\n"
        "print(json.dumps({'queues': queues.__file__, 'path': sys.path,\n"
        "                  'handler': handlers.get('billing.charge') is not None,\n"
        "                  'alias': queues.handlers is handlers}))\n"))
    site_packages = str(host.python.parent.parent / "lib")
    assert where["queues"].startswith(site_packages), where["queues"]
    assert "site-packages" in where["queues"], where["queues"]
    assert str(REPO) not in where["path"], f"the repository is on sys.path: {where['path']}"
    assert where["handler"], "billing.handlers was not autodiscovered"
    assert where["alias"], "queues.handlers is not queues.engine.handlers"
    # The standalone project of the repository is not part of the app.
    run([host.python, "-c", "import importlib.util, sys; "
         "sys.exit(importlib.util.find_spec('queueadmin') is not None)"],
        cwd=HOST_DIR, env=host.env, timeout=30)


def test_the_hosts_settings_pass_the_apps_checks(host):
    # queues' checks included: Q_CLUSTER, middleware, context processors, the queue's timeouts.
    host.manage("check", "--database", "default")


def test_a_cluster_runs_the_host_handler_for_two_tenants(host, processed):
    assert processed == EXPECTED_STATUSES
    accounts = dict(host.query("SELECT account, count(*) FROM queues_item GROUP BY account"))
    assert accounts == {"acme": 1, "globex": 2}
    (error,) = host.query("SELECT last_error FROM queues_item WHERE identifier = %s",
                          ["inv-globex-declined"])[0]
    assert "card declined" in error, error


def test_the_openapi_document_names_the_mount_point(server):
    status, content_type, body = get(f"{server}{API_PREFIX}openapi.json")
    assert status == 200 and content_type.startswith("application/json")
    document = json.loads(body)
    assert document["servers"][0]["url"] == "/ops/api", document["servers"]


def test_the_apps_static_files_are_served(server):
    for path, kind in [("/static/queues/css/dashboard.css", "text/css"),
                       ("/static/queues/js/stream.js", "javascript"),
                       ("/static/django_htmx/htmx-2.min.js", "javascript")]:
        status, content_type, body = get(f"{server}{path}")
        assert status == 200 and kind in content_type and body, (path, status, content_type)


def test_an_operator_browses_the_dashboard_under_the_prefix(page_as, server, processed):
    from playwright.sync_api import expect

    page = page_as("olga")
    expect(page.get_by_text("olga · Operator")).to_be_visible()
    stylesheet = [status for status, path in page_as.responses
                  if path == "/static/queues/css/dashboard.css"]
    assert stylesheet == [200], f"dashboard.css answered {stylesheet}"
    assert page.evaluate(
        "getComputedStyle(document.querySelector('header.top')).display") != "inline", \
        "the dashboard's stylesheet is not applied"
    queue_link = page.locator("#queue-table").get_by_role("link", name="Invoices")
    expect(queue_link).to_have_attribute("href", f"{PREFIX}queues/{QUEUE}/")
    assert_links_under_prefix(page)

    queue_link.click()
    page.wait_for_url(f"{server}{PREFIX}queues/{QUEUE}/")
    expect(page.get_by_role("link", name="inv-acme-1")).to_be_visible()
    assert_links_under_prefix(page)

    page.get_by_role("link", name="inv-acme-1").click()
    page.wait_for_url(re.compile(rf"{re.escape(server + PREFIX)}items/\d+/$"))
    expect(page.get_by_role("heading", name="inv-acme-1")).to_be_visible()
    expect(page.locator("#item-status")).to_have_text("Complete")
    assert_links_under_prefix(page)


def test_an_admin_gets_the_hosts_admin_site_link(page_as):
    from playwright.sync_api import expect

    page = page_as("adam")
    expect(page.get_by_text("adam · Admin")).to_be_visible()
    expect(page.get_by_role("link", name="Settings")).to_have_attribute("href", "/admin/")
    assert_links_under_prefix(page)


def test_every_dashboard_page_loads_and_links_under_the_prefix(page_as, server, processed):
    """Follows every link under the prefix from the overview (as an Admin, who sees every
    page), breadth first: each page loads without an error and links only under the prefix."""
    page = page_as("adam")
    seen, waiting = set(), [PREFIX]
    while waiting and len(seen) < MAX_CRAWL_PAGES:
        path = waiting.pop(0)
        seen.add(path)
        response = page.goto(f"{server}{path}")
        assert response.status == 200, f"{path} answered {response.status}"
        assert page.url.startswith(f"{server}{PREFIX}"), f"{path} went to {page.url}"
        assert_links_under_prefix(page)
        for link in page.eval_on_selector_all(
                "a[href]", "links => links.map(a => new URL(a.href, document.baseURI))"
                ".filter(u => u.origin === location.origin).map(u => u.pathname)"):
            # Exports are downloads, not pages.
            if (link.startswith(PREFIX) and not link.endswith((".csv", ".json", "/export/"))
                    and link not in seen and link not in waiting):
                waiting.append(link)
    visited = {re.sub(r"\d+", "<n>", path) for path in seen}
    for expected in (f"{PREFIX}queues/{QUEUE}/", f"{PREFIX}items/<n>/", f"{PREFIX}stream/",
                     f"{PREFIX}dead-letters/", f"{PREFIX}workers/", f"{PREFIX}audit/",
                     f"{PREFIX}tokens/", f"{PREFIX}queues/{QUEUE}/bulk/"):
        assert expected in visited, f"{expected} not reached from the overview: {sorted(seen)}"


def test_the_live_stream_receives_an_event_under_the_prefix(page_as, server, host, cluster):
    from playwright.sync_api import expect

    page = page_as("olga")
    page.goto(f"{server}{PREFIX}queues/{QUEUE}/")
    page.locator("nav.subnav").get_by_role("link", name="Live stream").click()
    page.wait_for_url(f"{server}{PREFIX}queues/{QUEUE}/stream/")
    table = page.locator("table[data-stream]")
    expect(table).to_have_attribute("data-mode", "sse")  # served by ASGI: a pushed stream
    expect(table).to_have_attribute("data-events-url", f"{PREFIX}queues/{QUEUE}/stream/events/")
    expect(page.locator("#stream-connection")).to_have_text("Live", timeout=WAIT_MS)
    assert_links_under_prefix(page)

    identifier = f"inv-live-{uuid.uuid4().hex[:8]}"
    host.enqueue([("initech", identifier, {"amount": 1})])
    row = page.locator("#stream-rows tr", has_text=identifier).first
    expect(row).to_be_visible(timeout=WAIT_MS)
    expect(row.get_by_role("link", name=identifier)).to_have_attribute(
        "href", re.compile(rf"^{PREFIX}items/\d+/$"))
    # The cluster runs it while the page watches.
    expect(page.locator("#stream-rows tr", has_text=identifier).filter(
        has_text="Completed")).to_have_count(1, timeout=WAIT_MS)


def test_an_operator_runs_a_bulk_retry_under_the_prefix(page_as, server, host, processed):
    from playwright.sync_api import expect

    page = page_as("olga")
    page.goto(f"{server}{PREFIX}queues/{QUEUE}/")
    page.locator("nav.subnav").get_by_role("link", name="Bulk retry / cancel").click()
    page.wait_for_url(f"{server}{PREFIX}queues/{QUEUE}/bulk/")
    assert_links_under_prefix(page)

    page.get_by_label("Retry", exact=True).check()
    page.get_by_label("Permanent Failure").check()
    page.get_by_label("Time range").select_option("1h")
    page.get_by_role("button", name="Preview").click()
    preview = page.locator("#bulk-preview")
    expect(preview).to_contain_text("Eligible")
    expect(preview.locator("dd").nth(1)).to_have_text("1")
    assert_links_under_prefix(page)

    page.get_by_role("button", name=re.compile(r"^Retry 1 items?$")).click()
    page.wait_for_url(re.compile(rf"{re.escape(server + PREFIX)}queues/{QUEUE}/bulk/\d+/$"))
    progress = page.locator("#bulk-progress")
    # The cluster runs the operation; the progress section refreshes itself until it is done.
    expect(progress).to_contain_text("Done", timeout=WAIT_MS)
    expect(progress.locator("dd").nth(1)).to_have_text("1")
    assert_links_under_prefix(page)
    # The retried item ran again and was refused again.

    def ran_twice():
        rows = host.query(
            "SELECT i.status, count(a.id) FROM queues_item i "
            "LEFT JOIN queues_attempt a ON a.item_id = i.id WHERE i.identifier = %s "
            "GROUP BY i.status", ["inv-globex-declined"])
        return rows == [("failed", 2)]

    assert wait_until(ran_twice, timeout=60), "the retried item did not fail a second time"


def test_tasks_enqueued_through_django_tasks_run_for_their_tenants(host, tasks_run):
    results = host.task_results(tasks_run)
    assert results["acme-invoice"] == {
        "status": "SUCCESSFUL", "attempts": 1, "task": "billing.tasks.send_invoice",
        "args": ["inv-acme-7"], "kwargs": {"amount": 120}, "workers": 1, "timed": True,
        "errors": [], "value": {"invoice": "inv-acme-7", "amount": 120, "sent": True}}
    assert results["globex-rates"]["status"] == "SUCCESSFUL"
    assert results["globex-rates"]["value"] == {"currency": "EUR", "rate": 1.25}
    assert results["globex-empty-invoice"]["status"] == "FAILED"
    assert results["globex-empty-invoice"]["errors"] == ["queues.engine.handlers.PermanentError"]
    rows = host.query("SELECT i.identifier, i.account, i.priority, q.handler FROM queues_item i "
                      "JOIN queues_queue q ON q.id = i.queue_id WHERE q.key = %s", [TASK_QUEUE])
    assert {identifier: (account, priority, handler)
            for identifier, account, priority, handler in rows} == {
        tasks_run["acme-invoice"]: ("acme", 0, "django_task"),
        tasks_run["globex-rates"]: ("globex", 10, "django_task"),
        tasks_run["globex-empty-invoice"]: ("globex", 0, "django_task")}


def test_the_dashboard_shows_a_tasks_arguments_return_value_and_errors(page_as, server, host,
                                                                       tasks_run):
    from playwright.sync_api import expect

    (done,), (failed,) = (host.query("SELECT id FROM queues_item WHERE identifier = %s",
                                     [tasks_run[name]])[0]
                          for name in ("acme-invoice", "globex-empty-invoice"))
    page = page_as("olga")
    page.goto(f"{server}{PREFIX}items/{done}/")
    expect(page.locator("#item-status")).to_have_text("Complete")
    expect(page.locator("#task-path")).to_have_text("billing.tasks.send_invoice")
    expect(page.locator("#task-args")).to_contain_text("inv-acme-7")
    expect(page.locator("#task-kwargs")).to_contain_text('"amount": 120')
    expect(page.locator("#task-return")).to_contain_text('"sent": true')
    assert_links_under_prefix(page)

    page.goto(f"{server}{PREFIX}items/{failed}/")
    expect(page.locator("#item-status")).to_have_text("Permanent Failure")
    expect(page.get_by_text("PermanentError: invoice inv-globex-0 has no amount to charge")
           .first).to_be_visible()

    page.goto(f"{server}{PREFIX}queues/{TASK_QUEUE}/?task=billing.tasks.send_invoice")
    expect(page.locator("#item-list").get_by_role("link", name=re.compile(
        "^[0-9a-f-]{36}$"))).to_have_count(2)
    assert_links_under_prefix(page)


def test_the_cluster_stops_on_sigterm(cluster, processed):
    assert cluster.process.poll() is None, f"the cluster died:\n{tail(cluster.log)}"
    started = time.monotonic()
    exit_code = cluster.stop(timeout=60)
    assert exit_code == 0, f"qcluster exited {exit_code}:\n{tail(cluster.log)}"
    assert time.monotonic() - started < 45, "qcluster took too long to stop"
    assert "has stopped" in cluster.log.read_text()
