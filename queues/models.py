"""QueueAdmin's data model. Status changes never happen here: see queues/lifecycle.py."""

import re
import unicodedata
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from queues.conf import handler_timeout_error, setting, stale_threshold_error


class Status(models.TextChoices):
    QUEUED = "queued", "Queued"
    DISPATCHED = "dispatched", "Dispatched"
    RUNNING = "running", "Running"
    COMPLETE = "complete", "Complete"
    RETRY = "retry", "Scheduled for Retry"
    FAILED = "failed", "Permanent Failure"
    CANCELLED = "cancelled", "Cancelled"


# An identifier is unique per queue among these statuses; after the item ends it may be reused.
LIVE_STATUSES = (Status.QUEUED, Status.DISPATCHED, Status.RUNNING, Status.RETRY)
READY_STATUSES = (Status.QUEUED, Status.RETRY)
IN_FLIGHT_STATUSES = (Status.DISPATCHED, Status.RUNNING)
FINISHED_STATUSES = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)
# Every status but the in-flight ones: an item waits or has ended, and nothing moves it soon.
AT_REST_STATUSES = READY_STATUSES + FINISHED_STATUSES

DEFAULT_BACKOFF_SECONDS = [120, 600, 1500, 2400, 2700]
# The longest retry delay or timeout a queue may set: a longer one reaches past the times the
# database holds (2100) or past what a datetime can add, failing the batch that applies it.
LONGEST_DELAY = timedelta(days=30)
MAX_RETENTION_DAYS = 3650
# The start of a bulk filter's range chosen as "Any time" (or a selection of ids): before any
# item, since the range is a required part of a frozen filter.
ANY_TIME_START = datetime(2000, 1, 1, tzinfo=UTC)
MAX_ACCOUNT_LENGTH = 200
MAX_IDENTIFIER_LENGTH = 255
MAX_TASK_PATH_LENGTH = 300
# Every id is a bigint. Django bounds an id compared by the ORM, but a keyset in raw SQL or an
# `IN (...)` list must be checked first: past it the database raises instead of finding nothing.
MAX_ID = 2**63 - 1
# Every time taken from outside lies in [EARLIEST_TIME, LATEST_TIME): PostgreSQL stores years
# that Python cannot read back (year 0, or 10000 after a time-zone shift), and a page that reads
# such a row would fail for every user.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(2100, 1, 1, tzinfo=UTC)
TIME_BOUNDS_TEXT = "must lie between 1970-01-01 and 2100-01-01 UTC"
# The end of a bulk filter's range left open ("Last hour", "Any time", a From with no To): after
# every time an item can hold, as the item list's open end, so that a range over the next-run
# clock keeps the items due later, which the list shows.
ANY_TIME_END = LATEST_TIME - timedelta(microseconds=1)
PRINTABLE_TEXT = ("must be printable text: no control or invisible characters, line or paragraph "
                  "breaks, and no space at either end")
# Characters that print as nothing (Unicode's default-ignorable code points that str.isprintable
# lets through: variation selectors, Hangul fillers, the combining grapheme joiner; and the
# blank Braille cell): "acme" followed by one reads "acme" on every page, yet names another
# tenant.
INVISIBLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164"
                       "\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]")


def time_in_bounds(moment: datetime) -> bool:
    return EARLIEST_TIME <= moment < LATEST_TIME


def canonical(text: str) -> str:
    """Identifiers and accounts in Unicode's composed form (NFC), as typed on most keyboards:
    "café" written with a combining accent is the same identifier, not a second item, and a
    search or filter finds it however it was typed."""
    return unicodedata.normalize("NFC", text)


def printable(text: str) -> bool:
    """Identifiers and accounts reach line-framed outputs (the live stream, log lines, CSV), so
    they hold printable characters and plain spaces only. Every page and form shows or takes
    them exactly, so none may look like another: no invisible character, and no space at
    either end (forms strip what is typed, and "acme " would be acted on as "acme")."""
    return (text.isprintable() and not INVISIBLE.search(text)
            and not text.startswith(" ") and not text.endswith(" "))


def validate_printable(text: str):
    from django.core.exceptions import ValidationError

    if not printable(text):
        raise ValidationError(PRINTABLE_TEXT.capitalize() + ".", code="printable")

QUEUE_KEY_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
key_validator = RegexValidator(
    # \Z, not $: `$` also matches before a final line break, and "emails\n" is no key.
    rf"\A{QUEUE_KEY_PATTERN}\Z",
    "Use 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit.",
)


def is_queue_key(text) -> bool:
    """Whether `text` could name a queue; only such text reaches a query (PostgreSQL refuses
    to compare text holding a NUL byte, with an error instead of no row)."""
    return isinstance(text, str) and key_validator.regex.fullmatch(text) is not None


class QueueKeyConverter:
    """URLs name a queue only by a key it could have: anything else (a NUL byte, which
    PostgreSQL refuses to compare, or 300 characters) is a 404 before any query."""

    regex = QUEUE_KEY_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


def default_backoff():
    return list(DEFAULT_BACKOFF_SECONDS)


def default_token_scopes():
    return ["enqueue"]


