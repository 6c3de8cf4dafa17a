"""A walk over every dashboard page that sends each parameter the page itself asks for (its
forms' fields, its links' query keys, the form behind each of its GET forms) the values people
and scripts really send: digits int() refuses ("²"), ids past bigint, cursors with a part
swapped for one, NUL bytes, dates at the calendar's ends, a parameter given twice. Every answer
must be a page or a 4xx, never a server error; exports are read to their end, since a streamed
body fails after its status is sent. Django's admin site is walked the same way: its change
lists' filters are parameters too. Adding a page or a parameter needs nothing here."""

import re
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from queues.models import Queue, Status
from queues.permissions import ADMIN
from tests.factories import items_in_status
from tests.test_security_walk import ADMIN_PAGES, URLS, rule_for, url_of

pytestmark = pytest.mark.django_db
HUGE = "99999999999999999999"  # past bigint: the database raises instead of finding nothing
HOSTILE = ["²", "-1", "0", HUGE, f"1-{HUGE}", f"{HUGE}-1", "\x00", "x" * 3000, "9999-12-31",
           "0001-01-01T00:00:00Z", "NaN", "1e309", "\u2028"]
# Where a page's forms lead further once it is asked something: the bulk page's preview, whose
# confirmation form is the one that starts an operation.
ASKED = {"queues:bulk": "?preview=1&kind=retry&status=failed&period=24h"}
PAGES = [url for url in URLS if getattr(rule_for(url[0], url[1]), "kind", "") in ("page", "self")]


class Forms(HTMLParser):
    """A page's forms (method, action, fields with their values) and its links' URLs."""

    def __init__(self, html: str):
        super().__init__()
        self.forms: list[dict] = []
        self.links: list[str] = []
        self.select: str | None = None  # the name of the select being read
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("href", "hx-get"):
            if attrs.get(name):
                self.links.append(attrs[name])
        if tag == "form":
            self.forms.append({"method": (attrs.get("method") or "get").lower(),
                               "action": attrs.get("action") or "", "fields": {}})
        elif tag in ("input", "select", "textarea", "button") and attrs.get("name"):
            form = self._form_of(attrs)
            if form is not None and attrs["name"] != "csrfmiddlewaretoken":
                checked = attrs.get("type") not in ("checkbox", "radio") or "checked" in attrs
                if not form["fields"].get(attrs["name"]):  # the first value given
                    form["fields"][attrs["name"]] = attrs.get("value") or "" if checked else ""
            self.select = attrs["name"] if tag == "select" and form is not None else None
        elif tag == "option" and self.select and "selected" in attrs:
            self.forms[-1]["fields"][self.select] = attrs.get("value") or ""

    def _form_of(self, attrs):
        # A field outside its form names it (form="selection-form"); else the open form.
        if attrs.get("form"):
            return None
        return self.forms[-1] if self.forms else None


def parameters(client, url: str) -> tuple[dict[str, set[str]], list[dict]]:
    """The GET parameters a page asks for (name: values seen) and its POST forms, following
    each GET form of the page once with its own values."""
    path = urlsplit(url).path
    names: dict[str, set[str]] = {k: {v} for k, v in parse_qsl(urlsplit(url).query)}
    posts = []
    pages = [url]
    for index, address in enumerate(pages):
        if address in pages[:index]:
            continue
        response = client.get(address)
        assert response.status_code < 500 if index else response.status_code == 200, address
        if "html" not in response.get("Content-Type", ""):
            continue
        found = Forms(response.content.decode())
        for link in found.links:
            parts = urlsplit(link)
            if parts.path in ("", path):
                for key, value in parse_qsl(parts.query, keep_blank_values=True):
                    names.setdefault(key, set()).add(value)
        for form in found.forms:
            action = urlsplit(form["action"]).path or urlsplit(address).path
            if form["method"] == "post":
                posted = {"action": form["action"] or address, "fields": form["fields"]}
                if posted not in posts:
                    posts.append(posted)
            elif action == path:
                for key, value in form["fields"].items():
                    names.setdefault(key, set()).add(value)
                if index == 0:
                    pages.append(f"{path}?" + "&".join(
                        f"{k}={v}" for k, v in form["fields"].items() if v))
    return names, posts


