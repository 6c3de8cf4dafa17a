"""Data for the browser tests, written by a child process into the server's own database:
one user per role and a queue with items in the states the tests click through."""

from datetime import timedelta

from django.contrib.auth.models import Group, User
from django.utils import timezone

from queues import enqueue
from queues.engine import alerts
from queues.models import AlertRule, Attempt, Item
from tests.factories import QueueFactory, item_in_status, items_in_status

PASSWORD = "browser-test-password-1"
TRACEBACK = ('Traceback (most recent call last):\n  File "/app/handlers.py", line 41, in '
             'deliver\n    response.raise_for_status()\nHTTPError: 503 Server Error')


def users():
    for role in ("Viewer", "Operator", "Admin"):
        user = User.objects.create_user(role.lower(), password=PASSWORD)
        user.groups.add(Group.objects.get(name=role))


def seed():
    users()
    queue = QueueFactory(key="emails", name="Emails")
    QueueFactory(key="reports", name="Reports", paused=True)
    failed = item_in_status(queue, "failed", prefix="invoice", account="tenant-1")
    Attempt.objects.filter(item=failed).update(traceback=TRACEBACK)
    items_in_status(queue, "retry", 3, prefix="retrying", account="tenant-2")
    items_in_status(queue, "complete", 4, prefix="done", account="tenant-3")
    enqueue("emails", account="tenant-4", identifier="waiting-1", payload={"to": "<b>x</b>"})
    old = enqueue("emails", account="tenant-4", identifier="old-1")
    Item.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))


def seed_headline():
    """The headline task's queue: items that failed an hour ago although they were enqueued
    three days ago, items that failed two days ago, and items still waiting."""
    users()
    queue = QueueFactory(key="webhooks", name="Webhooks")
    QueueFactory(key="emails", name="Emails")
    now = timezone.now()
    for prefix, failed_ago, n in (("late", timedelta(hours=1), 3), ("early", timedelta(days=2), 2)):
        items = items_in_status(queue, "failed", n, prefix=prefix, account="tenant-1")
        Item.objects.filter(pk__in=[i.pk for i in items]).update(
            created_at=now - timedelta(days=3), finished_at=now - failed_ago)
    items_in_status(queue, "queued", 2, prefix="waiting", account="tenant-2")


def seed_alerting():
    """seed(), with the Emails queue over every alert threshold, so that the overview shows its
    longest badges."""
    seed()
    AlertRule.objects.filter(queue__key="emails",
                             kind__in=["dead_letters", "depth", "failures"]).update(threshold=0)
    alerts.evaluate()
