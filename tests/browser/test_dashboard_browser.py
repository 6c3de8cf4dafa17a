"""The dashboard's everyday pages and actions in a real headless Chromium (tests/browser/conftest.py
starts the uvicorn server on a database of this module's own): each role's overview, filters, an
item's retry and cancel, what a Viewer is not offered, and axe-core on every other page.
Screenshots are saved under var/test-artifacts/browser/."""

import re

import pytest

from tests.browser import support
from tests.browser.support import check_accessibility

expect = support.playwright_or_skip().expect


@pytest.mark.parametrize("username", ["viewer", "operator", "admin"])
def test_each_role_logs_in_and_sees_the_overview(open_page, axe, username):
    page = open_page(username)
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="Emails")).to_be_visible()
    expect(page.locator("#queue-table .badge-paused")).to_have_count(1)
    expect(page.get_by_text(f"{username} · {username.capitalize()}")).to_be_visible()
    expect(page.get_by_role("link", name="Settings")).to_have_count(
        1 if username == "admin" else 0)
    check_accessibility(page, axe, f"overview-{username}")


def test_overview_refreshes_itself(open_page):
    page = open_page("viewer")
    first = page.locator("#queue-table time").first.get_attribute("datetime")
    page.wait_for_function(
        "first => document.querySelector('#queue-table time').getAttribute('datetime')"
        " !== first", arg=first, timeout=15_000)
    expect(page.locator("[data-connection]")).to_have_text("Live")


def test_the_overview_refresh_keeps_keyboard_focus_and_scroll(open_page):
    page = open_page("viewer")
    page.set_viewport_size({"width": 1280, "height": 300})
    link = page.locator("#q-emails-errors")
    link.focus()
    page.evaluate("window.scrollTo(0, 120)")
    scrolled = page.evaluate("window.scrollY")
    first = page.locator("#queue-table time").first.get_attribute("datetime")
    page.wait_for_function(
        "first => document.querySelector('#queue-table time').getAttribute('datetime')"
        " !== first", arg=first, timeout=15_000)
    expect(page.locator("#q-emails-errors")).to_be_focused()
    assert page.evaluate("window.scrollY") == scrolled


def test_filter_items_by_status_and_time_range(open_page, axe):
    page = open_page("viewer")
    page.get_by_role("link", name="Emails").click()
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
    check_accessibility(page, axe, "items")


def test_open_an_item_with_a_traceback_and_retry_it_without_a_reload(open_page, axe):
    page = open_page("operator")
    page.get_by_role("link", name="Emails").click()
    page.get_by_role("link", name="invoice-0").click()
    expect(page.locator("#item-status")).to_have_text("Permanent Failure")
    page.get_by_text("Traceback", exact=True).click()
    expect(page.locator("pre.traceback")).to_contain_text("HTTPError: 503 Server Error")
    check_accessibility(page, axe, "item-detail")
    expect(page.locator("#queue-counts")).to_contain_text("1 dead letters")
    page.evaluate("window.notReloaded = true")
    page.get_by_role("button", name="Retry").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#item-status")).to_have_text("Queued")
    expect(page.get_by_text("Retry: done.")).to_be_visible()
    # The Retry button is gone: the focus is on what it did, not on Cancel beside it.
    expect(page.get_by_text("Retry: done.")).to_be_focused()
    # The action's HX-Trigger makes the counts strip fetch itself again.
    expect(page.locator("#queue-counts")).to_contain_text("0 dead letters")
    assert page.evaluate("window.notReloaded") is True


def test_cancel_a_queued_item(open_page):
    page = open_page("operator")
    page.goto(page.url + "search/?q=waiting-1")
    page.get_by_role("link", name="waiting-1").click()
    page.get_by_role("button", name="Cancel").click()
    # The page's own confirmation dialog, not the browser's confirm().
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Cancel item waiting-1?")
    dialog.get_by_role("button", name="Confirm").click()
    expect(page.locator("#item-status")).to_have_text("Cancelled")


def test_viewer_sees_no_action_buttons(open_page):
    page = open_page("viewer")
    page.get_by_role("link", name="Emails").click()
    page.get_by_role("link", name="retrying-1").click()
    expect(page.locator("#item-status")).to_have_text("Scheduled for Retry")
    for name in ("Retry", "Cancel", "Run now"):
        expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
    page.get_by_role("link", name="Selector & sweeper").click()
    expect(page.get_by_role("button", name="Run the sweeper now")).to_have_count(0)


@pytest.mark.parametrize("path", ["/queues/emails/errors/", "/queues/emails/accounts/",
                                  "/search/?q=retrying", "/activity/", "/audit/",
                                  "/dead-letters/", "/preferences/", "/alerts/"])
def test_every_other_page_passes_axe(open_page, dashboard_server, axe, path):
    page = open_page("operator")
    page.goto(dashboard_server + path)
    expect(page.locator("h1")).to_be_visible()
    check_accessibility(page, axe, path.strip("/").split("?")[0].replace("/", "-"))


def test_select_all_selects_the_page_then_offers_every_matching_item(open_page):
    page = open_page("operator")
    page.get_by_role("link", name="Emails").click()
    rows = page.locator('#item-list input[name="ids"]')
    expect(rows.first).to_be_visible()
    page.get_by_label("Select every item on this page").check()
    assert all(box.is_checked() for box in rows.all())
    more = page.locator("[data-select-more]")
    expect(more).to_be_visible()
    # The list holds every status: its count is not what a retry would change.
    expect(more.get_by_role("link", name="Retry those that can be retried…")).to_be_visible()
    # An earlier test retried the one failed item; complete ones stay.
    page.get_by_label("Complete", exact=True).check()
    expect(page.get_by_role("link", name=re.compile(r"^Retry all \d+ matching…$")).first
           ).to_be_visible()
    page.get_by_label("Select every item on this page").uncheck()
    expect(more).to_be_hidden()


def test_a_bulk_preview_goes_once_its_filters_change(open_page, dashboard_server):
    """Its confirm button acts on the set it counted: left in place under changed filters, it
    would cancel every queued item where the form now says one account's last hour."""
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/bulk/?kind=retry&status=complete&period=7d"
              "&preview=1")
    confirm = page.get_by_role("button", name="Retry 4 items")
    expect(confirm).to_be_visible()
    # The keyboard starts at the preview: its confirm button is a few Tabs away, not 50.
    expect(page.locator("#bulk-preview-title")).to_be_focused()
    # Its times age every second on screen, not in a screen reader's ear (a live region).
    ages = page.locator("#bulk-preview [data-relative]")
    expect(ages.first).to_have_attribute("aria-hidden", "true")
    assert ages.evaluate_all("els => els.every(e => e.getAttribute('aria-hidden') === 'true')")
    page.get_by_role("textbox", name="Account").fill("acme")
    expect(confirm).to_have_count(0)
    expect(page.locator("#bulk-preview")).to_contain_text("The filters changed: preview again")
    page.get_by_role("textbox", name="Account").fill("")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_role("button", name="Retry 4 items")).to_be_visible()
