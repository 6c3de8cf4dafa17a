import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    # Concurrency guarantees are proven on PostgreSQL; .ci/run runs the suite there too.
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_retention_passes():
    """The sweeper keeps, per process, where its retention passes over events and items got
    to; ids and times start again in each test's database, so a pass left by one test would
    skip another's rows."""
    from queues.engine import sweeper

    sweeper.EVENT_PASSES.clear()
    sweeper.ITEM_PASSES.clear()


@pytest.fixture
def role_client(db, client):
    """A client signed in with a role: role_client("Viewer"), "Operator" or "Admin"."""
    from django.contrib.auth.models import Group, User

    def sign_in(role):
        user, created = User.objects.get_or_create(username=f"{role.lower()}-user")
        if created:
            user.set_password("pw-for-tests-1")
            user.save()
            user.groups.add(Group.objects.get(name=role))
        client.force_login(user)
        client.user = user
        return client

    return sign_in


@pytest.fixture
def sample(db):
    """One row of each kind a URL names (queue "q", an item, a running bulk operation, a token,
    an alert rule and its firing), by the placeholders the URL walks use: "$item", ..."""
    from django.utils import timezone

    from queues import enqueue
    from queues.engine import tokens
    from queues.models import AlertFiring, AlertRule, BulkOperation
    from tests.factories import QueueFactory

    queue = QueueFactory(key="q")
    item = enqueue("q", account="acme", identifier="walk-1", payload={"n": 1})
    bulk = BulkOperation.objects.create(
        queue=queue, kind="retry", actor_name="walker", filter={}, filter_hash="0" * 64,
        expected=0, created_at=timezone.now())  # running, so that stopping it changes it
    token, _ = tokens.create("walker", all_queues=True, scopes=tokens.SCOPES)
    rule = AlertRule.objects.get(queue=queue, kind="depth")
    firing = AlertFiring.objects.create(rule=rule, started_at=timezone.now(), threshold=1)
    return {"$item": item.pk, "$bulk": bulk.pk, "$token": token.pk, "$rule": rule.pk,
            "$firing": firing.pk}


@pytest.fixture(scope="module")
def server():
    """A webhook receiver on a local port for the module (tests.receiver)."""
    from tests.receiver import Receiver

    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def receiver(server):
    server.reset()
    return server
