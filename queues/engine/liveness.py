"""The installation's signs of life: the newest worker cluster heartbeat, when the selector's
schedule is next due, and when the sweeper last ran. /healthz (queues.ops.health) and the
installation-wide alert rules (queues.engine.alerts) judge the same figures."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Min

from queues.engine.schedules import SCHEDULES
from queues.models import ClusterHeartbeat, SweepRun

# The sweeper runs every 5 minutes (a run may take 4): three missed runs is a problem.
SWEEPER_LATE_AFTER = timedelta(minutes=15)
# The selector's schedule runs every minute; its next run this far in the past means no
# cluster's scheduler is picking it up.
SELECTOR_OVERDUE_AFTER = timedelta(minutes=3)
SELECTOR_SCHEDULE = next(s["name"] for s in SCHEDULES if s["func"] == "queues.engine.selector.tick")


@dataclass(frozen=True)
class Liveness:
    newest_beat: datetime | None
    first_start: datetime | None  # the earliest start among the clusters on record
    selector_next_run: datetime | None
    last_sweep: datetime | None  # when the latest sweeper run finished

    def heartbeat_age(self, now: datetime) -> float | None:
        return None if self.newest_beat is None else (now - self.newest_beat).total_seconds()

    def selector_overdue(self, now: datetime) -> float | None:
        if self.selector_next_run is None:
            return None
        return max(0.0, (now - self.selector_next_run).total_seconds())

    def sweeper_age(self, now: datetime) -> float | None:
        """Seconds since the sweeper last ran. Never run: None, unless a cluster started less
        than SWEEPER_LATE_AFTER ago, when its first run is simply not due yet (0)."""
        if self.last_sweep is not None:
            return (now - self.last_sweep).total_seconds()
        if self.first_start is not None and now - self.first_start < SWEEPER_LATE_AFTER:
            return 0.0
        return None


def read() -> Liveness:
    from django_q.models import Schedule

    clusters = ClusterHeartbeat.objects.aggregate(newest=Max("beat_at"), first=Min("started_at"))
    return Liveness(
        newest_beat=clusters["newest"],
        first_start=clusters["first"],
        selector_next_run=Schedule.objects.filter(name=SELECTOR_SCHEDULE).values_list(
            "next_run", flat=True).first(),
        last_sweep=SweepRun.objects.order_by("-started_at").values_list(
            "finished_at", flat=True).first(),
    )

