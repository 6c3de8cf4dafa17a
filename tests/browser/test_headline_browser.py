"""The operator's headline task in Debian's headless Chromium, counted in interactions: retry
every item that failed in the last 24 hours on a queue, starting from the overview. Items that
failed an hour ago are retried although they were enqueued three days ago; items that failed two
days ago are left alone (the range is over when items failed)."""

import pytest

from queues.bench import processes
from tests.browser.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ServerDatabase,
    migrate_and_seed,
    playwright_or_skip,
    sign_in,
)

playwright_sync = playwright_or_skip()
WAIT_MS = 30_000
MOST_INTERACTIONS = 3  # the budget: clicks, select changes or typed fields


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    database = ServerDatabase(tmp_path_factory.mktemp("headline-browser"), "headline")
    env = database.env()
    migrate_and_seed(env, "seed_headline")
    port = processes.free_port()
    # A cluster runs the bulk operation's steps; the requeued items may run after that.
    children = [processes.start_web(port, env=env),
                processes.start_manage("qcluster", env=env | {"QUEUEADMIN_WORKERS": "2"})]
    yield f"http://127.0.0.1:{port}"
    processes.stop(children)
    database.drop()


class Operator:
    """A signed-in page that counts what the operator does."""

    def __init__(self, page):
        self.page, self.interactions = page, 0

    def click(self, locator):
        self.interactions += 1
        locator.click()


def test_retrying_what_failed_in_the_last_24_hours_takes_three_interactions(server):
    expect = playwright_sync.expect
    problems = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("dialog", lambda dialog: problems.append(f"a browser dialog: {dialog.message}"))
        sign_in(page, server, "operator")  # lands on the overview
        operator = Operator(page)

        row = page.get_by_role("row").filter(has=page.get_by_role("link", name="Webhooks"))
        operator.click(row.get_by_role("link", name="failed in 24 h"))
        expect(page.locator("#item-list-title")).to_contain_text("3 items")
        operator.click(page.get_by_role("link", name="Retry all 3 matching…"))
        expect(page.locator("#bulk-preview")).to_contain_text("failed items finished from")
        operator.click(page.get_by_role("button", name="Retry 3 items"))
        expect(page.locator("#bulk-progress")).to_contain_text("Done", timeout=WAIT_MS)
        expect(page.locator("#bulk-progress dd").nth(1)).to_have_text("3")
        assert operator.interactions <= MOST_INTERACTIONS

        # What changed, checked on the item list (not counted): the two early failures stay.
        page.goto(f"{server}/queues/webhooks/?status=failed")
        expect(page.locator("#item-list-title")).to_contain_text("2 items")
        expect(page.get_by_role("link", name="early-0")).to_be_visible()
        expect(page.get_by_role("link", name="late-0")).to_have_count(0)
        browser.close()
    assert not problems, problems
