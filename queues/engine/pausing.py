"""Pause and resume (drain mode) per queue, per account within a queue, and for everything.

A pause only stops the selector from dispatching: new items are still accepted, dispatched and
running items finish, and nothing is lost; resuming continues where the selector left off.
Each change records who made it and when, and is audited.
"""

from django.db import transaction
from django.utils import timezone

from queues.engine import accounts, audit
from queues.models import AccountPolicy, GlobalPause, Queue, canonical


def _stamp(paused: bool, actor) -> dict:
    """The pause fields of a queue, policy or the global switch: who and when, or cleared."""
    return {"paused": paused, "paused_by": audit.actor_name(actor) if paused else "",
            "paused_at": timezone.now() if paused else None}


@transaction.atomic
def set_queue_paused(queue: Queue, paused: bool, *, actor) -> bool:
    """Returns whether anything changed (pausing a paused queue changes nothing)."""
    changed = Queue.objects.filter(pk=queue.pk, paused=not paused).update(
        **_stamp(paused, actor))
    if changed:
        audit.record(actor, "queue.pause" if paused else "queue.resume", queue_key=queue.key,
                     target=f"queue {queue.key}")
    queue.refresh_from_db(fields=["paused", "paused_by", "paused_at"])
    return bool(changed)


@transaction.atomic
def set_account_paused(queue: Queue, account: str, paused: bool, *, actor) -> bool:
    """Pauses one account of a queue through its (sparse) policy row."""
    account = canonical(account)
    # The callers check it first; never stored, whoever calls. A padded name an earlier
    # release stored is taken exactly, so its items can be held like any other account's.
    if why := accounts.refusal(account):
        raise ValueError(f"not an account: {why}")
    policy = AccountPolicy.objects.select_for_update().filter(queue=queue, account=account).first()
    if policy is None:
        if not paused:
            return False
        policy = AccountPolicy(queue=queue, account=account)
    elif policy.paused == paused:
        return False
    for name, value in _stamp(paused, actor).items():
        setattr(policy, name, value)
    policy.save()
    audit.record(actor, "account.pause" if paused else "account.resume", queue_key=queue.key,
                 target=f"account {account}")
    return True


def global_pause() -> GlobalPause:
    return GlobalPause.objects.filter(pk=1).first() or GlobalPause(pk=1)


@transaction.atomic
def set_global_paused(paused: bool, *, actor) -> bool:
    state, _ = GlobalPause.objects.select_for_update().get_or_create(pk=1)
    if state.paused == paused:
        return False
    for name, value in _stamp(paused, actor).items():
        setattr(state, name, value)
    state.save()
    audit.record(actor, "global.pause" if paused else "global.resume", target="all queues")
    return True
