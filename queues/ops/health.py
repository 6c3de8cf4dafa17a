"""Operational status: /healthz for load balancers, the workers page for people.

/healthz also evaluates the alert rule that no worker cluster is beating, which the clusters'
own schedule cannot (queues.engine.alerts.evaluate_from_web).

/healthz answers 200 whenever the database answers, with "status": "degraded" (still 200) when
no worker cluster has beaten lately or the selector or sweeper fell behind: the web processes
can still serve the dashboard and accept items, and a load balancer that took them out because
the workers are down would only add an outage. Only an unreachable database gives 503.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connection
from django.db.models import Max
from django.http import JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from queues.engine import alerts, heartbeat, liveness
from queues.engine.liveness import (
    SELECTOR_OVERDUE_AFTER,
    SELECTOR_SCHEDULE,  # noqa: F401  named here too for the tests and drills that look it up
    SWEEPER_LATE_AFTER,
)
from queues.models import ClusterHeartbeat, SelectorState
from queues.permissions import render_page, viewer_required

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
    signs = liveness.read()
    newest_beat = signs.newest_beat
    alive = ClusterHeartbeat.objects.filter(beat_at__gte=now - heartbeat.STALE_AFTER).count()
    last_round = SelectorState.objects.aggregate(at=Max("last_round_at"))["at"]

    problems = []
    if newest_beat is None or now - newest_beat > heartbeat.STALE_AFTER:
        problems.append("no worker cluster has sent a heartbeat in the last "
                        f"{int(heartbeat.STALE_AFTER.total_seconds())} s")
    overdue = signs.selector_overdue(now)
    if overdue is None or overdue > SELECTOR_OVERDUE_AFTER.total_seconds():
        problems.append("the selector's schedule is overdue")
    last_sweep = signs.last_sweep
    sweeper_age = signs.sweeper_age(now)
    if sweeper_age is None or sweeper_age > SWEEPER_LATE_AFTER.total_seconds():
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
    now = timezone.now()
    try:
        body = report(now)
    except DatabaseError:
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503,
                            headers={"Retry-After": "5"})
    # Probes reach every web process often, whether or not any cluster runs: the rule that no
    # cluster is beating is evaluated here (at most once a minute across the processes); its
    # notices go out after the answer.
    alerts.evaluate_from_web(now, deliver_later=True)
    return JsonResponse(body)


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
