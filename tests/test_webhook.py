"""The built-in webhook handler against real local HTTP(S) servers: outcomes by status,
Retry-After, timeouts, capped reads, redirects, SSRF refusals, the allow-list, signatures, and
the worker saving the response on the attempt."""

import hashlib
import hmac
import json
import socket
import ssl
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from urllib.parse import unquote

import pytest
import trustme
from django.utils import timezone

from queueadmin import config
from queues import enqueue_many
from queues.engine import handlers, lifecycle, selector, webhook
from queues.engine.handlers import PermanentError, RetryableError, Task
from queues.engine.worker import run_batch
from queues.models import Attempt, Item, ItemEvent, Status
from tests.factories import QueueFactory
from tests.receiver import HUGE_BYTES, Received, Receiver

SECRET = "receiver-and-queue-share-this"


@pytest.fixture
def allow_local(settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.fixture
def strict(settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": []}


def task(url: str, **options) -> Task:
    return Task(item_id=41, queue="hooks", account="acme", identifier="order 7/ü",
                payload={"order": 7, "total": "19.90", "note": "größer"}, attempt=2,
                options={"url": url, **options})


# --- what is sent ------------------------------------------------------------------------------

def test_it_posts_the_payload_as_json_with_headers_identifying_the_item(receiver, allow_local):
    webhook.deliver(task(receiver.url("/ok"), headers={"Authorization": "Bearer partner"}))
    [request] = receiver.received
    assert request.method == "POST"
    assert json.loads(request.body) == {"order": 7, "total": "19.90", "note": "größer"}
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-QueueAdmin-Item-Id"] == "41"
    assert unquote(request.headers["X-QueueAdmin-Identifier"]) == "order 7/ü"
    assert request.headers["X-QueueAdmin-Attempt"] == "2"
    assert request.headers["Authorization"] == "Bearer partner"
    assert request.headers["Host"] == f"127.0.0.1:{receiver.port}"
    assert "X-QueueAdmin-Signature" not in request.headers


def test_the_method_option_chooses_put_or_patch(receiver, allow_local):
    webhook.deliver(task(receiver.url("/ok"), method="put"))
    assert receiver.received[0].method == "PUT"


def verify_as_a_receiver(request: Received, secret: str, *, max_age: int = 300) -> bool:
    """What a receiver does: recompute the HMAC over timestamp.body and refuse old requests."""
    timestamp = request.headers["X-QueueAdmin-Timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + request.body,
                                    hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) <= max_age
    return fresh and hmac.compare_digest(expected, request.headers["X-QueueAdmin-Signature"])


def test_a_receiver_can_verify_the_signature_with_the_shared_secret(receiver, allow_local):
    webhook.deliver(task(receiver.url("/ok"), secret=SECRET))
    [request] = receiver.received
    assert verify_as_a_receiver(request, SECRET)
    assert not verify_as_a_receiver(request, "someone-else's-secret")
    tampered = Received(request.method, request.path, request.headers,
                        request.body.replace(b"19.90", b"0.01"), request.client_port)
    assert not verify_as_a_receiver(tampered, SECRET)


# --- outcomes by response ----------------------------------------------------------------------

def test_a_2xx_completes_with_the_status_a_body_excerpt_and_the_elapsed_time(receiver,
                                                                             allow_local):
    result = webhook.deliver(task(receiver.url("/ok")))
    assert result["status"] == 200
    assert result["body"] == '{"received": true}'
    assert result["truncated"] is False
    assert 0 <= result["elapsed_ms"] < 5000


@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_every_2xx_completes(receiver, allow_local, status):
    assert webhook.deliver(task(receiver.url(f"/status/{status}")))["status"] == status


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
def test_other_4xx_fail_permanently_quoting_the_receiver(receiver, allow_local, status):
    with pytest.raises(PermanentError, match=rf"^HTTP {status} .*: the receiver says why$"):
        webhook.deliver(task(receiver.url(f"/status/{status}")))


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_408_429_and_5xx_are_retried_with_the_queue_backoff(receiver, allow_local, status):
    with pytest.raises(RetryableError, match=rf"^HTTP {status} ") as raised:
        webhook.deliver(task(receiver.url(f"/status/{status}")))
    assert raised.value.delay is None


def test_it_retries_429_after_the_retry_after_delay(receiver, allow_local):
    with pytest.raises(RetryableError) as raised:
        webhook.deliver(task(receiver.url("/status/429?retry_after=7")))
    assert raised.value.delay == 7


def test_a_retry_after_http_date_is_honoured(receiver, allow_local):
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    with pytest.raises(RetryableError) as raised:
        webhook.deliver(task(receiver.url(f"/status/503?retry_after={when}")))
    assert 115 <= raised.value.delay <= 121


@pytest.mark.parametrize(("header", "delay"), [
    ("86400", 3600),  # capped at an hour
    ("0", 0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0),  # in the past: now
    ("soon", None),  # unreadable: the queue's backoff
    ("-5", None),
    ("\u00b2", None),  # a digit to str.isdigit, not to float()
    (None, None),
])
def test_retry_after_is_read_as_seconds_or_date_and_capped(header, delay):
    assert webhook.retry_after(header) == delay


def test_a_response_slower_than_the_timeout_is_retried(receiver, allow_local):
    started = time.monotonic()
    with pytest.raises(RetryableError, match="no response within 0.3 s"):
        webhook.deliver(task(receiver.url("/slow?seconds=2"), timeout=0.3))
    assert time.monotonic() - started < 1.5


def test_a_refused_connection_is_retried(allow_local):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens there once the socket is closed
    with pytest.raises(RetryableError, match="request failed"):
        webhook.deliver(task(f"http://127.0.0.1:{port}/hook", timeout=2))


def test_a_huge_response_is_cut_not_loaded_whole(receiver, allow_local):
    result = webhook.deliver(task(receiver.url("/huge")))
    assert result["status"] == 200
    assert result["truncated"] is True
    assert result["body"] == "x" * webhook.EXCERPT_LIMIT
    # We hung up after the cap: the receiver could not send it all.
    assert receiver.huge_done.wait(10)
    assert receiver.huge_sent[0] < HUGE_BYTES


def test_a_redirect_is_not_followed_even_to_a_private_address(receiver, allow_local):
    location = "http://10.0.0.1/internal-admin"
    with pytest.raises(PermanentError, match="HTTP 302 redirect to .*10.0.0.1.* not followed"):
        webhook.deliver(task(receiver.url(f"/redirect?location={location}")))
    assert [r.path for r in receiver.received] == ["/redirect"]


# --- where requests may go ---------------------------------------------------------------------

@pytest.mark.parametrize(("url", "reason"), [
    ("http://127.0.0.1:{port}/ok", "127.0.0.1 is a loopback address"),
    ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
    ("http://172.16.0.1/hook", "172.16.0.1 is a private address"),
    ("http://192.168.1.1/hook", "192.168.1.1 is a private address"),
    ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "a cloud metadata address"),
    ("http://169.254.10.10/hook", "a link-local address"),
    ("http://100.64.0.1/hook", "a carrier-grade NAT address"),
    ("http://224.0.0.1/hook", "a multicast address"),
    ("http://0.0.0.0:{port}/ok", "the unspecified address"),
    ("http://[::]:{port}/ok", "the unspecified address"),
    ("http://[::1]:{port}/ok", "::1 is a loopback address"),
    ("http://[fe80::1]/hook", "a link-local address"),
    ("http://[fc00::1]/hook", "a private address"),
    ("http://[::ffff:127.0.0.1]:{port}/ok", "an IPv6 form of 127.0.0.1, a loopback address"),
    ("http://[::ffff:10.0.0.1]/hook", "an IPv6 form of 10.0.0.1, a private address"),
    ("http://[64:ff9b::a9fe:a9fe]/hook", "an IPv6 form of 169.254.169.254, a cloud metadata"),
    ("http://[2002:7f00:1::]/hook", "an IPv6 form of 127.0.0.1, a loopback address"),
    ("http://localhost:{port}/ok", "localhost resolves to 127.0.0.1, a loopback address"),
    ("http://2130706433:{port}/ok", "2130706433 resolves to 127.0.0.1, a loopback address"),
    ("http://0x7f.1:{port}/ok", "0x7f.1 resolves to 127.0.0.1, a loopback address"),
    ("http://0177.0.0.1:{port}/ok", "0177.0.0.1 resolves to 127.0.0.1, a loopback address"),
    ("http://127.1:{port}/ok", "127.1 resolves to 127.0.0.1, a loopback address"),
])
def test_local_private_and_metadata_addresses_are_refused(receiver, strict, url, reason):
    with pytest.raises(PermanentError) as raised:
        webhook.deliver(task(url.format(port=receiver.port), timeout=2))
    message = str(raised.value)
    assert message.startswith("refused: ")
    assert reason in message
    assert "QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS" in message
    assert receiver.received == []


@pytest.mark.parametrize("url", [
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "gopher://127.0.0.1:25/_HELO",
    "javascript:alert(1)",
    "example.com/hook",
])
def test_schemes_other_than_http_and_https_are_refused(strict, url):
    with pytest.raises(PermanentError, match="^refused: .* must use http or https$"):
        webhook.deliver(task(url))


def test_the_allow_list_lets_a_listed_host_through_and_only_that_host(receiver, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": ["localhost"]}
    assert webhook.deliver(task(receiver.url("/ok", host="LocalHost")))["status"] == 200
    # The list names hosts, not addresses: the same address under another name stays refused.
    with pytest.raises(PermanentError, match="127.0.0.1 is a loopback address"):
        webhook.deliver(task(receiver.url("/ok")))
    assert len(receiver.received) == 1


def test_the_host_is_resolved_once_and_the_connection_goes_to_the_checked_address(
        receiver, settings, monkeypatch):
    # A rebinding DNS answers 127.0.0.1 first, then an address where nothing answers; only the
    # first answer may be used.
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": ["rebind.test"]}
    real_getaddrinfo = socket.getaddrinfo
    lookups = []

    def rebinding_dns(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "192.0.2.1"
        return real_getaddrinfo(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_dns)
    result = webhook.deliver(task(receiver.url("/ok", host="rebind.test"), timeout=2))
    assert result["status"] == 200
    assert lookups == ["rebind.test"]
    assert receiver.received[0].headers["Host"] == f"rebind.test:{receiver.port}"


def test_a_host_that_does_not_resolve_is_retried(strict):
    with pytest.raises(RetryableError, match="cannot resolve no-such-host.invalid"):
        webhook.deliver(task("http://no-such-host.invalid/hook"))


@pytest.fixture(scope="module")
def tls_receiver(tmp_path_factory):
    """An HTTPS receiver whose certificate names `localhost` only (no IP address), issued by a
    test CA, recording the server name each client asked for."""
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    server_names = []
    context.sni_callback = lambda connection, name, context: server_names.append(name)
    receiver = Receiver(tls_context=context)
    receiver.server_names = server_names
    receiver.ca_path = tmp_path_factory.mktemp("tls") / "ca.pem"
    authority.cert_pem.write_to_path(str(receiver.ca_path))
    yield receiver
    receiver.stop()


@pytest.fixture
def trust_test_ca(tls_receiver):
    # This thread's session is the one deliver() uses when called from the test.
    session = webhook.session()
    session.verify = str(tls_receiver.ca_path)
    yield
    session.verify = True


def test_https_keeps_the_host_name_for_sni_and_the_certificate_check(tls_receiver, settings,
                                                                      trust_test_ca):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": ["localhost"]}
    tls_receiver.reset()
    tls_receiver.server_names.clear()
    url = tls_receiver.url("/ok", host="localhost", scheme="https")
    assert webhook.deliver(task(url))["status"] == 200
    assert tls_receiver.server_names == ["localhost"]
    assert tls_receiver.received[0].headers["Host"] == f"localhost:{tls_receiver.port}"


def test_https_still_verifies_certificates(tls_receiver, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "WEBHOOK_ALLOWED_HOSTS": ["localhost"]}
    url = tls_receiver.url("/ok", host="localhost", scheme="https")
    with pytest.raises(RetryableError, match="CERTIFICATE_VERIFY_FAILED"):
        webhook.deliver(task(url))


# --- options and configuration -----------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    ({}, "needs a 'url' handler option"),
    ({"url": "http://exa mple.com/"}, "is not a valid URL"),
    ({"url": "http:///hook"}, "has no host"),
    ({"url": "https://example.com/", "method": "GET"}, "must be one of POST, PUT, PATCH"),
    ({"url": "https://example.com/", "timeout": 0}, "timeout 0 must be a number of seconds"),
    ({"url": "https://example.com/", "timeout": "10"}, "must be a number of seconds"),
    ({"url": "https://example.com/", "timeout": 10_000}, "must be a number of seconds"),
    ({"url": "https://example.com/", "headers": {"X-A": "b\r\nX-Injected: 1"}}, "single-line"),
    ({"url": "https://example.com/", "headers": ["X-A"]}, "must map names"),
    ({"url": "https://example.com/", "secret": 42}, "secret must be a string"),
])
def test_bad_handler_options_fail_permanently_saying_what_to_fix(options, message):
    with pytest.raises(PermanentError, match=message):
        webhook.parse_options(options)


def test_the_allow_list_is_read_from_the_environment():
    cfg = config.load({"QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS": " Hooks.Internal., 10.0.0.5,[::1] "})
    assert cfg.webhook_allowed_hosts == ["hooks.internal", "10.0.0.5", "::1"]
    assert config.load({}).webhook_allowed_hosts == []


@pytest.mark.parametrize("entry", ["http://hooks.internal", "hooks.internal:8443", "a b", "::zz"])
def test_a_bad_allow_list_entry_stops_start_up_naming_it(entry):
    with pytest.raises(config.ConfigError,
                       match=f"QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS entry '{entry}' is not a host"):
        config.load({"QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS": f"ok.internal,{entry}"})


# --- through the worker ------------------------------------------------------------------------

def dispatched_batch(queue, identifiers):
    enqueue_many(queue.key, [{"account": "acme", "identifier": i, "payload": {"id": i}}
                             for i in identifiers])
    return [[pk, 1] for pk in selector.run_round(queue).item_ids]


@pytest.mark.django_db
def test_a_completed_attempt_keeps_the_response(receiver, allow_local):
    queue = QueueFactory(handler="webhook",
                         handler_options={"url": receiver.url("/ok"), "secret": SECRET})
    assert run_batch(queue.pk, dispatched_batch(queue, ["order-1"])) == {"complete": 1}
    attempt = Attempt.objects.get()
    assert attempt.outcome == Attempt.Outcome.COMPLETE
    assert attempt.result["status"] == 200
    assert attempt.result["body"] == '{"received": true}'
    assert attempt.result["truncated"] is False
    assert isinstance(attempt.result["elapsed_ms"], int)
    [request] = receiver.received
    assert json.loads(request.body) == {"id": "order-1"}
    assert request.headers["X-QueueAdmin-Item-Id"] == str(attempt.item_id)
    assert verify_as_a_receiver(request, SECRET)


@pytest.mark.django_db
def test_a_binary_body_is_kept_as_text_without_nul_characters(receiver, allow_local):
    # PostgreSQL's jsonb refuses NUL: one such body must not fail the whole batch's record.
    queue = QueueFactory(handler="webhook", handler_options={"url": receiver.url("/binary")})
    assert run_batch(queue.pk, dispatched_batch(queue, ["order-1"])) == {"complete": 1}
    assert Attempt.objects.get().result["body"] == "ok\ufffd\ufffd"


@pytest.mark.django_db
def test_items_run_by_one_worker_thread_share_one_connection(receiver, allow_local):
    queue = QueueFactory(handler="webhook", concurrency=1,
                         handler_options={"url": receiver.url("/ok")})
    # Dispatched directly: the selector would not hand out more items than the concurrency.
    items = enqueue_many(queue.key, [{"account": "acme", "identifier": i} for i in "abc"])
    lifecycle.apply("dispatch", [item.pk for item in items], actor="selector")
    assert run_batch(queue.pk, [[item.pk, 1] for item in items]) == {"complete": 3}
    assert len(receiver.received) == 3
    assert len({request.client_port for request in receiver.received}) == 1


@pytest.mark.django_db
def test_a_429_puts_the_item_back_after_the_retry_after_delay(receiver, allow_local):
    queue = QueueFactory(handler="webhook",
                         handler_options={"url": receiver.url("/status/429?retry_after=30")})
    assert run_batch(queue.pk, dispatched_batch(queue, ["order-1"])) == {"retry": 1}
    item = Item.objects.get()
    assert item.status == Status.RETRY
    assert item.last_error == "RetryableError: HTTP 429 Too Many Requests: the receiver says why"
    assert abs((item.run_at - timezone.now()) - timedelta(seconds=30)) < timedelta(seconds=5)
    assert Attempt.objects.get().result is None


@pytest.mark.django_db
def test_a_refused_destination_becomes_a_dead_letter_with_the_reason(strict):
    queue = QueueFactory(handler="webhook",
                         handler_options={"url": "http://169.254.169.254/latest/meta-data/"})
    assert run_batch(queue.pk, dispatched_batch(queue, ["order-1"])) == {"fail": 1}
    item = Item.objects.get()
    assert item.status == Status.FAILED
    assert item.last_error.startswith(
        "PermanentError: refused: 169.254.169.254 is a cloud metadata address")


@handlers.handler("test-returns-unstorable")
def returns_unstorable(task):
    return {"object": {"when": datetime.now(UTC)}, "long": "x" * 20_000,
            "nul": "a\x00b", "surrogate": {"k\ud800": 1}}[task.identifier]


@pytest.mark.django_db
def test_a_result_the_attempt_cannot_store_is_replaced_by_a_note_not_lost_with_the_batch():
    queue = QueueFactory(handler="test-returns-unstorable")
    batch = dispatched_batch(queue, ["object", "long", "nul", "surrogate"])
    assert run_batch(queue.pk, batch) == {"complete": 4}
    notes = {a.item.identifier: a.result["unsaved"] for a in Attempt.objects.select_related("item")}
    assert notes["object"] == "not stored as JSON: a datetime is not a JSON value (at result.when)"
    assert notes["long"].startswith("20002 characters of JSON")
    assert notes["nul"] == "not stored as JSON: strings must not contain \\u0000 (at result)"
    assert notes["surrogate"].startswith("not stored as JSON: strings must not contain lone")
    assert notes["surrogate"].endswith("(at result.k\\ud800)")


@handlers.handler("test-raises-unstorable-text")
def raises_unstorable_text(task):
    raise RuntimeError("HTTP 503 Bad\x00Gateway \ud800")


@pytest.mark.django_db
def test_an_error_with_a_nul_or_a_lone_surrogate_is_recorded_escaped_not_lost_with_the_batch():
    # A webhook's status line or any handler's message may carry them; PostgreSQL's text
    # refuses a NUL, and a surrogate fails every reader that encodes the page.
    queue = QueueFactory(handler="test-raises-unstorable-text")
    assert run_batch(queue.pk, dispatched_batch(queue, ["order-1"])) == {"retry": 1}
    item = Item.objects.get()
    assert item.last_error == "RuntimeError: HTTP 503 Bad\\x00Gateway \\ud800"
    attempt = Attempt.objects.get()
    assert attempt.error == item.last_error
    assert "\x00" not in attempt.traceback and "Bad\\x00Gateway" in attempt.traceback
    assert ItemEvent.objects.get(to_status="retry").reason == item.last_error
