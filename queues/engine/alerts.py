"""Alert rules (models.AlertRule) evaluated against the figures the dashboard already keeps, and
their notices delivered to people.

`evaluate` runs from a django-q2 schedule (every minute), from `manage.py alerts`, and from the
web processes through /healthz (`evaluate_from_web`, the "no cluster beating" rule only, at most
once a minute across them): a check that no cluster is beating cannot run inside the clusters.
In one transaction it reads each enabled rule's figure, opens an AlertFiring when a rule starts
firing, closes it when the figure comes back (or the rule is disabled), and claims the notices
that are due; after the commit it delivers them and records the run, empty runs included.

Notices: one when a firing starts, one when it ends, and a reminder at most every
ALERT_REMINDER_HOURS while it fires unacknowledged; never one per evaluation. A muted rule
records its firings and delivers nothing (a firing still open when the mute ends is announced
then). Deliveries go by e-mail through Django's mail backend and to a webhook signed and checked
like the webhook handler's requests (queues.engine.webhook); a failure is recorded on the
firing and never stops the evaluation.

Figures come from the status counters, the outcome minutes, the metric history's run time
buckets, the head of an index (oldest wait) and the liveness records: never a count of items.
"""

import json
import logging
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.core import mail
from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from queues.conf import setting
from queues.engine import audit, counters, heartbeat, history, liveness, webhook
from queues.engine.db import is_postgres
from queues.engine.handlers import PermanentError
from queues.models import AlertFiring, AlertRule, AlertRun, MetricMinute, Queue, Status

log = logging.getLogger(__name__)
Kind = AlertRule.Kind
LOCK_KEY = 7_466_004  # the sweeper's is 7_466_002, the history's 7_466_003
MINUTE = timedelta(minutes=1)
WEB_INTERVAL = timedelta(minutes=1)
RUN_RETENTION = timedelta(days=7)
FIRING_RETENTION = timedelta(days=90)
# What a queue's rules start as (the queue platform seed's thresholds): kind -> (threshold,
# window). Counts, or seconds for the times.
QUEUE_RULES = {
    Kind.DEAD_LETTERS: (100, None),
    Kind.DEPTH: (10_000, None),
    Kind.FAILURES: (50, timedelta(hours=1)),
    Kind.RUN_TIME: (30, timedelta(minutes=15)),
    Kind.OLDEST_WAIT: (3600, None),
}
# The installation's rules, with the limits /healthz applies to the same figures.
INSTALLATION_RULES = {
    Kind.NO_CLUSTER: int(heartbeat.STALE_AFTER.total_seconds()),
    Kind.SELECTOR_BEHIND: int(liveness.SELECTOR_OVERDUE_AFTER.total_seconds()),
    Kind.SWEEPER_BEHIND: int(liveness.SWEEPER_LATE_AFTER.total_seconds()),
}
WINDOWED = (Kind.FAILURES, Kind.RUN_TIME)
# A figure these rules cannot find (no heartbeat, schedule or sweep ever) means they fire.
LIVENESS_KINDS = tuple(INSTALLATION_RULES)
# What only a process outside the clusters can see go wrong.
OUTSIDE_KINDS = (Kind.NO_CLUSTER,)
FIRING, REMINDER, RESOLVED = "firing", "reminder", "resolved"


# --- rules --------------------------------------------------------------------------------------

def create_default_rules(sender, instance: Queue, created: bool, raw: bool = False, **kwargs):
    """post_save of Queue: a new queue gets the default rules (fixtures bring their own)."""
    if created and not raw:
        AlertRule.objects.bulk_create(
            [AlertRule(queue=instance, kind=kind, threshold=threshold, window=window)
             for kind, (threshold, window) in QUEUE_RULES.items()],
            ignore_conflicts=True)


