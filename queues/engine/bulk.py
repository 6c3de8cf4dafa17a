"""Bulk retry and cancel by time range and status, safe at 100k+ items.

Every range names its clock (CLOCKS): when items were enqueued, finished, last updated or are due
to run. The natural reading is the default: retrying and replaying range over when items failed
or finished, cancelling over when they were enqueued.

A preview freezes a snapshot (items enqueued no later than the preview and with ids no higher
than the highest it saw) and counts what is eligible. Confirming re-counts inside that snapshot:
only a change there (not new arrivals) sends the operator back to a fresh preview. The operation
then runs as steps of at most STEP_SIZE items, each one short transaction through the set-based
lifecycle that also advances the operation's keyset position, so a lost or repeated step neither
skips nor repeats work.
"""

import hashlib
import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from django.core import signing
from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, Exists, Max, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_q.tasks import async_task

from queues.conf import setting
from queues.engine import audit, counters, lifecycle, payloads
from queues.engine.db import sorts_off
from queues.engine.errors import group_pattern
from queues.models import (
    ANY_TIME_END,
    ANY_TIME_START,
    LIVE_STATUSES,
    TIME_BOUNDS_TEXT,
    BulkOperation,
    DeadLetter,
    Item,
    Queue,
    Status,
    canonical,
    time_in_bounds,
)

log = logging.getLogger(__name__)
STEP_SIZE = 500
# Each task runs steps for about this long, then re-enqueues itself: no task runs long, and
# the broker's pickup latency is paid once per few dozen steps instead of once per step.
TASK_SECONDS = 5.0
SAMPLE_SIZE = 20
SIGNING_SALT = "queueadmin.bulk.preview"
# A confirmation starts one operation at most (its nonce is unique) and only this soon.
CONFIRMATION_SECONDS = 15 * 60

# kind: (lifecycle transition, statuses it applies to)
KINDS = {
    BulkOperation.Kind.RETRY: ("requeue", (Status.COMPLETE, Status.FAILED, Status.CANCELLED)),
    BulkOperation.Kind.CANCEL: ("cancel", (Status.QUEUED, Status.DISPATCHED, Status.RETRY)),
    # Dead letters: failed items with an open dead letter, chosen by the time they failed.
    BulkOperation.Kind.REPLAY: ("requeue", (Status.FAILED,)),
    BulkOperation.Kind.PURGE: ("delete", (Status.FAILED,)),
}
DEAD_LETTER_KINDS = (BulkOperation.Kind.REPLAY, BulkOperation.Kind.PURGE)
MAX_SELECTION = 1000  # one page of ids per request
# A retry or replay preview counts the eligible items whose identifier is live again (on another
# item) up to this many eligible items. Past it, the check would cost more than the page's budget
# and sway no decision; the steps skip those items all the same and the operation reports them.
LIVE_AGAIN_CHECK_MAX = 20_000
# count_items's first probe: a count this small costs a few milliseconds even from the heap.
COUNT_PROBE = 5_000
# clock: the item's column a time range applies to, and how a sentence names it.
CLOCKS = {"enqueued": "created_at", "finished": "finished_at", "updated": "updated_at",
          "next_run": "run_at"}
CLOCK_WORDS = {"enqueued": "enqueued", "finished": "finished", "updated": "last updated",
               "next_run": "due to run"}
# Identifiers sort below this character, so a prefix is an index range (as on the item list).
PREFIX_END = "\U0010ffff"


def default_clock(kind: str) -> str:
    """Retry, replay and purge act on ended items, by when they ended; cancel on waiting
    items, by when they were enqueued."""
    return "enqueued" if kind == BulkOperation.Kind.CANCEL else "finished"
INELIGIBLE_REASONS = {
    (BulkOperation.Kind.CANCEL, Status.RUNNING):
        "running items are not cancelled mid-flight; they finish on their own",
}


class BulkError(ValueError):
    def __init__(self, message: str, fields: dict | None = None):
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class StalePreview(BulkError):
    """The eligible items inside the previewed snapshot changed since the preview."""

    def __init__(self, fresh: "Preview"):
        super().__init__("the items changed since the preview; check the new counts and confirm")
        self.fresh = fresh


class ConfirmationExpired(BulkError):
    """A preview's confirmation is used within CONFIRMATION_SECONDS or not at all."""

    def __init__(self):
        super().__init__(f"the preview is older than {CONFIRMATION_SECONDS // 60} minutes; "
                         "preview again", {"frozen": "expired"})


