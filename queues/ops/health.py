"""Operational status: /healthz for load balancers, the workers page for people.

/healthz answers 200 whenever the database answers, with "status": "degraded" (still 200) when
no worker cluster has beaten lately or the selector or sweeper fell behind: the web processes
can still serve the dashboard and accept items, and a load balancer that took them out because
the workers are down would only add an outage. Only an unreachable database gives 503.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, connection
from django.db.models import Max
from django.http import JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from queues.engine import heartbeat
from queues.engine.schedules import SCHEDULES
from queues.models import ClusterHeartbeat, SelectorState, SweepRun
from queues.permissions import render_page, viewer_required

# The sweeper runs every 5 minutes (a run may take 4): three missed runs is a problem.
SWEEPER_LATE_AFTER = timedelta(minutes=15)
# The selector's schedule runs every minute; its next run this far in the past means no
# cluster's scheduler is picking it up.
SELECTOR_OVERDUE_AFTER = timedelta(minutes=3)
SELECTOR_SCHEDULE = next(s["name"] for s in SCHEDULES if s["func"] == "queues.engine.selector.tick")
PROBE_PATHS = ("/healthz", "/metrics")


class ProbeMiddleware:
    """Answers /healthz and /metrics ahead of every other middleware: probes address a machine
    by IP over plain HTTP, which ALLOWED_HOSTS and the HTTPS redirect would refuse, and need no
    session. /metrics does its own authorisation (queues.ops.metrics)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info == "/healthz":
            return _probe_response(healthz(request))
        if request.path_info == "/metrics":
            from queues.ops.metrics import metrics

            return _probe_response(metrics(request))
        return self.get_response(request)


def _probe_response(response):
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 1)


def report(now: datetime) -> dict:
    """The health document; raises DatabaseError when the database does not answer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    from django_q.models import Schedule

    newest = ClusterHeartbeat.objects.order_by("-beat_at").values_list("beat_at", flat=True)
    newest_beat = newest.first()
    alive = ClusterHeartbeat.objects.filter(beat_at__gte=now - heartbeat.STALE_AFTER).count()
    last_round = SelectorState.objects.aggregate(at=Max("last_round_at"))["at"]
    next_run = Schedule.objects.filter(name=SELECTOR_SCHEDULE).values_list(
        "next_run", flat=True).first()
    last_sweep = SweepRun.objects.order_by("-started_at").values_list(
        "finished_at", flat=True).first()

    problems = []
    if newest_beat is None or now - newest_beat > heartbeat.STALE_AFTER:
        problems.append("no worker cluster has sent a heartbeat in the last "
                        f"{int(heartbeat.STALE_AFTER.total_seconds())} s")
    overdue = max(0.0, (now - next_run).total_seconds()) if next_run else None
    if next_run is None or now - next_run > SELECTOR_OVERDUE_AFTER:
        problems.append("the selector's schedule is overdue")
    if last_sweep is None or now - last_sweep > SWEEPER_LATE_AFTER:
        problems.append("the sweeper has not run in the last "
                        f"{int(SWEEPER_LATE_AFTER.total_seconds() // 60)} minutes")
    return {
        "status": "degraded" if problems else "ok",
        "problems": problems,
        "database": "ok",
        "clusters": {"alive": alive,
                     "newest_heartbeat_age_seconds": _age(newest_beat, now)},
        # Empty rounds are not recorded, so an idle installation's last round may be old.
        "selector": {"last_round_age_seconds": _age(last_round, now),
                     "schedule_overdue_seconds": None if overdue is None else round(overdue, 1)},
        "sweeper": {"last_run_age_seconds": _age(last_sweep, now)},
    }


def healthz(request):
    if request.method not in ("GET", "HEAD"):
        return JsonResponse({"error": "use GET"}, status=405, headers={"Allow": "GET, HEAD"})
    try:
        return JsonResponse(report(timezone.now()))
    except DatabaseError:
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503,
                            headers={"Retry-After": "5"})


@dataclass
class ClusterRow:
    beat: ClusterHeartbeat
    stale: bool
    age_seconds: float

    @property
    def running(self) -> list[dict]:
        return [{**task, "since": parse_datetime(task.get("since") or "")}
                for task in self.beat.running]


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def workers_page(request):
    now = timezone.now()
    clusters = [ClusterRow(beat=row, stale=heartbeat.is_stale(row, now),
                           age_seconds=(now - row.beat_at).total_seconds())
                for row in ClusterHeartbeat.objects.order_by("host", "pid")]
    context = {"clusters": clusters, "now": now, "alive": sum(not c.stale for c in clusters),
               "stale_after": int(heartbeat.STALE_AFTER.total_seconds())}
    template = "queues/_workers_table.html" if request.htmx else "queues/workers.html"
    return render_page(request, template, context)