def ensure_installation_rules(apps=None, **kwargs):
    """post_migrate: the installation-wide rules exist (an edited one is kept as it is). Read
    through the migrated state's models: after a rollback to before the rules existed (migrate
    queues 0019) there is no table, and nothing to do."""
    try:
        rules = apps.get_model("queues", "AlertRule") if apps is not None else AlertRule
    except LookupError:
        return
    for kind, threshold in INSTALLATION_RULES.items():
        rules.objects.get_or_create(queue=None, kind=kind, defaults={"threshold": threshold})


def update_rule(rule: AlertRule, *, actor, **fields) -> list[str]:
    """Change a rule's threshold, window, enabled flag, channels or recipients; audited.
    Returns the names of the fields that changed."""
    changed = [name for name, value in fields.items() if getattr(rule, name) != value]
    for name in changed:
        setattr(rule, name, fields[name])
    if changed:
        with transaction.atomic():
            rule.save(update_fields=changed)
            audit.record(actor, "alert.rule", queue_key=_queue_key(rule), target=_target(rule),
                         filter={"fields": changed}, counts={"rows": 1})
    return changed


def mute(rule: AlertRule, until: datetime | None, *, actor):
    """Mute a rule until a time (None: unmute); audited with who and until when."""
    with transaction.atomic():
        rule.muted_until = until
        rule.muted_by = audit.actor_name(actor)[:150] if until else ""
        rule.save(update_fields=["muted_until", "muted_by"])
        audit.record(actor, "alert.mute" if until else "alert.unmute",
                     queue_key=_queue_key(rule), target=_target(rule),
                     filter={"until": until.isoformat()} if until else {}, counts={"rows": 1})


def acknowledge(firing: AlertFiring, *, actor) -> bool:
    """Someone is on it: no more reminders for this firing. False when it was already
    acknowledged or has ended."""
    with transaction.atomic():
        done = AlertFiring.objects.filter(
            pk=firing.pk, acknowledged_at__isnull=True, ended_at__isnull=True,
        ).update(acknowledged_at=timezone.now(), acknowledged_by=audit.actor_name(actor)[:150])
        if done:
            audit.record(actor, "alert.acknowledge", queue_key=_queue_key(firing.rule),
                         target=f"alert {firing.pk}: {_target(firing.rule)}",
                         counts={"rows": 1})
    return bool(done)


def _queue_key(rule: AlertRule) -> str:
    return rule.queue.key if rule.queue_id else ""


def _target(rule: AlertRule) -> str:
    return f"rule {rule.kind} of {_queue_key(rule) or 'the installation'}"


# --- evaluation ---------------------------------------------------------------------------------

@dataclass
class Notice:
    firing: AlertFiring
    event: str  # FIRING, REMINDER or RESOLVED


def run() -> dict[str, int] | None:
    """The scheduled task."""
    return evaluate(source="schedule")


def evaluate(now: datetime | None = None, *, kinds=None, source: str = "schedule",
             deliver_later: bool = False) -> dict[str, int] | None:
    """Evaluate every rule (or those of `kinds`), deliver the notices due, record the run.
    Returns what changed, or None when another evaluation holds the lock. `deliver_later`
    sends the notices from a thread of their own (see deliver_in_background)."""
    now = now or timezone.now()
    changed: Counter = Counter()
    with transaction.atomic():
        if not _alone():
            return None
        rules = AlertRule.objects.select_related("queue")
        if kinds is not None:
            rules = rules.filter(kind__in=kinds)
        rules = list(rules)
        firings = {firing.rule_id: firing for firing in AlertFiring.objects.filter(
            ended_at__isnull=True, rule__in=[rule.pk for rule in rules])}
        values = measure([rule for rule in rules if rule.enabled], now)
        notices = []
        for rule in rules:
            firing = firings.get(rule.pk)
            if firing is not None:
                firing.rule = rule
            notice = _step(rule, firing, values.get(rule.pk), now, changed)
            if notice is not None:
                notices.append(notice)
        AlertRule.objects.filter(pk__in=[rule.pk for rule in rules if rule.enabled]).update(
            checked_at=now)
        changed["runs pruned"] += AlertRun.objects.filter(
            started_at__lt=now - RUN_RETENTION).delete()[0]
        changed["firings pruned"] += AlertFiring.objects.filter(
            ended_at__lt=now - FIRING_RETENTION).delete()[0]
    # Deliveries wait on the network: never inside the transaction (or the lock).
    if deliver_later and notices:
        deliver_in_background(notices)
        changed["notices sent in the background"] += len(notices)
    else:
        for notice in notices:
            changed.update(deliver(notice))
    counts = {action: n for action, n in changed.items() if n}
    AlertRun.objects.create(started_at=now, finished_at=timezone.now(), source=source,
                            counts=counts)
    if counts:
        log.info("alerts changed %s", counts)
    return counts