def confirmation(preview: "Preview") -> dict:
    """What confirming a preview sends back: the frozen filter and a one-time nonce, signed
    with the time so that they return as they were sent and expire, its hash, and the eligible
    count the operator saw."""
    frozen = {"filter": preview.filter.as_json(), "nonce": secrets.token_hex(16)}
    return {"frozen": signing.dumps(frozen, salt=SIGNING_SALT),
            "filter_hash": preview.filter.digest(), "expected": preview.eligible}


@dataclass(frozen=True)
class Confirmed:
    filter: "BulkFilter"
    nonce: str


def from_confirmation(frozen: str) -> Confirmed:
    try:
        data = signing.loads(frozen, salt=SIGNING_SALT, max_age=CONFIRMATION_SECONDS)
        return Confirmed(BulkFilter.from_json(data["filter"]), str(data["nonce"])[:32])
    except signing.SignatureExpired:
        raise ConfirmationExpired() from None
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise BulkError("the confirmation was altered; preview again",
                        {"frozen": "not a preview's confirmation"}) from None


def selection_range() -> tuple[datetime, datetime]:
    """The time range of a selection of ids or of "Any time", which the operator did not choose
    by time: every time an item can hold (the preview's snapshot still bounds it)."""
    return ANY_TIME_START, ANY_TIME_END


def max_items() -> int:
    return setting("BULK_MAX_ITEMS")


