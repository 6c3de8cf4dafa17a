import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from queues.engine import lifecycle, tokens
from queues.engine.handlers import TASK_HANDLER
from queues.models import ApiToken, CounterDelta, Item, ItemEvent
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db
URL = "/api/v1/queues/{}/items"


@pytest.fixture
def queue():
    return QueueFactory(key="emails", max_retries=2)


@pytest.fixture
def secret(queue):
    return tokens.create("producer", queue_keys=[queue.key])[1]


@pytest.fixture
def post(client, secret):
    def post(body, *, key="emails", token=None, content_type="application/json", **headers):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return client.generic("POST", URL.format(key), data, content_type=content_type,
                              HTTP_AUTHORIZATION=f"Bearer {token or secret}", **headers)

    return post


def item(identifier="order-1", **fields):
    return {"account": "acme", "identifier": identifier, "payload": {"to": "a@b.c"}, **fields}


def nothing_written():
    return (Item.objects.count(), ItemEvent.objects.count(), CounterDelta.objects.count()) == (
        0, 0, 0)


def error_of(response):
    assert response["Content-Type"] == "application/json"
    return response.json()["error"]


# --- accepted ---------------------------------------------------------------------------------

def test_it_creates_one_item_with_201(post):
    response = post(item(priority=5))
    assert response.status_code == 201
    body = response.json()
    assert body["created"] is True
    assert (body["status"], body["identifier"], body["priority"]) == ("queued", "order-1", 5)
    assert Item.objects.get(pk=body["id"]).payload == {"to": "a@b.c"}


def test_it_returns_the_existing_item_with_200_for_a_live_identifier(post):
    first = post(item()).json()
    response = post(item())
    assert response.status_code == 200
    assert response.json()["id"] == first["id"]
    assert response.json()["created"] is False
    assert Item.objects.count() == 1


def test_it_refuses_a_live_identifier_with_another_payload_with_409(post):
    first = post(item()).json()
    response = post(item(payload={"to": "other@b.c"}))
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "identifier_conflict"
    assert error["item_id"] == first["id"]
    assert "identifier" in error["fields"]


def test_it_creates_a_batch_all_at_once(post):
    response = post({"items": [item(f"order-{i}") for i in range(1000)]})
    assert response.status_code == 201
    assert response.json()["created"] == 1000
    assert Item.objects.count() == 1000


def test_a_batch_of_known_identifiers_answers_200_with_each_existing_item(post):
    post({"items": [item("a"), item("b")]})
    response = post({"items": [item("b"), item("a")]})
    assert response.status_code == 200
    body = response.json()
    assert (body["created"], body["existing"]) == (0, 2)
    assert [row["identifier"] for row in body["items"]] == ["b", "a"]


def test_a_mixed_batch_answers_201_and_marks_each_item(post):
    post(item("a"))
    response = post({"items": [item("a"), item("b")]})
    assert response.status_code == 201
    assert [row["created"] for row in response.json()["items"]] == [False, True]


def test_a_delayed_item_reports_its_next_run(post):
    run_at = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    body = post(item(run_at=run_at.isoformat())).json()
    assert body["delayed"] is True
    assert body["next_run_at"] == run_at.isoformat().replace("+00:00", "Z")
    assert body["next_run_reason"] == "scheduled"


