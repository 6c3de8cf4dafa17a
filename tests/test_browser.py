"""The dashboard in a real headless Chromium against a uvicorn server started as a child
process on its own file-backed database (an SQLite file, or a separate PostgreSQL database when
the suite runs on PostgreSQL). axe-core checks every page for serious and critical violations;
screenshots are saved under var/test-artifacts/browser/."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from queues import processes
from tests.browser.seed import PASSWORD

CHROMIUM = "/usr/bin/chromium"
AXE_DIR = settings.BASE_DIR / "var" / "axe"
AXE = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
ARTIFACTS = settings.BASE_DIR / "var" / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

if not Path(CHROMIUM).exists():
    pytest.skip("Debian chromium is not installed (apt-get install chromium)",
                allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api")


def _database_url(tmp: Path) -> str:
    if connection.vendor != "postgresql":
        return f"sqlite:///{tmp / 'browser.sqlite3'}"
    import psycopg

    db = connection.settings_dict
    name = f"{db['NAME']}_browser"
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                         password=db["PASSWORD"] or None, dbname="postgres",
                         autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlsplit(processes.database_url())
    return urlunsplit(url._replace(path=f"/{name}"))


def _run(env: dict, *args: str):
    subprocess.run([sys.executable, *args], env=os.environ | env, check=True,  # noqa: S603
                   cwd=settings.BASE_DIR, capture_output=True, text=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    env = {"DATABASE_URL": _database_url(tmp), "QUEUEADMIN_ENV": "development", "DEBUG": "true"}
    _run(env, "manage.py", "migrate", "--noinput", "-v0")
    _run(env, "-c", "import django; django.setup(); from tests.browser.seed import seed; seed()")
    port = processes.free_port()
    web = processes.start_web(port, env=env | {"DJANGO_SETTINGS_MODULE": "queueadmin.settings"})
    yield f"http://127.0.0.1:{port}"
    processes.stop([web])


@pytest.fixture(scope="module")
def axe_source():
    if not AXE.exists() and shutil.which("npm"):
        AXE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "axe-core@4"],  # noqa: S607
                       cwd=AXE_DIR, check=True, capture_output=True)
    assert AXE.exists(), "axe-core is missing: npm install --prefix var/axe axe-core@4"
    return AXE.read_text()


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page_as(browser, server, request):
    """page_as("operator"): a fresh browser context signed in through the login form. Fails
    the test on any Content-Security-Policy violation or page error."""
    contexts, problems = [], []

    def open_as(username: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda m: problems.append(m.text)
                if m.type == "error" and not m.text.startswith("Failed to load") else None)
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}")
                if r.status >= 404 else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(f"{server}/accounts/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{server}/")
        return page

    yield open_as
    for context in contexts:
        context.close()
    assert not problems, problems


def check_accessibility(page, axe_source, name: str):
    """axe-core in the page (through the DevTools protocol, which the CSP does not block);
    serious and critical violations fail the test. Saves a screenshot as an artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}-{connection.vendor}.png", full_page=True)
    page.evaluate(axe_source)
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
           for v in result["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, f"{name}: {bad}"


@pytest.mark.parametrize("username", ["viewer", "operator", "admin"])
def test_each_role_logs_in_and_sees_the_overview(page_as, axe_source, username):
    page = page_as(username)
    expect = playwright_sync.expect
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="Emails")).to_be_visible()
    expect(page.locator("#queue-table .badge-paused")).to_have_count(1)
    expect(page.get_by_text(f"{username} · {username.capitalize()}")).to_be_visible()
    expect(page.get_by_role("link", name="Settings")).to_have_count(
        1 if username == "admin" else 0)
    check_accessibility(page, axe_source, f"overview-{username}")


