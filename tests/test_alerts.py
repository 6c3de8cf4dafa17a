"""Alert rules (queues.engine.alerts): figures from the counters and the history, firings opened
and closed, notices by e-mail (Django's test outbox) and webhook (a real local HTTP receiver),
no repeat storm, reminders, resolve notices, mute and acknowledge, the web processes' turn at
the outside-only rule, /metrics, the command, the migration of the old queue fields, and one
run of `manage.py alerts` as a real process."""

import hashlib
import hmac
import json
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core import mail
from django.core.management import call_command
from django.db import IntegrityError, connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import Schedule

from queueadmin import config
from queues.bench import processes
from queues.engine import alerts, history, lifecycle
from queues.engine.liveness import SELECTOR_SCHEDULE
from queues.engine.schedules import SCHEDULES
from queues.models import (
    AlertFiring,
    AlertRule,
    AlertRun,
    AuditEntry,
    ClusterHeartbeat,
    Item,
    MetricMinute,
    SweepRun,
    alert_summary,
    histogram_column,
)
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db
SECRET = "alerts-and-receiver-share-this"
OPS = "ops@example.com"


def configure(settings, **alert_settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "ALERT_EMAILS": [OPS],
                           "ALERT_WEBHOOK_URL": "", "ALERT_REMINDER_HOURS": 4, **alert_settings}


@pytest.fixture
def notify(settings):
    """Notices by e-mail to OPS (pytest-django's locmem backend: mail.outbox)."""
    configure(settings)


@pytest.fixture
def quiet_installation():
    """Only the queue rules speak: the installation's would fire in a database without
    clusters, and some tests move the clock hours ahead."""
    AlertRule.objects.filter(queue=None).update(enabled=False)


@pytest.fixture
def queue(quiet_installation):
    """A queue whose depth rule fires above 2 items; its oldest-wait rule is off, as tests
    that move the clock ahead would make its queued items old."""
    queue = QueueFactory(key="emails")
    AlertRule.objects.filter(queue=queue, kind="depth").update(threshold=2)
    AlertRule.objects.filter(queue=queue, kind="oldest_wait").update(enabled=False)
    return queue


def rule(queue, kind) -> AlertRule:
    return AlertRule.objects.get(queue=queue, kind=kind)


def subjects() -> list[str]:
    return [message.subject for message in mail.outbox]


def healthy(now=None):
    now = now or timezone.now()
    ClusterHeartbeat.objects.create(cluster="web-1:42", host="web-1", pid=42, started_at=now,
                                    beat_at=now)
    SweepRun.objects.create(started_at=now, finished_at=now)
    Schedule.objects.filter(name=SELECTOR_SCHEDULE).update(next_run=now)


# --- rules --------------------------------------------------------------------------------------

def test_a_new_queue_gets_the_seed_thresholds_as_its_rules():
    queue = QueueFactory(key="fresh")
    rules = {r.kind: (r.threshold, r.window, r.enabled, r.channels)
             for r in AlertRule.objects.filter(queue=queue)}
    assert rules == {
        "dead_letters": (100, None, True, ["email", "webhook"]),
        "depth": (10_000, None, True, ["email", "webhook"]),
        "failures": (50, timedelta(hours=1), True, ["email", "webhook"]),
        "run_time": (30, timedelta(minutes=15), True, ["email", "webhook"]),
        "oldest_wait": (3600, None, True, ["email", "webhook"]),
    }


def test_the_installation_has_one_rule_per_liveness_kind():
    assert dict(AlertRule.objects.filter(queue=None).values_list("kind", "threshold")) == {
        "no_cluster": 45, "selector_behind": 180, "sweeper_behind": 900}
    alerts.ensure_installation_rules()  # after every migrate: idempotent
    assert AlertRule.objects.filter(queue=None).count() == 3


def test_a_rule_cannot_have_two_open_firings():
    queue = QueueFactory(key="race")
    depth = rule(queue, "depth")
    now = timezone.now()
    AlertFiring.objects.create(rule=depth, started_at=now, threshold=1)
    with pytest.raises(IntegrityError):
        AlertFiring.objects.create(rule=depth, started_at=now, threshold=1)


# --- figures ------------------------------------------------------------------------------------

def test_depth_and_dead_letters_come_from_the_counters_without_counting_items(queue):
    items_in_status(queue, "queued", 3)
    items_in_status(queue, "failed", 2)
    with CaptureQueriesContext(connection) as queries:
        alerts.evaluate()
    assert not [q["sql"] for q in queries.captured_queries
                if "COUNT(" in q["sql"].upper() and '"queues_item"' in q["sql"]]
    firing = AlertFiring.objects.get(rule__queue=queue)
    assert (firing.rule.kind, firing.value, firing.threshold) == ("depth", 3, 2)
    assert firing.summary == "depth 3 (over 2)"
    assert not AlertFiring.objects.filter(rule__kind="dead_letters").exists()


