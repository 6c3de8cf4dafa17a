"""The built-in `webhook` handler: sends an item's payload as JSON to the queue's URL.

Handler options (the queue's handler_options):
- `url` (required): http or https only.
- `method`: POST (default), PUT or PATCH.
- `headers`: extra request headers; the item and signature headers below take precedence.
- `timeout`: seconds, default 10, allowed for connecting, for the response to start and for
  the whole exchange.
- `secret`: signs every request (stored in clear in handler_options, like the rest of them).

Every request carries X-QueueAdmin-Item-Id, X-QueueAdmin-Identifier (percent-encoded UTF-8),
X-QueueAdmin-Attempt and X-QueueAdmin-Timestamp (Unix seconds); with a secret also
X-QueueAdmin-Signature: `sha256=` + hex HMAC-SHA256(secret, timestamp + "." + body).

A 2xx completes the item and keeps status, a body excerpt and the elapsed time on the attempt;
408, 429, 5xx, timeouts and connection errors retry (after Retry-After when given, capped);
redirects are not followed and, like every other status, fail permanently.

The host is resolved once, every address it resolves to is checked, and the connection goes to
the checked address while the Host header and TLS (server name and certificate check) keep the
URL's host. Loopback, private, link-local, carrier-grade NAT, multicast, unspecified, reserved
and cloud metadata addresses are refused, also inside IPv6 forms of IPv4 addresses, unless the
URL's host is listed in QUEUEADMIN["WEBHOOK_ALLOWED_HOSTS"].
"""

import hashlib
import hmac
import ipaddress
import json
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from queues.conf import normal_host, setting
from queues.engine.handlers import PermanentError, RetryableError, Task, handler

METHODS = ("POST", "PUT", "PATCH")
DEFAULT_TIMEOUT = 10.0
# Bytes of a response read at most: enough to drain a normal reply, so that its connection can
# serve the next item, without ever holding a huge one in memory.
READ_LIMIT = 64 * 1024
CHUNK_SIZE = 16 * 1024
EXCERPT_LIMIT = 2000  # characters of the body kept on a completed attempt
ERROR_EXCERPT_LIMIT = 300  # characters of the body quoted in an error message
RETRY_AFTER_LIMIT = 3600  # seconds: a receiver cannot park an item for longer than an hour
USER_AGENT = "QueueAdmin-Webhook/1"
ALLOW_LIST_HINT = "list the host in QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS to allow it"
CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Instance metadata services hand out cloud credentials; some of them sit on addresses that
# look public (Azure's wire server, Oracle's), so they are named here.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(address) for address in (
    "169.254.169.254", "fd00:ec2::254", "168.63.129.16", "100.100.100.200", "192.0.0.192",
))


class RefusedDestination(Exception):
    """The URL points somewhere webhooks may not go; retrying cannot change that."""


@dataclass(frozen=True)
class Options:
    url: str
    method: str
    headers: dict[str, str]
    timeout: float
    secret: str


@handler("webhook")
def deliver(task: Task) -> dict:
    options = parse_options(task.options)
    body = json.dumps(task.payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {**options.headers, **item_headers(task, body, options.secret)}
    started = time.monotonic()
    try:
        with session().request(options.method, options.url, data=body, headers=headers,
                               timeout=options.timeout, allow_redirects=False,
                               stream=True) as response:
            content, cut = _read_capped(response, deadline=started + options.timeout)
    except RefusedDestination as exc:
        raise PermanentError(str(exc)) from None
    except requests.Timeout as exc:
        raise RetryableError(f"no response within {options.timeout:g} s") from exc
    except requests.RequestException as exc:
        raise RetryableError(f"request failed: {exc}") from exc
    elapsed_ms = round((time.monotonic() - started) * 1000)
    return _outcome(response, content, cut, elapsed_ms)


def parse_options(raw: dict) -> Options:
    """The queue's handler options, checked; a mistake fails the item with what to fix."""
    url = raw.get("url")
    if not isinstance(url, str) or not url.strip():
        raise PermanentError("the webhook handler needs a 'url' handler option")
    try:
        parsed = parse_url(url.strip())
    except LocationParseError as exc:
        raise PermanentError(f"refused: webhook url {url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise PermanentError(f"refused: webhook url {url!r} must use http or https")
    if not parsed.host:
        raise PermanentError(f"refused: webhook url {url!r} has no host")

    method = raw.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise PermanentError(f"webhook method {method!r} must be one of {', '.join(METHODS)}")

    headers = raw.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        _is_header_text(name) and _is_header_text(value) for name, value in headers.items()
    ):
        raise PermanentError("webhook headers must map names to single-line Latin-1 strings")

    timeout = raw.get("timeout", DEFAULT_TIMEOUT)
    # The attempt runs inside a worker task; past the task's own limit it would be killed.
    limit = setting("TASK_TIMEOUT_SECONDS")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
        0 < timeout <= limit
    ):
        raise PermanentError(f"webhook timeout {timeout!r} must be a number of seconds in "
                             f"(0, {limit}]")

    secret = raw.get("secret") or ""
    if not isinstance(secret, str):
        raise PermanentError("webhook secret must be a string")
    return Options(url=parsed.url, method=method.upper(), headers=headers,
                   timeout=float(timeout), secret=secret)


def _is_header_text(value) -> bool:
    if not isinstance(value, str) or "\r" in value or "\n" in value:
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def item_headers(task: Task, body: bytes, secret: str) -> dict[str, str]:
    return {
        **signed_headers(body, secret),
        "X-QueueAdmin-Item-Id": str(task.item_id),
        "X-QueueAdmin-Identifier": quote(task.identifier, safe=""),
        "X-QueueAdmin-Attempt": str(task.attempt),
    }


