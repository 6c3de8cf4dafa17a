"""Migration 0037: identifiers and accounts stored decomposed, before every door composed them
(NFC), are composed in place, on either database (upgrade audit)."""

import pytest
from django.utils import timezone

from queues import enqueue
from queues.engine import pausing
from queues.models import AccountPolicy, AccountStat, Item
from tests.factories import QueueFactory
from tests.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)
DECOMPOSED, COMPOSED = "cafe\u0301", "caf\u00e9"


def stored_decomposed(item: Item, **fields):
    Item.objects.filter(pk=item.pk).update(**fields)


def test_decomposed_names_are_composed_and_a_live_twin_keeps_its_own():
    queue = QueueFactory(key="emails")
    alone = enqueue("emails", account="acme", identifier="order-1")
    twin = enqueue("emails", account="acme", identifier=f"order-{COMPOSED}")
    clashing = enqueue("emails", account="acme", identifier="order-2")
    with migrated_back_to("0036_queue_key_without_line_break"):
        stored_decomposed(alone, account=f"tenant-{DECOMPOSED}", identifier=f"a-{DECOMPOSED}")
        stored_decomposed(clashing, account=f"tenant-{DECOMPOSED}",
                          identifier=f"order-{DECOMPOSED}")
        AccountPolicy.objects.create(queue=queue, account=f"tenant-{DECOMPOSED}", paused=True,
                                     paused_by="ops", paused_at=timezone.now())
        AccountPolicy.objects.create(queue=queue, account=f"tenant-{COMPOSED}", weight=3)
        AccountPolicy.objects.create(queue=queue, account=f"other-{DECOMPOSED}", weight=2)
        AccountStat.objects.create(queue=queue, account=f"tenant-{DECOMPOSED}", backlog=1,
                                   first_due=timezone.now(), refreshed_at=timezone.now())
    alone.refresh_from_db()
    assert (alone.account, alone.identifier) == (f"tenant-{COMPOSED}", f"a-{COMPOSED}")
    clashing.refresh_from_db()
    # Composed, it would be a second live item of twin's identifier.
    assert (clashing.account, clashing.identifier) == (f"tenant-{COMPOSED}",
                                                      f"order-{DECOMPOSED}")
    assert Item.objects.get(pk=twin.pk).identifier == f"order-{COMPOSED}"
    [merged] = AccountPolicy.objects.filter(account__startswith="tenant-")
    assert (merged.account, merged.paused, merged.weight) == (f"tenant-{COMPOSED}", True, 3)
    assert AccountPolicy.objects.filter(account=f"other-{COMPOSED}", weight=2).exists()
    assert not AccountStat.objects.exists()
    # The account paused before the upgrade is resumed by its name, however it is typed.
    assert pausing.set_account_paused(queue, f"tenant-{DECOMPOSED}", False, actor="ops")
    assert not AccountPolicy.objects.get(account=f"tenant-{COMPOSED}").paused
