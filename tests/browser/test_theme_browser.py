"""Dark mode in Debian's headless Chromium: the theme follows prefers-color-scheme (Playwright's
color_scheme) until the user chooses light or dark in their preferences; the first frame is
already in the right theme; and axe-core finds no contrast (or other serious) violation on the
main pages in either theme. Screenshots go to var/test-artifacts/browser/ (theme-*.png)."""

import pytest

from tests.browser.conftest import MAIN_PAGES
from tests.browser.support import check_accessibility, playwright_or_skip

playwright_sync = playwright_or_skip()
LIGHT_BG, DARK_BG = "rgb(246, 247, 249)", "rgb(15, 20, 25)"
# Read by an init script in the first animation frame, which a render-blocking stylesheet holds
# back: what the user first sees, before any page script has run.
FIRST_FRAME = """requestAnimationFrame(() => {
  window.firstFrameBg = getComputedStyle(document.body || document.documentElement).backgroundColor;
});"""


def background(page) -> str:
    # After the page's stylesheets: on a busy machine the status of a save was shown while the
    # theme's stylesheet was still loading. What the first frame shows is FIRST_FRAME's test.
    page.wait_for_load_state("load")
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def choose_theme(page, server: str, label: str):
    page.goto(f"{server}/preferences/")
    page.get_by_label(label).check()
    page.get_by_role("button", name="Save").click()
    saved = page.get_by_role("status").filter(has_text="Saved")
    playwright_sync.expect(saved).to_contain_text(f"theme: {label}")


@pytest.mark.parametrize(("system", "expected"), [("light", LIGHT_BG), ("dark", DARK_BG)])
def test_a_user_who_chose_nothing_follows_the_system(open_page, system, expected):
    page = open_page("viewer", color_scheme=system)
    assert background(page) == expected


def test_following_the_system_switches_when_the_system_does(open_page):
    page = open_page("viewer", color_scheme="light")
    page.emulate_media(color_scheme="dark")
    assert background(page) == DARK_BG
    page.emulate_media(color_scheme="light")
    assert background(page) == LIGHT_BG


def test_the_chosen_theme_overrides_the_system_from_the_first_frame(open_page, dashboard_server):
    page = open_page("admin", color_scheme="light")
    page.add_init_script(FIRST_FRAME)
    choose_theme(page, dashboard_server, "Dark")
    assert background(page) == DARK_BG
    page.goto(f"{dashboard_server}/")
    assert page.evaluate("window.firstFrameBg") == DARK_BG
    page.emulate_media(color_scheme="dark")
    choose_theme(page, dashboard_server, "Light")
    page.goto(f"{dashboard_server}/")
    assert page.evaluate("window.firstFrameBg") == LIGHT_BG
    choose_theme(page, dashboard_server, "Follow the system")
    assert background(page) == DARK_BG
    # A new session on another machine gets the saved choice from the login.
    choose_theme(page, dashboard_server, "Dark")
    assert background(open_page("admin", color_scheme="light")) == DARK_BG
    choose_theme(page, dashboard_server, "Follow the system")


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("name", MAIN_PAGES)
def test_every_main_page_passes_axe_in_both_themes(open_page, dashboard_server, main_pages, axe,
                                                   theme, name):
    page = open_page(None if name == "login" else "operator", color_scheme=theme)
    page.goto(dashboard_server + main_pages[name])
    playwright_sync.expect(page.locator("h1")).to_be_visible()
    assert background(page) == (DARK_BG if theme == "dark" else LIGHT_BG)
    check_accessibility(page, axe, f"theme-{theme}-{name}")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_dialogs_pass_axe_in_both_themes(open_page, axe, theme):
    page = open_page("operator", color_scheme=theme)
    page.keyboard.press("?")
    playwright_sync.expect(page.get_by_role("dialog", name="Keyboard shortcuts")).to_be_visible()
    check_accessibility(page, axe, f"theme-{theme}-shortcuts")
    page.keyboard.press("Escape")
    page.get_by_role("link", name="Emails").click()
    page.get_by_role("button", name="Pause queue").click()
    playwright_sync.expect(page.locator("#confirm-dialog")).to_be_visible()
    check_accessibility(page, axe, f"theme-{theme}-confirm")
