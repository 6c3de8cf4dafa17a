"""Selector rounds and sweeper runs, with "run now" for Operators; audit and dead-letter lists."""

import pytest

from queues.models import AuditEntry, Item, SelectorRound, SweepRun
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db


def test_operator_runs_a_selector_round_and_sees_it(role_client):
    queue = QueueFactory(key="emails")
    enqueued(queue, 3)
    client = role_client("Operator")
    response = client.post("/activity/selector/", {"queue": "emails"})
    assert response.status_code == 302
    assert SelectorRound.objects.get().taken == 3
    assert Item.objects.filter(status="dispatched").count() == 3
    entry = AuditEntry.objects.get(action="selector.run")
    assert entry.counts == {"dispatched": 3, "accounts": 1}
    html = client.get("/activity/").content.decode()
    assert "dispatched 3 items" in html and "Latest selector rounds" in html


def test_operator_runs_the_sweeper(role_client):
    response = role_client("Operator").post("/activity/sweeper/")
    assert response.status_code == 302
    assert SweepRun.objects.count() == 1
    assert AuditEntry.objects.filter(action="sweeper.run").exists()


def test_viewer_sees_no_run_buttons(role_client):
    html = role_client("Viewer").get("/activity/").content.decode()
    assert "Run the sweeper now" not in html
    assert role_client("Viewer").post("/activity/selector/", {"queue": "x"}).status_code == 403


def test_audit_log_lists_entries_newest_first(role_client):
    from queues.engine import audit

    audit.record("cli", "first")
    audit.record("cli", "second", queue_key="emails", target="<b>t</b>")
    response = role_client("Viewer").get("/audit/")
    assert [e.action for e in response.context["entries"]] == ["second", "first"]
    assert b"<b>t</b>" not in response.content
    assert [e.action for e in role_client("Viewer").get("/audit/?queue=emails")
            .context["entries"]] == ["second"]


def test_dead_letters_lists_open_letters(role_client):
    queue = QueueFactory(key="emails")
    items_in_status(queue, "failed", 2)
    response = role_client("Viewer").get("/dead-letters/?queue=emails")
    assert len(response.context["letters"]) == 2
    assert b"permanent" in response.content