def test_failures_count_retries_and_permanent_failures_in_the_window(queue):
    AlertRule.objects.filter(queue=queue, kind="failures").update(threshold=1)
    items_in_status(queue, "retry", 1)
    items_in_status(queue, "failed", 1)
    alerts.evaluate()
    firing = AlertFiring.objects.get(rule__kind="failures")
    assert firing.value == 2
    assert firing.summary == "2 failures in the last hour (over 1)"


def test_one_dead_letter_or_failure_is_said_in_the_singular():
    hour = timedelta(hours=1)
    assert alert_summary("dead_letters", 1, 0, None) == "1 dead letter (over 0)"
    assert alert_summary("dead_letters", 1_234, 100, None) == "1,234 dead letters (over 100)"
    assert alert_summary("failures", 1, 0, hour) == "1 failure in the last hour (over 0)"
    assert alert_summary("failures", 0, 0, hour) == "0 failures in the last hour (over 0)"


def test_run_time_p95_comes_from_the_history_buckets(queue):
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=2)
    slow, fast = history.bucket_of(45.0), history.bucket_of(0.2)
    MetricMinute.objects.create(queue=queue, start=minute, completed=40,
                                **{histogram_column("run", slow): 1,
                                   histogram_column("run", fast): 39})
    alerts.evaluate()
    assert not AlertFiring.objects.filter(rule__kind="run_time").exists()  # p95 is fast

    MetricMinute.objects.filter(queue=queue).update(**{histogram_column("run", fast): 0})
    alerts.evaluate()
    firing = AlertFiring.objects.get(rule__kind="run_time")
    assert 32 <= firing.value <= 66  # inside the 45 s bucket
    assert firing.summary.startswith("run time p95 ") and "in the last 15 min (over 30 s)" in \
        firing.summary


def test_oldest_wait_fires_for_a_due_item_waiting_past_the_threshold(queue):
    AlertRule.objects.filter(queue=queue, kind="oldest_wait").update(enabled=True)
    [item] = items_in_status(queue, "queued", 1)
    alerts.evaluate()
    assert not AlertFiring.objects.filter(rule__kind="oldest_wait").exists()
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Item.objects.filter(pk=item.pk).update(created_at=two_hours_ago, run_at=two_hours_ago)
    alerts.evaluate()
    assert AlertFiring.objects.get(rule__kind="oldest_wait").summary.startswith("oldest wait 2")


# --- notices ------------------------------------------------------------------------------------

def test_a_firing_is_announced_once_not_at_every_evaluation(queue, notify):
    items_in_status(queue, "queued", 3)
    for _ in range(5):
        alerts.evaluate()
    assert subjects() == ["[QueueAdmin] FIRING emails: depth 3 (over 2)"]
    assert mail.outbox[0].to == [OPS]
    firing = AlertFiring.objects.get()
    assert (firing.notices, firing.delivery) == (1, {"email": "sent"})
    assert AlertRun.objects.count() == 5  # every evaluation is recorded, empty ones too
    assert AlertRun.objects.order_by("id").first().counts["opened"] == 1


def test_a_reminder_at_most_every_reminder_hours_while_unacknowledged(queue, notify):
    items_in_status(queue, "queued", 3)
    start = timezone.now()
    alerts.evaluate(start)
    alerts.evaluate(start + timedelta(hours=3, minutes=59))
    assert len(mail.outbox) == 1
    alerts.evaluate(start + timedelta(hours=4))
    alerts.evaluate(start + timedelta(hours=5))
    assert subjects()[1].startswith("[QueueAdmin] STILL FIRING emails: depth 3 (over 2) (since ")
    assert len(mail.outbox) == 2
    alerts.evaluate(start + timedelta(hours=8))
    assert len(mail.outbox) == 3


def test_an_acknowledged_firing_gets_no_reminders_but_its_end_is_told(queue, notify):
    items = items_in_status(queue, "queued", 3)
    start = timezone.now()
    alerts.evaluate(start)
    assert alerts.acknowledge(AlertFiring.objects.get(), actor="alice")
    alerts.evaluate(start + timedelta(hours=9))
    assert len(mail.outbox) == 1
    lifecycle.apply("cancel", [item.pk for item in items], actor="admin")
    alerts.evaluate(start + timedelta(hours=10))
    assert subjects()[1].startswith("[QueueAdmin] RESOLVED emails: depth 3 (over 2) (fired from")
    assert AuditEntry.objects.get(action="alert.acknowledge").actor_name == "alice"