def _step(rule: AlertRule, firing: AlertFiring | None, value: float | None, now: datetime,
          changed: Counter) -> Notice | None:
    """One rule's evaluation: opens, updates or closes its firing; the notice it claims."""
    if rule.enabled and fires(rule, value):
        if firing is None:
            firing = AlertFiring.objects.create(rule=rule, started_at=now, value=value,
                                                threshold=rule.threshold)
            changed["opened"] += 1
        event = _due(rule, firing, now)
        if event is not None:
            firing.notified_at, firing.notices = now, firing.notices + 1
        firing.value = value
        firing.save(update_fields=["value", "notified_at", "notices"])
        return Notice(firing, event) if event else None
    if firing is None:
        return None
    firing.ended_at = now
    firing.save(update_fields=["ended_at"])
    changed["closed"] += 1
    # Those who heard it start hear it end, unless the rule has been muted since.
    if firing.notices and not rule.muted(now):
        return Notice(firing, RESOLVED)
    return None


def fires(rule: AlertRule, value: float | None) -> bool:
    if value is None:
        return rule.kind in LIVENESS_KINDS
    return value > rule.threshold


def _due(rule: AlertRule, firing: AlertFiring, now: datetime) -> str | None:
    if rule.muted(now):
        return None
    if not firing.notices:
        return FIRING
    hours = setting("ALERT_REMINDER_HOURS")
    if firing.acknowledged_at is None and hours and (
            firing.notified_at is None or now - firing.notified_at >= timedelta(hours=hours)):
        return REMINDER
    return None


def _alone() -> bool:
    """One evaluation at a time across machines, so that two never open the same firing or
    claim the same notice; on SQLite the write transaction already serialises them."""
    if not is_postgres():
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
        return cursor.fetchone()[0]


def evaluate_from_web(now: datetime | None = None, *,
                      deliver_later: bool = False) -> dict[str, int] | None:
    """The outside-only rules, evaluated by a web process when nobody evaluated them in the last
    minute. A compare-and-set on the rules' checked_at lets one process of many win a minute,
    and the schedule's evaluations (which set it too) leave nothing to do while clusters beat.
    Never raises: it rides on a health probe, which must answer (so the probe delivers later)."""
    now = now or timezone.now()
    try:
        claimed = AlertRule.objects.filter(kind__in=OUTSIDE_KINDS, enabled=True).filter(
            Q(checked_at__isnull=True) | Q(checked_at__lte=now - WEB_INTERVAL),
        ).update(checked_at=now)
        if not claimed:
            return None
        return evaluate(now, kinds=OUTSIDE_KINDS, source="web", deliver_later=deliver_later)
    except Exception:
        log.exception("evaluating the alert rules from a web process failed")
        return None


# --- figures ------------------------------------------------------------------------------------

