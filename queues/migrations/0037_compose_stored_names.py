"""Identifiers and accounts stored before every door composed them (Unicode's NFC) are
composed in place: left decomposed, an item could not be found by its identifier or
account, an enqueue of the same identifier made a second live item, and a pause or resume of
the account changed a policy no item had.

Only rows holding a character outside ASCII can change, so each batch of ids reads those alone
(the same regular expression on both databases), in a short transaction of its own. A live
item whose composed identifier is another live item's keeps its own (it stays reachable by its
id); a policy whose composed account already has one is merged into it, paused if either was;
an account's ranking row is dropped and rebuilt by the sweeper's next run. Events, dead
letters' history and the charts keep what they recorded."""

import unicodedata

from django.db import migrations, transaction
from django.db.models import Max, Min, Q

NON_ASCII = r"[^\x01-\x7f]"
BATCH = 50_000
LIVE = ("queued", "dispatched", "running", "retry")


def composed(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def compose_items(apps, schema_editor):
    Item = apps.get_model("queues", "Item")
    bounds = Item.objects.aggregate(low=Min("id"), high=Max("id"))
    if bounds["low"] is None:
        return
    for start in range(bounds["low"], bounds["high"] + 1, BATCH):
        rows = (Item.objects.filter(id__gte=start, id__lt=start + BATCH)
                .filter(Q(account__regex=NON_ASCII) | Q(identifier__regex=NON_ASCII))
                .values_list("id", "queue_id", "status", "account", "identifier"))
        with transaction.atomic():
            for pk, queue_id, status, account, identifier in rows:
                account_now, identifier_now = composed(account), composed(identifier)
                if (account_now, identifier_now) == (account, identifier):
                    continue
                if (identifier_now != identifier and status in LIVE and Item.objects.filter(
                        queue_id=queue_id, identifier=identifier_now, status__in=LIVE
                ).exclude(pk=pk).exists()):
                    identifier_now = identifier
                Item.objects.filter(pk=pk).update(account=account_now,
                                                  identifier=identifier_now)


def compose_accounts(apps, schema_editor):
    AccountPolicy = apps.get_model("queues", "AccountPolicy")
    AccountStat = apps.get_model("queues", "AccountStat")
    DeadLetter = apps.get_model("queues", "DeadLetter")
    with transaction.atomic():
        for policy in AccountPolicy.objects.filter(account__regex=NON_ASCII):
            account = composed(policy.account)
            if account == policy.account:
                continue
            kept = AccountPolicy.objects.filter(queue_id=policy.queue_id, account=account).first()
            if kept is None:
                AccountPolicy.objects.filter(pk=policy.pk).update(account=account)
                continue
            if policy.paused and not kept.paused:
                kept.paused, kept.paused_by, kept.paused_at = (True, policy.paused_by,
                                                               policy.paused_at)
                kept.save(update_fields=["paused", "paused_by", "paused_at"])
            policy.delete()
        AccountStat.objects.filter(pk__in=[
            pk for pk, account in AccountStat.objects.filter(account__regex=NON_ASCII)
            .values_list("pk", "account") if composed(account) != account]).delete()
        for pk, account in DeadLetter.objects.filter(account__regex=NON_ASCII).values_list(
                "pk", "account"):
            if composed(account) != account:
                DeadLetter.objects.filter(pk=pk).update(account=composed(account))


class Migration(migrations.Migration):
    # Each batch commits on its own: a long transaction over millions of rows would hold back
    # vacuum and every concurrent migration's lock.
    atomic = False

    dependencies = [
        ('queues', '0036_queue_key_without_line_break'),
    ]

    operations = [
        migrations.RunPython(compose_items, migrations.RunPython.noop, elidable=True),
        migrations.RunPython(compose_accounts, migrations.RunPython.noop, elidable=True),
    ]
