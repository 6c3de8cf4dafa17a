"""XSS matrix: hostile strings in every user-controlled field (queue names, accounts,
identifiers, payload keys and values, errors, tracebacks, event reasons, dead letters, audit
entries, token names, usernames) rendered by every dashboard page, its htmx fragment and the
stream rows, as an Admin (who sees the most). Everything must arrive inert: no element, event
handler, htmx attribute or javascript: link made from data."""

from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse
from django.utils import timezone

from queues.engine import audit, tokens
from queues.models import Attempt, BulkOperation, DeadLetter, Item, ItemEvent, MetricMinute
from tests.factories import QueueFactory, items_in_status
from tests.test_security_walk import RULES, walk

pytestmark = pytest.mark.django_db
MARK = "xss1"  # every hostile string carries it, so any element or attribute it lands in is found
HOSTILE = [
    f"<script>alert('{MARK}')</script>",
    f'"><img src=x onerror=alert("{MARK}")>',
    f"' onmouseover='alert(\"{MARK}\")' x='",
    f'<div hx-get="/pause-all/?{MARK}" hx-trigger="load">x</div>',
    f'<a hx-on:click="alert(\'{MARK}\')">x</a>',
    f'" hx-post="/pause-all/?{MARK}" hx-trigger="load',
    f"javascript:alert('{MARK}')",
    f'<svg onload=alert("{MARK}")><a href="javascript:alert(\'{MARK}\')">x</a></svg>',
]
ALL = " ".join(HOSTILE)
# Attributes whose value is shown as text only (htmx shows hx-confirm in a confirm dialog).
TEXT_ATTRIBUTES = {"value", "title", "aria-label", "alt", "placeholder", "hx-confirm",
                   "datetime", "download"}
PAGES = [name for name, rule in RULES.items() if rule.kind == "page"]
ADMIN_PAGES = ["admin:queues_queue_changelist", "admin:queues_item_changelist",
               "admin:queues_deadletter_changelist", "admin:auth_user_changelist"]


