"""Item detail `/items/<id>/` and its actions: retry, cancel, run now."""

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from queues import enqueue
from queues.engine import lifecycle
from queues.models import Attempt, AuditEntry, Item, ItemEvent
from queues.tasks_backend import tenant
from tests import tasks as functions
from tests.factories import QueueFactory, item_in_status, run_one_round

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails", backoff_seconds=[60, 600], max_retries=3)


def test_detail_shows_payload_timeline_attempts_and_traceback(role_client, queue):
    item = item_in_status(queue, "retry", payload={"to": "<b>ada</b>", "n": 1})
    Attempt.objects.filter(item=item).update(traceback="Traceback (most recent call last):\n"
                                                       '  File "x.py", line 1\nKeyError: <k>')
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "&quot;to&quot;: &quot;&lt;b&gt;ada&lt;/b&gt;&quot;" in html  # pretty, escaped
    assert "<b>ada</b>" not in html
    for transition in ("enqueued", "dispatched", "started", "retry_scheduled"):
        assert transition in html
    assert "Attempt 1" in html and "worker-1" in html and "temporary trouble" in html
    assert "<summary>Traceback</summary>" in html and "KeyError: &lt;k&gt;" in html
    assert "Next run (estimated)" in html and "Dead letter if every attempt fails" in html


def test_a_timeline_trimmed_by_retention_says_so(role_client, queue):
    item = item_in_status(queue, "retry")
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "have been removed" not in html
    Item.objects.filter(pk=item.pk).update(created_at=timezone.now() - timedelta(days=90))
    ItemEvent.objects.filter(item=item, transition="enqueued").delete()
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Events older than this queue's retention (60 days) have been removed" in html


def test_attempts_removed_by_retention_are_said_to_be_gone(role_client, queue):
    item = item_in_status(queue, "retry")
    Attempt.objects.create(item=item, number=2, finished_at=timezone.now(), outcome="retry")
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "have been removed" not in html
    Attempt.objects.filter(item=item, number=1).delete()
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Attempts before attempt 2 are older than every queue's retention" in html


def test_dead_letter_estimate_adds_the_remaining_backoff(queue):
    from queues.web.queries import dead_letter_estimate

    start = timezone.now()
    # Attempt 1 done; attempt 2 at start, then retries 2 and 3 wait 600 s each (last repeats).
    assert dead_letter_estimate(queue, 1, start) == start + timedelta(seconds=1200)
    assert dead_letter_estimate(queue, 3, start) == start


# The queue's backoff if every attempt fails: 60 s after attempt 1, 600 s after attempts 2 and
# 3 (the last delay repeats), and attempt 4, the last, goes to the dead letters.
ALL_RETRIES = timedelta(seconds=60 + 600 + 600)


def forecast(item, now):
    from queues.web.queries import item_detail

    return item_detail(Item.objects.get(pk=item.pk), now).dead_letter_at


def start_next_attempt(item):
    """Dispatches and starts the item's next attempt through the lifecycle."""
    attempt = item.attempts + 1
    lifecycle.apply("dispatch", [item.pk], actor="selector")
    lifecycle.apply("start", [item.pk], actor="worker", expected_attempts={item.pk: attempt})
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("running", attempt)


def fail_attempt(queue, item, *, delay=None):
    """Fails the running attempt with a temporary error, as the worker records a handler's
    RetryableError(delay=delay)."""
    lifecycle.finish(queue, [lifecycle.Outcome(item_id=item.pk, attempt=item.attempts,
                                               error="timeout", delay=delay)], worker="worker-1")
    item.refresh_from_db()
    assert item.status == "retry"


@pytest.mark.parametrize("status", ["queued", "dispatched", "running"])
def test_dead_letter_forecast_before_a_first_failure_is_the_whole_backoff(queue, status):
    item = item_in_status(queue, status)
    now = timezone.now()
    assert forecast(item, now) == now + ALL_RETRIES


def test_dead_letter_forecast_of_a_delayed_item_starts_at_its_run_at(queue):
    item = enqueue("emails", account="a", identifier="later",
                   run_at=timezone.now() + timedelta(days=1))
    assert forecast(item, timezone.now()) == item.run_at + ALL_RETRIES


