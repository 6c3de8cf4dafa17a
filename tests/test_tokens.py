import hashlib
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queues.engine import tokens
from queues.models import ApiToken, AuditEntry
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def test_only_a_digest_of_the_secret_is_stored(queue):
    token, secret = tokens.create("producer", queue_keys=["emails"])
    stored = ApiToken.objects.get(pk=token.pk)
    assert secret.startswith("qa_") and len(secret) > 40
    assert stored.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {stored.digest, stored.prefix, stored.name}
    assert stored.prefix == secret[:10]


def test_authenticate_finds_the_token_and_records_its_use(queue):
    token, secret = tokens.create("producer", queue_keys=["emails"])
    assert tokens.authenticate(secret).pk == token.pk
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute(queue):
    token, secret = tokens.create("producer", queue_keys=["emails"])
    tokens.authenticate(secret)
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    tokens.authenticate(secret)
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    tokens.authenticate(secret)
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


@pytest.mark.parametrize("presented", ["", "qa_", "qa_wrong", "x" * 500, "qa_\ud800"])
def test_authenticate_refuses_wrong_secrets(queue, presented):
    tokens.create("producer", queue_keys=["emails"])
    assert tokens.authenticate(presented) is None


def test_a_revoked_token_no_longer_authenticates(queue):
    token, secret = tokens.create("producer", queue_keys=["emails"])
    assert tokens.revoke(token) is True
    assert tokens.authenticate(secret) is None
    assert tokens.revoke(token) is False  # once


def test_scope_is_the_listed_queues_only(queue):
    other = QueueFactory(key="billing")
    token, _ = tokens.create("producer", queue_keys=["emails"])
    assert tokens.allows(token, queue.pk)
    assert not tokens.allows(token, other.pk)
    assert tokens.queue_ids(token) == [queue.pk]


def test_an_all_queues_token_allows_queues_created_later(queue):
    token, _ = tokens.create("ops", all_queues=True)
    later = QueueFactory(key="later")
    assert tokens.allows(token, later.pk)
    assert tokens.queue_ids(token) is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"queue_keys": []}, "some queues or to all"),
    ({"queue_keys": ["emails"], "all_queues": True}, "not both"),
    ({"queue_keys": ["nope"]}, "unknown queue"),
    ({"queue_keys": ["emails\x00"]}, "unknown queue"),  # PostgreSQL would refuse the query
])
def test_create_refuses_an_unclear_scope(queue, kwargs, message):
    with pytest.raises(tokens.TokenError, match=message):
        tokens.create("producer", **kwargs)
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("name", ["", "x" * 101, "nul\x00", "two\nlines"])
def test_create_refuses_a_name_the_token_list_and_audit_log_cannot_show(queue, name):
    with pytest.raises(tokens.TokenError, match="1-100 printable characters"):
        tokens.create(name, queue_keys=["emails"])
    assert not ApiToken.objects.exists()


def test_creation_and_revocation_are_audited(queue):
    token, _ = tokens.create("producer", queue_keys=["emails"])
    tokens.revoke(token)
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == [
        "token.create", "token.revoke"]


def test_the_command_prints_the_secret_once(queue, capsys):
    call_command("create_api_token", "producer", "--queue", "emails")
    secret = capsys.readouterr().out.strip()
    assert tokens.authenticate(secret) is not None


def test_the_command_revokes_by_name(queue, capsys):
    call_command("create_api_token", "producer", "--queue", "emails")
    secret = capsys.readouterr().out.strip()
    call_command("create_api_token", "producer", "--revoke")
    assert tokens.authenticate(secret) is None
    with pytest.raises(CommandError, match="no live token"):
        call_command("create_api_token", "producer", "--revoke")


def test_the_command_explains_a_bad_scope(queue):
    with pytest.raises(CommandError, match="unknown queue"):
        call_command("create_api_token", "producer", "--queue", "nope")


def test_revoked_at_is_set(queue):
    token, _ = tokens.create("producer", queue_keys=["emails"])
    tokens.revoke(token)
    assert ApiToken.objects.get(pk=token.pk).revoked_at <= timezone.now()
