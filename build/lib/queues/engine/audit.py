"""The audit log's one writer: every mutation made by a person or a token calls record()."""

from django.utils import timezone

from queues.models import AuditEntry


def actor_name(actor) -> str:
    """How an actor is named in records: a user's name, "token:<name>", or the plain name a
    command passes."""
    if getattr(actor, "is_authenticated", False):
        return actor.get_username()
    if hasattr(actor, "prefix"):
        return f"token:{actor.name}"
    return str(actor)


def record(actor, action, *, queue_key="", target="", filter=None, counts=None):
    """Append an entry. `actor` is a user, an ApiToken or a plain name (commands)."""
    user = actor if getattr(actor, "is_authenticated", False) else None
    return AuditEntry.objects.create(
        at=timezone.now(), actor=user, actor_name=actor_name(actor)[:150], action=action,
        queue_key=queue_key, target=str(target)[:255], filter=filter or {}, counts=counts or {},
    )