@dataclass(frozen=True)
class BulkFilter:
    queue_id: int
    kind: str
    statuses: tuple[str, ...]
    created_from: datetime
    created_to: datetime
    account: str = ""
    error_contains: str = ""
    snapshot_at: datetime | None = None
    max_id: int | None = None
    ids: tuple[int, ...] = ()  # a selection of items instead of every match
    reason: str = ""  # dead-letter reason (replay and purge)
    # Which time created_from and created_to bound (a key of CLOCKS).
    clock: str = "enqueued"
    identifier_prefix: str = ""
    error_group: str = ""  # a normalised error message (queues.engine.errors)
    payload: str = ""  # a payload field condition, "path = value" (queues.engine.payloads)
    task: str = ""  # the module path of a django.tasks task (Item.task_path)

    @classmethod
    def build(cls, queue: Queue, kind: str, statuses, created_from: datetime,
              created_to: datetime, account: str = "", error_contains: str = "", *,
              ids=(), reason: str = "", clock: str = "", identifier_prefix: str = "",
              error_group: str = "", payload: str = "", task: str = "") -> "BulkFilter":
        """Checks what an operator asked for; raises BulkError naming each bad field. For
        dead-letter kinds the status is always failed. No clock means the kind's natural one."""
        fields = {}
        if not isinstance(kind, str) or kind not in KINDS:
            fields["kind"] = f"must be one of {', '.join(KINDS)}"
        else:
            clock = clock or default_clock(kind)
            if kind in DEAD_LETTER_KINDS:
                statuses = [Status.FAILED]
        if clock not in CLOCKS:
            fields["clock"] = f"must be one of {', '.join(CLOCKS)}"
        if payload.strip():
            try:
                payload = payloads.parse(payload).text
            except payloads.PayloadFilterError as error:
                fields["payload"] = str(error)
        ids = tuple(sorted(set(ids)))
        if len(ids) > MAX_SELECTION:
            fields["ids"] = f"select at most {MAX_SELECTION} items"
        statuses = tuple(dict.fromkeys(statuses))
        unknown = [s for s in statuses if s not in Status.values]
        if not statuses or unknown:
            fields["statuses"] = (f"unknown status {unknown[0]!r}" if unknown
                                  else "choose at least one status")
        for name, value in (("created_from", created_from), ("created_to", created_to)):
            if not isinstance(value, datetime) or timezone.is_naive(value):
                fields[name] = "must be a date-time with a time zone"
            elif not time_in_bounds(value):
                fields[name] = TIME_BOUNDS_TEXT
        if not fields and created_from >= created_to:
            fields["created_to"] = "must be after the start of the range"
        if fields:
            raise BulkError("; ".join(f"{k} {v}" for k, v in fields.items()), fields)
        return cls(queue.pk, kind, statuses, created_from, created_to,
                   canonical(account.strip()), error_contains.strip(), ids=ids,
                   reason=reason.strip(), clock=clock,
                   identifier_prefix=canonical(identifier_prefix.strip()),
                   error_group=error_group.strip(), payload=payload.strip(), task=task.strip())

    def frozen(self, now: datetime) -> "BulkFilter":
        """The same filter over a fixed snapshot: what exists now, and nothing enqueued later."""
        if self.snapshot_at is not None:
            return self
        highest = Item.objects.aggregate(n=Max("id"))["n"] or 0
        return replace(self, snapshot_at=now, max_id=highest)

    @property
    def eligible_statuses(self) -> tuple[str, ...]:
        accepted = KINDS[self.kind][1]
        return tuple(s for s in self.statuses if s in accepted)

    @property
    def kind_statuses(self) -> tuple[str, ...]:
        """The statuses this kind of operation acts on, whatever the filter chose."""
        return tuple(KINDS[self.kind][1])

    @property
    def time_field(self) -> str:
        return CLOCKS[self.clock]

    @property
    def any_time(self) -> bool:
        """Chosen as "Any time" or as a selection: the range only bounds it by the snapshot."""
        return self.created_from == ANY_TIME_START

    @property
    def open_end(self) -> bool:
        """No end chosen ("Last hour", a From alone): every item from its start on."""
        return self.created_to == ANY_TIME_END

    @property
    def clock_words(self) -> str:
        return CLOCK_WORDS[self.clock]

    @property
    def newest_first(self) -> tuple[str, ...]:
        """The sample's order: the most recently finished first when the range is by finish
        time (an index order, item_finished_status_idx), else the most recently enqueued."""
        if self.clock == "finished":
            return ("-finished_at", "-created_at", "-id")
        return ("-created_at", "-id")

    def in_time(self) -> Q:
        """The time range on its clock."""
        return Q(**{f"{self.time_field}__gte": self.created_from,
                    f"{self.time_field}__lt": self.created_to})

    def in_range(self) -> Q:
        """The time range and the frozen snapshot: all a plain filter asks of an item of its
        queue and statuses."""
        time_field = self.time_field
        condition = self.in_time()
        if self.snapshot_at is not None:
            condition &= Q(created_at__lte=self.snapshot_at, id__lte=self.max_id)
            if self.clock in ("finished", "updated"):
                # An item that ends or changes after the preview joins no range it saw.
                condition &= Q(**{f"{time_field}__lte": self.snapshot_at})
        return condition

    @property
    def is_plain(self) -> bool:
        """Statuses, a time range and nothing else: its items are a status's total (from the
        counters) less those out of range, which count_items may count instead."""
        return not (self.ids or self.kind in DEAD_LETTER_KINDS or self.account
                    or self.identifier_prefix or self.error_contains or self.error_group
                    or self.payload or self.task)

    def items(self, statuses=None):
        query = Item.objects.filter(self.in_range(), queue_id=self.queue_id,
                                    status__in=statuses or self.statuses)
        if self.ids:
            query = query.filter(id__in=self.ids)
        if self.kind in DEAD_LETTER_KINDS:
            letters = DeadLetter.objects.filter(item_id=OuterRef("id"), replayed_at__isnull=True)
            if self.reason:
                letters = letters.filter(reason=self.reason)
            query = query.filter(Exists(letters))
        if self.account:
            query = query.filter(account=self.account)
        if self.identifier_prefix:
            prefix = self.identifier_prefix
            query = query.filter(identifier__gte=prefix, identifier__lt=prefix + PREFIX_END,
                                 identifier__startswith=prefix)
        if self.error_contains:
            query = query.filter(last_error__icontains=self.error_contains)
        if self.error_group:
            query = query.filter(last_error__regex=group_pattern(self.error_group))
        if self.payload:
            query = payloads.parse(self.payload).apply(query)
        if self.task:
            query = query.filter(task_path=self.task)
        return query

    def as_json(self) -> dict:
        data = asdict(self)
        for name in ("created_from", "created_to", "snapshot_at"):
            data[name] = data[name].isoformat() if data[name] else None
        data["statuses"] = list(self.statuses)
        data["ids"] = list(self.ids)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "BulkFilter":
        values = dict(data)
        for name in ("created_from", "created_to", "snapshot_at"):
            values[name] = parse_datetime(values[name]) if values.get(name) else None
        values["statuses"] = tuple(values["statuses"])
        values["ids"] = tuple(values.get("ids", ()))
        # Operations recorded before ranges named their clock: dead letters by failure time,
        # the rest by enqueue time.
        values.setdefault("clock", "finished" if values["kind"] in DEAD_LETTER_KINDS
                          else "enqueued")
        return cls(**values)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()