def test_dead_letter_forecast_starts_at_the_delay_the_handler_asked_for(queue):
    # RetryableError(delay=7200) in attempt 1: attempt 2 runs in two hours, not in 60 s, and
    # only the retries after it follow the backoff.
    item = item_in_status(queue, "running")
    fail_attempt(queue, item, delay=7200)
    assert item.run_at > timezone.now() + timedelta(seconds=7100)
    assert forecast(item, timezone.now()) == item.run_at + timedelta(seconds=600 + 600)


def test_dead_letter_forecast_of_a_due_retry_starts_now(queue):
    item = item_in_status(queue, "retry")
    now = item.run_at + timedelta(hours=1)
    assert forecast(item, now) == now + timedelta(seconds=600 + 600)


def test_dead_letter_forecast_of_a_later_attempt_under_way(queue):
    item = item_in_status(queue, "retry")
    start_next_attempt(item)
    fail_attempt(queue, item)
    start_next_attempt(item)
    now = timezone.now()
    assert forecast(item, now) == now + timedelta(seconds=600)  # attempt 3 of 4
    fail_attempt(queue, item)
    start_next_attempt(item)
    assert forecast(item, now) == now  # the last attempt: its failure is the dead letter


@pytest.mark.parametrize("status", ["complete", "failed", "cancelled"])
def test_finished_items_have_no_dead_letter_forecast(role_client, queue, status):
    item = item_in_status(queue, status)
    assert forecast(item, timezone.now()) is None
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Dead letter if every attempt fails" not in html


def test_a_running_item_shows_its_dead_letter_forecast_but_no_next_run(role_client, queue):
    item = item_in_status(queue, "running")
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Dead letter if every attempt fails" in html
    assert "Next run (estimated)" not in html


def test_failed_item_shows_its_dead_letter_reason(role_client, queue):
    item = item_in_status(queue, "failed")
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Dead letter" in html and "permanent after 1 attempt" in html


def test_viewer_sees_no_action_buttons(role_client, queue):
    item = item_in_status(queue, "failed")
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "Retry</button>" not in html and "Cancel</button>" not in html


def test_operator_sees_the_actions_the_status_allows(role_client, queue):
    client = role_client("Operator")
    failed = client.get(f"/items/{item_in_status(queue, 'failed').pk}/").content.decode()
    assert "Retry</button>" in failed and "Cancel</button>" not in failed
    retry = client.get(f"/items/{item_in_status(queue, 'retry').pk}/").content.decode()
    assert "Run now</button>" in retry and "Cancel</button>" in retry and "hx-confirm" in retry
    running = client.get(f"/items/{item_in_status(queue, 'running').pk}/").content.decode()
    assert "Cancel</button>" not in running and "not cancelled mid-flight" in running


def test_retry_swaps_the_summary_triggers_refresh_and_is_audited(role_client, queue):
    item = item_in_status(queue, "failed")
    response = role_client("Operator").post(f"/items/{item.pk}/retry/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert 'id="item-summary"' in response.content.decode() and b"<html" not in response.content
    assert "queueadmin:changed" in json.loads(response["HX-Trigger"])
    item.refresh_from_db()
    assert item.status == "queued" and item.attempts == 0
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_name, entry.queue_key) == ("item.retry", "operator-user",
                                                                 "emails")
    assert entry.counts == {"changed": 1, "skipped": 0}
    assert ItemEvent.objects.filter(item=item, transition="requeued",
                                    actor="operator-user").exists()