def default_sensitive_keys():
    return ["password", "secret", "token", "api_key", "authorization"]


def default_stale_threshold():
    return timedelta(seconds=setting("STALE_THRESHOLD_SECONDS"))


def default_handler_timeout():
    return timedelta(seconds=setting("HANDLER_TIMEOUT_SECONDS"))


def validate_backoff(value):
    from django.core.exceptions import ValidationError

    longest = int(LONGEST_DELAY.total_seconds())
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= 101  # a delay per retry, 100 retries at most
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= longest
                   for v in value)
    ):
        raise ValidationError(
            f"Backoff delays must be a list of 1 to 101 whole seconds, each at most {longest:,} "
            "(30 days), e.g. [120, 600]."
        )


class Queue(models.Model):
    key = models.CharField(max_length=64, unique=True, validators=[key_validator])
    name = models.CharField(max_length=200, validators=[validate_printable])
    handler = models.CharField(max_length=100, default="noop")
    handler_options = models.JSONField(default=dict, blank=True)
    batch_size = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    concurrency = models.PositiveIntegerField(
        default=100,
        validators=[MinValueValidator(1)],
        help_text="Most items of this queue dispatched or running at once.",
    )
    rate_limit_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Most items started per minute; empty for no limit (pause a queue to stop it)."
    )
    max_retries = models.PositiveSmallIntegerField(default=5, validators=[MaxValueValidator(100)])
    backoff_seconds = models.JSONField(
        default=default_backoff,
        validators=[validate_backoff],
        help_text="Delay before each retry in seconds (+-10% jitter); the last one repeats.",
    )
    # A batch may wait for a worker process this long before its items are rescued.
    dispatch_timeout = models.DurationField(default=timedelta(minutes=5), validators=[
        MinValueValidator(timedelta(seconds=30)), MaxValueValidator(LONGEST_DELAY)])
    stale_threshold = models.DurationField(default=default_stale_threshold,
                                           validators=[MaxValueValidator(LONGEST_DELAY)])
    handler_timeout = models.DurationField(
        default=default_handler_timeout,
        help_text="An attempt running longer is recorded as timed out (a retryable error) and "
                  "its late result refused.",
    )
    retention_days = models.PositiveIntegerField(default=60, validators=[
        MinValueValidator(1), MaxValueValidator(MAX_RETENTION_DAYS)])
    # Most ready (queued and retry) items the queue holds: beyond it an enqueue answers 429, so
    # one producer cannot fill the database. Generous by default; per account see AccountPolicy.
    max_ready = models.PositiveIntegerField(default=10_000_000, validators=[MinValueValidator(1)],
                                            help_text="Most queued and retry items at once.")
    refused_over_limit = models.PositiveBigIntegerField(
        default=0, editable=False, help_text="Enqueue calls refused at a ready-item limit.")
    paused = models.BooleanField(default=False, help_text="Drain mode: the selector skips it.")
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    # Payload keys shown masked to Viewers (matched case-insensitively at any depth).
    sensitive_keys = models.JSONField(default=default_sensitive_keys, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key"]

    def __str__(self):
        return self.key

    def clean(self):
        from django.core.exceptions import ValidationError

        errors = {}
        if self.stale_threshold and (error := stale_threshold_error(
                self.stale_threshold.total_seconds())):
            errors["stale_threshold"] = f"The stale threshold {error}."
        if self.handler_timeout is not None and (error := handler_timeout_error(
                self.handler_timeout.total_seconds())):
            errors["handler_timeout"] = f"The handler timeout {error}."
        if errors:
            raise ValidationError(errors)


class AccountPolicy(models.Model):
    """Sparse per-(queue, account) overrides; accounts without a row use the defaults."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="policies",
                              db_index=False)
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH, validators=[validate_printable])
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    # Most ready items of this account on this queue (none: only the queue's limit applies).
    max_ready = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "account policies"
        constraints = [
            models.UniqueConstraint(fields=["queue", "account"], name="policy_queue_account_uniq")
        ]

    def __str__(self):
        return f"{self.queue_id}:{self.account}"


class Item(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Indexed by the composite indexes below, which all start with the queue.
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="items",
                              db_index=False)
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH, validators=[validate_printable])
    identifier = models.CharField(max_length=MAX_IDENTIFIER_LENGTH,
                                  validators=[validate_printable])
    payload = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    # Written by the same UPDATE that changes status, so a set-based transition can return what
    # each row changed from (RETURNING sees only new values).
    previous_status = models.CharField(max_length=10, choices=Status.choices, blank=True)
    # Counts dispatches: the attempt number doubles as the fencing token for workers.
    attempts = models.PositiveSmallIntegerField(default=0)
    # Not-before time: enqueue time, a delayed run_at, or the next retry ("Retry (Estimated)").
    run_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A random number each dispatch writes: only the worker task carrying it may start the item,
    # so a stale delivery of a batch whose items were released and dispatched again does nothing.
    dispatch_token = models.BigIntegerField(default=0, db_default=0)
    # The worker cluster (host:pid, as in ClusterHeartbeat) whose batch claimed the dispatched
    # item: when that cluster stops beating, its items are rescued without waiting for timeouts.
    # In no index, so that a claim, which writes only this, is a HOT update that adds no index
    # entry, and a dispatch and a start add one fewer each (migration 0039).
    cluster = models.CharField(max_length=100, blank=True, default="", db_default="")
    # The module path of the django.tasks task the item runs (queues.engine.tasks), written
    # only by the tasks backend: the JSON API and queues.enqueue never accept it.
    task_path = models.CharField(max_length=MAX_TASK_PATH_LENGTH, blank=True, default="",
                                 db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "identifier"],
                condition=Q(status__in=LIVE_STATUSES),
                name="item_live_identifier_uniq",  # enqueue dedup
            ),
            # The one timestamp an outside value sets: readable by every reader (EARLIEST_TIME).
            models.CheckConstraint(
                condition=Q(run_at__gte=EARLIEST_TIME, run_at__lt=LATEST_TIME),
                name="item_run_at_in_bounds",
            ),
        ]
        indexes = [
            # Selector: per account, highest priority then oldest-ready among ready items.
            models.Index(
                fields=["queue", "account", "-priority", "run_at", "id"],
                condition=Q(status__in=READY_STATUSES),
                name="item_ready_idx",
            ),
            # The oldest wait (overview, /metrics, its alert): a queue's ready items by their
            # not-before time (migration 0035).
            models.Index(fields=["queue", "run_at"], condition=Q(status__in=READY_STATUSES),
                         name="item_ready_due_idx"),
            # Item browser and bulk operations: one queue, some statuses, an enqueue time range,
            # walked by keyset on (created_at, id).
            models.Index(fields=["queue", "status", "created_at", "id"], name="item_browse_idx"),
            # Search by identifier, including finished items.
            models.Index(fields=["queue", "identifier"], name="item_identifier_idx"),
            # Sweeper: dispatched or running items older than their timeout; a small set, which
            # the rescue of a silent cluster's items reads whole (cluster is in no index, 0039).
            models.Index(
                fields=["queue", "status", "updated_at"],
                condition=Q(status__in=IN_FLIGHT_STATUSES),
                name="item_in_flight_idx",
            ),
            # Sweeper retention pruning: finished items by finish time.
            models.Index(
                fields=["queue", "finished_at"],
                condition=Q(status__in=FINISHED_STATUSES),
                name="item_finished_idx",
            ),
            # Bulk retry, replay and purge by when items failed or finished, the headline task:
            # the preview counts a status's items in a finish-time range from this index alone
            # (the snapshot's created_at and id, and the identifier its live-again check reads,
            # are in it too), where item_finished_idx has no status and sends every row to the
            # heap. Built concurrently by migration 0029, and only on PostgreSQL.
            models.Index(
                fields=["queue", "status", "finished_at", "created_at", "id", "identifier"],
                condition=Q(status__in=FINISHED_STATUSES),
                name="item_finished_status_idx",
            ),
            # Accounts view, per-account in-flight counts, and a bulk preview by account: its
            # sample of the latest finished is an index walk that stops at 20, where the
            # account's every item in range was read and sorted (85 ms for 100,000 failures).
            # Built concurrently by migration 0038.
            models.Index(fields=["queue", "account", "status", "finished_at", "created_at", "id"],
                         name="item_account_finish_idx"),
            # Find by payload field (queues.engine.payloads): `payload @> {...}` on PostgreSQL.
            # Built concurrently by migration 0031, and only there. Every non-HOT update adds
            # the new row's payload keys to each index whose condition the row meets. A dispatch
            # and a start write nothing to this one (their rows are in flight, found by the
            # in-flight index instead): their entries were 2 of a selector round's 13 ms, and
            # the payload never changes. Without fastupdate each statement adds its own keys,
            # not a pending list that one unlucky statement merges (250 to 400 ms at 10M, 0030).
            GinIndex(fields=["payload"], opclasses=["jsonb_path_ops"],
                     condition=Q(status__in=AT_REST_STATUSES), name="item_payload_at_rest_gin",
                     fastupdate=False),
        ]

    def __str__(self):
        return f"{self.queue_id}/{self.identifier}#{self.pk}"


class Attempt(models.Model):
    class Outcome(models.TextChoices):
        COMPLETE = "complete", "Complete"
        RETRY = "retry", "Retryable error"
        FAILED = "failed", "Permanent error"
        LOST = "lost", "Worker lost"

    id = models.BigAutoField(primary_key=True)
    # No constraint in the database: on PostgreSQL attempts go by their own age, a day at a
    # time, after the item they belong to (see queues/engine/partitions.py).
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="attempt_set",
                             db_index=False, db_constraint=False)
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # What the handler returned, kept small: e.g. a webhook's response status and body excerpt.
    result = models.JSONField(null=True, blank=True)

    class Meta:
        # Item detail lists its attempts in order.
        indexes = [models.Index(fields=["item", "number"], name="attempt_item_idx")]

    def __str__(self):
        return f"attempt {self.number} of item {self.item_id}: {self.outcome}"

    @property
    def duration(self):
        if self.started_at is None:
            return None
        return self.finished_at - self.started_at


class ItemEvent(models.Model):
    """Append-only history of transitions; queue, account and identifier are copied so that the
    live stream and audit views never join the item table."""

    id = models.BigAutoField(primary_key=True)
    # No database constraint: events outlive nothing and are pruned on their own schedule, and the
    # hot insert path should not pay for a foreign-key check.
    item = models.ForeignKey(
        Item, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
        related_name="events",
    )
    queue = models.ForeignKey(
        Queue, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH)
    identifier = models.CharField(max_length=MAX_IDENTIFIER_LENGTH)
    transition = models.CharField(max_length=20)
    from_status = models.CharField(max_length=10, blank=True)
    to_status = models.CharField(max_length=10)
    attempt = models.PositiveSmallIntegerField(default=0)
    at = models.DateTimeField()
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True)

    class Meta:
        indexes = [
            # Per-queue live stream: events after a position.
            models.Index(fields=["queue", "id"], name="event_queue_idx"),
            # Live stream filtered by account: its newest events without scanning the queue's.
            models.Index(fields=["queue", "account", "id"], name="event_account_idx"),
            # Item detail: its history.
            models.Index(fields=["item", "id"], name="event_item_idx"),
        ]

    def __str__(self):
        return f"{self.transition} item {self.item_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class DeadLetter(models.Model):
    id = models.BigAutoField(primary_key=True)
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="dead_letters")
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="dead_letters")
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH)
    reason = models.CharField(max_length=20)  # "permanent", "exhausted" or "worker lost"
    last_error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField()
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            # Dead-letter page: open letters per queue, newest first.
            models.Index(
                fields=["queue", "-created_at"],
                condition=Q(replayed_at__isnull=True),
                name="deadletter_open_idx",
            ),
            models.Index(fields=["item"], name="deadletter_item_idx"),
        ]

    def __str__(self):
        return f"dead letter {self.pk} of item {self.item_id} ({self.reason})"


class SelectorState(models.Model):
    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="selector_state"
    )
    cursor = models.CharField(max_length=MAX_ACCOUNT_LENGTH, blank=True)
    last_round_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"cursor {self.cursor!r} of queue {self.queue_id}"


class SelectorLease(models.Model):
    """One row (id 1): which process runs the selector loop. Times are the database's clock in
    epoch seconds, so machines with skewed clocks agree on when a lease has run out; a newer
    scheduled tick writes itself as `successor` and the holder hands over."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    holder = models.CharField(max_length=150, blank=True)
    renewed_at = models.FloatField(default=0)
    successor = models.CharField(max_length=150, blank=True)
    # When the successor wrote itself, so that one which died waiting cannot block a restart;
    # a database default, as the previous release (running during a deploy) inserts without it.
    successor_since = models.FloatField(db_default=0)

    def __str__(self):
        return f"selector loop held by {self.holder or 'nobody'}"


class SelectorRound(models.Model):
    """One selector round: what it took per account, for the fairness view and the rate limit."""

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    taken = models.PositiveIntegerField()
    accounts = models.PositiveIntegerField()
    allocation = models.JSONField(default=dict)  # {account: items taken}
    cursor = models.CharField(max_length=MAX_ACCOUNT_LENGTH, blank=True)

    class Meta:
        # Rate limit (items started in the last minute) and the fairness view: recent rounds.
        indexes = [models.Index(fields=["queue", "started_at"], name="round_queue_idx")]

    def __str__(self):
        return f"round of queue {self.queue_id} at {self.started_at:%H:%M:%S}: {self.taken}"


class AccountStat(models.Model):
    """One account with ready items on one queue, as the last sweeper run found it: what the
    accounts page orders by backlog and oldest wait, because grouping every ready item on each
    page view is too slow at scale (its order by share of service is live).
    queues.engine.account_stats replaces a queue's rows at once; the page shows live figures
    beside this order."""

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH)
    backlog = models.PositiveIntegerField()  # queued and retry items
    # The earliest not-before time among them: waiting since then, or (future) nothing due yet.
    first_due = models.DateTimeField()
    # No longer written or read (the order by share is live since 0034); kept, with a default,
    # for the previous release's sweeper during a deploy, and dropped in the next release.
    served = models.PositiveIntegerField(db_default=0)
    refreshed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "account"], name="accountstat_uniq")
        ]
        # One per order of the accounts page, walked by keyset; ties go by account.
        indexes = [
            models.Index(fields=["queue", "-backlog", "account"], name="accountstat_backlog_idx"),
            models.Index(fields=["queue", "first_due", "account"], name="accountstat_wait_idx"),
        ]

    def __str__(self):
        return f"{self.account} on queue {self.queue_id}: {self.backlog} ready"


