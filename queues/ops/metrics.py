"""/metrics in Prometheus's text format, from a collector that reads the counters and recent
records at scrape time (prometheus-client renders it).

Every query is cheap at 10 million items: counts come from the status counters, the oldest
waiting item from the head of an index, and the rest from small recent-records tables. Values
kept for a window (rounds, outcomes) are gauges over that window rather than counters, because
the records behind them are pruned and a counter must never go down.
"""

import hmac
import ipaddress
import statistics
from collections import Counter, defaultdict
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from queues.conf import setting
from queues.engine import counters, heartbeat
from queues.models import (
    AlertFiring,
    AlertRule,
    BulkOperation,
    ClusterHeartbeat,
    Queue,
    SelectorRound,
    Status,
    SweepRun,
)

WINDOW = timedelta(minutes=5)
SWEEPER_WINDOW = timedelta(hours=1)
OUTCOMES = (Status.COMPLETE, Status.RETRY, Status.FAILED, Status.CANCELLED)


def metrics(request):
    if request.method not in ("GET", "HEAD"):
        return HttpResponse("use GET\n", status=405, content_type="text/plain",
                            headers={"Allow": "GET, HEAD"})
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueAdminCollector())
    try:
        body = generate_latest(registry)
    except DatabaseError:
        return HttpResponse("the database is unavailable\n", status=503,
                            content_type="text/plain", headers={"Retry-After": "5"})
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def _refusal(request) -> HttpResponse | None:
    """None when the request carries the metrics token or comes from an allowed network."""
    token = setting("METRICS_TOKEN")
    networks = [ipaddress.ip_network(n) for n in setting("METRICS_ALLOWED_NETWORKS")]
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
            return None
    try:
        peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        peer = None
    if peer is not None and any(peer in network for network in networks):
        return None
    if not (token or networks):
        return HttpResponse("metrics are disabled: set QUEUEADMIN_METRICS_TOKEN or "
                            "QUEUEADMIN_METRICS_ALLOWED_NETWORKS\n", status=403,
                            content_type="text/plain")
    response = HttpResponse("a metrics token or an allowed network is required\n",
                            status=401 if token else 403, content_type="text/plain")
    if token:
        response["WWW-Authenticate"] = 'Bearer realm="queueadmin-metrics"'
    return response