def test_the_figure_coming_back_closes_the_firing_with_one_resolved_notice(queue, notify):
    items_in_status(queue, "queued", 3)
    alerts.evaluate()
    AlertRule.objects.filter(queue=queue, kind="depth").update(threshold=10)
    alerts.evaluate()
    alerts.evaluate()
    firing = AlertFiring.objects.get()
    assert firing.ended_at is not None
    assert [s.split(":")[0] for s in subjects()] == ["[QueueAdmin] FIRING emails",
                                                     "[QueueAdmin] RESOLVED emails"]


def test_disabling_a_rule_ends_its_firing(queue, notify):
    items_in_status(queue, "queued", 3)
    alerts.evaluate()
    AlertRule.objects.filter(queue=queue, kind="depth").update(enabled=False)
    alerts.evaluate()
    assert AlertFiring.objects.get().ended_at is not None
    assert subjects()[-1].startswith("[QueueAdmin] RESOLVED")


def test_a_muted_rule_records_its_firing_and_sends_nothing_until_the_mute_ends(queue, notify):
    items_in_status(queue, "queued", 3)
    start = timezone.now()
    alerts.mute(rule(queue, "depth"), start + timedelta(hours=1), actor="bob")
    alerts.evaluate(start)
    firing = AlertFiring.objects.get()
    assert (firing.ended_at, firing.notices, mail.outbox) == (None, 0, [])
    alerts.evaluate(start + timedelta(hours=1, minutes=1))
    assert subjects() == ["[QueueAdmin] FIRING emails: depth 3 (over 2)"]
    entry = AuditEntry.objects.get(action="alert.mute")
    assert entry.actor_name == "bob" and entry.filter["until"].startswith(
        str((start + timedelta(hours=1)).year))


def test_rule_recipients_are_added_to_the_installation_ones_and_channels_chosen(queue, notify):
    AlertRule.objects.filter(queue=queue, kind="depth").update(emails=["dev@example.com", OPS])
    items_in_status(queue, "queued", 3)
    alerts.evaluate()
    assert mail.outbox[0].to == [OPS, "dev@example.com"]
    AlertRule.objects.filter(queue=queue, kind="dead_letters").update(threshold=0,
                                                                      channels=["webhook"])
    items_in_status(queue, "failed", 1)
    alerts.evaluate()
    assert len(mail.outbox) == 1  # the dead-letter rule sends by webhook only (none set)