def test_overview_refreshes_itself(page_as):
    page = page_as("viewer")
    first = page.locator("#queue-table time").first.get_attribute("datetime")
    page.wait_for_function(
        "first => document.querySelector('#queue-table time').getAttribute('datetime')"
        " !== first", arg=first, timeout=15_000)
    playwright_sync.expect(page.locator("[data-connection]")).to_have_text("Live")


def test_filter_items_by_status_and_time_range(page_as, server, axe_source):
    page = page_as("viewer")
    page.get_by_role("link", name="Emails").click()
    expect = playwright_sync.expect
    expect(page.get_by_role("link", name="old-1")).to_be_visible()
    page.get_by_label("Permanent Failure").check()
    expect(page.get_by_role("link", name="invoice-0")).to_be_visible()
    expect(page.get_by_role("link", name="retrying-0")).to_have_count(0)
    assert "status=failed" in page.url
    page.get_by_label("Permanent Failure").uncheck()
    page.get_by_label("Queued").check()
    expect(page.get_by_role("link", name="old-1")).to_be_visible()
    page.get_by_label("Created").select_option("24h")
    expect(page.get_by_role("link", name="old-1")).to_have_count(0)
    expect(page.get_by_role("link", name="waiting-1")).to_be_visible()
    assert re.search(r"period=24h", page.url) and "status=queued" in page.url
    check_accessibility(page, axe_source, "items")


def test_open_an_item_with_a_traceback_and_retry_it_without_a_reload(page_as, axe_source):
    page = page_as("operator")
    page.get_by_role("link", name="Emails").click()
    page.get_by_role("link", name="invoice-0").click()
    expect = playwright_sync.expect
    expect(page.locator("#item-status")).to_have_text("Permanent Failure")
    page.get_by_text("Traceback", exact=True).click()
    expect(page.locator("pre.traceback")).to_contain_text("HTTPError: 503 Server Error")
    check_accessibility(page, axe_source, "item-detail")
    expect(page.locator("#queue-counts")).to_contain_text("1 dead letters")
    page.evaluate("window.notReloaded = true")
    page.get_by_role("button", name="Retry").click()
    expect(page.locator("#item-status")).to_have_text("Queued")
    expect(page.get_by_text("Retry: done.")).to_be_visible()
    # The action's HX-Trigger makes the counts strip fetch itself again.
    expect(page.locator("#queue-counts")).to_contain_text("0 dead letters")
    assert page.evaluate("window.notReloaded") is True


def test_cancel_a_queued_item(page_as):
    page = page_as("operator")
    page.goto(page.url + "search/?q=waiting-1")
    page.get_by_role("link", name="waiting-1").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel").click()
    playwright_sync.expect(page.locator("#item-status")).to_have_text("Cancelled")


def test_viewer_sees_no_action_buttons(page_as):
    page = page_as("viewer")
    page.get_by_role("link", name="Emails").click()
    page.get_by_role("link", name="retrying-1").click()
    expect = playwright_sync.expect
    expect(page.locator("#item-status")).to_have_text("Scheduled for Retry")
    for name in ("Retry", "Cancel", "Run now"):
        expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
    page.get_by_role("link", name="Selector & sweeper").click()
    expect(page.get_by_role("button", name="Run the sweeper now")).to_have_count(0)


@pytest.mark.parametrize("path", ["/queues/emails/errors/", "/queues/emails/accounts/",
                                  "/search/?q=retrying", "/activity/", "/audit/",
                                  "/dead-letters/", "/preferences/"])
def test_every_other_page_passes_axe(page_as, server, axe_source, path):
    page = page_as("operator")
    page.goto(server + path)
    playwright_sync.expect(page.locator("h1")).to_be_visible()
    check_accessibility(page, axe_source, path.strip("/").split("?")[0].replace("/", "-"))


def test_phone_width_keeps_the_navigation_usable(page_as, axe_source):
    page = page_as("viewer")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    playwright_sync.expect(page.get_by_role("link", name="Dead letters")).to_be_visible()
    check_accessibility(page, axe_source, "overview-phone")
