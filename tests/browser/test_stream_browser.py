"""The live stream in Debian's headless Chromium against a uvicorn child process on a database of
its own: rows arrive in order as items are enqueued through the JSON API, pause holds them,
resume shows them in order, and after a server restart the page carries on from the last row
it showed, without gaps or duplicates.

Fixtures are this module's own (names prefixed stream_): the restart needs a server the test
can stop and start on the same port, which the dashboard's module-scoped server is not."""

import pytest
import requests

from queues.bench import processes
from tests.browser.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ServerDatabase,
    axe_source,
    check_accessibility,
    migrate_and_seed,
    playwright_or_skip,
    run,
    sign_in,
)

WAIT_MS = 15_000
ROWS_PER_SECOND = 5  # the server's row cap; the test posts single items well below it

playwright_sync = playwright_or_skip()


@pytest.fixture(scope="module")
def stream_env(tmp_path_factory):
    """Environment of the server and of the commands run on its database."""
    database = ServerDatabase(tmp_path_factory.mktemp("stream-browser"), "stream")
    env = database.env() | {"QUEUEADMIN_STREAM_ROWS_PER_SECOND": str(ROWS_PER_SECOND)}
    migrate_and_seed(env)
    yield env
    database.drop()


@pytest.fixture(scope="module")
def stream_server(stream_env):
    """Start, stop and start again on the same port."""

    class Server:
        port = processes.free_port()
        process = None

        @property
        def url(self):
            return f"http://127.0.0.1:{self.port}"

        def start(self):
            self.process = processes.start_web(self.port, env=stream_env)

        def stop(self):
            processes.stop([self.process])

    server = Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stream_api(stream_env, stream_server):
    secret = run(stream_env, "manage.py", "create_api_token", "stream-test", "--queue", "emails")

    def post(*identifiers: str):
        """One item, or several in one request (one transaction: one burst of events)."""
        items = [{"account": "tenant-9", "identifier": i} for i in identifiers]
        response = requests.post(
            f"{stream_server.url}/api/v1/queues/emails/items",
            json=items[0] if len(items) == 1 else {"items": items},
            headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        assert response.status_code == 201, response.text

    return post


@pytest.fixture
def stream_page(stream_server):
    problems = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("console", lambda m: problems.append(m.text)
                if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        sign_in(page, stream_server.url, "viewer")
        yield page
        browser.close()
    assert not problems, problems


def shown(page) -> list[str]:
    """Identifiers in the table, top (newest) first."""
    return page.locator("#stream-rows tr[data-event] td:nth-child(2) a").all_inner_texts()


def event_ids(page) -> list[str]:
    return page.locator("#stream-rows tr").evaluate_all("rows => rows.map(r => r.dataset.event)")


def test_rows_arrive_in_order_pause_resume_and_survive_a_server_restart(
        stream_page, stream_server, stream_api, stream_env):
    page, expect = stream_page, playwright_sync.expect
    page.get_by_role("link", name="Live stream").click()  # the all-queues stream in the main nav
    expect(page.get_by_role("heading", name="Live stream all queues")).to_be_visible()
    page.goto(f"{stream_server.url}/queues/emails/stream/")
    expect(page.locator("#stream-connection")).to_have_text("Live", timeout=WAIT_MS)
    expect(page.locator("#stream-rows tr").first).to_be_visible(timeout=WAIT_MS)
    check_accessibility(page, axe_source(), "stream")
    before = shown(page)

    for n in range(3):
        stream_api(f"live-{n}")
    expect(page.locator("#stream-rows tr").first).to_contain_text("live-2", timeout=WAIT_MS)
    assert shown(page)[:3] == ["live-2", "live-1", "live-0"]

    page.get_by_role("button", name="Freeze view").click()
    expect(page.locator("#stream-connection")).to_have_text("Live (view frozen)")
    stream_api("held-0")
    said = page.locator("#stream-buffered-said")
    expect(said).to_have_text("1 new event while frozen", timeout=WAIT_MS)
    stream_api("held-1")
    expect(page.locator("#stream-buffered")).to_have_text("2 new events while frozen",
                                                         timeout=WAIT_MS)
    # The screen shows every event; a screen reader hears the count at most every 15 s.
    expect(said).to_have_text("1 new event while frozen")
    assert shown(page)[0] == "live-2"
    page.get_by_role("button", name="Unfreeze view").click()
    expect(page.locator("#stream-connection")).to_have_text("Live")
    assert shown(page)[:2] == ["held-1", "held-0"]
    expect(page.locator("#stream-buffered")).to_have_text("")

    stream_server.stop()
    expect(page.locator("#stream-connection")).to_have_text("Connection lost, reconnecting",
                                                            timeout=WAIT_MS)
    for n in range(2):  # written while no server runs; the page must still show them
        run(stream_env, "manage.py", "enqueue", "emails", "--account", "tenant-9",
            "--identifier", f"offline-{n}")
    stream_server.start()
    expect(page.locator("#stream-rows tr").first).to_contain_text("offline-1", timeout=WAIT_MS)
    expect(page.locator("#stream-connection")).to_have_text("Live")
    stream_api("after-restart")
    expect(page.locator("#stream-rows tr").first).to_contain_text("after-restart",
                                                                 timeout=WAIT_MS)

    new = ["after-restart", "offline-1", "offline-0", "held-1", "held-0", "live-2", "live-1",
           "live-0"]
    assert shown(page) == (new + before)[:len(shown(page))]
    ids = event_ids(page)
    assert len(ids) == len(set(ids)) and ids == sorted(ids, key=int, reverse=True)


def test_a_burst_past_the_row_cap_shows_its_first_rows_then_a_row_counting_the_rest(
        stream_page, stream_server, stream_api):
    page, expect = stream_page, playwright_sync.expect
    page.goto(f"{stream_server.url}/queues/emails/stream/")
    expect(page.locator("#stream-connection")).to_have_text("Live", timeout=WAIT_MS)
    stream_api(*[f"burst-{n:02d}" for n in range(12)])
    summary = page.locator("#stream-rows tr.stream-summary").first
    expect(summary).to_contain_text("7 events not shown in the last second: 7 enqueued.",
                                    timeout=WAIT_MS)
    assert page.locator("#stream-rows tr").first.get_attribute("class") == "stream-summary"
    assert shown(page)[:5] == [f"burst-{n:02d}" for n in range(4, -1, -1)]
    link = summary.get_by_role("link", name="items updated then")
    assert "clock=updated" in link.get_attribute("href")

    page.get_by_role("button", name="Freeze view").click()
    stream_api(*[f"frozen-{n:02d}" for n in range(9)])
    expect(page.locator("#stream-buffered")).to_have_text("9 new events while frozen",
                                                         timeout=WAIT_MS)
    page.get_by_role("button", name="Unfreeze view").click()
    assert page.locator("#stream-rows tr").first.get_attribute("class") == "stream-summary"
    assert shown(page)[:5] == [f"frozen-{n:02d}" for n in range(4, -1, -1)]