class Findings(HTMLParser):
    """Elements and attributes that carry the mark: any of them would make data live."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if MARK in name:
                self.problems.append(f"<{tag}> got an attribute named from data: {name}")
            if value is None or MARK not in value:
                continue
            live = name.startswith("on") or name.startswith(("hx-", "data-hx"))
            if live and name not in TEXT_ATTRIBUTES:
                self.problems.append(f"<{tag} {name}> carries data: {value[:80]}")
            if name in ("href", "src", "action", "formaction") and value.strip().lower(
                    ).startswith("javascript:"):
                self.problems.append(f"<{tag} {name}> is a javascript: link")
        if tag in ("script", "svg", "img", "iframe", "object", "embed") and MARK in str(attrs):
            self.problems.append(f"<{tag}> made from data: {attrs}")

    def handle_data(self, data):
        if self.lasttag == "script" and MARK in data:
            self.problems.append(f"script body made from data: {data[:80]}")


def findings(html: str) -> list[str]:
    parser = Findings()
    parser.feed(html)
    parser.close()
    problems = parser.problems
    problems += [f"unescaped {text!r}" for text in HOSTILE if "<" in text and text in html]
    return problems


@pytest.fixture
def hostile(role_client):
    """A queue and rows whose every text field holds the hostile strings."""
    queue = QueueFactory(key="xss", name=ALL[:200], sensitive_keys=["password"])
    account = ALL[:200]
    payload = {text: text for text in HOSTILE} | {"nested": [ALL], "password": ALL}
    items = (items_in_status(queue, "failed", 1, account=account, prefix=HOSTILE[0],
                             payload=payload)
             + items_in_status(queue, "retry", 1, account=account, prefix=HOSTILE[3],
                               payload=payload)
             + items_in_status(queue, "queued", 1, account=account, prefix=HOSTILE[7][:200],
                               payload=payload))
    ids = [item.pk for item in items]
    Item.objects.filter(pk__in=ids).update(last_error=ALL)
    Attempt.objects.filter(item_id__in=ids).update(error=ALL, traceback=ALL + "\n" + ALL,
                                                   worker=ALL[:200])
    ItemEvent.objects.filter(item_id__in=ids).update(reason=ALL, actor=ALL[:200])
    DeadLetter.objects.filter(item_id__in=ids).update(last_error=ALL)
    audit.record(ALL[:150], ALL[:50], queue_key="xss", target=ALL[:255],
                 filter={ALL: ALL}, counts={ALL[:50]: 1})
    _, secret = tokens.create(ALL[:100], queue_keys=["xss"])
    BulkOperation.objects.create(
        queue=queue, kind="retry", actor_name=ALL[:150], filter={"account": ALL},
        filter_hash="0" * 64, expected=1, created_at=timezone.now(), error=ALL)
    User.objects.create_user(ALL[:150]).groups.add(Group.objects.get(name="Viewer"))
    # History of the hostile account: the charts name it in legends, hover titles and tables.
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    MetricMinute.objects.create(queue=queue, start=minute, completed=2, depth_queued=1)
    MetricMinute.objects.create(queue=queue, account=account, start=minute, completed=1)
    client = role_client("Admin")
    return {"client": client, "item": items[0].pk, "bulk": BulkOperation.objects.get().pk,
            "secret": secret}


def page_urls(sample):
    kwargs_of = {name: kwargs for name, _, _, kwargs in walk()}
    values = {"key": "xss", "pk": sample["item"], "fmt": "csv"}
    for name in PAGES:
        rule = RULES[name]
        chosen = values | {k: sample.get(str(v).lstrip("$"), v) for k, v in rule.kwargs.items()}
        yield name, reverse(name, kwargs={k: chosen[k] for k in kwargs_of[name]}) + rule.query


def test_hostile_strings_reach_the_pages(hostile):
    """The matrix below means something only if the data is on the pages at all."""
    html = hostile["client"].get(f"/items/{hostile['item']}/").content.decode()
    assert "&lt;script&gt;alert(&#x27;xss1&#x27;)&lt;/script&gt;" in html


def test_every_page_and_fragment_renders_hostile_data_inert(hostile):
    client = hostile["client"]
    problems = {}
    for name, url in page_urls(hostile):
        for headers in ({}, {"HTTP_HX_REQUEST": "true",
                             "HTTP_HX_CURRENT_URL": f"http://testserver{url}"}):
            response = client.get(url, **headers)
            assert response.status_code == 200, (name, url, response.status_code)
            if response.streaming or not response["Content-Type"].startswith("text/html"):
                continue
            found = findings(response.content.decode())
            if found:
                problems[f"{name} {url} {'htmx' if headers else 'page'}"] = found[:3]
    assert not problems, problems


def test_stream_rows_render_hostile_data_inert(hostile):
    for url in ("/stream/rows/?after=0", "/queues/xss/stream/rows/?after=0"):
        html = hostile["client"].get(url).content.decode()
        assert "&lt;" in html, "the rows should hold the escaped hostile identifiers"
        assert not findings(html), findings(html)


def test_the_search_page_renders_a_hostile_query_inert(hostile):
    html = hostile["client"].get("/search/", {"q": HOSTILE[1]}).content.decode()
    assert not findings(html)


@pytest.mark.parametrize("name", ADMIN_PAGES)
def test_django_admin_pages_render_hostile_data_inert(hostile, name):
    response = hostile["client"].get(reverse(name))
    assert response.status_code == 200
    assert not findings(response.content.decode())


def test_the_api_serves_hostile_data_as_json_that_no_browser_renders(hostile, client):
    response = client.get(f"/api/v1/items/{hostile['item']}",
                          HTTP_AUTHORIZATION=f"Bearer {hostile['secret']}")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "<" not in response.content.decode() and "\\u003cscript" in response.content.decode()


@pytest.mark.parametrize("html", [
    f"<p>{HOSTILE[0]}</p>", f"<p>{HOSTILE[1]}</p>", f"<a title='{HOSTILE[2]}'>x</a>",
    f"<p>{HOSTILE[3]}</p>", f"<p>{HOSTILE[4]}</p>", f'<a title="{HOSTILE[5]}">x</a>',
    f'<a href="{HOSTILE[6]}">x</a>', f"<p>{HOSTILE[7]}</p>",
])
def test_the_detector_finds_each_hostile_string_when_it_is_not_escaped(html):
    assert findings(html)
