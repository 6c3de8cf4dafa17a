"""Property tests: any text and any time a producer sends either is refused at the door or is
stored in a form every reader can read: the item list, the item page, the export, the API read
and the live stream's framing. Every way in is tried: Python, the JSON API, the dashboard's
forms and filters, Django's admin site and the enqueue command. Derandomized, 50 examples each."""

import io
import json
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queues import enqueue
from queues.engine import lifecycle, tokens
from queues.models import AccountPolicy, CounterDelta, Item, ItemEvent
from queues.web.stream import SSE_LINE_BREAK, _sse
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db
EXAMPLES = settings(max_examples=50, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
hostile_text = st.text(min_size=1, max_size=40)
any_time = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                        timezones=st.just(UTC))


@pytest.fixture
def reader(role_client):
    QueueFactory(key="hostile")
    secret = tokens.create("reader", queue_keys=["hostile"])[1]
    return role_client("Viewer"), secret


@EXAMPLES
@given(identifier=hostile_text, account=hostile_text, error=st.text(max_size=200))
def test_any_text_is_refused_or_read_back_on_every_page(reader, identifier, account, error):
    viewer, secret = reader
    Item.objects.all().delete()
    try:
        item = enqueue("hostile", account=account, identifier=identifier,
                       payload={"note": error})
    except lifecycle.EnqueueError:
        return
    Item.objects.filter(pk=item.pk).update(last_error=error)
    for url in ("/queues/hostile/", f"/items/{item.pk}/", "/queues/hostile/errors/",
                "/queues/hostile/accounts/", "/queues/hostile/export.csv"):
        response = viewer.get(url)
        assert response.status_code == 200, url
    api = viewer.get(f"/api/v1/items/{item.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.status_code == 200 and api.json()["identifier"] == identifier
    framed = _sse("row", f"<td>{identifier}</td><td>{account}</td><td>{error}</td>")
    lines = SSE_LINE_BREAK.split(framed.removesuffix("\n\n"))
    assert lines[0] == "event: row" and all(line.startswith("data: ") for line in lines[1:])


@EXAMPLES
@given(run_at=any_time)
def test_any_time_is_refused_or_read_back(reader, run_at):
    viewer, _ = reader
    Item.objects.all().delete()
    try:
        item = enqueue("hostile", account="acme", identifier="t", run_at=run_at)
    except lifecycle.EnqueueError:
        assert not datetime(1970, 1, 1, tzinfo=UTC) <= run_at < datetime(2100, 1, 1, tzinfo=UTC)
        return
    assert Item.objects.get(pk=item.pk).run_at == run_at
    assert viewer.get("/queues/hostile/").status_code == 200
    assert viewer.get(f"/items/{item.pk}/").status_code == 200
    assert timezone.is_aware(run_at)


# --- every other way in: the JSON API, the dashboard's forms, Django's admin site, commands ------

def nothing_stored() -> bool:
    return not (Item.objects.exists() or ItemEvent.objects.exists()
                or CounterDelta.objects.exists())


@EXAMPLES
@given(identifier=hostile_text, account=hostile_text,
       run_at=st.one_of(any_time.map(datetime.isoformat), st.text(max_size=30)))
def test_the_api_refuses_hostile_input_with_a_4xx_writing_nothing_or_reads_it_back(
        reader, client, identifier, account, run_at):
    viewer, secret = reader
    Item.objects.all().delete()
    ItemEvent.objects.all().delete()
    CounterDelta.objects.all().delete()
    body = {"account": account, "identifier": identifier, "run_at": run_at}
    response = client.post("/api/v1/queues/hostile/items", json.dumps(body),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code < 500 and response["Content-Type"] == "application/json"
    if response.status_code >= 400:
        assert nothing_stored()
        return
    item = Item.objects.get()
    assert (item.identifier, item.account) == (identifier, account)
    assert viewer.get(f"/items/{item.pk}/").status_code == 200
    assert viewer.get("/queues/hostile/").status_code == 200


@EXAMPLES
@given(text=hostile_text, when=st.text(max_size=30))
def test_dashboard_filters_and_forms_answer_hostile_text_without_a_server_error(
        role_client, text, when):
    QueueFactory(key="hostile")
    operator = role_client("Operator")
    pages = [("/search/", {"q": text}),
             ("/queues/hostile/", {"identifier": text, "account": text, "text": text,
                                   "payload": f"{text} = {text}", "from": when}),
             ("/queues/hostile/errors/", {"account": text}),
             ("/queues/hostile/accounts/", {"sort": text, "cursor": text, "after": text})]
    for url, query in pages:
        assert operator.get(url, query).status_code in (200, 400), url
    response = operator.post("/queues/hostile/accounts/pause/", {"account": text})
    assert response.status_code < 500
    if response.status_code >= 400:
        assert not AccountPolicy.objects.exists()
    AccountPolicy.objects.all().delete()


@EXAMPLES
@given(account=hostile_text, weight=st.text(max_size=8))
def test_the_admin_site_refuses_a_hostile_account_policy_or_stores_one_it_can_list(
        role_client, account, weight):
    queue = QueueFactory(key="hostile")
    admin = role_client("Admin")
    AccountPolicy.objects.all().delete()
    response = admin.post("/django-admin/queues/accountpolicy/add/", {
        "queue": queue.pk, "account": account, "weight": weight or "1"})
    assert response.status_code in (200, 302)  # 200: the form again, with its errors
    if response.status_code == 200:
        assert not AccountPolicy.objects.exists()
    listing = admin.get("/django-admin/queues/accountpolicy/")
    assert listing.status_code == 200


@EXAMPLES
@given(identifier=hostile_text, account=hostile_text, run_at=st.text(max_size=30))
def test_the_enqueue_command_refuses_hostile_input_with_a_message_or_stores_it_readably(
        reader, identifier, account, run_at):
    viewer, _ = reader
    Item.objects.all().delete()
    arguments = ["hostile", f"--account={account}", f"--identifier={identifier}"]
    if run_at:
        arguments.append(f"--run-at={run_at}")
    try:
        call_command("enqueue", *arguments, stdout=io.StringIO())
    except CommandError:
        assert not Item.objects.exists()
        return
    item = Item.objects.get()
    assert (item.identifier, item.account) == (identifier, account)
    assert viewer.get(f"/items/{item.pk}/").status_code == 200
