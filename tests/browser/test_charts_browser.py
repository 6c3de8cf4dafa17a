"""The history charts in Debian's headless Chromium, on a real uvicorn server and a database of
its own (tests.browser.history_seed): the queue page loads its charts with axes, legend, hover
values and a table; the range picker swaps them; the errors page draws each group's trend; no
CSP or console error; axe-core finds no serious violation in either theme. Screenshots go to
var/test-artifacts/browser/charts-*.png."""

import re

import pytest

from queues.bench import processes
from tests.browser import support
from tests.browser.conftest import DESKTOP, PHONE

playwright_sync = support.playwright_or_skip()
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def dashboard_server(tmp_path_factory):
    """The module's own server (open_page of tests/browser/conftest.py signs in on it)."""
    database = support.ServerDatabase(tmp_path_factory.mktemp("charts"), "charts")
    env = database.env()
    support.run(env, "manage.py", "migrate", "--noinput", "-v0")
    support.run(env, "-c", "import django; django.setup(); "
                           "from tests.browser import history_seed; history_seed.seed()")
    port = processes.free_port()
    web = processes.start_web(port, env=env)
    yield f"http://127.0.0.1:{port}"
    processes.stop([web])
    database.drop()


def test_the_queue_page_draws_its_charts_with_axes_and_a_table(open_page, dashboard_server):
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/queues/emails/")
    chart = page.locator("#chart-throughput")
    expect(chart.locator("svg.history-chart")).to_be_visible()
    expect(chart.locator("text.axis-title").first).to_have_text("Time (UTC)")
    expect(chart.locator("text.axis-title").nth(1)).to_have_text("items per 15 min")
    assert chart.locator("text.tick-x").count() >= 6
    assert chart.locator("text.tick-y").count() >= 3
    expect(chart.locator(".chart-legend")).to_contain_text("Completed")
    assert chart.locator("path").first.get_attribute("d").startswith("M")
    box = chart.locator("svg.history-chart").bounding_box()
    assert box["width"] > 300 and box["height"] > 120
    # Hover values: each step's column carries its numbers in an SVG <title>.
    assert "Completed" in chart.locator(".hover rect").last.locator("title").text_content()
    for name in ("failures", "depth", "wait"):
        expect(page.locator(f"#chart-{name} svg.history-chart")).to_be_visible()
    chart.get_by_text("Show as table").click()
    expect(chart.locator("table tbody tr")).to_have_count(96)
    page.screenshot(path=support.artifact("charts-queue"), full_page=True)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_filters_stay_under_the_pointer_while_the_charts_load(open_page, dashboard_server,
                                                                  viewport):
    """A chart still loading takes a drawn chart's box: a status box clicked as the charts
    arrive was once 63 px lower than a moment before, and the click missed it."""
    page = open_page("viewer", viewport=viewport)
    held = []
    page.route("**/history/**", lambda route: held.append(route))
    page.goto(f"{dashboard_server}/queues/emails/")
    expect(page.locator(".chart-loading")).to_have_count(4)
    status_box = page.get_by_label("Permanent Failure")
    before = status_box.bounding_box()
    for request in held:
        request.continue_()
    expect(page.locator(".chart-loading")).to_have_count(0)
    expect(page.locator("svg.history-chart")).to_have_count(4)
    assert abs(status_box.bounding_box()["y"] - before["y"]) < 1


def test_the_range_picker_swaps_the_charts_in_place(open_page, dashboard_server):
    page = open_page("viewer")
    page.goto(f"{dashboard_server}/queues/emails/?status=complete")
    expect(page.locator("#chart-throughput svg.history-chart")).to_be_visible()
    picker = page.get_by_role("navigation", name="Time range of the charts")
    picker.get_by_role("link", name="30 d").click()
    expect(page.locator("#chart-throughput figcaption")).to_contain_text("last 30 d, per 6 h")
    expect(page.locator("#chart-throughput text.axis-title").nth(1)).to_have_text(
        "items per 6 h")
    expect(picker.get_by_role("link", name="30 d")).to_have_attribute("aria-current", "true")
    # The page itself is untouched; each link is also the page's address in its range.
    assert page.url.endswith("/queues/emails/?status=complete")
    expect(page.locator("#item-filters")).to_be_visible()
    assert picker.get_by_role("link", name="7 d").get_attribute("href") == (
        "/queues/emails/?status=complete&range=7d")
    page.screenshot(path=support.artifact("charts-queue-30d"), full_page=True)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_charts_pass_axe_in_both_themes(open_page, dashboard_server, axe, theme):
    page = open_page("viewer", color_scheme=theme)
    for path in ("/", "/queues/emails/accounts/"):
        page.goto(dashboard_server + path)
        expect(page.locator("svg.history-chart").first).to_be_visible()
        support.check_accessibility(page, axe, f"charts-{theme}-{path.strip('/') or 'overview'}"
                                    .replace("/", "-"))



@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_errors_page_draws_each_groups_trend_and_passes_axe(open_page, dashboard_server,
                                                                axe, theme):
    page = open_page("viewer", color_scheme=theme)
    page.goto(f"{dashboard_server}/queues/emails/errors/")
    trends = page.get_by_role("img", name=re.compile(r"^\d+ failures in 24 h, peak \d+ per hour"))
    expect(trends).to_have_count(2)
    box = trends.first.bounding_box()
    assert box["width"] > 40 and box["height"] > 10
    assert trends.first.locator("path").get_attribute("d").startswith("M")
    page.get_by_role("navigation", name="Time range of the trends").get_by_role(
        "link", name="7 d").click()
    expect(page.get_by_role("img", name=re.compile(r"failures in 7 d, peak"))).to_have_count(2)
    page.screenshot(path=support.artifact(f"charts-errors-{theme}"), full_page=True)
    support.check_accessibility(page, axe, f"charts-{theme}-errors")