class SweepRun(models.Model):
    """One sweeper run and what it changed, empty runs included: the dashboard's liveness
    signal for the sweeper."""

    id = models.BigAutoField(primary_key=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    counts = models.JSONField(default=dict)  # {action: rows}

    class Meta:
        # Dashboard and health check: the latest runs.
        indexes = [models.Index(fields=["started_at"], name="sweeprun_started_idx")]

    def __str__(self):
        return f"sweep at {self.started_at:%Y-%m-%d %H:%M:%S}: {self.counts}"


class CounterDelta(models.Model):
    """Change to a (queue, status) count, inserted in the transition's own transaction.

    Inserts never contend with each other, unlike updating one counter row per queue; the
    rollup folds them into StatusCount and OutcomeMinute.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    status = models.CharField(max_length=10, choices=Status.choices)
    delta = models.IntegerField()
    minute = models.DateTimeField()

    class Meta:
        # Readers add the not-yet-rolled-up deltas of one queue to its base counts.
        indexes = [models.Index(fields=["queue", "status"], name="delta_queue_idx")]

    def __str__(self):
        return f"{self.status} {self.delta:+d} on queue {self.queue_id}"


class StatusCount(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    status = models.CharField(max_length=10, choices=Status.choices)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "status"], name="statuscount_uniq")
        ]

    def __str__(self):
        return f"{self.status}={self.count} on queue {self.queue_id}"


class OutcomeMinute(models.Model):
    """Items entering an outcome status (complete, retry, failed, cancelled) per queue and
    minute."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    minute = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices)
    count = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "minute", "status"], name="outcomeminute_uniq"
            )
        ]
        # /metrics and the alert rules read every queue's last minutes, and the sweeper prunes by
        # age: without it both scanned the whole table (7 days of 100 queues: millions of rows).
        indexes = [models.Index(fields=["minute"], name="outcomeminute_minute_idx")]

    def __str__(self):
        return f"{self.status}={self.count} on queue {self.queue_id} at {self.minute:%H:%M}"