class QueueAdminCollector:
    def collect(self):
        now = timezone.now()
        keys = dict(Queue.objects.values_list("pk", "key"))
        yield from self._items(keys, now)
        yield from self._refused(keys)
        yield from self._selector(keys, now)
        yield from self._outcomes(keys, now)
        yield from self._sweeper(now)
        yield from self._bulk()
        yield from self._clusters(now)
        yield from self._alerts(now)

    def _refused(self, keys: dict[int, str]):
        refused = CounterMetricFamily(
            "queueadmin_enqueue_refused_over_limit",
            "Enqueue calls refused because a queue or account held its most ready items.",
            labels=["queue"])
        for queue_id, n in Queue.objects.filter(pk__in=list(keys)).values_list(
                "pk", "refused_over_limit"):
            refused.add_metric([keys[queue_id]], n)
        yield refused

    def _items(self, keys: dict[int, str], now: datetime):
        items = GaugeMetricFamily("queueadmin_items", "Items per queue and status (counters).",
                                  labels=["queue", "status"])
        dead = GaugeMetricFamily("queueadmin_dead_letters",
                                 "Open dead letters per queue.", labels=["queue"])
        for queue_id, counts in counters.status_counts(list(keys)).items():
            for status, n in counts.items():
                items.add_metric([keys[queue_id], status], n)
            # A failed item has exactly one open dead letter (replay requeues, purge deletes).
            dead.add_metric([keys[queue_id]], counts[Status.FAILED])
        oldest = GaugeMetricFamily(
            "queueadmin_oldest_ready_age_seconds",
            "How long the longest-waiting ready item (queued or retry) has been due: since the "
            "later of its enqueue and its not-before time, paused accounts left out (0 when "
            "none).",
            labels=["queue"])
        for queue_id, created in counters.oldest_waiting(list(keys), now).items():
            oldest.add_metric([keys[queue_id]],
                              0.0 if created is None else (now - created).total_seconds())
        return [items, dead, oldest]

    def _selector(self, keys: dict[int, str], now: datetime):
        durations = defaultdict(list)
        for queue_id, ms in SelectorRound.objects.filter(
                started_at__gte=now - WINDOW).values_list("queue_id", "duration_ms"):
            durations[queue_id].append(ms / 1000)
        quantiles = GaugeMetricFamily(
            "queueadmin_selector_round_duration_seconds",
            "Selector round durations over the last 5 minutes (rounds that dispatched items).",
            labels=["queue", "quantile"])
        rounds = GaugeMetricFamily("queueadmin_selector_rounds_last_5m",
                                   "Selector rounds that dispatched items, last 5 minutes.",
                                   labels=["queue"])
        for queue_id, key in keys.items():
            values = sorted(durations.get(queue_id, []))
            rounds.add_metric([key], len(values))
            if values:
                quantiles.add_metric([key, "0.5"], statistics.median(values))
                quantiles.add_metric([key, "0.95"], values[int(0.95 * (len(values) - 1))])
                quantiles.add_metric([key, "1"], values[-1])
        return [quantiles, rounds]

    def _outcomes(self, keys: dict[int, str], now: datetime):
        """Items entering each outcome status in the 5 whole minutes before the current one: the
        rolled-up minutes plus the deltas the sweeper has not folded yet. Counts are kept per
        minute, so the minute under way is left out rather than making a window of 5 to 6
        minutes. A retry includes attempts lost with their worker."""
        current = now.replace(second=0, microsecond=0)
        totals: Counter = Counter()
        for queue_id, minute, status, n in counters.outcome_rows(current - WINDOW, OUTCOMES):
            if minute < current:
                totals[(queue_id, status)] += n
        family = GaugeMetricFamily("queueadmin_outcomes_last_5m",
                                   "Attempt outcomes (items entering complete, retry, failed "
                                   "or cancelled) in the 5 whole minutes before the current "
                                   "one.",
                                   labels=["queue", "outcome"])
        for queue_id, key in keys.items():
            for status in OUTCOMES:
                family.add_metric([key, status], totals[(queue_id, status)])
        return [family]

    def _sweeper(self, now: datetime):
        runs = list(SweepRun.objects.filter(started_at__gte=now - SWEEPER_WINDOW)
                    .values_list("counts", flat=True))
        actions: Counter = Counter()
        for counts in runs:
            actions.update(counts)
        family = GaugeMetricFamily("queueadmin_sweeper_actions_last_hour",
                                   "Rows each sweeper action changed in the last hour.",
                                   labels=["action"])
        for action, n in sorted(actions.items()):
            family.add_metric([action], n)
        last = SweepRun.objects.order_by("-started_at").values_list(
            "finished_at", flat=True).first()
        last_run = GaugeMetricFamily("queueadmin_sweeper_last_run_timestamp_seconds",
                                     "When the latest sweeper run finished (Unix time).")
        if last is not None:
            last_run.add_metric([], last.timestamp())
        return [family, last_run]

    def _bulk(self):
        running = dict(BulkOperation.objects.filter(
            state__in=(BulkOperation.State.RUNNING, BulkOperation.State.STOPPING))
            .values("kind").annotate(n=Count("id")).values_list("kind", "n"))
        family = GaugeMetricFamily("queueadmin_bulk_operations_running",
                                   "Bulk operations running or stopping.", labels=["kind"])
        for kind in BulkOperation.Kind.values:
            family.add_metric([kind], running.get(kind, 0))
        return [family]

    def _clusters(self, now: datetime):
        beats = list(ClusterHeartbeat.objects.values_list("beat_at", flat=True))
        alive = sum(now - at <= heartbeat.STALE_AFTER for at in beats)
        clusters = GaugeMetricFamily("queueadmin_clusters",
                                     "Worker clusters by heartbeat state.", labels=["state"])
        clusters.add_metric(["alive"], alive)
        clusters.add_metric(["stale"], len(beats) - alive)
        newest = GaugeMetricFamily("queueadmin_cluster_heartbeat_age_seconds",
                                   "Age of the newest worker cluster heartbeat.")
        if beats:
            newest.add_metric([], (now - max(beats)).total_seconds())
        return [clusters, newest]

    def _alerts(self, now: datetime):
        """Each rule's state as the latest evaluation left it: 1 while it fires."""
        firing = set(AlertFiring.objects.filter(ended_at__isnull=True)
                     .values_list("rule_id", flat=True))
        family = GaugeMetricFamily(
            "queueadmin_alert_firing",
            "1 while an alert rule fires (queue empty: an installation-wide rule).",
            labels=["queue", "rule"])
        muted = GaugeMetricFamily("queueadmin_alert_muted",
                                  "1 while an alert rule is muted: it records, sends nothing.",
                                  labels=["queue", "rule"])
        # Values, not models: five rules a queue made 500 model instances (with their queues'
        # JSON fields) a third of a scrape at 100 queues.
        rules = AlertRule.objects.filter(enabled=True).order_by("queue__key", "kind").values_list(
            "pk", "queue__key", "kind", "muted_until")
        for pk, queue_key, kind, muted_until in rules:
            labels = [queue_key or "", kind]
            family.add_metric(labels, int(pk in firing))
            muted.add_metric(labels, int(muted_until is not None and muted_until > now))
        return [family, muted]