def measure(rules: list[AlertRule], now: datetime) -> dict[int, float | None]:
    """Each rule's current figure, by rule id: a few set-based statements in all."""
    by_kind = defaultdict(list)
    for rule in rules:
        by_kind[rule.kind].append(rule)
    values: dict[int, float | None] = {}
    counted = by_kind[Kind.DEAD_LETTERS] + by_kind[Kind.DEPTH]
    if counted:
        counts = counters.status_counts({rule.queue_id for rule in counted})
        for rule in by_kind[Kind.DEAD_LETTERS]:
            # A failed item has exactly one open dead letter (replay requeues, purge deletes).
            values[rule.pk] = counts[rule.queue_id][Status.FAILED]
        for rule in by_kind[Kind.DEPTH]:
            values[rule.pk] = (counts[rule.queue_id][Status.QUEUED]
                               + counts[rule.queue_id][Status.RETRY])
    if by_kind[Kind.FAILURES]:
        values |= _failures(by_kind[Kind.FAILURES], now)
    if by_kind[Kind.RUN_TIME]:
        values |= _run_time_p95(by_kind[Kind.RUN_TIME], now)
    if by_kind[Kind.OLDEST_WAIT]:
        oldest = counters.oldest_waiting(list({r.queue_id for r in by_kind[Kind.OLDEST_WAIT]}),
                                         now)
        for rule in by_kind[Kind.OLDEST_WAIT]:
            created = oldest.get(rule.queue_id)
            values[rule.pk] = 0.0 if created is None else (now - created).total_seconds()
    if any(by_kind[kind] for kind in LIVENESS_KINDS):
        signs = liveness.read()
        figures = {Kind.NO_CLUSTER: signs.heartbeat_age(now),
                   Kind.SELECTOR_BEHIND: signs.selector_overdue(now),
                   Kind.SWEEPER_BEHIND: signs.sweeper_age(now)}
        for kind in LIVENESS_KINDS:
            for rule in by_kind[kind]:
                values[rule.pk] = figures[kind]
    return values


def _first_minute(now: datetime, window: timedelta) -> datetime:
    """The first of the window's minutes, the current minute being the last (as the overview's
    last hour)."""
    return now.replace(second=0, microsecond=0) - window + MINUTE


def _failures(rules: list[AlertRule], now: datetime) -> dict[int, float]:
    """Retryable and permanent failures per rule window, from the outcome minutes and the
    counter deltas not yet folded into them: one statement for the longest window."""
    firsts = {rule.pk: _first_minute(now, rule.window or timedelta(hours=1)) for rule in rules}
    rows = counters.outcome_rows(min(firsts.values()), (Status.RETRY, Status.FAILED),
                                 {rule.queue_id for rule in rules})
    per_minute: Counter = Counter()
    for queue_id, minute, _, count in rows:
        per_minute[(queue_id, minute)] += count
    return {rule.pk: float(sum(n for (queue_id, minute), n in per_minute.items()
                               if queue_id == rule.queue_id and minute >= firsts[rule.pk]))
            for rule in rules}


def _run_time_p95(rules: list[AlertRule], now: datetime) -> dict[int, float | None]:
    """p95 of the run times over each rule's window, from the metric history's buckets (the
    minutes rolled up so far): one statement per distinct window."""
    columns = history.BUCKETS["run"]
    by_window = defaultdict(list)
    for rule in rules:
        by_window[rule.window or timedelta(minutes=15)].append(rule)
    values: dict[int, float | None] = {}
    for window, windowed in by_window.items():
        sums = {row["queue_id"]: row for row in MetricMinute.objects.filter(
            queue_id__in={rule.queue_id for rule in windowed}, account="",
            start__gte=now.replace(second=0, microsecond=0) - window,
        ).values("queue_id").annotate(**{column: Sum(column) for column in columns})}
        for rule in windowed:
            row = sums.get(rule.queue_id)
            values[rule.pk] = None if row is None else history.percentile(
                [int(row[column] or 0) for column in columns], 0.95)
    return values


# --- delivery -----------------------------------------------------------------------------------

HEADLINES = {FIRING: "FIRING", REMINDER: "STILL FIRING", RESOLVED: "RESOLVED"}


