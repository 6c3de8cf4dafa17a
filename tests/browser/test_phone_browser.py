"""The dashboard on a phone (390x844) in Debian's headless Chromium: a compact header whose menu
opens behind a button (and stays open without scripts), no page that scrolls sideways (a table
scrolls inside its own box), the overview's queue column that stays beside its numbers, and
status badges never cut off. And the overview whole in a laptop's window (1280 px), alerts
firing. Screenshots go to var/test-artifacts/browser/ (phone-*.png)."""

import pytest

from tests.browser.conftest import DESKTOP, MAIN_PAGES, PHONE
from tests.browser.seed import PASSWORD
from tests.browser.support import artifact, check_accessibility, playwright_or_skip

playwright_sync = playwright_or_skip()
expect = playwright_sync.expect
SEED = "seed_alerting"
MOST_HEADER_PX = 56
MORE_PAGES = {"stream": "/queues/emails/stream/", "search": "/search/?q=retrying",
              "activity": "/activity/", "workers": "/workers/"}
# A badge's box and the boxes it must fit in: its table cell or list entry, and the viewport.
BADGE_BOXES = """badge => {
  const box = e => e.getBoundingClientRect().toJSON();
  return {badge: box(badge), cell: box(badge.closest('td, th, dd, li') || document.body),
          viewport: {left: 0, top: 0, right: innerWidth, bottom: innerHeight},
          overflows: badge.scrollWidth > badge.clientWidth};
}"""


def inside(inner: dict, outer: dict) -> bool:
    return all(inner[side] >= outer[side] - 0.5 for side in ("left", "top")) and \
        all(inner[side] <= outer[side] + 0.5 for side in ("right", "bottom"))


def assert_badges_whole(page, where: str):
    badges = page.locator(".badge")
    assert badges.count(), f"{where}: no badge to check"
    for badge in badges.all():
        badge.scroll_into_view_if_needed()
        boxes, text = badge.evaluate(BADGE_BOXES), badge.inner_text()
        assert not boxes["overflows"], f"{where}: the text of {text!r} overflows its badge"
        assert inside(boxes["badge"], boxes["cell"]), f"{where}: {text!r} sticks out of its cell"
        assert inside(boxes["badge"], boxes["viewport"]), f"{where}: {text!r} is off the screen"


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def test_the_header_is_compact_and_its_menu_opens_behind_a_button(open_page, axe):
    page = open_page("operator", viewport=PHONE)
    assert page.get_by_role("banner").bounding_box()["height"] <= MOST_HEADER_PX
    menu = page.get_by_role("button", name="Menu")
    dead_letters = page.get_by_role("link", name="Dead letters")
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(dead_letters).to_be_hidden()
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(dead_letters).to_be_visible()
    check_accessibility(page, axe, "phone-menu")
    page.keyboard.press("Escape")
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(menu).to_be_focused()
    # The search box is in the menu: / opens it on the way.
    page.keyboard.press("/")
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("searchbox", name="Search by identifier")).to_be_focused()
    dead_letters.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Dead letters")
    expect(menu).to_have_attribute("aria-expanded", "false")


def test_without_scripts_the_header_menu_stays_open(chromium, dashboard_server):
    context = chromium.new_context(viewport=PHONE, java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{dashboard_server}/accounts/login/")
    page.get_by_label("Username").fill("viewer")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("link", name="Dead letters")).to_be_visible()
    expect(page.get_by_role("button", name="Menu")).to_be_hidden()
    context.close()


@pytest.mark.parametrize("name", MAIN_PAGES + list(MORE_PAGES))
def test_no_page_scrolls_sideways(open_page, dashboard_server, main_pages, axe, name):
    page = open_page(None if name == "login" else "operator", viewport=PHONE)
    page.goto(dashboard_server + (main_pages | MORE_PAGES)[name])
    expect(page.locator("h1")).to_be_visible()
    if name == "item":
        page.get_by_text("Traceback", exact=True).click()
    check_accessibility(page, axe, f"phone-{name}")
    assert page_width(page) <= PHONE["width"], f"{name} is {page_width(page)} px wide"


def test_the_overview_keeps_each_queue_beside_its_numbers(open_page):
    page = open_page("viewer", viewport=PHONE)
    table = page.locator("#queue-table .table-scroll")
    queue = page.locator("#queue-table").get_by_role("link", name="Emails")
    row = page.locator("#queue-table tbody tr").filter(has=page.get_by_role("link", name="Emails"))
    table.evaluate("box => box.scrollLeft = box.scrollWidth")
    page.wait_for_function("document.querySelector('#queue-table .table-scroll').scrollLeft > 0")
    table.screenshot(path=artifact("phone-overview-scrolled"))
    name, last = queue.bounding_box(), row.locator("td").last.bounding_box()
    assert name["x"] >= 0, "the queue scrolled away"
    assert name["x"] + name["width"] <= last["x"], "the queue name covers its numbers"
    assert last["x"] + last["width"] <= PHONE["width"] + 0.5
    assert page_width(page) <= PHONE["width"]


@pytest.mark.parametrize("name", ["overview", "items", "item", "search"])
def test_status_badges_are_never_cut_off(open_page, dashboard_server, main_pages, name):
    page = open_page("viewer", viewport=PHONE)
    page.goto(dashboard_server + (main_pages | MORE_PAGES)[name])
    assert_badges_whole(page, name)


def test_the_overview_fits_a_laptop_window_with_its_alerts_firing(open_page):
    page = open_page("viewer", viewport=DESKTOP)
    table = page.locator("#queue-table .table-scroll")
    expect(page.locator("#queue-table .badge-alert").first).to_be_visible()
    table.screenshot(path=artifact("laptop-overview"))
    width, room = table.evaluate("box => [box.scrollWidth, box.clientWidth]")
    assert width <= room, f"the overview is {width} px wide in {room} px: a column is cut off"


@pytest.mark.parametrize("name", ["item", "accounts", "activity", "overview"])
def test_at_320_px_wide_no_card_pushes_the_page_sideways(open_page, dashboard_server, main_pages,
                                                         name):
    # 320 CSS px: the narrowest phones, and a 1280 px window zoomed to 400% (WCAG 1.4.10).
    narrow = {"width": 320, "height": 640}
    page = open_page("operator", viewport=narrow)
    page.goto(dashboard_server + (main_pages | MORE_PAGES)[name])
    expect(page.locator("h1")).to_be_visible()
    assert page_width(page) <= narrow["width"], f"{name} is {page_width(page)} px wide"