@dataclass
class Preview:
    filter: BulkFilter
    eligible: int
    ineligible: dict[str, int] = field(default_factory=dict)  # reason: count
    sample: list = field(default_factory=list)
    too_many: bool = False
    # False when there were too many eligible items to count those whose identifier is live
    # again (LIVE_AGAIN_CHECK_MAX): they are among the eligible, and the steps skip them.
    live_again_counted: bool = True

    @property
    def matching(self) -> int:
        return self.eligible + sum(self.ineligible.values())


def count_items(frozen: BulkFilter, statuses, limit: int) -> int:
    """How many of the frozen filter's items are in `statuses`, exactly, stopping past `limit`.

    An exact count reads the heap page of every row changed since the last vacuum: right after
    an outage, every failure of the hour. The items a range leaves out are often few and long
    vacuumed (the older failures), so a plain filter counts whichever side turns out smaller,
    in probes of growing size: the items in range, or the status's total from the counters
    less the items out of range."""
    in_range = frozen.items(statuses)
    if not frozen.is_plain:
        return in_range[:limit + 1].count()
    probe = COUNT_PROBE
    while probe <= limit:
        n = in_range[:probe].count()
        if n < probe:
            return n
        total, outside = _total_and_outside(frozen, statuses, probe)
        if outside < probe:
            return min(total - outside, limit + 1)
        probe *= 4
    return in_range[:limit + 1].count()


def _total_and_outside(frozen: BulkFilter, statuses, probe: int) -> tuple[int, int]:
    """The statuses' total and the items out of range, in one statement: one snapshot, so a
    transition committing meanwhile is in both or in neither. The items out of range are the
    sum of disjoint parts, each an index range that stays clear of the items in range (a plain
    NOT would walk them all); each part stops at `probe`, so a sum under `probe` is exact."""
    total_sql, params = counters.total_sql(frozen.queue_id, list(statuses))
    parts = []
    for part in _outside_parts(frozen, statuses):
        sql, part_params = part.values("id")[:probe].query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS part)")
        params += part_params
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {total_sql}, {' + '.join(parts)}", params)
        total, outside = cursor.fetchone()
    return int(total), int(outside)


def _outside_parts(frozen: BulkFilter, statuses) -> list:
    """The items of the queue and statuses that the frozen range leaves out, as disjoint
    querysets: no time, before the range, after it, and (in range) enqueued or changed after
    the snapshot."""
    field = frozen.time_field
    items = Item.objects.filter(queue_id=frozen.queue_id, status__in=statuses)
    in_time = items.filter(frozen.in_time())
    parts = [items.filter(**{f"{field}__isnull": True}),
             items.filter(**{f"{field}__lt": frozen.created_from}),
             items.filter(**{f"{field}__gte": frozen.created_to}),
             in_time.filter(id__gt=frozen.max_id),
             in_time.filter(id__lte=frozen.max_id, created_at__gt=frozen.snapshot_at)]
    if frozen.clock in ("finished", "updated"):
        parts.append(in_time.filter(id__lte=frozen.max_id, created_at__lte=frozen.snapshot_at,
                                    **{f"{field}__gt": frozen.snapshot_at}))
    return parts


