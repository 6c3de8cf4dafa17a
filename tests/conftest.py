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
