"""Keyboard shortcuts in Debian's headless Chromium (dashboard.js): / focuses the search, ?
lists the shortcuts in a dialog that Escape closes, j and k move a visible selection through a
list's rows (kept across htmx refreshes), Enter opens the selected row, g then q goes to the
queues, r retries the open item after the confirmation dialog (Operators). None of them fires
while the user types in a field or holds Ctrl, Meta or Alt. An action whose region htmx
replaces keeps the focus in that region, and a time range is a preset or typed dates."""

import re

from tests.browser.support import artifact, playwright_or_skip

playwright_sync = playwright_or_skip()
expect = playwright_sync.expect


def selected(page):
    return page.locator("main tr[data-selected]")


def test_slash_focuses_the_search_without_typing_into_it(open_page):
    page = open_page("viewer")
    page.keyboard.press("/")
    search = page.get_by_role("searchbox", name="Search by identifier")
    expect(search).to_be_focused()
    expect(search).to_have_value("")
    page.keyboard.type("old-1")
    page.keyboard.press("Enter")
    expect(page.get_by_role("link", name="old-1")).to_be_visible()


def test_question_mark_lists_the_shortcuts_in_a_dialog_that_escape_closes(open_page):
    page = open_page("operator")
    page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Retry the open item")
    expect(dialog.get_by_role("button", name="Close")).to_be_focused()
    # Inside the dialog the page's shortcuts are off: j moves nothing behind it.
    page.keyboard.press("j")
    expect(selected(page)).to_have_count(0)
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Shortcuts").click()
    expect(dialog).to_be_visible()


def test_viewers_are_not_offered_the_retry_shortcut(open_page):
    page = open_page("viewer")
    page.keyboard.press("?")
    expect(page.get_by_role("dialog", name="Keyboard shortcuts")).not_to_contain_text("Retry")


def test_j_and_k_move_a_visible_selection_and_enter_opens_it(open_page, dashboard_server):
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/queues/emails/")
    links = page.locator("#item-list tbody tr td:first-child a")
    first, second = links.nth(0).inner_text(), links.nth(1).inner_text()
    page.keyboard.press("j")
    expect(selected(page)).to_have_count(1)
    expect(selected(page).get_by_role("link", name=first)).to_be_focused()
    page.keyboard.press("j")
    expect(selected(page).get_by_role("link", name=second)).to_be_focused()
    # Visible without the focus ring too: the row has its own background.
    plain = page.locator("#item-list tbody tr").nth(0).locator("td").first
    marked = selected(page).locator("td").first
    assert marked.evaluate("e => getComputedStyle(e).backgroundColor") != \
        plain.evaluate("e => getComputedStyle(e).backgroundColor")
    page.screenshot(path=artifact("keyboard-selection"))
    page.keyboard.press("k")
    expect(selected(page).get_by_role("link", name=first)).to_be_focused()
    page.keyboard.press("k")  # stays on the first row
    expect(selected(page).get_by_role("link", name=first)).to_be_focused()
    # Enter opens the selected row even when the focus has left its link.
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text(first)


def test_the_selection_survives_the_overview_refreshing_its_rows(open_page):
    page = open_page("viewer")
    page.keyboard.press("j")
    row = page.locator("#queue-table tbody tr").filter(has=page.get_by_role("link", name="Emails"))
    expect(row).to_have_attribute("data-selected", "")
    updated = page.locator("#queue-table time").first.get_attribute("datetime")
    page.wait_for_function(
        "updated => document.querySelector('#queue-table time').getAttribute('datetime')"
        " !== updated", arg=updated, timeout=15_000)
    expect(row).to_have_attribute("data-selected", "")
    page.keyboard.press("j")
    expect(page.locator("#queue-table tbody tr").filter(
        has=page.get_by_role("link", name="Reports"))).to_have_attribute("data-selected", "")


def test_shortcuts_never_fire_while_typing_or_with_a_modifier(open_page, dashboard_server):
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/")
    page.keyboard.press("j")
    first = selected(page).get_by_role("link").first.inner_text()
    search = page.get_by_role("searchbox", name="Search by identifier")
    search.click()
    page.keyboard.type("jk/?gq")
    expect(search).to_have_value("jk/?gq")
    page.get_by_label("Time", exact=True).focus()
    page.keyboard.press("j")
    # The pages have no text area or editable region of their own; the test adds one of each.
    page.evaluate("""() => {
        const main = document.querySelector('main');
        main.prepend(Object.assign(document.createElement('textarea'), {id: 'text'}));
        main.prepend(Object.assign(document.createElement('div'), {id: 'note',
                                                                   contentEditable: 'true'}));
    }""")
    page.locator("#text").click()
    page.keyboard.type("jk?r")
    expect(page.locator("#text")).to_have_value("jk?r")
    page.locator("#note").click()
    page.keyboard.type("jk?r")
    expect(page.locator("#note")).to_have_text("jk?r")
    page.locator("h1").click()
    for chord in ("Control+j", "Alt+j", "Meta+j"):
        page.keyboard.press(chord)
    expect(selected(page)).to_have_count(1)
    expect(selected(page).get_by_role("link").first).to_have_text(first)
    expect(page.get_by_role("dialog")).to_have_count(0)
    assert page.url.startswith(f"{dashboard_server}/queues/emails/")