def message(notice: Notice) -> tuple[str, dict]:
    """The notice's one-line text (the e-mail's subject and the webhook's `text`) and the
    webhook's JSON document."""
    firing, rule = notice.firing, notice.firing.rule
    where = rule.queue.key if rule.queue_id else "installation"
    text = f"[QueueAdmin] {HEADLINES[notice.event]} {where}: {firing.summary}"
    if notice.event == RESOLVED:
        text += f" (fired from {firing.started_at:%Y-%m-%d %H:%M} to {firing.ended_at:%H:%M} UTC)"
    elif notice.event == REMINDER:
        text += f" (since {firing.started_at:%Y-%m-%d %H:%M} UTC, not acknowledged)"
    document = {
        "text": text,
        "event": notice.event,
        "alert": firing.pk,
        "queue": rule.queue.key if rule.queue_id else None,
        "rule": rule.kind,
        "value": firing.value,
        "threshold": firing.threshold,
        "started_at": firing.started_at.isoformat(),
        "ended_at": firing.ended_at.isoformat() if firing.ended_at else None,
        "acknowledged_by": firing.acknowledged_by or None,
    }
    return text, document


def deliver(notice: Notice) -> Counter:
    """Send the notice to the rule's channels; what each did is kept on the firing."""
    rule = notice.firing.rule
    text, document = message(notice)
    outcome = {}
    recipients = list(dict.fromkeys([*setting("ALERT_EMAILS"), *rule.emails]))
    if "email" in rule.channels and recipients:
        outcome["email"] = send_email(text, recipients)
    if "webhook" in rule.channels and setting("ALERT_WEBHOOK_URL"):
        outcome["webhook"] = post_webhook(document)
    AlertFiring.objects.filter(pk=notice.firing.pk).update(delivery=outcome)
    failed = [channel for channel, said in outcome.items() if said != "sent"]
    for channel in failed:
        log.warning("alert %s: %s delivery failed: %s", notice.firing.pk, channel,
                    outcome[channel])
    return Counter({f"{notice.event} notices": 1, "deliveries": len(outcome) - len(failed),
                    "deliveries failed": len(failed)})


# Threads sending a health probe's notices; a test or a shutdown can wait for them.
background_deliveries: set[threading.Thread] = set()


def deliver_in_background(notices: list[Notice]) -> threading.Thread:
    """Deliver from a daemon thread: a health probe answers at once, where each channel may
    wait up to the delivery timeout per network operation (connect, then read; every step of
    an SMTP exchange), longer than a probe's timeout."""
    def run():
        try:
            for notice in notices:
                deliver(notice)
        except Exception:
            log.exception("delivering alert notices in the background failed")
        finally:
            connection.close()  # this thread's own connection
            background_deliveries.discard(thread)

    thread = threading.Thread(target=run, name="alert-notices", daemon=True)
    background_deliveries.add(thread)
    thread.start()
    return thread


def send_email(text: str, recipients: list[str]) -> str:
    """"sent", or why not. Any backend's error is recorded rather than raised: the evaluation
    goes on and the other channel still gets its notice."""
    try:
        backend = mail.get_connection(timeout=setting("ALERT_DELIVERY_TIMEOUT_SECONDS"))
        mail.EmailMessage(subject=text, body=text + "\n", to=recipients,
                          connection=backend).send()
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"[:500]
    return "sent"


def post_webhook(document: dict) -> str:
    """POST the notice to ALERT_WEBHOOK_URL through the webhook handler's session, so that the
    same address checks (and allow-list) apply and the connection goes to the checked address;
    signed with ALERT_WEBHOOK_SECRET as the handler signs items. "sent", or why not."""
    try:
        options = webhook.parse_options({"url": setting("ALERT_WEBHOOK_URL"),
                                         "secret": setting("ALERT_WEBHOOK_SECRET"),
                                         "timeout": setting("ALERT_DELIVERY_TIMEOUT_SECONDS")})
    except PermanentError as exc:
        return f"failed: {exc}"
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        # Streamed and never read: a receiver's answer cannot be large enough to matter.
        with webhook.session().post(options.url, data=body,
                                    headers=webhook.signed_headers(body, options.secret),
                                    timeout=options.timeout, allow_redirects=False,
                                    stream=True) as response:
            status = response.status_code
    except webhook.RefusedDestination as exc:
        return f"failed: {exc}"
    except requests.RequestException as exc:
        return f"failed: request failed: {exc}"[:500]
    return "sent" if 200 <= status < 300 else f"failed: HTTP {status}"
