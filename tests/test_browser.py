"""The dashboard in a real headless Chromium against a uvicorn server started as a child
process on its own file-backed database (an SQLite file, or a separate PostgreSQL database when
the suite runs on PostgreSQL). axe-core checks every page for serious and critical violations;
screenshots are saved under var/test-artifacts/browser/."""

import re

import pytest

from queues.bench import processes
from tests.browser import support
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, check_accessibility

playwright_sync = support.playwright_or_skip()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    database = support.ServerDatabase(tmp_path_factory.mktemp("browser"), "browser")
    env = database.env()
    support.migrate_and_seed(env)
    port = processes.free_port()
    web = processes.start_web(port, env=env)
    yield f"http://127.0.0.1:{port}"
    processes.stop([web])
    database.drop()


@pytest.fixture(scope="module")
def axe_source():
    return support.axe_source()


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
        support.sign_in(page, server, username)
        return page

    yield open_as
    for context in contexts:
        context.close()
    assert not problems, problems


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


def test_the_overview_refresh_keeps_keyboard_focus_and_scroll(page_as):
    page = page_as("viewer")
    page.set_viewport_size({"width": 1280, "height": 300})
    link = page.locator("#q-emails-errors")
    link.focus()
    page.evaluate("window.scrollTo(0, 120)")
    scrolled = page.evaluate("window.scrollY")
    first = page.locator("#queue-table time").first.get_attribute("datetime")
    page.wait_for_function(
        "first => document.querySelector('#queue-table time').getAttribute('datetime')"
        " !== first", arg=first, timeout=15_000)
    playwright_sync.expect(page.locator("#q-emails-errors")).to_be_focused()
    assert page.evaluate("window.scrollY") == scrolled


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
    page.get_by_label("Time", exact=True).select_option("24h")
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
    page.get_by_role("button", name="Cancel").click()
    # The page's own confirmation dialog, not the browser's confirm().
    dialog = page.get_by_role("dialog")
    playwright_sync.expect(dialog).to_contain_text("Cancel item waiting-1?")
    dialog.get_by_role("button", name="Confirm").click()
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
                                  "/dead-letters/", "/preferences/", "/alerts/"])
def test_every_other_page_passes_axe(page_as, server, axe_source, path):
    page = page_as("operator")
    page.goto(server + path)
    playwright_sync.expect(page.locator("h1")).to_be_visible()
    check_accessibility(page, axe_source, path.strip("/").split("?")[0].replace("/", "-"))


def test_select_all_selects_the_page_then_offers_every_matching_item(page_as):
    page = page_as("operator")
    page.get_by_role("link", name="Emails").click()
    expect = playwright_sync.expect
    rows = page.locator('#item-list input[name="ids"]')
    expect(rows.first).to_be_visible()
    page.get_by_label("Select every item on this page").check()
    assert all(box.is_checked() for box in rows.all())
    more = page.locator("[data-select-more]")
    expect(more).to_be_visible()
    total = page.locator("#item-list-title").inner_text().split(" ")[0]
    expect(more.get_by_role("link", name=f"Retry all {total} matching…")).to_be_visible()
    page.get_by_label("Select every item on this page").uncheck()
    expect(more).to_be_hidden()