def preview(bulk_filter: BulkFilter, now: datetime | None = None) -> Preview:
    """Counts inside the (frozen) snapshot; each count stops past the operation maximum."""
    frozen = bulk_filter.frozen(now or timezone.now())
    cap = max_items()
    ineligible: Counter = Counter()
    for status in frozen.statuses:
        if status not in frozen.eligible_statuses:
            n = count_items(frozen, [status], cap)
            if n:
                reason = INELIGIBLE_REASONS.get(
                    (frozen.kind, status),
                    f"{Status(status).label.lower()} items cannot be "
                    f"{'retried' if frozen.kind == 'retry' else 'cancelled'}")
                ineligible[reason] += n
    eligible_items = frozen.items(frozen.eligible_statuses) if frozen.eligible_statuses else None
    eligible = 0
    live_again_counted = True
    if eligible_items is not None:
        eligible = count_items(frozen, frozen.eligible_statuses, cap)
        if frozen.kind in (BulkOperation.Kind.RETRY, BulkOperation.Kind.REPLAY) and eligible:
            live_again_counted = eligible <= LIVE_AGAIN_CHECK_MAX
            if live_again_counted:
                # Retrying an item whose identifier is live again on another item would
                # duplicate it. A scalar subquery, not EXISTS: PostgreSQL turns an EXISTS into a
                # join, and on a queue its statistics do not know yet it read the queue's whole
                # live set once per failure (4.7 s for 200 failures beside 50,000 queued items).
                live_item = Item.objects.filter(
                    queue_id=frozen.queue_id, identifier=OuterRef("identifier"),
                    status__in=LIVE_STATUSES).values("id")[:1]
                live_again = eligible_items.alias(live_item=Subquery(live_item)).filter(
                    live_item__isnull=False).count()
                if live_again:
                    ineligible[lifecycle.LIVE_AGAIN] += live_again
                    eligible -= live_again
    sample = _sample(frozen) if eligible_items is not None else []
    return Preview(frozen, eligible, dict(ineligible), sample, too_many=eligible > cap,
                   live_again_counted=live_again_counted)


def _sample(frozen: BulkFilter) -> list[Item]:
    """The newest eligible items: over several statuses one ORDER BY sorts every item in range
    (0.35 s for 300,000 queued items of the last hour), so each status is read in its index's
    order (newest_first)."""
    return newest_first(frozen.items(frozen.eligible_statuses), list(frozen.eligible_statuses),
                        SAMPLE_SIZE, tuple(name.lstrip("-") for name in frozen.newest_first),
                        by_status=not frozen.payload,
                        index_ordered=frozen.is_plain and frozen.clock in ("enqueued",
                                                                           "finished"))


def start_confirmed(confirmed: Confirmed, *, expected: int, filter_hash: str, actor
                    ) -> tuple[BulkOperation, bool]:
    """Start the operation of a confirmation once: a repeat, even one racing the first,
    answers the operation it started (and False)."""
    existing = BulkOperation.objects.filter(nonce=confirmed.nonce).first()
    if existing is not None:
        return existing, False
    try:
        return start(confirmed.filter, expected=expected, filter_hash=filter_hash, actor=actor,
                     nonce=confirmed.nonce), True
    except IntegrityError:
        # The unique nonce: a concurrent submission of the same confirmation got there first.
        return BulkOperation.objects.get(nonce=confirmed.nonce), False


@transaction.atomic
def start(bulk_filter: BulkFilter, *, expected: int, filter_hash: str, actor,
          nonce: str | None = None) -> BulkOperation:
    """Confirm a preview: refuses when the frozen filter was altered, answers StalePreview when
    its eligible count changed, otherwise records the operation and schedules its first step."""
    if bulk_filter.snapshot_at is None or bulk_filter.digest() != filter_hash:
        raise BulkError("the confirmation does not match its preview; preview again")
    fresh = preview(bulk_filter)
    if fresh.too_many:
        raise BulkError(f"more than {max_items()} items; narrow the filter",
                        {"created_from": "narrow the range"})
    if fresh.eligible != expected:
        raise StalePreview(fresh)
    if not fresh.eligible:
        raise BulkError("nothing to do: no eligible items")
    user = actor if getattr(actor, "is_authenticated", False) else None
    operation = BulkOperation.objects.create(
        queue_id=bulk_filter.queue_id, kind=bulk_filter.kind, actor=user,
        actor_name=audit.actor_name(actor)[:150],
        filter=bulk_filter.as_json(), filter_hash=filter_hash, expected=expected,
        created_at=timezone.now(), nonce=nonce,
    )
    queue_key = Queue.objects.values_list("key", flat=True).get(pk=bulk_filter.queue_id)
    audit.record(actor, f"bulk.{bulk_filter.kind}", queue_key=queue_key,
                 target=f"bulk operation {operation.pk}", filter=bulk_filter.as_json(),
                 counts={"eligible": expected, **fresh.ineligible})
    transaction.on_commit(lambda: schedule(operation.pk))
    return operation


def schedule(operation_id: int):
    async_task("queues.engine.bulk.run", operation_id, task_name=f"bulk operation {operation_id}")


def stop(operation: BulkOperation, *, actor) -> bool:
    """Ask a running operation to stop after its current step; finished steps stay applied."""
    changed = BulkOperation.objects.filter(
        pk=operation.pk, state=BulkOperation.State.RUNNING).update(
        state=BulkOperation.State.STOPPING)
    if changed:
        audit.record(actor, "bulk.stop", queue_key=operation.queue.key,
                     target=f"bulk operation {operation.pk}")
    return bool(changed)