class ApiToken(models.Model):
    """A bearer token for the JSON API. Only a SHA-256 digest of the secret is stored: the
    secret has 256 random bits, so a slow password hash would add latency and no safety."""

    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    # The first characters of the secret, shown in lists so operators can tell tokens apart.
    prefix = models.CharField(max_length=12)
    all_queues = models.BooleanField(default=False)
    queues = models.ManyToManyField(Queue, blank=True, related_name="+")
    # What the token may do on its queues (queues.engine.tokens.SCOPES); new tokens enqueue only.
    scopes = models.JSONField(default=default_token_scopes)
    # Tokens made before scopes existed were given enqueue and operate: an Admin should confirm.
    needs_review = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class AuditEntry(models.Model):
    """One mutation by a person or a token: who, when, what, on which target and filter, and
    how many rows it changed. Append-only; written by queues.engine.audit.record."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_index=True)
    # The name is kept beside the link so the entry survives the user's deletion.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", db_constraint=False,
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=50)
    queue_key = models.CharField(max_length=64, blank=True)
    target = models.CharField(max_length=255, blank=True)
    filter = models.JSONField(default=dict, blank=True)
    counts = models.JSONField(default=dict, blank=True)

    class Meta:
        # The audit view filters by queue and shows the newest first.
        indexes = [models.Index(fields=["queue_key", "at"], name="audit_queue_idx")]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target}"


class UserPreference(models.Model):
    """Per-user dashboard settings; the time zone and theme are copied into the session at login
    so that pages never read this table."""

    class Theme(models.TextChoices):
        SYSTEM = "system", "Follow the system"
        LIGHT = "light", "Light"
        DARK = "dark", "Dark"

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                primary_key=True, related_name="queueadmin_preference")
    time_zone = models.CharField(max_length=64, default="UTC")
    theme = models.CharField(max_length=6, choices=Theme.choices, default=Theme.SYSTEM)

    def __str__(self):
        return f"preferences of user {self.user_id}"


class BulkOperation(models.Model):
    """A bulk retry or cancel over a frozen filter, run as resumable steps of at most 500 items
    (queues.engine.bulk). The record is the operation's progress, result and audit trail."""

    class Kind(models.TextChoices):
        RETRY = "retry", "Retry"
        CANCEL = "cancel", "Cancel"
        REPLAY = "replay", "Replay dead letters"
        PURGE = "purge", "Purge dead letters"

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        STOPPING = "stopping", "Stopping"
        STOPPED = "stopped", "Stopped"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="bulk_operations")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", db_constraint=False,
    )
    actor_name = models.CharField(max_length=150)
    # The frozen filter: statuses, time range, account, error text, snapshot time and highest id.
    filter = models.JSONField()
    filter_hash = models.CharField(max_length=64)
    # The one-time nonce of the confirmation that started it: a repeat starts nothing.
    nonce = models.CharField(max_length=32, unique=True, null=True, blank=True)
    expected = models.PositiveIntegerField()  # eligible items counted by the confirmed preview
    # Keyset position of the next step: index into the filter's statuses, created_at and id,
    # and "at" (finished_at) when the walk is by finish time.
    position = models.JSONField(default=dict)
    changed = models.PositiveIntegerField(default=0)
    skipped = models.JSONField(default=dict)  # {reason: count}
    steps = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    last_step_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Queue page: its latest operations.
            models.Index(fields=["queue", "-created_at"], name="bulk_queue_idx"),
            # The sweeper resumes running operations whose step was lost.
            models.Index(fields=["state", "last_step_at"], name="bulk_state_idx",
                         condition=Q(state__in=["running", "stopping"])),
        ]

    def __str__(self):
        return f"bulk {self.kind} {self.pk} on queue {self.queue_id}: {self.state}"

    @property
    def any_time(self) -> bool:
        """Its range was chosen as "Any time" (or it is a selection of ids)."""
        return self.filter.get("created_from") == ANY_TIME_START.isoformat()

    @property
    def open_end(self) -> bool:
        return self.filter.get("created_to") == ANY_TIME_END.isoformat()

    @property
    def finished(self) -> bool:
        return self.state in (self.State.STOPPED, self.State.DONE, self.State.FAILED)

    @property
    def percent_done(self) -> int:
        if self.state == self.State.DONE or not self.expected:
            return 100
        return min(100, 100 * (self.changed + sum(self.skipped.values())) // self.expected)

    def estimated_end(self, now):
        """When a running operation should end at the pace of its steps so far, or None."""
        done = self.changed + sum(self.skipped.values())
        if self.finished or not done or not self.last_step_at:
            return None
        pace = (self.last_step_at - self.created_at) / done
        return now + pace * max(0, self.expected - done)


class GlobalPause(models.Model):
    """One row (id 1): when paused, the selector dispatches nothing on any queue (drain mode
    for the whole installation); items are still accepted and running ones finish."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    paused = models.BooleanField(default=False)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return "paused" if self.paused else "running"


class ClusterHeartbeat(models.Model):
    """A django-q2 worker cluster's latest sign of life, written by the cluster itself: the
    workers page and /healthz read this table, not a per-process cache."""

    cluster = models.CharField(max_length=100, primary_key=True)  # host:pid of the cluster
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    workers = models.PositiveSmallIntegerField(default=0)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    running = models.JSONField(default=list, blank=True)  # what its workers run now

    def __str__(self):
        return f"cluster {self.cluster} at {self.beat_at:%H:%M:%S}"


# --- metric history (queues.engine.history) ---------------------------------------------------

# Upper bounds, in seconds, of the wait and run time histogram buckets: doubling from 1 ms to
# about 18.6 hours, and a last bucket for anything longer. Any window's percentiles are read from
# its summed buckets, so they are right to within one bucket (a factor of two).
HISTOGRAM_BOUNDS = tuple(round(0.001 * 2 ** k, 3) for k in range(27))
HISTOGRAM_BUCKETS = len(HISTOGRAM_BOUNDS) + 1
HISTOGRAM_KINDS = ("wait", "run")


def histogram_column(kind: str, bucket: int) -> str:
    return f"{kind}_{bucket:02d}"


class PeriodFigures(models.Model):
    """What one period (a minute or an hour) held: items completed, failed for good, scheduled
    for retry and enqueued, the depth by status at the period's end, and the wait and run times
    of the items that finished in it as histograms (the columns wait_00... and run_00..., one per
    bucket of HISTOGRAM_BOUNDS)."""

    id = models.BigAutoField(primary_key=True)
    # Database defaults too: the rollup's INSERT ... SELECT names only the columns it fills.
    completed = models.IntegerField(default=0, db_default=0)
    failed = models.IntegerField(default=0, db_default=0)
    retried = models.IntegerField(default=0, db_default=0)
    enqueued = models.IntegerField(default=0, db_default=0)
    # Sampled once a minute, for the whole queue only; an hour keeps its highest sample. Null
    # where no sample was taken (the rollup was not running).
    depth_queued = models.IntegerField(null=True, blank=True)
    depth_retry = models.IntegerField(null=True, blank=True)
    depth_dispatched = models.IntegerField(null=True, blank=True)
    depth_running = models.IntegerField(null=True, blank=True)
    depth_failed = models.IntegerField(null=True, blank=True)

    class Meta:
        abstract = True


for _kind in HISTOGRAM_KINDS:
    for _bucket in range(HISTOGRAM_BUCKETS):
        PeriodFigures.add_to_class(histogram_column(_kind, _bucket),
                                   models.IntegerField(default=0, db_default=0))


class MetricPeriod(PeriodFigures):
    """A period's figures for a queue, or for one of the queue's top accounts."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    account = models.CharField(max_length=MAX_ACCOUNT_LENGTH, blank=True)  # "": the whole queue
    start = models.DateTimeField()

    class Meta:
        abstract = True

    def __str__(self):
        return f"{self.account or 'queue'} {self.queue_id} at {self.start:%Y-%m-%d %H:%M}"


class MetricMinute(MetricPeriod):
    """Kept for 48 hours."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "account", "start"],
                                               name="metricminute_uniq")]
        # Charts read one queue's rows by time (the unique index); rewrites and pruning take
        # every queue's rows of a time range.
        indexes = [models.Index(fields=["start"], name="metricminute_start_idx")]


class MetricHour(MetricPeriod):
    """Kept for 30 days."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "account", "start"],
                                               name="metrichour_uniq")]
        indexes = [models.Index(fields=["start"], name="metrichour_start_idx")]


