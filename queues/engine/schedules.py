"""django-q2 schedules that drive QueueAdmin, created idempotently after every migrate."""

from django.utils import timezone

SCHEDULES = [
    # django-q2's finest schedule is one minute; the task itself runs rounds for ~50 s while they
    # fill their batch, so throughput is not capped at one batch per tick.
    {"name": "queueadmin: selector", "func": "queues.engine.selector.tick", "minutes": 1},
    {"name": "queueadmin: sweeper", "func": "queues.engine.sweeper.run", "minutes": 5},
    # The charts' per-minute history; a run rewrites every minute since the last one.
    {"name": "queueadmin: history", "func": "queues.engine.history.run", "minutes": 1},
    # Alert rules and their notices; outside the clusters, `manage.py alerts` and /healthz also
    # evaluate what the clusters cannot see about themselves.
    {"name": "queueadmin: alerts", "func": "queues.engine.alerts.run", "minutes": 1},
]


def ensure_schedules(**kwargs):
    from django_q.models import Schedule

    for spec in SCHEDULES:
        Schedule.objects.update_or_create(
            name=spec["name"],
            defaults={
                "func": spec["func"],
                "schedule_type": Schedule.MINUTES,
                "minutes": spec["minutes"],
                "repeats": -1,
            },
            create_defaults={
                "func": spec["func"],
                "schedule_type": Schedule.MINUTES,
                "minutes": spec["minutes"],
                "repeats": -1,
                "next_run": timezone.now(),
            },
        )
