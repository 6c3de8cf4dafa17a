"""QueueAdmin's settings: `settings.QUEUEADMIN` over the defaults below, so that a host project
needs no setting to start, and the limits every timeout must keep.

django-q2's task timeout (`Q_CLUSTER["timeout"]`) bounds a batch's life; the handler timeout and
the stale threshold are checked against it here, for the system checks and for the admin forms.
"""

import ipaddress

from django.conf import settings

# django-q2's own default task timeout when Q_CLUSTER names none.
DEFAULT_TASK_TIMEOUT_SECONDS = 300
STALE_MARGIN_SECONDS = 60
MIN_TASK_TIMEOUT_SECONDS = 120
MIN_START_WINDOW_SECONDS = 30

DEFAULTS = {
    # Default stale threshold for new queues: a running item older than this is presumed lost.
    "STALE_THRESHOLD_SECONDS": 7200,
    # Default handler timeout of new queues: an attempt running longer is recorded as timed out.
    "HANDLER_TIMEOUT_SECONDS": 180,
    # On SIGTERM a cluster lets running handlers finish for this long, then records the rest as
    # retries with the reason "shutdown".
    "SHUTDOWN_GRACE_SECONDS": 30,
    # Hosts the webhook handler may reach although they resolve to private or local addresses.
    "WEBHOOK_ALLOWED_HOSTS": (),
    # JSON API limits: request body (413 above it), one item's payload, and how far ahead
    # run_at may be (a typo in a year should not park an item for a century).
    "API_MAX_BODY_BYTES": 4 * 1024 * 1024,
    "API_MAX_PAYLOAD_BYTES": 64 * 1024,
    "API_MAX_DELAY_DAYS": 90,
    # The most items one bulk retry or cancel may change.
    "BULK_MAX_ITEMS": 500_000,
    # A live stream shows at most this many rows a second (nobody reads more); the events past
    # it are counted by transition and shown as one summary row a second.
    "STREAM_ROWS_PER_SECOND": 30,
    # /metrics: a bearer token, or scrapers from these networks (ipaddress networks).
    "METRICS_TOKEN": "",
    "METRICS_ALLOWED_NETWORKS": ("127.0.0.0/8", "::1/128"),
    # Admins without a confirmed authenticator are sent to set one up and may do nothing else
    # (needs django-otp's TOTP and static apps and its OTPMiddleware).
    "REQUIRE_TWO_FACTOR_FOR_ADMINS": False,
    # Alert notices (queues.engine.alerts): e-mail recipients of every rule, a webhook (JSON
    # with a `text` field, signed with the secret like the webhook handler's requests), how often
    # a firing alert nobody acknowledged is repeated (0: never), and how long one delivery may
    # take per channel.
    "ALERT_EMAILS": (),
    "ALERT_WEBHOOK_URL": "",
    "ALERT_WEBHOOK_SECRET": "",
    "ALERT_REMINDER_HOURS": 4,
    "ALERT_DELIVERY_TIMEOUT_SECONDS": 5,
}


def q_cluster(**overrides) -> dict:
    """The django-q2 settings QueueAdmin needs, for a project's `Q_CLUSTER`. QueueAdmin owns
    retries (attempts, backoff, dead letters), so the broker must never redeliver on its own: one
    attempt, failures acknowledged, retry longer than the timeout, no catch-up burst of missed
    schedules; the task timeout leaves the selector loop a whole minute's tick."""
    timeout = overrides.get("timeout", DEFAULT_TASK_TIMEOUT_SECONDS)
    return {
        "name": "queueadmin",
        "orm": "default",
        "workers": 4,
        "timeout": timeout,
        "retry": timeout + 60,
        "max_attempts": 1,
        "ack_failures": True,
        "catch_up": False,
        "save_limit": 1000,
        # django-q2's own default: a dispatched batch waits for a worker about 0.1 s on average.
        "poll": 0.2,
        **overrides,
    }


def setting(name: str):
    if name == "TASK_TIMEOUT_SECONDS":
        return task_timeout_seconds()
    return getattr(settings, "QUEUEADMIN", {}).get(name, DEFAULTS[name])


def task_timeout_seconds() -> int:
    return getattr(settings, "Q_CLUSTER", {}).get("timeout") or DEFAULT_TASK_TIMEOUT_SECONDS


def handler_timeout_error(handler_seconds: float) -> str | None:
    """Why a handler timeout is unsafe, or None: a batch must be able to start an item and let
    it run for its whole handler timeout before django-q2 kills the batch's task."""
    maximum = task_timeout_seconds() - MIN_START_WINDOW_SECONDS
    if handler_seconds <= 0:
        return "must be positive"
    if handler_seconds > maximum:
        return (f"must be at most the worker task timeout less {MIN_START_WINDOW_SECONDS} s "
                f"({maximum} s)")
    return None


def stale_threshold_error(stale_seconds: float) -> str | None:
    """Why a stale threshold is unsafe, or None: a healthy attempt may run for the whole task
    timeout, and rescuing it earlier would run it twice."""
    minimum = task_timeout_seconds() + STALE_MARGIN_SECONDS
    if stale_seconds <= minimum:
        return (f"must be more than the worker task timeout plus {STALE_MARGIN_SECONDS} s "
                f"({minimum} s)")
    return None


def normal_host(host: str) -> str:
    """One spelling per host, so that an allow-list entry and a URL's host compare equal:
    lower case, no trailing dot, IPv6 without brackets and in its compressed form."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host
