"""The audit log's one writer: every mutation made by a person or a token calls record()."""

from django.utils import timezone

from queues.models import AuditEntry


def record(actor, action, *, queue_key="", target="", filter=None, counts=None):
    """Append an entry. `actor` is a user, an ApiToken or a plain name (commands)."""
    user = actor if getattr(actor, "is_authenticated", False) else None
    if user is not None:
        name = user.get_username()
    elif hasattr(actor, "prefix"):
        name = f"token:{actor.name}"
    else:
        name = str(actor)
    return AuditEntry.objects.create(
        at=timezone.now(), actor=user, actor_name=name[:150], action=action,
        queue_key=queue_key, target=str(target)[:255], filter=filter or {}, counts=counts or {},
    )