def run(operation_id: int, seconds: float = TASK_SECONDS) -> int:
    """The worker task: steps for a few seconds, then hands the rest to a new task.
    Returns the steps taken."""
    deadline = time.monotonic() + seconds
    steps = 0
    while True:
        try:
            go_on = step(operation_id)
        except Exception as exc:
            # The failed step rolled back alone: earlier steps stay applied and the record
            # says what changed before the failure.
            log.exception("bulk operation %s failed", operation_id)
            _fail(operation_id, exc)
            return steps
        steps += 1
        if not go_on:
            after_last_step(operation_id)
            return steps
        if time.monotonic() > deadline:
            schedule(operation_id)
            return steps


def after_last_step(operation_id: int):
    """Reads the head of the queue's ready index once, from the worker: a cancel of the oldest
    waiting items leaves their entries dead at its front, and the next reader walks every one
    (the overview's oldest wait took 66 ms and more after a cancel of 100,000 at 10M items).
    The walk marks them, so the operator's next page skips them."""
    queue_id = BulkOperation.objects.filter(pk=operation_id).values_list("queue_id", flat=True)
    counters.oldest_waiting(list(queue_id), timezone.now())


def step(operation_id: int) -> bool:
    """One batch in one transaction; returns whether more remains."""
    now = timezone.now()
    with transaction.atomic():
        # Steps of one operation run one at a time even if a lost step was re-scheduled.
        operation = BulkOperation.objects.select_for_update().get(pk=operation_id)
        if operation.finished:
            return False
        if operation.state == BulkOperation.State.STOPPING:
            _finish(operation, BulkOperation.State.STOPPED, now)
            return False
        bulk_filter = BulkFilter.from_json(operation.filter)
        ids, position = _next_batch(bulk_filter, operation.position)
        if ids:
            skipped = Counter(operation.skipped)
            if operation.kind == BulkOperation.Kind.PURGE:
                deleted = lifecycle.delete_finished(operation.queue_id, ids)["items"]
                operation.changed += deleted
                skipped["it is no longer failed"] += len(ids) - deleted
            else:
                transition, _ = KINDS[operation.kind]
                result = lifecycle.apply(transition, ids,
                                         actor=f"bulk {operation.pk} by {operation.actor_name}")
                operation.changed += len(result.changed)
                skipped.update(result.skipped.values())
            operation.skipped = +skipped
        operation.position = position or {}
        operation.steps += 1
        operation.last_step_at = now
        if position is None:
            _finish(operation, BulkOperation.State.DONE, now)
            return False
        operation.save(update_fields=["changed", "skipped", "position", "steps", "last_step_at"])
    return True


def _finish(operation: BulkOperation, state: str, now: datetime):
    operation.state = state
    operation.finished_at = now
    operation.save()
    log.info("bulk %s %s %s: %s changed, skipped %s", operation.kind, operation.pk, state,
             operation.changed, operation.skipped)


def _fail(operation_id: int, exc: Exception):
    with transaction.atomic():
        operation = BulkOperation.objects.select_for_update().get(pk=operation_id)
        if not operation.finished:
            operation.error = f"{type(exc).__name__}: {exc}"[:2000]
            _finish(operation, BulkOperation.State.FAILED, timezone.now())


def _next_batch(bulk_filter: BulkFilter, position: dict) -> tuple[list[int], dict | None]:
    """Up to STEP_SIZE eligible ids after `position`, walking one status at a time in the order
    of an index: (finished_at, created_at, id) for a range by finish time, which is how
    item_finished_status_idx holds them, else (created_at, id), the browse index's order.
    None: nothing is left."""
    statuses = bulk_filter.eligible_statuses
    index = position.get("status", 0)
    # A walk begun before finish-time ranges had their own order has no "at" in its position:
    # it goes on in enqueue order, which its positions keep.
    by_finish = bulk_filter.clock == "finished" and ("at" in position or "id" not in position)
    columns = ("finished_at", "created_at", "id") if by_finish else ("created_at", "id")
    after = _keyset(position, by_finish) if "id" in position else None
    ids: list[int] = []
    while index < len(statuses):
        query = bulk_filter.items([statuses[index]])
        if bulk_filter.snapshot_at is not None:
            # An item that changed after the preview is not what the operator saw, on any
            # clock: by enqueue time, a second retry of a range would run again every item the
            # first one ran and that failed since. Read here, not in the preview's counts,
            # where it would walk every row of the range.
            query = query.filter(updated_at__lte=bulk_filter.snapshot_at)
        if after is not None:
            query = query.filter(keyset_after(columns, after))
        rows = list(query.order_by(*columns).values_list(*columns)[:STEP_SIZE - len(ids)])
        ids += [row[-1] for row in rows]
        if len(ids) == STEP_SIZE:
            return ids, _position(index, rows[-1], by_finish)
        index, after = index + 1, None
    return ids, ({"status": index} if ids else None)


