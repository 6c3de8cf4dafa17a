"""The bulk flow in Debian's headless Chromium, with a uvicorn server and a django-q2 cluster
as child processes on a database of their own: pause the queue, preview a bulk retry by time
range and status, confirm, watch the operation finish; then cancel a selection of items."""

import re

import pytest

from queues.bench import processes
from tests.browser.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ServerDatabase,
    axe_source,
    check_accessibility,
    migrate_and_seed,
    playwright_or_skip,
    sign_in,
)

playwright_sync = playwright_or_skip()
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def bulk_server(tmp_path_factory):
    database = ServerDatabase(tmp_path_factory.mktemp("bulk-browser"), "bulk")
    env = database.env()
    migrate_and_seed(env)
    port = processes.free_port()
    children = [processes.start_web(port, env=env)]

    def start_cluster():
        # A cluster starts the selector loop at once: started after the test paused the queue,
        # it leaves the items where the seed put them.
        children.append(processes.start_manage("qcluster", env=env | {"QUEUEADMIN_WORKERS": "2"}))

    yield f"http://127.0.0.1:{port}", start_cluster
    processes.stop(children)
    database.drop()


@pytest.fixture
def operator_page(bulk_server):
    problems = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("dialog", lambda dialog: problems.append(f"a browser dialog: {dialog.message}"))
        sign_in(page, bulk_server[0], "operator")
        yield page, bulk_server[1]
        browser.close()
    assert not problems, problems


def test_bulk_retry_by_time_range_and_status_then_cancel_a_selection(operator_page):
    (page, start_cluster), expect = operator_page, playwright_sync.expect
    page.get_by_role("link", name="Emails").click()
    # Paused, so the cluster's selector leaves the items where the test put them.
    page.get_by_role("button", name="Pause queue").click()
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
    expect(page.locator("#toast")).to_contain_text("Queue emails paused")
    expect(page.locator("#queue-pause")).to_contain_text("Paused by operator")
    start_cluster()

    page.get_by_role("link", name="Bulk retry / cancel").click()
    page.get_by_label("Retry", exact=True).check()
    page.get_by_label("Complete").check()
    page.get_by_label("Time range").select_option("7d")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#bulk-preview")).to_contain_text("Eligible")
    expect(page.locator("#bulk-preview dd").nth(1)).to_have_text("4")
    axe = axe_source()
    check_accessibility(page, axe, "bulk-preview")
    page.get_by_role("button", name="Retry 4 items").click()

    expect(page.locator("#bulk-progress")).to_contain_text("Done", timeout=WAIT_MS)
    expect(page.locator("#bulk-progress")).to_contain_text("Changed")
    expect(page.locator("#bulk-progress dd").nth(1)).to_have_text("4")
    check_accessibility(page, axe, "bulk-operation")

    page.get_by_role("link", name="Items").click()
    page.get_by_label("Scheduled for Retry").check()
    # The filtered list replaces the whole list when it arrives (its URL is pushed then): a
    # box ticked in the list before it would be ticked in a list about to go.
    page.wait_for_url(re.compile(r"[?&]status=retry"))
    expect(page.get_by_role("link", name="retrying-0")).to_be_visible()
    page.get_by_label("Select retrying-0").check()
    page.get_by_label("Select retrying-2").check()
    page.get_by_role("button", name="Cancel selected…").click()
    expect(page.locator("#bulk-preview")).to_contain_text("2 selected items")
    page.get_by_role("button", name="Cancel 2 items").click()
    expect(page.locator("#bulk-progress")).to_contain_text("Done", timeout=WAIT_MS)

    page.get_by_role("link", name="Items").click()
    page.get_by_label("Cancelled").check()
    expect(page.get_by_role("link", name="retrying-0")).to_be_visible()
    expect(page.get_by_role("link", name="retrying-2")).to_be_visible()
    expect(page.get_by_role("link", name="retrying-1")).to_have_count(0)