class InstallationPeriod(PeriodFigures):
    """Every queue's whole-queue MetricPeriod rows of one period summed (depth too: the queues'
    samples of that period added up), written by the same rollup. A chart of every queue reads
    one row per period whatever the number of queues: summing 100 queues' rows for 24 hours
    read 144,000 wide rows, 165 ms at 10 million items."""

    start = models.DateTimeField(unique=True)

    class Meta:
        abstract = True

    def __str__(self):
        return f"every queue at {self.start:%Y-%m-%d %H:%M}"


class InstallationMinute(InstallationPeriod):
    """Kept for 48 hours, as the queues' minutes."""


class InstallationHour(InstallationPeriod):
    """Kept for 30 days, as the queues' hours."""


OTHER_ERROR_GROUP = "other"  # the key of a period's failures outside its largest groups


class ErrorGroupPeriod(models.Model):
    """The failures (attempts scheduled for retry or failed for good) of one error group on a
    queue in one period (a minute or an hour). A group is queues.engine.errors' (kind, message),
    keyed by a hash of both; each period keeps its largest groups (history.ERROR_GROUPS) and
    counts the rest under OTHER_ERROR_GROUP, so that a flood of unique messages stays small."""

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    start = models.DateTimeField()
    # errors.group_key(kind, message), or "other"; not named `key`, a keyword of SQLite's.
    group_key = models.CharField(max_length=16)
    kind = models.TextField(blank=True)
    message = models.TextField(blank=True)
    failures = models.IntegerField()

    class Meta:
        abstract = True

    def __str__(self):
        return (f"{self.group_key} on {self.queue_id} at {self.start:%Y-%m-%d %H:%M}: "
                f"{self.failures}")