def test_the_webhook_notice_is_signed_json_with_a_text_field(queue, settings, receiver):
    configure(settings, ALERT_EMAILS=[], ALERT_WEBHOOK_URL=receiver.url("/ok"),
              ALERT_WEBHOOK_SECRET=SECRET, WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"])
    items_in_status(queue, "queued", 3)
    alerts.evaluate()
    [request] = receiver.received
    document = json.loads(request.body)
    assert document["text"] == "[QueueAdmin] FIRING emails: depth 3 (over 2)"
    assert {k: document[k] for k in ("event", "queue", "rule", "value", "threshold")} == {
        "event": "firing", "queue": "emails", "rule": "depth", "value": 3, "threshold": 2}
    timestamp = request.headers["X-QueueAdmin-Timestamp"]
    expected = hmac.new(SECRET.encode(), timestamp.encode() + b"." + request.body,
                        hashlib.sha256).hexdigest()
    assert request.headers["X-QueueAdmin-Signature"] == f"sha256={expected}"
    assert request.headers["Content-Type"] == "application/json"
    assert AlertFiring.objects.get().delivery == {"webhook": "sent"}


def test_the_webhook_refuses_a_local_address_unless_allow_listed_and_mail_still_goes(
        queue, settings, receiver):
    configure(settings, ALERT_WEBHOOK_URL=receiver.url("/ok"), WEBHOOK_ALLOWED_HOSTS=[])
    items_in_status(queue, "queued", 3)
    counts = alerts.evaluate()
    assert receiver.received == []
    delivery = AlertFiring.objects.get().delivery
    assert delivery["email"] == "sent"
    assert delivery["webhook"].startswith("failed: refused: 127.0.0.1 is a loopback address")
    assert counts["deliveries failed"] == 1 and counts["deliveries"] == 1


def test_a_receiver_error_and_a_broken_mail_server_are_recorded_not_raised(
        queue, settings, receiver):
    configure(settings, ALERT_WEBHOOK_URL=receiver.url("/status/503"),
              WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"])
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", processes.free_port()  # nobody there
    items_in_status(queue, "queued", 3)
    counts = alerts.evaluate()
    delivery = AlertFiring.objects.get().delivery
    assert delivery["webhook"] == "failed: HTTP 503"
    assert delivery["email"].startswith("failed: ConnectionRefusedError")
    assert counts["deliveries failed"] == 2
    alerts.evaluate()
    assert len(receiver.received) == 1  # a failed notice is not retried at every evaluation


# --- outside the clusters -----------------------------------------------------------------------

def test_no_cluster_beating_is_noticed_by_a_web_process_once_a_minute(notify):
    now = timezone.now()
    assert alerts.evaluate_from_web(now) == {"opened": 1, "firing notices": 1, "deliveries": 1}
    assert subjects() == ["[QueueAdmin] FIRING installation: no worker cluster has ever sent a "
                          "heartbeat"]
    # Another web process (or request) within the minute finds the turn taken.
    assert alerts.evaluate_from_web(now + timedelta(seconds=30)) is None
    healthy(now + timedelta(seconds=61))
    assert alerts.evaluate_from_web(now + timedelta(seconds=61))["closed"] == 1
    assert subjects()[1].startswith("[QueueAdmin] RESOLVED installation:")
    assert list(AlertRun.objects.values_list("source", flat=True)) == ["web", "web"]


def test_healthz_evaluates_the_no_cluster_rule(client):
    client.get("/healthz")
    firing = AlertFiring.objects.get()
    assert (firing.rule.kind, firing.rule.queue) == ("no_cluster", None)


@pytest.mark.django_db(transaction=True)
def test_healthz_answers_before_a_slow_receiver_gets_its_notice(client, settings, receiver):
    # Each channel may wait its delivery timeout per network step: longer than a probe waits.
    configure(settings, ALERT_EMAILS=[], ALERT_WEBHOOK_URL=receiver.url("/slow?seconds=3"),
              WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"])
    started = time.monotonic()
    assert client.get("/healthz").status_code == 200
    assert time.monotonic() - started < 2
    for thread in list(alerts.background_deliveries):
        thread.join(10)
    firing = AlertFiring.objects.get()
    assert firing.rule.kind == "no_cluster" and firing.delivery == {"webhook": "sent"}
    assert [r.path for r in receiver.received] == ["/slow"]
    assert AlertRun.objects.get().counts["notices sent in the background"] == 1


def test_the_schedule_evaluates_every_rule_and_leaves_the_web_nothing_to_do(notify):
    healthy()
    assert alerts.run() == {}
    assert alerts.evaluate_from_web() is None
    assert {"name": "queueadmin: alerts", "func": "queues.engine.alerts.run",
            "minutes": 1} in SCHEDULES


def test_selector_and_sweeper_behind_fire_as_healthz_judges_them(notify):
    healthy()
    later = timezone.now() + timedelta(minutes=20)
    ClusterHeartbeat.objects.update(beat_at=later)
    alerts.evaluate(later)
    assert sorted(AlertFiring.objects.values_list("rule__kind", flat=True)) == [
        "selector_behind", "sweeper_behind"]


def test_a_sweeper_that_never_ran_is_not_behind_while_the_first_cluster_is_new(notify):
    """Its first run comes minutes after a cluster starts: a fresh installation's overview
    must not say "the sweeper has never run" for those minutes."""
    AlertRule.objects.filter(queue=None).exclude(kind="sweeper_behind").update(enabled=False)
    AlertRule.objects.filter(queue=None, kind="sweeper_behind").update(enabled=True)
    now = timezone.now()
    ClusterHeartbeat.objects.create(cluster="web-1:42", host="web-1", pid=42, started_at=now,
                                    beat_at=now)
    alerts.evaluate(now + timedelta(minutes=2))
    assert not AlertFiring.objects.exists()
    ClusterHeartbeat.objects.update(beat_at=now + timedelta(minutes=16))
    alerts.evaluate(now + timedelta(minutes=16))
    assert AlertFiring.objects.get().summary == "the sweeper has never run"


def test_the_command_evaluates_and_says_what_changed(queue):
    items_in_status(queue, "queued", 3)
    out = StringIO()
    call_command("alerts", stdout=out)
    assert "opened: 1" in out.getvalue()
    assert AlertRun.objects.get().source == "command"


def test_metrics_expose_each_rule_state(client, settings, queue):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "METRICS_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    items_in_status(queue, "queued", 3)
    alerts.evaluate()
    alerts.mute(rule(queue, "dead_letters"), timezone.now() + timedelta(hours=1), actor="x")
    body = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'queueadmin_alert_firing{queue="emails",rule="depth"} 1.0' in body
    assert 'queueadmin_alert_firing{queue="emails",rule="dead_letters"} 0.0' in body
    assert 'queueadmin_alert_muted{queue="emails",rule="dead_letters"} 1.0' in body


# --- the migration of the old queue fields ------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_the_queue_alert_fields_into_rules_and_back():
    before, after = [("queues", "0019_metric_history")], [("queues", "0020_alert_rules")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("queues", "Queue")
    old.objects.create(key="legacy", name="Legacy", alert_dead_letters=7, alert_depth=500,
                       alert_failures_per_hour=3)
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    rules = executor.loader.project_state(after).apps.get_model("queues", "AlertRule")
    assert dict(rules.objects.filter(queue__key="legacy").values_list("kind", "threshold")) == {
        "dead_letters": 7, "depth": 500, "failures": 3, "run_time": 30, "oldest_wait": 3600}
    assert rules.objects.get(queue__key="legacy", kind="failures").window == timedelta(hours=1)

    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("queues", "Queue")
    assert old.objects.filter(key="legacy").values_list(
        "alert_dead_letters", "alert_depth", "alert_failures_per_hour").get() == (7, 500, 3)
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes("queues"))


# --- end to end ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_manage_py_alerts_as_a_process_delivers_by_file_mail_and_signed_webhook(tmp_path,
                                                                                 receiver):
    queue = QueueFactory(key="e2e")
    AlertRule.objects.filter(queue=queue, kind="depth").update(threshold=1)
    items_in_status(queue, "queued", 2)
    output = processes.run_manage("alerts", env={
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(tmp_path),
        "QUEUEADMIN_ALERT_EMAILS": OPS,
        "QUEUEADMIN_ALERT_WEBHOOK_URL": receiver.url("/ok"),
        "QUEUEADMIN_ALERT_WEBHOOK_SECRET": SECRET,
        "QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    })
    assert "opened: " in output
    mails = "\n".join(path.read_text() for path in tmp_path.iterdir())
    assert f"To: {OPS}" in mails
    assert "FIRING e2e: depth 2 (over 1)" in mails
    # No cluster runs in this test: the command, outside the clusters, says so too.
    assert "FIRING installation: no worker cluster has ever sent a heartbeat" in mails
    texts = {json.loads(request.body)["text"] for request in receiver.received}
    assert "[QueueAdmin] FIRING e2e: depth 2 (over 1)" in texts
    for request in receiver.received:
        timestamp = request.headers["X-QueueAdmin-Timestamp"]
        assert request.headers["X-QueueAdmin-Signature"] == "sha256=" + hmac.new(
            SECRET.encode(), timestamp.encode() + b"." + request.body, hashlib.sha256,
        ).hexdigest()
    assert AlertFiring.objects.get(rule__queue=queue).delivery == {"email": "sent",
                                                                    "webhook": "sent"}


# --- configuration ------------------------------------------------------------------------------

def test_alert_channels_and_django_mail_settings_are_read_from_the_environment():
    cfg = config.load({"QUEUEADMIN_ALERT_EMAILS": " ops@example.com,dev@example.com ,",
                       "QUEUEADMIN_ALERT_WEBHOOK_URL": "https://hooks.example.com/a",
                       "QUEUEADMIN_ALERT_REMINDER_HOURS": "0",
                       "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                       "EMAIL_FILE_PATH": "/srv/queueadmin/mail"})
    assert cfg.alert_emails == ["ops@example.com", "dev@example.com"]
    assert (cfg.alert_webhook_url, cfg.alert_reminder_hours) == ("https://hooks.example.com/a", 0)
    assert cfg.email["EMAIL_FILE_PATH"] == "/srv/queueadmin/mail"
    assert config.load({}).alert_emails == [] and config.load({}).alert_reminder_hours == 4


@pytest.mark.parametrize("variable, value, message", [
    ("QUEUEADMIN_ALERT_EMAILS", "ops@example.com,not-an-address", "is not an e-mail address"),
    ("QUEUEADMIN_ALERT_WEBHOOK_URL", "ftp://hooks.example.com/", "must be an http or https"),
    ("QUEUEADMIN_ALERT_REMINDER_HOURS", "-1", "must be at least 0"),
    ("EMAIL_PORT", "smtp", "is not an integer"),
])
def test_a_bad_alert_setting_stops_start_up_naming_it(variable, value, message):
    with pytest.raises(config.ConfigError, match=f"{variable}.*{message}"):
        config.load({variable: value})