def test_g_then_q_goes_to_the_queues(open_page, dashboard_server):
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/dead-letters/")
    page.keyboard.press("q")  # q alone does nothing
    page.keyboard.press("g")
    page.keyboard.press("q")
    page.wait_for_url(f"{dashboard_server}/")
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()


def test_r_retries_the_open_item_after_the_confirmation_dialog(open_page, dashboard_server):
    page = open_page("operator")
    page.goto(f"{dashboard_server}/search/?q=invoice-0")
    page.get_by_role("link", name="invoice-0").click()
    # Until the load event the page's script may not listen for keys yet.
    page.wait_for_url(re.compile(r"/items/\d+/$"), wait_until="load")
    expect(page.locator("#item-status")).to_have_text("Permanent Failure")
    page.keyboard.press("r")
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Retry item invoice-0?")
    dialog.get_by_role("button", name="Go back").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#item-status")).to_have_text("Permanent Failure")
    page.keyboard.press("r")
    dialog.get_by_role("button", name="Retry").click()
    expect(page.locator("#item-status")).to_have_text("Queued")
    expect(page.get_by_text("Retry: done.")).to_be_visible()
    # Nothing left to retry: r does nothing.
    page.keyboard.press("r")
    expect(page.get_by_role("dialog")).to_have_count(0)


def test_r_does_nothing_for_a_viewer(open_page, dashboard_server):
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/search/?q=done-0")
    page.get_by_role("link", name="done-0").click()
    # Until the load event the page's script may not listen for keys yet.
    page.wait_for_url(re.compile(r"/items/\d+/$"), wait_until="load")
    page.keyboard.press("r")
    expect(page.get_by_role("dialog")).to_have_count(0)
    assert re.search(r"/items/\d+/$", page.url)


def test_the_focus_stays_in_a_region_the_action_replaced(open_page, dashboard_server):
    # htmx swaps the pause form for its opposite: without dashboard.js the focus fell to
    # <body>, and a keyboard user started again from the top of the page.
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/")
    page.get_by_role("button", name="Pause queue").focus()
    page.keyboard.press("Enter")
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
    resume = page.get_by_role("button", name="Resume queue")
    expect(resume).to_be_focused()
    page.keyboard.press("Enter")  # resuming asks nothing
    expect(page.get_by_role("button", name="Pause queue")).to_be_focused()


def test_typing_a_date_chooses_from_to_and_a_preset_clears_the_dates(open_page,
                                                                     dashboard_server):
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/bulk/")
    period = page.get_by_label("Time range")
    expect(period).to_have_value("1h")
    start = page.locator('input[name="created_from"]')
    start.fill("2026-01-01T10:00")
    expect(period).to_have_value("custom")
    period.select_option("24h")
    expect(start).to_have_value("")


def test_the_dates_leave_the_tab_order_while_a_preset_is_chosen(open_page, dashboard_server):
    """Chromium gives each date field seven Tab stops, which a preset's range never uses."""
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/bulk/")
    period, clock = page.get_by_label("Time range"), page.get_by_label("Range over")
    start = page.locator('input[name="created_from"]')
    expect(period).to_have_value("1h")
    clock.focus()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Account", exact=True)).to_be_focused()
    period.select_option("custom")
    clock.focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "created_from"
    # A click still reaches them, and a typed date keeps them in the order.
    period.select_option("24h")
    start.fill("2026-01-01T10:00")
    expect(period).to_have_value("custom")
    expect(start).not_to_have_attribute("tabindex", "-1")


def test_apply_keeps_the_focus_on_its_button_and_the_new_count_is_said(open_page,
                                                                     dashboard_server):
    # The button is disabled while its request runs, which dropped the focus to <body>.
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/queues/emails/?status=failed")
    apply = page.locator("#item-filters").get_by_role("button", name="Apply")
    page.get_by_label("Identifier starts with").fill("invoice")
    apply.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#announcer")).to_have_text(re.compile(r"^\d+ items? newest first$"))
    expect(apply).to_be_focused()


def test_a_filter_error_marks_its_field_and_the_field_names_the_error(open_page,
                                                                     dashboard_server):
    page = open_page("viewer", answered=(400,))
    page.goto(f"{dashboard_server}/queues/emails/")
    payload = page.get_by_label("Payload field")
    payload.fill("no equals sign")
    payload.press("Enter")
    error = page.locator("#id_payload_error")
    expect(error).to_contain_text("Payload field")
    expect(payload).to_have_attribute("aria-invalid", "true")
    assert "id_payload_error" in payload.get_attribute("aria-describedby").split()
    # Fixed and sent again, the field is no longer marked.
    payload.fill("n = 1")
    payload.press("Enter")
    expect(page.locator("#id_payload_error")).to_have_count(0)
    expect(payload).not_to_have_attribute("aria-invalid", "true")


def test_a_skip_link_goes_past_the_charts_and_filters_to_the_items(open_page, dashboard_server):
    page = open_page("operator")
    page.goto(f"{dashboard_server}/queues/emails/")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to the items")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#item-list")).to_be_focused()
    page.keyboard.press("Tab")
    # The next stop is the list's first control (its bulk action, or its first item).
    assert page.evaluate("document.activeElement.closest('#item-list') !== null")