def mutations(values: set[str]) -> set[str]:
    """Each value the page handed out with one of its numbers swapped for one past bigint."""
    swapped = set()
    for value in values:
        for match in re.finditer(r"\d+", value):
            swapped.add(value[:match.start()] + HUGE + value[match.end():])
    return swapped


def answer(client, method: str, url: str, data) -> str | None:
    """What went wrong with a request, or None: a status of 500 or more, or an exception."""
    try:
        response = getattr(client, method)(url, data)
        if response.streaming:
            b"".join(response.streaming_content)
    except Exception as error:  # noqa: BLE001 (the test client re-raises the view's error)
        return f"{method.upper()} {url} {data!r:.200}: {error!r:.200}"
    if response.status_code >= 500:
        return f"{method.upper()} {url} {data!r:.200}: {response.status_code}"
    return None


@pytest.fixture
def admin(db):
    user = User.objects.create_user("hostile-admin")
    user.groups.add(Group.objects.get(name=ADMIN))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def more_than_a_page(sample):
    """Enough items for pages to hand out their page positions, failures among them."""
    queue = Queue.objects.get(key="q")
    for status in (Status.QUEUED, Status.FAILED, Status.RETRY, Status.COMPLETE):
        items_in_status(queue, status, 20, account=f"a-{status}")
    return sample


@pytest.mark.parametrize("name, namespace, kwarg_names", PAGES, ids=[url[0] for url in PAGES])
def test_every_parameter_of_the_page_answers_hostile_values_without_a_server_error(
        name, namespace, kwarg_names, more_than_a_page, admin):
    url = url_of(name, kwarg_names, rule_for(name, namespace), more_than_a_page) \
        + ASKED.get(name, "")
    names, posts = parameters(admin, url)
    base = dict(parse_qsl(urlsplit(url).query))
    path = urlsplit(url).path
    problems = []
    for key, seen in sorted(names.items()):
        for value in [*HOSTILE, *sorted(mutations(seen)), ["1", "²"]]:
            problems.append(answer(admin, "get", path, base | {key: value}))
    for form in posts:
        for key in form["fields"]:
            for value in HOSTILE:
                problems.append(
                    answer(admin, "post", form["action"], form["fields"] | {key: value}))
    problems = [problem for problem in problems if problem]
    assert not problems, "\n".join(problems[:10])


ADMIN_LISTS = [name for name in ADMIN_PAGES if name.endswith("_changelist")]


@pytest.mark.parametrize("name", ADMIN_LISTS)
def test_every_filter_of_the_admin_sites_lists_answers_hostile_values_without_a_server_error(
        name, more_than_a_page, admin):
    url = reverse(name)
    names, posts = parameters(admin, url)
    names.setdefault("q", set())  # the search box, on lists that have search fields
    problems = [answer(admin, "get", url, {key: value})
                for key, seen in sorted(names.items())
                for value in [*HOSTILE, *sorted(mutations(seen)), ["1", "²"]]]
    problems += [answer(admin, "get", f"{url}{value}/change/", {}) for value in (HUGE, "²")]
    problems = [problem for problem in problems if problem]
    assert not problems, "\n".join(problems[:10])


KEYED = [(name, namespace, kwarg_names) for name, namespace, kwarg_names in URLS
         if "key" in kwarg_names]
NOT_QUEUE_KEYS = ["a%00b", "%00", "Q", "a%20b", "x" * 65, "a%E2%80%AEb"]


@pytest.mark.parametrize("name, namespace, kwarg_names", KEYED, ids=[url[0] for url in KEYED])
def test_a_url_naming_a_key_no_queue_could_have_is_a_404_before_any_query(
        name, namespace, kwarg_names, sample, admin):
    """PostgreSQL refuses to compare text with a NUL byte: such a key, looked up, was a 500."""
    from queues.engine import tokens

    _, secret = tokens.create("walker", all_queues=True, scopes=tokens.SCOPES)
    url = urlsplit(url_of(name, kwarg_names, rule_for(name, namespace), sample)).path
    assert "/queues/q/" in url
    for key in NOT_QUEUE_KEYS:
        hostile = url.replace("/queues/q/", f"/queues/{key}/", 1)
        for method in ("get", "post"):
            response = getattr(admin, method)(hostile, HTTP_AUTHORIZATION=f"Bearer {secret}")
            assert response.status_code == 404, (method, hostile, response.status_code)
            if namespace == "queues_api":
                assert response["Content-Type"] == "application/json"