class ErrorGroupMinute(ErrorGroupPeriod):
    """Kept for 48 hours, like the metric minutes, so that an hour can be rolled up again."""

    class Meta:
        # The errors page reads one queue's rows by time; rewrites and pruning take every
        # queue's rows of a time range.
        constraints = [models.UniqueConstraint(fields=["queue", "start", "group_key"],
                                               name="errorgroupminute_uniq")]
        indexes = [models.Index(fields=["start"], name="errorgroupminute_start_idx")]


class ErrorGroupHour(ErrorGroupPeriod):
    """Kept for 30 days."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "start", "group_key"],
                                               name="errorgrouphour_uniq")]
        indexes = [models.Index(fields=["start"], name="errorgrouphour_start_idx")]


class HistoryRun(models.Model):
    """One run of the history rollup and what it wrote. `last_event_id` is the newest item event
    when the run began: every event that happens later has a higher id, so later runs read
    events by id from a run's mark instead of scanning the event table by time."""

    id = models.BigAutoField(primary_key=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    rolled_to = models.DateTimeField()  # the minutes before it are rolled up
    last_event_id = models.BigIntegerField()
    counts = models.JSONField(default=dict)  # {action: rows}

    class Meta:
        indexes = [models.Index(fields=["started_at"], name="historyrun_started_idx")]

    def __str__(self):
        return f"history run at {self.started_at:%Y-%m-%d %H:%M:%S}: {self.counts}"


# --- alerts (queues.engine.alerts) ---------------------------------------------------------------

ALERT_CHANNELS = ("email", "webhook")


def default_alert_channels():
    return list(ALERT_CHANNELS)


def seconds_words(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class AlertRule(models.Model):
    """A threshold that fires an alert while a figure is above it: per queue, or (queue empty)
    for the whole installation. Queues get their rules when they are created
    (queues.engine.alerts.create_default_rules)."""

    class Kind(models.TextChoices):
        DEAD_LETTERS = "dead_letters", "Dead letters"
        DEPTH = "depth", "Depth (queued and retry items)"
        FAILURES = "failures", "Failures (retryable and permanent) in the window"
        RUN_TIME = "run_time", "Run time p95 in the window (seconds)"
        OLDEST_WAIT = "oldest_wait", "Oldest wait of a due item (seconds)"
        NO_CLUSTER = "no_cluster", "No worker cluster beating (seconds since the newest beat)"
        SELECTOR_BEHIND = "selector_behind", "Selector behind (seconds its schedule is overdue)"
        SWEEPER_BEHIND = "sweeper_behind", "Sweeper behind (seconds since its last run)"

    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="alert_rules", db_index=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    threshold = models.PositiveIntegerField(help_text="It fires while the figure is above this.")
    # The span a failure count or a run time percentile is measured over; None for the others.
    window = models.DurationField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    channels = models.JSONField(default=default_alert_channels, blank=True)
    # Recipients of this rule's e-mail beside the installation's (QUEUEADMIN_ALERT_EMAILS).
    emails = models.JSONField(default=list, blank=True)
    # A muted rule still records its firings but delivers nothing until then.
    muted_until = models.DateTimeField(null=True, blank=True)
    muted_by = models.CharField(max_length=150, blank=True)
    # The latest evaluation: web processes compare-and-set it to take turns (engine.alerts).
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "kind"], name="alertrule_queue_kind_uniq"),
            # NULLs are distinct in the constraint above: one installation-wide rule per kind.
            models.UniqueConstraint(fields=["kind"], condition=Q(queue__isnull=True),
                                    name="alertrule_installation_kind_uniq"),
        ]

    def __str__(self):
        return f"{self.kind} on {self.queue_id or 'the installation'}"

    def muted(self, now: datetime) -> bool:
        return self.muted_until is not None and self.muted_until > now