def test_an_overdue_item_says_why_it_has_not_run(post, client, secret):
    body = post(item("late")).json()
    Item.objects.filter(pk=body["id"]).update(run_at=timezone.now() - timedelta(minutes=11))
    read = client.get(f"/api/v1/items/{body['id']}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert (read.json()["next_run_reason"], read.json()["delayed"]) == ("backlog ahead", False)


def test_run_at_accepts_a_z_suffix_and_other_offsets(post):
    assert post(item("z", run_at="2026-01-01T09:00:00Z")).status_code == 201
    assert post(item("o", run_at="2026-01-01T09:00:00+05:30")).status_code == 201
    stored = Item.objects.get(identifier="o").run_at
    assert stored == datetime(2026, 1, 1, 3, 30, tzinfo=UTC)


# --- the bad-input matrix: each case names its field and writes nothing -----------------------

BAD_BODIES = [
    # (case, raw body, status, code, field)
    ("malformed JSON", b'{"account": "acme",', 400, "invalid_json", "body"),
    ("invalid UTF-8", b'{"account": "\xff\xfe", "identifier": "x"}', 400, "invalid_json",
     "body"),
    ("byte order mark", b'\xef\xbb\xbf{"account": "acme", "identifier": "x"}', 400,
     "invalid_json", "body"),
    ("deep nesting", b'{"account": "a", "identifier": "x", "payload": ' + b"[" * 100 + b"]" * 100
     + b"}", 400, "invalid_json", "payload" + "[0]" * 32),
    ("nesting past the parser's stack", b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json",
     "body"),
    ("huge integer", b'{"account": "a", "identifier": "x", "payload": {"n": 9007199254740993}}',
     400, "invalid_json", "body"),
    ("thousands of digits", b'{"account": "a", "identifier": "x", "priority": 1' + b"0" * 5000
     + b"}", 400, "invalid_json", "body"),
    ("NaN", b'{"account": "a", "identifier": "x", "payload": {"n": NaN}}', 400, "invalid_json",
     "body"),
    ("Infinity", b'{"account": "a", "identifier": "x", "payload": {"n": -Infinity}}', 400,
     "invalid_json", "body"),
    ("float overflow", b'{"account": "a", "identifier": "x", "payload": {"n": 1e999}}', 400,
     "invalid_json", "body"),
    ("duplicate keys", b'{"account": "a", "account": "b", "identifier": "x"}', 400,
     "invalid_json", "body"),
    ("NUL in a string", b'{"account": "a\\u0000b", "identifier": "x"}', 400, "invalid_json",
     "account"),
    ("NUL in a payload key", b'{"account": "a", "identifier": "x", "payload": {"k\\u0000": 1}}',
     400, "invalid_json", "payload.k\x00"),
    ("lone surrogate", b'{"account": "a", "identifier": "\\ud800"}', 400, "invalid_json",
     "identifier"),
    ("lone surrogate deep in the payload",
     b'{"account": "a", "identifier": "x", "payload": {"list": ["ok", "\\udfff"]}}', 400,
     "invalid_json", "payload.list[1]"),
]


@pytest.mark.parametrize(("case", "raw", "status", "code", "field"), BAD_BODIES,
                         ids=[case[0] for case in BAD_BODIES])
def test_it_refuses_malformed_bodies(post, case, raw, status, code, field):
    response = post(raw)
    assert response.status_code == status, response.content
    error = error_of(response)
    assert error["code"] == code
    assert field in error["fields"]
    assert nothing_written()


BAD_ITEMS = [
    ("top level array", [item()], "body"),
    ("missing account", {"identifier": "x"}, "account"),
    ("missing identifier", {"account": "a"}, "identifier"),
    ("account of the wrong type", {"account": 42, "identifier": "x"}, "account"),
    ("identifier of the wrong type", {"account": "a", "identifier": ["x"]}, "identifier"),
    ("empty identifier", {"account": "a", "identifier": "  "}, "identifier"),
    ("overlong identifier", {"account": "a", "identifier": "x" * 256}, "identifier"),
    ("priority as a string", item(priority="5"), "priority"),
    ("priority as a boolean", item(priority=True), "priority"),
    ("priority as a float", item(priority=1.5), "priority"),
    ("priority out of range", item(priority=40_000), "priority"),
    ("unknown field", item(queue="other"), "queue"),
    ("a task path, which only django.tasks sets", item(task_path="os.system"), "task_path"),
    ("naive run_at", item(run_at="2026-01-01T09:00:00"), "run_at"),
    ("unparsable run_at", item(run_at="next tuesday"), "run_at"),
    ("run_at as a number", item(run_at=1767258000), "run_at"),
    ("far-future run_at", item(run_at="2999-01-01T00:00:00Z"), "run_at"),
    ("payload over the size limit", item(payload={"blob": "x" * 70_000}), "payload"),
    ("items not an array", {"items": {"a": 1}}, "items"),
    ("empty batch", {"items": []}, "items"),
    ("more than 1000 items", {"items": [item(f"i-{n}") for n in range(1001)]}, "items"),
    ("a field beside items", {"items": [item()], "extra": 1}, "extra"),
    ("a bad item deep in a batch",
     {"items": [item("a"), item("b"), item("c", run_at="2026-01-01")]}, "items[2].run_at"),
    ("a batch item that is not an object", {"items": [item("a"), "b"]}, "items[1]"),
]


@pytest.mark.parametrize(("case", "body", "field"), BAD_ITEMS, ids=[c[0] for c in BAD_ITEMS])
def test_it_refuses_invalid_items_with_422_naming_the_field(post, case, body, field):
    response = post(body)
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert nothing_written()


def test_a_queue_of_django_tasks_refuses_api_items_with_422(post, queue):
    queue.handler = TASK_HANDLER
    queue.save()
    response = post(item())
    assert response.status_code == 422
    assert error_of(response)["fields"] == {"queue": "runs django.tasks tasks only"}
    assert nothing_written()


def test_a_batch_with_one_conflicting_identifier_writes_nothing(post):
    post(item("taken"))
    response = post({"items": [item("new-1"), item("taken", payload={"other": 1}), item("new-2")]})
    assert response.status_code == 409
    assert list(Item.objects.values_list("identifier", flat=True)) == ["taken"]


def test_it_refuses_an_empty_body(client, queue, secret):
    response = client.generic("POST", URL.format(queue.key), b"", CONTENT_TYPE="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 400
    assert error_of(response)["message"] == "the body is empty; send a JSON object"
    assert nothing_written()


def test_it_refuses_an_unknown_queue_with_404(client):
    secret = tokens.create("all", all_queues=True)[1]
    response = client.post(URL.format("nope"), item(), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 404
    assert error_of(response)["fields"] == {"queue": "unknown"}
    assert nothing_written()


def test_it_refuses_another_content_type_with_415(post):
    response = post(b"account=acme&identifier=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert nothing_written()


def test_it_refuses_a_body_over_the_limit_with_413(post, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "API_MAX_BODY_BYTES": 2048}
    response = post({"items": [item(f"order-{i}") for i in range(40)]})
    assert response.status_code == 413
    assert error_of(response)["code"] == "too_large"
    assert nothing_written()


def test_it_refuses_a_body_longer_than_its_content_length_claims(post, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "API_MAX_BODY_BYTES": 2048}
    body = json.dumps({"items": [item(f"order-{i}") for i in range(40)]}).encode()
    response = post(body, CONTENT_LENGTH="100")
    assert response.status_code in (400, 413)
    assert nothing_written()


def test_it_answers_405_in_json_for_other_methods(client, secret):
    response = client.get(URL.format("emails"), HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert error_of(response)["code"] == "method_not_allowed"


# --- authentication and scope ------------------------------------------------------------------

@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer qa_wrong", "Bearer not-a-token",
    "Token qa_x",
])
def test_it_refuses_missing_or_wrong_tokens_with_401(client, queue, header):
    headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
    response = client.post(URL.format(queue.key), item(), content_type="application/json",
                           **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert error_of(response)["code"] == "unauthorized"
    assert nothing_written()


def test_a_revoked_token_gets_401(post, secret):
    tokens.revoke(ApiToken.objects.get())
    assert post(item()).status_code == 401
    assert nothing_written()


def test_a_queue_outside_the_tokens_scope_answers_like_one_that_does_not_exist(post, queue):
    QueueFactory(key="billing")
    outside = post(item(), key="billing")
    missing = post(item(), key="nowhere")
    assert outside.status_code == missing.status_code == 404
    assert error_of(outside) == {**error_of(missing), "message": "there is no queue 'billing'"}
    assert nothing_written()


def test_the_api_ignores_a_logged_in_session(client, queue, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "r@x.y", "pw"))
    response = client.post(URL.format(queue.key), item(), content_type="application/json")
    assert response.status_code == 401


def test_the_api_needs_no_csrf_token(secret, queue):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    response = strict.post(URL.format(queue.key), item(), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 201


def test_a_token_does_not_open_dashboard_pages(client, secret):
    for page in ("/", "/django-admin/"):
        response = client.get(page, HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert response.status_code == 302, page


# --- reading -----------------------------------------------------------------------------------

def test_item_detail_shows_status_attempts_error_and_next_retry(client, queue, secret):
    [retrying] = items_in_status(queue, "retry")
    response = client.get(f"/api/v1/items/{retrying.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["attempts"], body["retries_left"]) == ("retry", 1, 2)
    assert body["last_error"]
    assert body["next_run_at"] is not None


def read_item(client, item):
    secret = tokens.create(f"reader-{item.pk}", queue_keys=[item.queue.key])[1]
    response = client.get(f"/api/v1/items/{item.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    return response.json()


def run_next_attempt(queue, item, *, error="still down"):
    """Dispatches and starts the item's next attempt through the lifecycle, then fails it with
    a temporary error, or leaves it running when error is None."""
    attempt = item.attempts + 1
    lifecycle.apply("dispatch", [item.pk], actor="selector")
    lifecycle.apply("start", [item.pk], actor="worker", expected_attempts={item.pk: attempt})
    if error is not None:
        lifecycle.finish(queue, [lifecycle.Outcome(item_id=item.pk, attempt=attempt, error=error)],
                         worker="worker-1")
    item.refresh_from_db()
    assert item.attempts == attempt
    return item


@pytest.mark.parametrize(("status", "retries_left"), [
    ("queued", 5), ("dispatched", 5), ("running", 5), ("retry", 5),
    ("failed", 0), ("complete", None), ("cancelled", None),
])
def test_item_detail_counts_the_retries_left_in_every_status(client, status, retries_left):
    # Attempts counts runs: the first run, and the retry after its failure, use no retry yet.
    queue = QueueFactory(key="reports")
    assert queue.max_retries == 5
    body = read_item(client, items_in_status(queue, status)[0])
    assert (body["status"], body["retries_left"]) == (status, retries_left)


def test_every_attempt_after_the_first_uses_one_retry(client):
    queue = QueueFactory(key="reports")
    [item] = items_in_status(queue, "retry")
    for _ in range(2):
        item = run_next_attempt(queue, item)
    assert (item.status, item.attempts, read_item(client, item)["retries_left"]) == (
        "retry", 3, 3)
    for _ in range(2):
        item = run_next_attempt(queue, item)
    item = run_next_attempt(queue, item, error=None)
    assert (item.status, item.attempts, read_item(client, item)["retries_left"]) == (
        "running", 6, 0)


def test_retries_left_is_not_negative_after_max_retries_was_lowered(client):
    queue = QueueFactory(key="reports")
    [item] = items_in_status(queue, "retry")
    for _ in range(3):
        item = run_next_attempt(queue, item)
    queue.max_retries = 1
    queue.save(update_fields=["max_retries"])
    assert (item.status, read_item(client, item)["retries_left"]) == ("retry", 0)


def test_item_detail_is_404_for_unknown_and_absurd_ids(client, secret):
    for item_id in (12345, 2**70):
        response = client.get(f"/api/v1/items/{item_id}", HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert response.status_code == 404
        assert error_of(response)["code"] == "not_found"


def test_an_item_outside_the_tokens_scope_answers_like_one_that_does_not_exist(client, secret):
    [other] = enqueued(QueueFactory(key="billing"))
    outside = client.get(f"/api/v1/items/{other.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    missing = client.get(f"/api/v1/items/{other.pk + 1000}",
                         HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert outside.status_code == missing.status_code == 404
    assert error_of(outside)["code"] == error_of(missing)["code"] == "not_found"


def test_queue_list_shows_only_scoped_queues_with_counts(client, queue, secret):
    enqueued(queue, 3)
    enqueued(QueueFactory(key="billing"), 2)
    response = client.get("/api/v1/queues", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    [row] = response.json()["queues"]
    assert row["key"] == "emails"
    assert row["counts"]["queued"] == 3
    assert set(row["counts"]) == {"queued", "dispatched", "running", "complete", "retry",
                                  "failed", "cancelled"}


def test_queue_list_of_an_all_queues_token_shows_every_queue(client, queue):
    QueueFactory(key="billing")
    secret = tokens.create("ops", all_queues=True, scopes=tokens.SCOPES)[1]
    response = client.get("/api/v1/queues", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [row["key"] for row in response.json()["queues"]] == ["billing", "emails"]


def test_payloads_come_back_escaped_as_json_not_html(post):
    response = post(item(payload={"html": "<script>alert(1)</script>"}))
    assert b"<" not in response.content
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response.json()["payload"] == {"html": "<script>alert(1)</script>"}
