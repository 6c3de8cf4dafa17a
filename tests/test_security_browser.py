"""The XSS matrix in a real browser: Debian's headless Chromium against a uvicorn child process on
a database of its own, seeded with items whose every field holds the hostile strings of
tests/test_security_xss.py. The item pages, the lists and the live stream (rows arriving over
server-sent events and swapped in by htmx) must open no dialog, log no console error (a CSP
violation would be one), and send no request that data asked for."""

import time

import pytest

from queues.bench import processes
from tests.browser import support
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS

SEED = """
import django; django.setup()
from django.contrib.auth.models import Group, User
from queues.models import Attempt, DeadLetter, Item, ItemEvent
from tests.factories import QueueFactory, items_in_status
from tests.browser.seed import PASSWORD
from tests.test_security_xss import ALL, HOSTILE
User.objects.create_user("admin", password=PASSWORD).groups.add(Group.objects.get(name="Admin"))
User.objects.create_user("viewer", password=PASSWORD).groups.add(Group.objects.get(name="Viewer"))
queue = QueueFactory(key="xss", name=ALL[:200])
payload = {text: text for text in HOSTILE} | {"password": ALL}
items = (items_in_status(queue, "failed", 1, account=ALL[:200], prefix=HOSTILE[0], payload=payload)
         + items_in_status(queue, "retry", 1, account=HOSTILE[3], prefix=HOSTILE[7][:200],
                           payload=payload))
ids = [item.pk for item in items]
Item.objects.filter(pk__in=ids).update(last_error=ALL)
Attempt.objects.filter(item_id__in=ids).update(error=ALL, traceback=ALL + "\\n" + ALL)
ItemEvent.objects.filter(item_id__in=ids).update(reason=ALL)
DeadLetter.objects.filter(item_id__in=ids).update(last_error=ALL)
print(",".join(str(pk) for pk in ids))
"""

playwright_sync = support.playwright_or_skip()


@pytest.fixture(scope="module")
def xss_server(tmp_path_factory):
    database = support.ServerDatabase(tmp_path_factory.mktemp("xss"), "xss")
    env = database.env()
    support.run(env, "manage.py", "migrate", "--noinput", "-v0")
    item_ids = support.run(env, "-c", SEED).splitlines()[-1].split(",")
    port = processes.free_port()
    web = processes.start_web(port, env=env)
    yield f"http://127.0.0.1:{port}", item_ids
    processes.stop([web])
    database.drop()


@pytest.fixture(scope="module")
def xss_browser():
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.parametrize("username", ["admin", "viewer"])
def test_hostile_data_opens_no_dialog_and_runs_nothing(xss_browser, xss_server, username):
    server, item_ids = xss_server
    context = xss_browser.new_context()
    page = context.new_page()
    dialogs, errors, requested = [], [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requested.append(r.url) if "xss1" in r.url
            and "/accounts/login/" not in r.url else None)
    support.sign_in(page, server, username)
    for pk in item_ids:
        page.goto(f"{server}/items/{pk}/")
        page.wait_for_load_state("networkidle")
        # The hostile identifier is on the page, as text.
        playwright_sync.expect(page.get_by_role("heading", level=1)).to_contain_text("alert(")
    for path in ("/queues/xss/", "/queues/xss/errors/", "/queues/xss/accounts/",
                 "/dead-letters/", "/audit/"):
        page.goto(f"{server}{path}")
        page.wait_for_load_state("networkidle")
    # The stream page lists the items' events as they come in over SSE.
    page.goto(f"{server}/queues/xss/stream/")
    page.wait_for_selector("tbody tr >> text=alert(", timeout=10_000)
    time.sleep(1)  # let htmx process whatever was swapped in
    context.close()
    assert not dialogs, dialogs
    assert not errors, errors
    assert not requested, requested
