"""Property tests: any text and any time a producer sends either is refused at the door or is
stored in a form every reader can read: the item list, the item page, the export, the API read
and the live stream's framing. Derandomized, 50 examples each."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queues import enqueue
from queues.engine import lifecycle, tokens
from queues.models import Item
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