class AlertFiring(models.Model):
    """One time a rule fired: from when its figure went above the threshold to when it came
    back (ended_at), with the notices sent about it."""

    id = models.BigAutoField(primary_key=True)
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="firings",
                             db_index=False)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # The latest figure while it fired (None: never seen, e.g. no cluster has ever beaten) and
    # the threshold it crossed, kept as they were when the rule is edited later.
    value = models.FloatField(null=True, blank=True)
    threshold = models.PositiveIntegerField()
    notified_at = models.DateTimeField(null=True, blank=True)  # the latest notice or reminder
    notices = models.PositiveIntegerField(default=0)
    # What the latest delivery did per channel: "sent" or why it failed.
    delivery = models.JSONField(default=dict, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            # Two evaluations racing cannot open the same alert twice.
            models.UniqueConstraint(fields=["rule"], condition=Q(ended_at__isnull=True),
                                    name="alertfiring_one_open"),
        ]
        indexes = [
            models.Index(fields=["rule", "started_at"], name="alertfiring_rule_idx"),
            # The alerts page: the latest firings of every rule.
            models.Index(fields=["started_at"], name="alertfiring_started_idx"),
        ]

    def __str__(self):
        return f"alert {self.pk} of rule {self.rule_id} since {self.started_at:%Y-%m-%d %H:%M}"

    @property
    def open(self) -> bool:
        return self.ended_at is None

    @property
    def summary(self) -> str:
        """The firing in words, as badges and notices say it."""
        return alert_summary(self.rule.kind, self.value, self.threshold, self.rule.window)


