"""API bearer tokens: created once and shown once, stored as a digest, checked in constant time."""

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queues.engine import audit
from queues.models import ApiToken, Queue, is_queue_key, printable

# What a token may do: enqueue (and read items and queues), operate (bulk retry, cancel and
# replay; pause and resume; reading too), purge (delete failed items for good, and follow the
# purges it starts; nothing else). A token holds the least it needs.
ENQUEUE, OPERATE, PURGE = "enqueue", "operate", "purge"
SCOPES = (ENQUEUE, OPERATE, PURGE)
TOKEN_PREFIX = "qa_"  # noqa: S105 (a marker that lets secret scanners spot leaked tokens)
# last_used_at is written at most this often per token, so a busy producer does not turn every
# request into a write on one hot row.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class TokenError(Exception):
    pass


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@transaction.atomic
def create(name: str, *, queue_keys=(), all_queues=False, scopes=(ENQUEUE,),
           actor="command") -> tuple[ApiToken, str]:
    """Create a token; returns it and its secret, which is not stored and cannot be shown again."""
    name = name.strip()
    given = set(scopes)
    if not given or given - set(SCOPES):
        raise TokenError(f"give a token one or more scopes of: {', '.join(SCOPES)}")
    scopes = [scope for scope in SCOPES if scope in given]
    if not name or len(name) > 100 or not printable(name):  # it is shown in the audit log
        raise TokenError("a token needs a name of 1-100 printable characters")
    queue_keys = sorted(set(queue_keys))
    if all_queues == bool(queue_keys):
        raise TokenError("scope a token to some queues or to all queues (not both, not neither)")
    queues = list(Queue.objects.filter(key__in=[key for key in queue_keys if is_queue_key(key)]))
    unknown = set(queue_keys) - {queue.key for queue in queues}
    if unknown:
        raise TokenError(f"unknown queue(s): {', '.join(sorted(unknown))}")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    user = actor if getattr(actor, "is_authenticated", False) else None
    token = ApiToken.objects.create(name=name, digest=digest(secret), prefix=secret[:10],
                                    all_queues=all_queues, created_by=user, scopes=scopes)
    token.queues.set(queues)
    audit.record(actor, "token.create", target=f"token {token.pk} {token.name}",
                 filter={"queues": "*" if all_queues else queue_keys, "scopes": scopes})
    return token, secret


def revoke(token: ApiToken, *, actor="command") -> bool:
    changed = ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(
        revoked_at=timezone.now()
    )
    if changed:
        audit.record(actor, "token.revoke", target=f"token {token.pk} {token.name}")
    return bool(changed)


def authenticate(secret: str) -> ApiToken | None:
    """The live token for a presented secret, or None."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 100:
        return None
    presented = digest(secret)
    token = ApiToken.objects.filter(digest=presented, revoked_at=None).first()
    # The lookup is by digest, which leaks nothing about the secret; comparing again in constant
    # time keeps the check independent of how the database compares strings.
    if token is None or not hmac.compare_digest(token.digest, presented):
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).filter(
            Q(last_used_at=None) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
        token.last_used_at = now
    return token


def may(token: ApiToken, scope: str) -> bool:
    return scope in token.scopes


def allows(token: ApiToken, queue_id: int) -> bool:
    return token.all_queues or token.queues.filter(pk=queue_id).exists()


def queue_ids(token: ApiToken) -> list[int] | None:
    """Ids of the queues a token may use; None means every queue."""
    return None if token.all_queues else list(token.queues.values_list("pk", flat=True))