def test_cancel_a_queued_item(role_client, queue):
    item = enqueue("emails", account="a", identifier="x")
    response = role_client("Operator").post(f"/items/{item.pk}/cancel/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert Item.objects.get(pk=item.pk).status == "cancelled"


def test_cancel_of_a_running_item_says_why_not(role_client, queue):
    item = item_in_status(queue, "running")
    response = role_client("Operator").post(f"/items/{item.pk}/cancel/", HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert b"running items are not cancelled mid-flight" in response.content
    assert Item.objects.get(pk=item.pk).status == "running"
    assert AuditEntry.objects.get().counts == {"changed": 0, "skipped": 1}


def test_run_now_makes_a_retry_due_at_once(role_client, queue):
    item = item_in_status(queue, "retry")
    assert item.run_at > timezone.now()
    role_client("Operator").post(f"/items/{item.pk}/run-now/", HTTP_HX_REQUEST="true")
    item.refresh_from_db()
    assert item.status == "queued" and item.run_at <= timezone.now() and item.attempts == 1


def test_run_now_makes_a_delayed_item_due(role_client, queue):
    item = enqueue("emails", account="a", identifier="later",
                   run_at=timezone.now() + timedelta(days=1))
    role_client("Operator").post(f"/items/{item.pk}/run-now/")
    item.refresh_from_db()
    assert item.status == "queued" and item.run_at <= timezone.now()


def test_run_now_transition_keeps_counts(queue):
    from queues.engine import counters

    item = enqueue("emails", account="a", identifier="later",
                   run_at=timezone.now() + timedelta(days=1))
    lifecycle.transition(item.pk, "run_now", actor="t")
    assert counters.status_counts([queue.pk])[queue.pk]["queued"] == 1


def test_action_without_htmx_redirects_with_a_message(role_client, queue):
    item = item_in_status(queue, "complete")
    client = role_client("Operator")
    response = client.post(f"/items/{item.pk}/retry/")
    assert response.status_code == 302 and response["Location"] == f"/items/{item.pk}/"
    assert b"Retry: done." in client.get(response["Location"]).content


def test_viewer_cannot_act_and_actions_are_post_only(role_client, queue):
    item = item_in_status(queue, "failed")
    assert role_client("Viewer").post(f"/items/{item.pk}/retry/").status_code == 403
    assert Item.objects.get(pk=item.pk).status == "failed"
    assert role_client("Operator").get(f"/items/{item.pk}/retry/").status_code == 405
    assert role_client("Operator").post(f"/items/{item.pk}/explode/").status_code == 404


def test_detail_has_a_counts_strip_that_refreshes_after_actions(role_client, queue):
    item = item_in_status(queue, "failed")
    client = role_client("Operator")
    html = client.get(f"/items/{item.pk}/").content.decode()
    assert 'id="queue-counts"' in html and "queueadmin:changed from:body" in html
    assert "1 dead letters" in html
    client.post(f"/items/{item.pk}/retry/", HTTP_HX_REQUEST="true")
    strip = client.get("/queues/emails/counts/", HTTP_HX_REQUEST="true").content.decode()
    assert "0 dead letters" in strip and "1 queued" in strip


def test_a_task_item_shows_its_task_arguments_and_return_value_masked_for_viewers(role_client):
    with tenant("acme"):
        enqueued = functions.echo.enqueue("ada", api_key="k-123", n=1)
    run_one_round("default")
    item = Item.objects.get(identifier=enqueued.id)

    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert '<code id="task-path">tests.tasks.echo</code>' in html
    assert "?task=tests.tasks.echo" in html
    kwargs = re.search(r'id="task-kwargs">(.*?)</pre>', html, re.S).group(1)
    assert "&quot;n&quot;: 1" in kwargs and "••••••" in kwargs and "k-123" not in kwargs
    returned = re.search(r'id="task-return">(.*?)</pre>', html, re.S).group(1)
    assert "&quot;ada&quot;" in returned and "k-123" not in returned
    assert "k-123" not in html
    assert "positional arguments have no key to match" in html

    html = role_client("Operator").get(f"/items/{item.pk}/").content.decode()
    assert html.count("k-123") == 2  # the keyword argument and the return value


def test_a_failed_task_item_shows_each_attempts_error_and_traceback(role_client):
    enqueued = functions.fail.enqueue("input")
    run_one_round("default")
    item = Item.objects.get(identifier=enqueued.id)
    html = role_client("Viewer").get(f"/items/{item.pk}/").content.decode()
    assert "ValueError: bad input" in html and "<summary>Traceback</summary>" in html
    assert 'id="task-return"' not in html
