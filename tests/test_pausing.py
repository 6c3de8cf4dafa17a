import pytest

from queues.engine import pausing, selector
from queues.models import AccountPolicy, AuditEntry, GlobalPause, Item, Status
from tests.factories import QueueFactory, enqueued

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


def test_a_paused_queue_dispatches_nothing_but_still_accepts_items(queue):
    pausing.set_queue_paused(queue, True, actor="ops")
    enqueued(queue, 3)
    assert selector.run_round(queue).skipped == "paused"
    assert Item.objects.filter(status=Status.QUEUED).count() == 3
    pausing.set_queue_paused(queue, False, actor="ops")
    assert selector.run_round(queue).total == 3


def test_pausing_records_who_and_when_and_audits_once(queue):
    assert pausing.set_queue_paused(queue, True, actor="ops")
    assert not pausing.set_queue_paused(queue, True, actor="ops")
    queue.refresh_from_db()
    assert (queue.paused, queue.paused_by) == (True, "ops")
    assert queue.paused_at is not None
    pausing.set_queue_paused(queue, False, actor="ops")
    queue.refresh_from_db()
    assert (queue.paused_by, queue.paused_at) == ("", None)
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == [
        "queue.pause", "queue.resume"]


def test_a_paused_account_waits_while_the_others_are_served(queue):
    enqueued(queue, 2, account="acme", prefix="a")
    enqueued(queue, 2, account="globex", prefix="g")
    pausing.set_account_paused(queue, "acme", True, actor="ops")
    assert selector.run_round(queue).taken == {"globex": 2}
    pausing.set_account_paused(queue, "acme", False, actor="ops")
    assert selector.run_round(queue).taken == {"acme": 2}
    policy = AccountPolicy.objects.get(queue=queue, account="acme")
    assert (policy.paused, policy.paused_by) == (False, "")


def test_resuming_an_account_without_a_policy_changes_nothing(queue):
    assert not pausing.set_account_paused(queue, "nobody", False, actor="ops")
    assert not AccountPolicy.objects.exists()


def test_the_global_pause_stops_every_queue(queue):
    other = QueueFactory(key="billing")
    enqueued(queue, 1)
    enqueued(other, 1)
    pausing.set_global_paused(True, actor="ops")
    assert selector.run_round(queue).skipped == "paused globally"
    assert selector.run_round(other).skipped == "paused globally"
    state = GlobalPause.objects.get()
    assert (state.paused, state.paused_by) == (True, "ops")
    pausing.set_global_paused(False, actor="ops")
    assert selector.run_round(queue).total == 1
    assert AuditEntry.objects.filter(action="global.resume").exists()


# --- the buttons ---------------------------------------------------------------------------

def test_an_operator_pauses_and_resumes_a_queue_from_its_page(role_client, queue):
    client = role_client("Operator")
    response = client.post("/queues/emails/pause/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "Paused by operator-user" in response.content.decode()
    assert "queueadmin:changed" in response["HX-Trigger"]
    queue.refresh_from_db()
    assert queue.paused
    assert client.post("/queues/emails/resume/").status_code == 302
    queue.refresh_from_db()
    assert not queue.paused


def test_a_viewer_cannot_pause(role_client, queue):
    client = role_client("Viewer")
    assert client.post("/queues/emails/pause/").status_code == 403
    assert client.post("/pause-all/").status_code == 403
    assert client.post("/queues/emails/accounts/pause/", {"account": "acme"}).status_code == 403
    queue.refresh_from_db()
    assert not queue.paused and not GlobalPause.objects.exists()
    assert "Pause queue" not in client.get("/queues/emails/").content.decode()


def test_pause_urls_refuse_get(role_client, queue):
    client = role_client("Operator")
    for url in ("/queues/emails/pause/", "/pause-all/", "/queues/emails/accounts/pause/"):
        assert client.get(url).status_code == 405


def test_an_operator_pauses_an_account_from_the_accounts_page(role_client, queue):
    client = role_client("Operator")
    response = client.post("/queues/emails/accounts/pause/", {"account": "acme <b>"},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "acme &lt;b&gt;" in response.content.decode()
    assert AccountPolicy.objects.get(account="acme <b>").paused
    assert client.post("/queues/emails/accounts/pause/", {"account": ""}).status_code == 422


def test_pausing_an_account_from_the_accounts_page_form_says_so_after_the_reload(role_client,
                                                                                  queue):
    """The account paused may have no backlog, so no row of the page would show it."""
    client = role_client("Operator")
    response = client.post("/queues/emails/accounts/pause/", {"account": "quiet"}, follow=True,
                           HTTP_REFERER="http://testserver/queues/emails/accounts/")
    assert response.redirect_chain[-1][0] == "/queues/emails/accounts/"
    assert "Account quiet on emails paused" in response.content.decode()


@pytest.mark.parametrize("account", ["web\x07bell", "web\u200bzw", "web\nline", "evil\u202etxt"])
def test_an_account_no_item_could_have_is_refused_by_every_door(role_client, queue, account):
    # An item's account is printable; a policy for another could match nothing, and its
    # audit line would carry a line break or a right-to-left override.
    client = role_client("Operator")
    assert client.post("/queues/emails/accounts/pause/", {"account": account}).status_code == 422
    with pytest.raises(ValueError):
        pausing.set_account_paused(queue, account, True, actor="python")
    assert not AccountPolicy.objects.exists()
    assert not AuditEntry.objects.filter(action="account.pause").exists()


def test_the_overview_shows_the_global_pause_and_who_set_it(role_client, queue):
    client = role_client("Operator")
    client.post("/pause-all/")
    html = client.get("/").content.decode()
    assert "Every queue is paused" in html and "operator-user" in html
    assert "Resume all queues" in html


def test_a_pause_without_htmx_goes_back_only_to_a_page_of_this_site(role_client):
    QueueFactory(key="emails")
    client = role_client("Operator")
    back = client.post("/queues/emails/pause/", {"next": "/queues/emails/errors/"})
    assert back["Location"] == "/queues/emails/errors/"
    elsewhere = client.post("/queues/emails/resume/", {"next": "https://evil.example/"})
    assert elsewhere["Location"] == "/queues/emails/"


def test_a_pause_from_htmx_says_what_it_did_and_refreshes_the_page(role_client):
    import json

    QueueFactory(key="emails")
    response = role_client("Operator").post("/queues/emails/pause/", HTTP_HX_REQUEST="true")
    events = json.loads(response["HX-Trigger"])
    assert "queueadmin:changed" in events
    assert events["queueadmin:toast"]["message"].startswith("Queue emails paused")


# "²" and "queues:overview" are not paths: redirect() would read them as view names and fail
# (a 500 after the pause was made) or go wherever the name leads.
@pytest.mark.parametrize("target", ["javascript:alert(1)", "//evil.example/x", "https://evil.example/",
                                    "²", "queues:overview", "audit/"])
def test_a_hostile_next_falls_back_to_the_queue_page(role_client, target):
    QueueFactory(key="emails")
    response = role_client("Operator").post("/queues/emails/pause/", {"next": target})
    assert (response.status_code, response["Location"]) == (302, "/queues/emails/")


def test_pausing_an_account_typed_with_a_combining_accent_pauses_the_composed_one(queue):
    pausing.set_account_paused(queue, "cafe\u0301", True, actor="admin")

    assert AccountPolicy.objects.get(queue=queue).account == "café"
