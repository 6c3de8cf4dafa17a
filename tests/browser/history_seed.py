"""Data for the charts' browser test: the usual seed (tests.browser.seed) and a day of minute
rollups and a month of hours for the Emails queue and two of its accounts, shaped like a working
day, and a week of hours of its two error groups, as queues.engine.history would have written
them, with the installation's rows summed from them."""

import math
from datetime import timedelta

from django.utils import timezone

from queues.engine import history
from queues.engine.errors import group_key, normalise_error
from queues.models import (
    ErrorGroupHour,
    InstallationHour,
    InstallationMinute,
    MetricHour,
    MetricMinute,
    Queue,
    histogram_column,
)
from tests.browser import seed as base


def figures(n: int) -> dict:
    wave = 1 + math.sin(n / 90)
    return {"completed": int(40 * wave) + 5, "enqueued": int(42 * wave) + 5,
            "failed": n % 7 == 0, "retried": 1 + n % 3,
            histogram_column("wait", history.bucket_of(1 + wave)): 30,
            histogram_column("wait", history.bucket_of(20 * wave + 1)): 2,
            histogram_column("run", history.bucket_of(0.2)): 32}


def seed():
    base.seed()
    queue = Queue.objects.get(key="emails")
    newest = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    minutes = []
    for n in range(24 * 60):
        start = newest - timedelta(minutes=n)
        minutes.append(MetricMinute(queue=queue, start=start, depth_queued=300 + n % 120,
                                    depth_retry=20, depth_dispatched=5, depth_running=8,
                                    depth_failed=3, **figures(n)))
        minutes.append(MetricMinute(queue=queue, account="tenant-3", start=start,
                                    completed=figures(n)["completed"] // 2))
        minutes.append(MetricMinute(queue=queue, account="tenant-1", start=start,
                                    completed=figures(n)["completed"] // 5))
    MetricMinute.objects.bulk_create(minutes)
    hour = newest.replace(minute=0)
    MetricHour.objects.bulk_create([
        MetricHour(queue=queue, start=hour - timedelta(hours=n), **{
            k: v * 60 for k, v in figures(n * 60).items()}) for n in range(30 * 24)])
    # The installation's rows, which the charts of every queue read, as the rollup sums them.
    history.roll_up_installation(InstallationMinute, newest - timedelta(days=1),
                                 newest + timedelta(minutes=1))
    history.roll_up_installation(InstallationHour, hour - timedelta(days=30),
                                 hour + timedelta(hours=1))
    # The seed's retrying and failed items' errors (tests.factories.items_in_status).
    for error, scale in (("temporary trouble", 6), ("bad input", 1)):
        kind, message = normalise_error(error)
        ErrorGroupHour.objects.bulk_create([
            ErrorGroupHour(queue=queue, start=hour - timedelta(hours=n), kind=kind,
                           message=message, group_key=group_key(kind, message),
                           failures=scale * (1 + n % 5)) for n in range(7 * 24)])