def alert_summary(kind: str, value: float | None, threshold: int, window) -> str:
    kinds = AlertRule.Kind
    if value is None:
        return {kinds.NO_CLUSTER: "no worker cluster has ever sent a heartbeat",
                kinds.SELECTOR_BEHIND: "the selector has no schedule",
                kinds.SWEEPER_BEHIND: "the sweeper has never run"}.get(kind, f"{kind}: no figure")
    # Only the kind's own words are made: an overview shows hundreds of firing alerts.
    words = {
        kinds.DEAD_LETTERS: lambda: f"{_count(value, 'dead letter')} (over {threshold:,})",
        kinds.DEPTH: lambda: f"depth {value:,.0f} (over {threshold:,})",
        kinds.FAILURES: lambda: f"{_count(value, 'failure')} in {_window_words(window)} "
                                f"(over {threshold:,})",
        kinds.RUN_TIME: lambda: f"run time p95 {seconds_words(value)} in {_window_words(window)} "
                                f"(over {seconds_words(threshold)})",
        kinds.OLDEST_WAIT: lambda: f"oldest wait {seconds_words(value)} "
                                   f"(over {seconds_words(threshold)})",
        kinds.NO_CLUSTER: lambda: f"no cluster heartbeat for {seconds_words(value)} "
                                  f"(over {seconds_words(threshold)})",
        kinds.SELECTOR_BEHIND: lambda: f"selector schedule {seconds_words(value)} overdue "
                                       f"(over {seconds_words(threshold)})",
        kinds.SWEEPER_BEHIND: lambda: f"sweeper last ran {seconds_words(value)} ago "
                                      f"(over {seconds_words(threshold)})",
    }
    return words[kind]()


def alert_condition(kind: str, value: float | None, threshold: int, window) -> str:
    """A queue's firing alert as its overview badge says it: the rule's condition without the
    figure, which was the evaluator's and stood beside the row's live one (427 dead letters
    beside 588); the installation's alerts, shown where no live figure is, keep theirs."""
    kinds = AlertRule.Kind
    span = _window_words(window)
    conditions = {
        kinds.DEAD_LETTERS: lambda: f"dead letters over {threshold:,}",
        kinds.DEPTH: lambda: f"depth over {threshold:,}",
        kinds.FAILURES: lambda: f"failures in {span} over {threshold:,}",
        kinds.RUN_TIME: lambda: f"run time p95 in {span} over {seconds_words(threshold)}",
        kinds.OLDEST_WAIT: lambda: f"oldest wait over {seconds_words(threshold)}",
    }
    if kind in conditions:
        return conditions[kind]()
    return alert_summary(kind, value, threshold, window)


def _window_words(window) -> str:
    return "the last hour" if window == timedelta(hours=1) else (
        f"the last {seconds_words(window.total_seconds())}" if window else "")


def _count(value: float, noun: str) -> str:
    return f"{value:,.0f} {noun}" + ("" if round(value) == 1 else "s")


class AlertRun(models.Model):
    """One evaluation of the alert rules and what it changed, empty ones included, like the
    sweeper's runs."""

    id = models.BigAutoField(primary_key=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    source = models.CharField(max_length=20)  # "schedule", "command" or "web"
    counts = models.JSONField(default=dict)  # {action: n}

    class Meta:
        indexes = [models.Index(fields=["started_at"], name="alertrun_started_idx")]

    def __str__(self):
        return f"alert run at {self.started_at:%Y-%m-%d %H:%M:%S}: {self.counts}"