def _keyset(position: dict, by_finish: bool) -> tuple:
    at = (parse_datetime(position["at"]),) if by_finish else ()
    return (*at, parse_datetime(position["created_at"]), position["id"])


def _position(index: int, row: tuple, by_finish: bool) -> dict:
    *at, created_at, last_id = row
    position = {"status": index, "created_at": created_at.isoformat(), "id": last_id}
    if by_finish:
        position["at"] = at[0].isoformat()
    return position


def keyset_after(columns: tuple[str, ...], values: tuple, descending: bool = False) -> RawSQL:
    """Rows after `values` in the order of `columns` (each descending when `descending`), as
    one row comparison: the index range starts there, where (a > x) OR (a = x AND ...) would
    filter every row that ties on the first column (all of them when a whole outage failed in
    one moment)."""
    quote = connection.ops.quote_name
    table = quote(Item._meta.db_table)
    fields = [Item._meta.get_field(name) for name in columns]
    names = ", ".join(f"{table}.{quote(field.column)}" for field in fields)
    marks = ", ".join(["%s"] * len(columns))
    # Values as the database stores them (on SQLite a time is text in one exact format).
    params = [field.get_db_prep_value(value, connection) for field, value in zip(
        fields, values, strict=True)]
    # Names from the model and placeholders only: the values travel as parameters.
    return RawSQL(f"({names}) {'<' if descending else '>'} ({marks})", params,  # noqa: S611
                  output_field=BooleanField())


def newest_first(items, statuses: list[str], limit: int,
                 order: tuple[str, ...], *, by_status: bool = True,
                 oldest: bool = False, index_ordered: bool = False) -> list[Item]:
    """Newest first across statuses in one statement: one index-ordered scan per status
    (the indexes lead with queue and status) merged by the outer ORDER BY, never a sort of
    every matching row.

    `by_status=False` is for a filter whose own index finds its rows (a payload containment):
    its matches are sorted whatever the statuses, and a part per status repeated that scan
    and let PostgreSQL pair it with the in-flight indexes (55 ms at 10M items in one queue,
    against 0.1 ms for one scan).

    `oldest=True` reads the other way, oldest first (a page of newer items, walked back).
    `index_ordered=True` says an index gives each part's order exactly (statuses and a range on
    the list's own clock, nothing else): then no part may sort (sorts_off)."""
    if not statuses:
        return []
    sign, direction = ("", "ASC") if oldest else ("-", "DESC")
    if not by_status:
        ordered = items.filter(status__in=statuses).order_by(*[sign + name for name in order])
        return list(ordered[:limit])
    parts, params = [], []
    for status in statuses:
        query = items.filter(status=status).order_by(*[sign + name for name in order])[:limit].query
        sql, part_params = query.sql_with_params()
        parts.append(f"SELECT * FROM ({sql}) AS s{len(parts)}")
        params += part_params
    sql = (" UNION ALL ".join(parts) + " ORDER BY "
           + ", ".join(f"{name} {direction}" for name in order) + f" LIMIT {int(limit)}")
    if not index_ordered:
        return list(Item.objects.raw(sql, params))
    with sorts_off():
        return list(Item.objects.raw(sql, params))


def resume_lost(older_than: datetime) -> int:
    """Re-schedule operations whose step vanished with its worker (the sweeper calls this)."""
    lost = list(BulkOperation.objects.filter(
        state__in=(BulkOperation.State.RUNNING, BulkOperation.State.STOPPING)).filter(
        Q(last_step_at__lt=older_than) | Q(last_step_at=None, created_at__lt=older_than),
    ).values_list("pk", flat=True))
    for operation_id in lost:
        schedule(operation_id)
    return len(lost)