def signed_headers(body: bytes, secret: str) -> dict[str, str]:
    """The headers of every JSON request QueueAdmin sends (webhook items, alert notices): the
    timestamp and, with a secret, the signature over it and the body."""
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        # We keep an excerpt only: a compressed body could inflate far beyond the bytes read.
        "Accept-Encoding": "identity",
        "X-QueueAdmin-Timestamp": timestamp,
    }
    if secret:
        headers["X-QueueAdmin-Signature"] = "sha256=" + signature(secret, timestamp, body)
    return headers


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of `timestamp.body`. Signing the timestamp too lets a receiver refuse an
    old request replayed by someone who captured it."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _read_capped(response: requests.Response, *, deadline: float) -> tuple[bytes, bool]:
    """At most READ_LIMIT bytes of the body and whether there was more. The socket timeout only
    bounds each read, so a body trickling in byte by byte is stopped by the deadline."""
    content = bytearray()
    for chunk in response.iter_content(CHUNK_SIZE):
        content += chunk
        if len(content) > READ_LIMIT:
            return bytes(content[:READ_LIMIT]), True
        if time.monotonic() > deadline:
            raise RetryableError("the response body did not arrive within the timeout")
    return bytes(content), False


def _outcome(response: requests.Response, content: bytes, cut: bool, elapsed_ms: int) -> dict:
    status = response.status_code
    excerpt = _excerpt(content)
    if 200 <= status < 300:
        return {"status": status, "body": excerpt[:EXCERPT_LIMIT],
                "truncated": cut or len(excerpt) > EXCERPT_LIMIT, "elapsed_ms": elapsed_ms}
    location = response.headers.get("Location")
    if 300 <= status < 400 and location:
        raise PermanentError(f"HTTP {status} redirect to {location!r} not followed: webhooks go "
                             "only to the configured URL")
    summary = f"HTTP {status} {response.reason or ''}".rstrip()
    if excerpt.strip():
        summary += f": {excerpt[:ERROR_EXCERPT_LIMIT]}"
    if status in (408, 429) or status >= 500:
        raise RetryableError(summary, delay=retry_after(response.headers.get("Retry-After")))
    raise PermanentError(summary)


def _excerpt(content: bytes) -> str:
    # NUL cannot be stored in PostgreSQL text or jsonb; four bytes per character at most.
    text = content[:(EXCERPT_LIMIT + 1) * 4].decode("utf-8", errors="replace")
    return text[:EXCERPT_LIMIT + 1].replace("\x00", "\ufffd")


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta seconds or an HTTP date), capped; None when
    absent or unreadable, so that the queue's own backoff applies."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # isdigit alone passes "²", which float() refuses
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)  # HTTP dates are in GMT
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), RETRY_AFTER_LIMIT)


# --- where the request may go --------------------------------------------------------------

_threads = threading.local()


def session() -> requests.Session:
    """This thread's session: a worker thread runs several items of a batch, and those going to
    the same receiver reuse its open connection."""
    current = getattr(_threads, "session", None)
    if current is None:
        current = requests.Session()
        # Proxies from the environment would take the request somewhere other than the checked
        # address.
        current.trust_env = False
        adapter = PinnedAddressAdapter()
        current.mount("http://", adapter)
        current.mount("https://", adapter)
        _threads.session = current
    return current


class PinnedAddressAdapter(HTTPAdapter):
    """Connects to the address that `checked_address` approved instead of letting the
    connection resolve the host again, which a DNS answer changing in between (rebinding) would
    turn against us. The Host header, the TLS server name and the certificate check keep the
    URL's host."""

    def send(self, request, **kwargs):
        url = parse_url(request.url)
        address = checked_address(url.scheme, url.host, url.port)
        pinned = request.copy()
        pinned.url = url._replace(host=f"[{address}]" if address.version == 6
                                  else str(address)).url
        pinned.headers["Host"] = url.netloc
        pinned.server_hostname = url.host.strip("[]")
        return super().send(pinned, **kwargs)

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert)
        if host_params["scheme"] == "https":
            # SNI and certificate verification on the name, while the socket goes to the address.
            pool_kwargs["server_hostname"] = request.server_hostname
        return host_params, pool_kwargs


def checked_address(scheme: str, host: str, port: int | None):
    """Resolve `host` once and return the address to connect to, refusing the lot when any of
    its addresses is not public (unless the host is allow-listed)."""
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name, port or (443 if scheme == "https" else 80),
                                   type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise requests.ConnectionError(f"cannot resolve {name}: {exc}") from exc
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    # Entries are normalised here too: a host project's settings are not parsed by ours.
    if normal_host(name) not in {normal_host(h) for h in setting("WEBHOOK_ALLOWED_HOSTS")}:
        for address in addresses:
            reason = refusal(address)
            if reason is None:
                continue
            if normal_host(name) == str(address):
                raise RefusedDestination(f"refused: {address} is {reason} ({ALLOW_LIST_HINT})")
            raise RefusedDestination(
                f"refused: {name} resolves to {address}, {reason} ({ALLOW_LIST_HINT})")
    return addresses[0]


def refusal(address) -> str | None:
    """Why a webhook may not connect to `address` ("a loopback address"), or None if public."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        reason = refusal(embedded)
        return reason and f"an IPv6 form of {embedded}, {reason}"
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address in CARRIER_GRADE_NAT:
        return "a carrier-grade NAT address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a reserved address"
    return None


def _embedded_ipv4(address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4 or NAT64), if any."""
    if address.version != 6:
        return None
    if address.ipv4_mapped or address.sixtofour:
        return address.ipv4_mapped or address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None
