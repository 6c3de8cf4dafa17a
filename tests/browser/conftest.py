"""Fixtures for the browser test modules that share the dashboard's usual set-up: a uvicorn
child process on a database of the module's own, seeded by the function of tests.browser.seed
that the module names in SEED ("seed" unless it says otherwise), Debian's Chromium, and pages
signed in as a role. Modules with other needs (a cluster, a restart) keep fixtures of their own."""

import pytest

from queues.bench import processes
from tests.browser import support

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
MAIN_PAGES = ["login", "overview", "items", "item", "accounts", "errors", "dead-letters", "audit",
              "bulk-preview", "bulk-operation", "preferences"]


@pytest.fixture(scope="module")
def dashboard_server(request, tmp_path_factory):
    label = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    database = support.ServerDatabase(tmp_path_factory.mktemp(label), label)
    env = database.env()
    support.migrate_and_seed(env, getattr(request.module, "SEED", "seed"))
    port = processes.free_port()
    web = processes.start_web(port, env=env)
    yield f"http://127.0.0.1:{port}"
    processes.stop([web])
    database.drop()


@pytest.fixture(scope="module")
def chromium():
    playwright_sync = support.playwright_or_skip()
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=support.CHROMIUM, args=support.CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def axe():
    return support.axe_source()


@pytest.fixture(scope="module")
def main_pages(chromium, dashboard_server) -> dict[str, str]:
    """The paths of MAIN_PAGES on the seed's data: the item's is looked up, and a bulk operation
    is started through its preview for the operation's page (no cluster runs it: it stays
    running)."""
    context = chromium.new_context()
    page = context.new_page()
    support.sign_in(page, dashboard_server, "operator")
    page.goto(f"{dashboard_server}/search/?q=invoice-0")
    item = page.get_by_role("link", name="invoice-0").get_attribute("href")
    bulk = "/queues/emails/bulk/?kind=retry&status=complete&period=7d&preview=1"
    page.goto(dashboard_server + bulk)
    page.get_by_role("button", name="Retry 4 items").click()
    page.wait_for_url("**/bulk/*/")
    operation = page.url.removeprefix(dashboard_server)
    context.close()
    return {"login": "/accounts/login/", "overview": "/", "items": "/queues/emails/",
            "item": item, "accounts": "/queues/emails/accounts/",
            "errors": "/queues/emails/errors/", "dead-letters": "/dead-letters/",
            "audit": "/audit/", "bulk-preview": bulk, "bulk-operation": operation,
            "preferences": "/preferences/"}


@pytest.fixture
def open_page(chromium, dashboard_server):
    """open_page("operator", color_scheme="dark", viewport=PHONE): a page in a fresh browser
    context, signed in through the login form (or not, for None). The test fails on any console
    error (a CSP violation is one), page error, failed request or browser dialog."""
    contexts, problems = [], []

    def open_as(username: str | None, *, color_scheme: str = "light", viewport: dict = DESKTOP,
                answered: tuple[int, ...] = ()):
        """`answered`: statuses the test provokes on purpose (a refused filter's 400), which
        the browser logs as errors."""
        context = chromium.new_context(viewport=viewport, color_scheme=color_scheme)
        contexts.append(context)
        page = context.new_page()
        provoked = tuple(f"status of {status} " for status in answered)

        def on_console(message):
            if message.type == "error" and not any(p in message.text for p in provoked):
                problems.append(message.text)

        page.on("console", on_console)
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}")
                if r.status >= 404 else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("dialog", lambda d: problems.append(f"a browser dialog: {d.message}"))
        if username is None:
            page.goto(f"{dashboard_server}/accounts/login/")
        else:
            support.sign_in(page, dashboard_server, username)
        return page

    yield open_as
    for context in contexts:
        context.close()
    assert not problems, problems
