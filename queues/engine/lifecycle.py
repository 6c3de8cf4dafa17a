"""The only code that changes an item's status.

Every transition is one UPDATE guarded by the statuses it may start from (and, for worker
transitions, by the attempt number as a fencing token), so two racing callers can never both move
the same item. Each changed row gets an event and counter deltas in the same transaction.
"""

import json
import random
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from queues.engine import counters, strictjson
from queues.engine.db import (
    chunked,
    from_db_datetime,
    insert_rows,
    is_postgres,
    placeholders,
    to_db_datetime,
    typed,
)
from queues.engine.handlers import TASK_HANDLER
from queues.engine.stream import CHANNEL, notify_events_written
from queues.models import (
    FINISHED_STATUSES,
    IN_FLIGHT_STATUSES,
    LIVE_STATUSES,
    MAX_ACCOUNT_LENGTH,
    MAX_IDENTIFIER_LENGTH,
    PRINTABLE_TEXT,
    READY_STATUSES,
    TIME_BOUNDS_TEXT,
    AccountPolicy,
    Attempt,
    CounterDelta,
    DeadLetter,
    Item,
    ItemEvent,
    Queue,
    Status,
    canonical,
    is_queue_key,
    printable,
    time_in_bounds,
)

BATCH_LIMIT = 1000  # rows per statement: keeps statements and transactions short
ERROR_LIMIT = 10_000  # characters of an error message kept on the item and attempt
TRACEBACK_LIMIT = 20_000
WORKER_LOST = "worker lost"
# Why a requeue skips an item: another item holds its identifier in a live status.
LIVE_AGAIN = "its identifier is live again on another item"
PRIORITY_RANGE = (-32768, 32767)
ATTEMPT_COLUMNS = ("item_id", "number", "started_at", "finished_at", "outcome", "error",
                   "traceback", "worker", "result")
DEAD_LETTER_COLUMNS = ("item_id", "queue_id", "account", "reason", "last_error", "attempts",
                       "created_at", "replayed_by")
RETURNED = ("id, queue_id, account, identifier, previous_status, attempts, started_at, "
            "dispatch_token")
EVENT_COLUMNS = ("item_id", "queue_id", "account", "identifier", "transition", "from_status",
                 "to_status", "attempt", "at", "actor", "reason")


@dataclass(frozen=True)
class Transition:
    name: str
    sources: tuple[str, ...]
    target: str
    event: str
    attempt_outcome: str | None = None  # transitions that end an attempt record it
    dead_letter: bool = False


TRANSITIONS = {
    t.name: t
    for t in (
        Transition("dispatch", (Status.QUEUED, Status.RETRY), Status.DISPATCHED, "dispatched"),
        Transition("start", (Status.DISPATCHED,), Status.RUNNING, "started"),
        # A dispatched item its batch never started (the batch's time ran out, its cluster is
        # shutting down or stopped beating) is ready again; no attempt was spent on it.
        Transition("release", (Status.DISPATCHED,), Status.QUEUED, "released"),
        Transition("complete", (Status.RUNNING,), Status.COMPLETE, "completed",
                   attempt_outcome=Attempt.Outcome.COMPLETE),
        Transition("retry", (Status.RUNNING,), Status.RETRY, "retry_scheduled",
                   attempt_outcome=Attempt.Outcome.RETRY),
        Transition("fail", (Status.RUNNING,), Status.FAILED, "failed",
                   attempt_outcome=Attempt.Outcome.FAILED, dead_letter=True),
        Transition("lost_retry", (Status.DISPATCHED, Status.RUNNING), Status.RETRY, "lost",
                   attempt_outcome=Attempt.Outcome.LOST),
        Transition("lost_fail", (Status.DISPATCHED, Status.RUNNING), Status.FAILED, "lost",
                   attempt_outcome=Attempt.Outcome.LOST, dead_letter=True),
        Transition("cancel", (Status.QUEUED, Status.DISPATCHED, Status.RETRY), Status.CANCELLED,
                   "cancelled"),
        Transition("requeue", (Status.COMPLETE, Status.FAILED, Status.CANCELLED), Status.QUEUED,
                   "requeued"),
        # "Run now" in the dashboard: a retry or a delayed item becomes due at once; its
        # attempts and last error are kept.
        Transition("run_now", (Status.QUEUED, Status.RETRY), Status.QUEUED, "run_now"),
    )
}


class LifecycleError(Exception):
    pass


class IllegalTransition(LifecycleError):
    pass


class EnqueueError(LifecycleError, ValueError):
    """Bad enqueue input; `fields` maps each offending field to what is wrong with it."""

    code = "invalid"

    def __init__(self, message: str, fields: Mapping[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.fields = dict(fields or {})


class UnknownQueue(EnqueueError):
    code = "unknown_queue"


class OverLimit(EnqueueError):
    """The queue, or the account on it, holds its most ready items: try again later."""

    code = "over_limit"
    retry_after = 60


class IdentifierConflict(EnqueueError):
    """A live item already holds the identifier with a different payload."""

    code = "identifier_conflict"

    def __init__(self, identifier: str, existing_id: int | None):
        super().__init__(
            f"identifier {identifier!r} is live on this queue with a different payload",
            {"identifier": "live with a different payload"},
        )
        self.identifier = identifier
        self.existing_id = existing_id


@dataclass(frozen=True)
class Changed:
    """One row a transition moved, as it is after the change."""

    id: int
    queue_id: int
    account: str
    identifier: str
    from_status: str
    attempts: int
    started_at: datetime | None
    token: int = 0  # the dispatch token, which a worker needs to claim a dispatched item
    extra: tuple = ()  # columns a caller asked for beside these (see start_claimed)


@dataclass
class TransitionResult:
    action: str
    requested: list[int]
    changed: list[Changed] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)

    @property
    def changed_ids(self) -> list[int]:
        return [row.id for row in self.changed]


@dataclass(frozen=True)
class Outcome:
    """What a worker (or the sweeper) reports about one attempt of one item."""

    item_id: int
    attempt: int
    error: str | None = None  # None means the attempt succeeded
    traceback: str = ""
    permanent: bool = False
    delay: float | None = None  # seconds, e.g. from a Retry-After header
    result: object = None  # what a completed attempt's handler returned, JSON-serialisable
    # The attempt's own times and the thread that ran it; unset, the item's start and now.
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str = ""


# --- enqueue ---------------------------------------------------------------------------------

def _live_status_sql() -> str:
    # Must match the partial unique index's predicate word for word so that ON CONFLICT can use it.
    return "status IN (" + ", ".join(f"'{s}'" for s in LIVE_STATUSES) + ")"


def _check_text(fields: dict, name: str, value, limit: int):
    if not isinstance(value, str) or not value.strip():
        fields[name] = "must be a non-empty string"
    # Measured as stored: composing (NFC) can lengthen text, U+1D160 into three characters.
    elif len(canonical(value)) > limit:
        fields[name] = f"must be at most {limit} characters"
    elif not printable(value):
        fields[name] = PRINTABLE_TEXT


def normalise_item(item: Mapping, now: datetime) -> dict:
    """Check one item to enqueue; returns its stored form or raises EnqueueError naming fields."""
    fields: dict[str, str] = {}
    if not isinstance(item, Mapping):
        raise EnqueueError("an item must be a mapping", {"item": "must be an object"})
    unknown = set(item) - {"account", "identifier", "payload", "run_at", "priority"}
    if unknown:
        fields.update({name: "unknown field" for name in sorted(unknown)})
    _check_text(fields, "account", item.get("account"), MAX_ACCOUNT_LENGTH)
    _check_text(fields, "identifier", item.get("identifier"), MAX_IDENTIFIER_LENGTH)
    payload = item.get("payload")
    payload = {} if payload is None else payload
    try:
        # The API's rules for any caller (no NUL, lone surrogate, huge integer or deep nesting:
        # what the database refuses or the API could not read back), then a round-trip so that
        # the stored payload and the dedup comparison see the same values.
        strictjson.check_python(payload, "payload")
        payload = json.loads(json.dumps(payload))
    except strictjson.JSONBodyError as exc:
        fields["payload"] = f"{exc.message} (at {exc.field})"
    run_at = item.get("run_at")
    if run_at is None:
        run_at = now
    elif not isinstance(run_at, datetime):
        fields["run_at"] = "must be a datetime"
    elif timezone.is_naive(run_at):
        fields["run_at"] = "must be timezone-aware"
    elif not time_in_bounds(run_at):
        fields["run_at"] = TIME_BOUNDS_TEXT
    priority = item.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        fields["priority"] = "must be an integer"
    elif not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        fields["priority"] = f"must be between {PRIORITY_RANGE[0]} and {PRIORITY_RANGE[1]}"
    if fields:
        raise EnqueueError("invalid item: " + "; ".join(f"{k} {v}" for k, v in fields.items()),
                           fields)
    return {
        "account": canonical(item["account"]),
        "identifier": canonical(item["identifier"]),
        "payload": payload,
        "run_at": run_at,
        "priority": priority,
    }


def enqueue_many(queue_key: str, items: Iterable[Mapping], *, actor: str = "python",
                 task_path: str = "") -> list[Item]:
    """Put items on a queue, all or nothing.

    A live identifier returns the existing item when the payload is the same (also inside one
    batch) and raises IdentifierConflict when it differs. Each returned Item carries `created`.
    `task_path` (the django.tasks backend's alone) names the task the items run; a queue takes
    task items only if it runs the task handler, and nothing else then.
    """
    now = timezone.now()
    items = list(items)
    if len(items) > BATCH_LIMIT:
        raise EnqueueError(f"at most {BATCH_LIMIT} items per call", {"items": "too many"})
    rows = [normalise_item(item, now) for item in items]
    try:
        if not is_queue_key(queue_key):
            raise Queue.DoesNotExist
        queue = Queue.objects.get(key=queue_key)
    except Queue.DoesNotExist:
        raise UnknownQueue(f"unknown queue {queue_key!r}", {"queue": "unknown"}) from None
    _check_handler(queue, task_path)

    firsts: dict[str, dict] = {}
    for row in rows:
        first = firsts.setdefault(row["identifier"], row)
        if first["payload"] != row["payload"]:
            raise IdentifierConflict(row["identifier"], None)
    # One global order: two batches sharing identifiers in opposite orders would otherwise each
    # wait on the other's uncommitted insert (a deadlock on PostgreSQL).
    unique_rows = sorted(firsts.values(), key=lambda row: row["identifier"])

    _check_ready_limits(queue, unique_rows)
    with transaction.atomic():
        by_identifier = _insert_or_find(queue, unique_rows, now, actor, task_path)
    return [by_identifier[row["identifier"]] for row in rows]


def _check_handler(queue: Queue, task_path: str):
    """An item without a task on a task queue would only fail at run time, and a task on a
    queue running another handler would never run as a task: both are refused here."""
    if task_path and queue.handler != TASK_HANDLER:
        raise EnqueueError(
            f"queue {queue.key} runs handler {queue.handler!r}; django.tasks tasks go to queues "
            f"whose handler is {TASK_HANDLER!r}", {"queue": "does not run django.tasks tasks"})
    if not task_path and queue.handler == TASK_HANDLER:
        raise EnqueueError(
            f"queue {queue.key} runs django.tasks tasks; enqueue them with Task.enqueue()",
            {"queue": "runs django.tasks tasks only"})


def _check_ready_limits(queue: Queue, rows: list[dict]):
    """Refuse a batch that would take the queue, or an account with a limit of its own, past
    its most ready items. Only new identifiers count (a producer's retry of a batch it sent adds
    nothing); the queue's figure comes from the counters, an account's is counted in the ready
    index up to its limit. A check, not a lock: concurrent batches may pass it together.

    The whole batch is an upper bound of what it adds, so the live identifiers of the batch are
    looked up only when that bound would pass a limit: a batch far below every limit costs two
    short queries."""
    counts = counters.status_counts([queue.pk])[queue.pk]
    ready = max(0, counts[Status.QUEUED]) + max(0, counts[Status.RETRY])
    limits = dict(AccountPolicy.objects.filter(
        queue=queue, account__in={row["account"] for row in rows}, max_ready__isnull=False
    ).values_list("account", "max_ready"))
    if ready + len(rows) <= queue.max_ready and not limits:
        return
    live = set(Item.objects.filter(queue=queue, status__in=LIVE_STATUSES, identifier__in=[
        row["identifier"] for row in rows]).values_list("identifier", flat=True))
    new = [row for row in rows if row["identifier"] not in live]
    if not new:
        return
    if ready + len(new) > queue.max_ready:
        _refuse(queue, f"queue {queue.key} holds {ready:,} ready items and takes at most "
                       f"{queue.max_ready:,}; try again later", {"queue": "at its ready limit"})
    per_account = Counter(row["account"] for row in new)
    for account, limit in limits.items():
        if not per_account[account]:
            continue
        held = Item.objects.filter(queue=queue, account=account, status__in=READY_STATUSES
                                   ).values("id")[:limit + 1].count()
        if held + per_account[account] > limit:
            _refuse(queue, f"account {account} holds {held:,} ready items on {queue.key} and "
                           f"takes at most {limit:,}; try again later",
                    {"account": "at its ready limit"})


def _refuse(queue: Queue, message: str, fields: dict):
    Queue.objects.filter(pk=queue.pk).update(refused_over_limit=F("refused_over_limit") + 1)
    raise OverLimit(message, fields)


def _insert_or_find(queue: Queue, rows: list[dict], now: datetime, actor: str,
                    task_path: str) -> dict[str, Item]:
    found: dict[str, Item] = {}
    pending = rows
    # A live item found by ON CONFLICT may finish before we read it; then the identifier is free
    # again and the next pass inserts it. Three passes cover any realistic interleaving.
    for _ in range(3):
        created_ids = _insert_ignoring_live_duplicates(queue, pending, now, task_path)
        missing = [row for row in pending if row["identifier"] not in created_ids]
        existing = {
            item.identifier: item
            for item in Item.objects.filter(
                queue=queue,
                identifier__in=[row["identifier"] for row in missing],
                status__in=LIVE_STATUSES,
            )
        }
        created = [_saved_item(queue, row, created_ids[row["identifier"]], now, task_path)
                   for row in pending if row["identifier"] in created_ids]
        for item in created:
            found[item.identifier] = item
        _record_enqueued(queue, created, now, actor)
        pending = []
        for row in missing:
            item = existing.get(row["identifier"])
            if item is None:
                pending.append(row)
            elif item.payload != row["payload"]:
                raise IdentifierConflict(row["identifier"], item.pk)
            else:
                item.created = False
                found[item.identifier] = item
        if not pending:
            return found
    raise LifecycleError("identifier kept changing state during enqueue; try again")


def _saved_item(queue: Queue, row: dict, pk: int, now: datetime, task_path: str) -> Item:
    """The inserted row as an Item, built from what we wrote instead of read back."""
    item = Item(id=pk, queue=queue, account=row["account"], identifier=row["identifier"],
                payload=row["payload"], priority=row["priority"], status=Status.QUEUED,
                previous_status="", attempts=0, run_at=row["run_at"], last_error="",
                created_at=now, updated_at=now, task_path=task_path)
    item._state.adding = False
    item._state.db = connection.alias
    item.created = True
    return item


def _insert_ignoring_live_duplicates(queue: Queue, rows: list[dict], now: datetime,
                                    task_path: str) -> dict:
    payload_field = Item._meta.get_field("payload")
    columns = ("queue_id", "account", "identifier", "payload", "priority", "status",
               "previous_status", "attempts", "run_at", "last_error", "created_at", "updated_at",
               "task_path")
    at = to_db_datetime(now)
    inserted = insert_rows(
        Item, columns,
        [
            (queue.pk, row["account"], row["identifier"],
             payload_field.get_db_prep_save(row["payload"], connection), row["priority"],
             Status.QUEUED, "", 0, to_db_datetime(row["run_at"]), "", at, at, task_path)
            for row in rows
        ],
        suffix=f"ON CONFLICT (queue_id, identifier) WHERE {_live_status_sql()} DO NOTHING",
        returning="id, identifier",
    )
    return {identifier: pk for pk, identifier in inserted}


def _record_enqueued(queue: Queue, items: list[Item], now: datetime, actor: str):
    if not items:
        return
    at = to_db_datetime(now)
    insert_rows(ItemEvent, EVENT_COLUMNS, [
        (item.pk, queue.pk, item.account, item.identifier, "enqueued", "", Status.QUEUED, 0, at,
         actor, "")
        for item in items
    ])
    notify_events_written()
    counters.record({(queue.pk, Status.QUEUED): len(items)}, now)


# --- transitions -----------------------------------------------------------------------------

def apply(
    action: str,
    ids: Iterable[int],
    *,
    actor: str,
    reason: str = "",
    expected_attempts: Mapping[int, int] | None = None,
    values: Mapping[int, Mapping] | None = None,
    guard: tuple[str, list] | None = None,
) -> TransitionResult:
    """Move every listed item that is in one of the action's source statuses.

    `expected_attempts` fences worker transitions: an item moves only while its attempt number
    is still the one the caller was given; `guard` adds a condition on the row (SQL, params),
    such as the worker's claim. `values` carries per-item data: run_at, error, traceback,
    worker, dead_reason, started_at, finished_at. Items that did not move are listed in
    `skipped` with why.
    """
    transition_ = TRANSITIONS.get(action)
    if transition_ is None:
        raise IllegalTransition(f"unknown transition {action!r}")
    ids = list(dict.fromkeys(int(i) for i in ids))
    result = TransitionResult(action=action, requested=ids)
    if not ids:
        return result
    now = timezone.now()
    values = values or {}
    if transition_.event == "lost" and not reason:
        reason = WORKER_LOST  # the item, its attempt and dead letter all say why
    with transaction.atomic(savepoint=False):
        if action == "requeue":
            # Over the whole request, not per chunk: a shared identifier may span two chunks.
            ids = _drop_requeue_duplicates(ids, result)
        for chunk in chunked(ids, BATCH_LIMIT):
            result.changed += _move(transition_, chunk, now, actor, reason, expected_attempts,
                                    values, guard)
        result.skipped.update(_explain_skipped(transition_, result, expected_attempts))
    return result


def apply_selected(action: str, selection_sql: str, selection_params: list, *,
                   actor: str) -> list[Changed]:
    """Move the items a SELECT of ids finds, such as the selector's claim. On PostgreSQL the
    SELECT, the UPDATE, its events and its counter deltas are one statement: the ids never
    travel to Python and back."""
    transition_ = TRANSITIONS[action]
    if not _records_in_sql():
        with transaction.atomic(savepoint=False):
            return apply(action, _selected_ids(selection_sql, selection_params),
                         actor=actor).changed
    # ARRAY() makes the selection an init plan, run once. As `id IN (...)` the planner may
    # run it again for each row it updates, and a selection with FOR UPDATE SKIP LOCKED then
    # skips the rows this statement has just changed and finds others, past its LIMIT (a
    # PostgreSQL test run with autovacuum on saw rounds take every ready item).
    with transaction.atomic(savepoint=False):
        return _update_recorded(transition_, f"id = ANY(ARRAY({selection_sql}))",
                                selection_params, [], timezone.now(), actor, "", None, None)


def dispatch_started(selection_sql: str, selection_params: list, *,
                     cluster: str) -> list[dict]:
    """A running batch's top-up: the items a SELECT of ids finds are dispatched to `cluster`,
    claimed for it and started, returning what their handlers need. The history is a dispatch
    and a start, as for any batch, but on PostgreSQL it is one UPDATE of each row rather than
    two: nothing outside the batch's transaction could have seen the dispatched state."""
    if not _records_in_sql():
        with transaction.atomic(savepoint=False):
            changed = apply("dispatch", _selected_ids(selection_sql, selection_params),
                            actor="selector").changed
            batch = [[row.id, row.attempts, row.token] for row in changed]
            claim(batch, cluster)
            return start_claimed([row.id for row in changed], cluster=cluster,
                                 expected_attempts={row.id: row.attempts for row in changed},
                                 tokens={row.token for row in changed})
    with transaction.atomic(savepoint=False):
        changed = _update_recorded(
            TRANSITIONS["dispatch"], f"id = ANY(ARRAY({selection_sql}))", selection_params, [],
            timezone.now(), "selector", "", None, None, start_for=cluster,
            returning=", payload, task_path")
    return _handler_rows(changed)


def _selected_ids(selection_sql: str, selection_params: list) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(selection_sql, selection_params)
        return [row[0] for row in cursor.fetchall()]


def transition(item_id: int, action: str, *, actor: str, reason: str = "",
               expected_attempt: int | None = None, **item_values) -> Changed:
    """One item; raises IllegalTransition with the reason when it cannot move."""
    expected = {item_id: expected_attempt} if expected_attempt is not None else None
    result = apply(action, [item_id], actor=actor, reason=reason, expected_attempts=expected,
                   values={item_id: item_values} if item_values else None)
    if not result.changed:
        raise IllegalTransition(f"cannot {action} item {item_id}: {result.skipped[item_id]}")
    return result.changed[0]


def _set_clauses(transition_: Transition, ids: list[int], now: datetime, reason: str,
                 values: Mapping[int, Mapping], start_for: str = "") -> tuple[list[str], list]:
    sets = ["status = %s", "previous_status = status", "updated_at = %s"]
    params: list = [Status.RUNNING if start_for else transition_.target, to_db_datetime(now)]

    def per_item(column: str, key: str, pg_type: str, default, convert=lambda v: v):
        cases = [(i, values[i][key]) for i in ids if key in values.get(i, {})]
        if not cases:
            sets.append(f"{column} = %s")
            params.append(convert(default))
            return
        whens = " ".join(f"WHEN %s THEN {typed('%s', pg_type)}" for _ in cases)
        sets.append(f"{column} = CASE id {whens} ELSE {typed('%s', pg_type)} END")
        for item_id, value in cases:
            params.extend([item_id, convert(value)])
        params.append(convert(default))

    name = transition_.name
    if name == "dispatch":
        sets += ["attempts = attempts + 1", "dispatched_at = %s", "started_at = %s",
                 "dispatch_token = %s", "cluster = %s"]
        params += [to_db_datetime(now), to_db_datetime(now) if start_for else None,
                   secrets.randbits(62), start_for]
    elif name == "release":
        # The dispatch gave the item an attempt number it never used: take it back.
        sets += ["attempts = attempts - 1", "dispatched_at = NULL", "cluster = ''"]
    elif name == "start":
        sets.append("started_at = %s")
        params.append(to_db_datetime(now))
    elif name == "complete":
        sets += ["finished_at = %s", "last_error = ''"]
        params.append(to_db_datetime(now))
    elif name in ("retry", "lost_retry"):
        per_item("run_at", "run_at", "timestamptz", now, to_db_datetime)
        per_item("last_error", "error", "text", reason, _clip_error)
    elif name in ("fail", "lost_fail"):
        sets.append("finished_at = %s")
        params.append(to_db_datetime(now))
        per_item("last_error", "error", "text", reason, _clip_error)
    elif name == "cancel":
        sets.append("finished_at = %s")
        params.append(to_db_datetime(now))
    elif name == "run_now":
        sets.append("run_at = %s")
        params.append(to_db_datetime(now))
    elif name == "requeue":
        sets += ["attempts = 0", "run_at = %s", "last_error = ''", "dispatched_at = NULL",
                 "started_at = NULL", "finished_at = NULL"]
        params.append(to_db_datetime(now))
    return sets, params


def _update_sql(transition_: Transition, id_condition: str, id_params: list, ids: list[int],
                now: datetime, reason: str, expected_attempts: Mapping[int, int] | None,
                values: Mapping[int, Mapping], guard: tuple[str, list] | None, *,
                start_for: str = "", returning: str = "") -> tuple[str, list] | None:
    """The guarded UPDATE ... RETURNING of one transition for the rows `id_condition` picks;
    None when the fence leaves no row to move."""
    table = Item._meta.db_table
    sets, params = _set_clauses(transition_, ids, now, reason, values, start_for)
    # The rows are found by id. Written as `status IN`, the status check would let the planner
    # reach them through a partial index of those statuses instead, and on statistics taken
    # when almost nothing was ready it does: the dispatch then read every ready item of every
    # queue. An expression matches no index predicate, so the primary key is the only way.
    where = [id_condition, f"status || '' IN ({placeholders(len(transition_.sources))})"]
    params += id_params + list(transition_.sources)
    if expected_attempts is not None:
        # Group by attempt number: a batch holds few distinct numbers, so this stays small.
        groups: dict[int, list[int]] = {}
        for item_id in ids:
            if item_id in expected_attempts:
                groups.setdefault(expected_attempts[item_id], []).append(item_id)
        if not groups:
            return None
        fence = []
        for number, members in groups.items():
            fence.append(f"(attempts = %s AND id IN ({placeholders(len(members))}))")
            params += [number, *members]
        where.append("(" + " OR ".join(fence) + ")")
    if guard is not None:
        where.append(f"({guard[0]})")
        params += guard[1]
    if transition_.name == "requeue":
        # A retry must not create a second live item with the same identifier.
        where.append(
            f"NOT EXISTS (SELECT 1 FROM {table} AS live WHERE live.queue_id = {table}.queue_id "
            f"AND live.identifier = {table}.identifier AND live.{_live_status_sql()})"
        )
    sql = (f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(where)} "
           f"RETURNING {RETURNED}{returning}")
    return sql, params


def _move(transition_: Transition, ids: list[int], now: datetime, actor: str, reason: str,
          expected_attempts: Mapping[int, int] | None, values: Mapping[int, Mapping],
          guard: tuple[str, list] | None = None) -> list[Changed]:
    """One chunk: the guarded UPDATE and its records."""
    try:
        # Only a requeue recovers from an error here, so only it pays for a savepoint.
        with transaction.atomic(savepoint=transition_.name == "requeue"):
            if _records_in_sql():
                return _update_recorded(transition_, "id = ANY(%s::bigint[])", [ids], ids, now,
                                        actor, reason, expected_attempts, guard, values=values)
            changed = _update(transition_, ids, now, reason, expected_attempts, values, guard)
            _record(transition_, changed, now, actor, reason, values)
            return changed
    except IntegrityError:
        if transition_.name != "requeue" or len(ids) == 1:
            raise
        # A concurrent enqueue took one of the identifiers between our check and our write:
        # redo the chunk item by item so only that one is skipped.
        changed = []
        for item_id in ids:
            try:
                changed += _move(transition_, [item_id], now, actor, reason, expected_attempts,
                                 values)
            except IntegrityError:
                continue
        return changed


def _update(transition_: Transition, ids: list[int], now: datetime, reason: str,
            expected_attempts: Mapping[int, int] | None, values: Mapping[int, Mapping],
            guard: tuple[str, list] | None) -> list[Changed]:
    statement = _update_sql(transition_, f"id IN ({placeholders(len(ids))})", ids, ids, now,
                            reason, expected_attempts, values, guard)
    if statement is None:
        return []
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        return [_changed(row) for row in cursor.fetchall()]


def _changed(row) -> Changed:
    return Changed(id=row[0], queue_id=row[1], account=row[2], identifier=row[3],
                   from_status=row[4], attempts=row[5], started_at=from_db_datetime(row[6]),
                   token=row[7], extra=tuple(row[8:]))


def _records_in_sql() -> bool:
    """On PostgreSQL a transition's records are written by its UPDATE's own statement."""
    return is_postgres()


def _update_recorded(transition_: Transition, id_condition: str, id_params: list,
                     ids: list[int], now: datetime, actor: str, reason: str,
                     expected_attempts: Mapping[int, int] | None,
                     guard: tuple[str, list] | None, *, values: Mapping[int, Mapping] = None,
                     start_for: str = "", returning: str = "") -> list[Changed]:
    """PostgreSQL: the UPDATE, the events and counter deltas of the rows it moved, their
    attempts and dead letters (for a requeue, their dead letters marked replayed) and the
    streams' wake-up in one statement, so a selector round, a worker's outcomes or a bulk step
    pay one round trip and ship no rows to the database but per-item data. A dispatch
    `start_for` a cluster also claims and starts its items for it (see dispatch_started) and
    records both events."""
    values = values or {}
    statement = _update_sql(transition_, id_condition, id_params, ids, now, reason,
                            expected_attempts, values, guard, start_for=start_for,
                            returning=returning)
    if statement is None:
        return []
    update_sql, params = statement
    at, minute = to_db_datetime(now), to_db_datetime(now.replace(second=0, microsecond=0))
    parts = [f"moved AS ({update_sql})"]
    records = transition_.attempt_outcome or transition_.dead_letter or values
    if records:
        parts.append(_per_item_sql(transition_, ids, reason, values, params))
        source, event_reason = "moved JOIN per_item USING (id)", "per_item.error"
    else:
        source, event_reason = "moved", "%s"
    if start_for:
        # Two events per row, the dispatch's first: their ids keep the history's order.
        start = TRANSITIONS["start"]
        parts.append(
            f"events AS (INSERT INTO {ItemEvent._meta.db_table} ({', '.join(EVENT_COLUMNS)}) "
            f"SELECT id, queue_id, account, identifier, e.transition, e.from_status, "
            f"e.to_status, attempts, %s, e.actor, %s FROM moved CROSS JOIN LATERAL "
            f"(VALUES (%s, previous_status, %s, %s), (%s, %s, %s, %s)) "
            f"AS e(transition, from_status, to_status, actor))")
        params += [at, _clip_error(reason), transition_.event, transition_.target, actor,
                   start.event, transition_.target, start.target, "worker"]
    else:
        parts.append(
            f"events AS (INSERT INTO {ItemEvent._meta.db_table} ({', '.join(EVENT_COLUMNS)}) "
            f"SELECT id, queue_id, account, identifier, %s, previous_status, %s, attempts, "
            f"%s, %s, {event_reason} FROM {source})")
        params += [transition_.event, transition_.target, at, actor]
        if not records:
            params.append(_clip_error(reason))
    # Each row leaves its previous status and enters the target; run_now's -1 and +1 on the
    # same status cancel out and are not written.
    parts.append(
        f"deltas AS (INSERT INTO {CounterDelta._meta.db_table} (queue_id, status, delta, "
        f"minute) SELECT queue_id, d.status, SUM(d.delta), %s FROM moved CROSS JOIN LATERAL "
        f"(VALUES (previous_status, -1), (%s, 1)) AS d(status, delta) "
        f"GROUP BY queue_id, d.status HAVING SUM(d.delta) <> 0)")
    params += [minute, Status.RUNNING if start_for else transition_.target]
    if transition_.attempt_outcome:
        parts.append(
            f"attempts_ AS (INSERT INTO {Attempt._meta.db_table} ({', '.join(ATTEMPT_COLUMNS)}) "
            f"SELECT id, attempts, COALESCE(per_item.started_at, moved.started_at), "
            f"COALESCE(per_item.finished_at, %s), %s, per_item.error, per_item.traceback, "
            f"per_item.worker, per_item.result::jsonb FROM {source})")
        params += [at, transition_.attempt_outcome]
    if transition_.dead_letter:
        parts.append(
            f"dead AS (INSERT INTO {DeadLetter._meta.db_table} ({', '.join(DEAD_LETTER_COLUMNS)}) "
            f"SELECT id, queue_id, account, per_item.dead_reason, per_item.error, attempts, %s, "
            f"'' FROM {source})")
        params.append(at)
    if transition_.name == "requeue":
        parts.append(
            f"replayed AS (UPDATE {DeadLetter._meta.db_table} SET replayed_at = %s, "
            f"replayed_by = %s WHERE item_id IN (SELECT id FROM moved) "
            f"AND replayed_at IS NULL)")
        params += [at, actor]
    # Wakes the streams and the selector loop when the transaction commits (see
    # stream.notify_events_written); a volatile CTE runs once.
    parts.append("woken AS (SELECT pg_notify(%s, '') FROM (SELECT 1 FROM moved LIMIT 1) AS m)")
    params.append(CHANNEL)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT {RETURNED}{returning} FROM moved "
                       f"LEFT JOIN woken ON true", params)
        rows = cursor.fetchall()
    return [_changed(row) for row in rows]


def _per_item_sql(transition_: Transition, ids: list[int], reason: str,
                  values: Mapping[int, Mapping], params: list) -> str:
    """What each moved row records beside itself (error, traceback, worker, result, times,
    dead-letter reason), one array per column: a dozen parameters for a thousand rows."""
    result_field = Attempt._meta.get_field("result")
    default_dead = WORKER_LOST if transition_.event == "lost" else "permanent"
    columns: dict[str, list] = {name: [] for name in (
        "id", "error", "traceback", "worker", "result", "started_at", "finished_at",
        "dead_reason")}
    for item_id in ids:
        data = values.get(item_id, {})
        result = data.get("result")
        for name, value in (
                ("id", item_id), ("error", _clip_error(data.get("error") or reason)),
                ("traceback", (data.get("traceback") or "")[-TRACEBACK_LIMIT:]),
                ("worker", data.get("worker", "")),
                ("result", None if result is None
                 else json.dumps(result, cls=result_field.encoder)),
                ("started_at", to_db_datetime(data.get("started_at"))),
                ("finished_at", to_db_datetime(data.get("finished_at"))),
                ("dead_reason", data.get("dead_reason", default_dead))):
            columns[name].append(value)
    types = ("bigint", "text", "text", "text", "text", "timestamptz", "timestamptz", "text")
    params += list(columns.values())
    arrays = ", ".join(f"%s::{pg_type}[]" for pg_type in types)
    return f"per_item AS (SELECT * FROM unnest({arrays}) AS p({', '.join(columns)}))"


def _drop_requeue_duplicates(ids: list[int], result: TransitionResult) -> list[int]:
    """Two finished items with one identifier cannot both become live: keep the newest."""
    newest: dict[tuple[int, str], int] = {}
    rows: list[tuple[int, int, str]] = []
    for chunk in chunked(ids, BATCH_LIMIT):
        rows += Item.objects.filter(pk__in=chunk).values_list("pk", "queue_id", "identifier")
    for pk, queue_id, identifier in sorted(rows):
        key = (queue_id, identifier)
        if key in newest:
            result.skipped[newest[key]] = "a newer item with the same identifier is also selected"
        newest[key] = pk
    dropped = set(result.skipped)
    return [pk for pk in ids if pk not in dropped]


def _record(transition_: Transition, changed: list[Changed], now: datetime, actor: str,
            reason: str, values: Mapping[int, Mapping]):
    """SQLite: events, counter deltas, attempts and dead letters of the rows a transition moved,
    one statement each (PostgreSQL writes them in the UPDATE's, see _update_recorded). Nothing
    listens for notifications on SQLite: its streams and selector poll."""
    if not changed:
        return
    at = to_db_datetime(now)

    def data(row: Changed) -> Mapping:
        return values.get(row.id, {})

    def error(row: Changed) -> str:
        return _clip_error(data(row).get("error") or reason)

    insert_rows(ItemEvent, EVENT_COLUMNS, [
        (row.id, row.queue_id, row.account, row.identifier, transition_.event, row.from_status,
         transition_.target, row.attempts, at, actor, error(row))
        for row in changed
    ])
    deltas: Counter = Counter()
    for row in changed:
        deltas[(row.queue_id, row.from_status)] -= 1
        deltas[(row.queue_id, transition_.target)] += 1
    counters.record(deltas, now)

    if transition_.attempt_outcome:
        result_field = Attempt._meta.get_field("result")
        insert_rows(Attempt, ATTEMPT_COLUMNS, [
            (row.id, row.attempts, to_db_datetime(data(row).get("started_at") or row.started_at),
             to_db_datetime(data(row).get("finished_at") or now),
             transition_.attempt_outcome, error(row),
             (data(row).get("traceback") or "")[-TRACEBACK_LIMIT:], data(row).get("worker", ""),
             result_field.get_db_prep_save(data(row).get("result"), connection))
            for row in changed
        ])
    if transition_.dead_letter:
        default_reason = WORKER_LOST if transition_.event == "lost" else "permanent"
        insert_rows(DeadLetter, DEAD_LETTER_COLUMNS, [
            (row.id, row.queue_id, row.account, data(row).get("dead_reason", default_reason),
             error(row), row.attempts, at, "")
            for row in changed
        ])
    if transition_.name == "requeue":
        DeadLetter.objects.filter(
            item_id__in=[row.id for row in changed], replayed_at__isnull=True
        ).update(replayed_at=now, replayed_by=actor)


def _explain_skipped(transition_: Transition, result: TransitionResult,
                     expected_attempts: Mapping[int, int] | None) -> dict[int, str]:
    moved = set(result.changed_ids) | set(result.skipped)
    rest = [pk for pk in result.requested if pk not in moved]
    if not rest:
        return {}
    reasons = {pk: "no such item" for pk in rest}
    for chunk in chunked(rest, BATCH_LIMIT):
        for pk, status, attempts in Item.objects.filter(pk__in=chunk).values_list(
            "pk", "status", "attempts"
        ):
            if status not in transition_.sources:
                label = Status(status).label.lower()
                if transition_.name == "cancel" and status == Status.RUNNING:
                    reasons[pk] = "it is running; running items are not cancelled mid-flight"
                else:
                    reasons[pk] = f"it is {label}"
            elif expected_attempts is not None and expected_attempts.get(pk) != attempts:
                reasons[pk] = (f"attempt {expected_attempts.get(pk)} is stale; "
                               f"the item is on attempt {attempts}")
            elif transition_.name == "requeue":
                reasons[pk] = LIVE_AGAIN
            else:
                reasons[pk] = "it changed concurrently"
    return reasons


def _clip_error(message: str | None) -> str:
    return storable_text((message or "")[:ERROR_LIMIT])


def storable_text(text: str) -> str:
    """A handler's error or traceback as PostgreSQL's text and every reader can hold it: a NUL
    or a lone surrogate would fail the statement recording its whole batch, so both are
    written out as escapes."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# --- the transitions callers use -------------------------------------------------------------

def retry_delay(backoff_seconds: list[int], retry_number: int,
                rng: random.Random = random) -> float:
    """Seconds before retry number `retry_number` (1-based), with +-10% jitter so that items
    failing together do not all come back in the same second. The last delay repeats."""
    base = backoff_seconds[min(retry_number, len(backoff_seconds)) - 1]
    return base * rng.uniform(0.9, 1.1)


def finish(queue: Queue, outcomes: Iterable[Outcome], *, worker: str, actor: str = "worker",
           guard: tuple[str, list] | None = None) -> dict[str, TransitionResult]:
    """Record the outcome of running attempts: one statement per outcome kind. A worker passes
    its claim (`claimed_by`) as the guard: the attempt number alone comes back after a retry
    resets it, and a frozen cluster's late result would then land on a newer run."""
    return _settle(queue, list(outcomes), lost=False, worker=worker, actor=actor, guard=guard)


def delete_finished(queue_id: int, ids: list[int], *, with_events: bool = True,
                    with_attempts: bool = True) -> Counter:
    """Delete finished items (retention, or an Admin's purge of dead letters) with their
    dead letters, attempts and events (the last two unless retention removes them by their own
    age); the counters lose them in the same transaction. An item that is live again by now is
    left alone, with its history."""
    deleted: Counter = Counter()
    if not ids:
        return deleted
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # The items first: the row lock makes a concurrent requeue wait, and only rows that
        # were still finished take their attempts, dead letters and events with them.
        cursor.execute(
            f"DELETE FROM {Item._meta.db_table} WHERE queue_id = %s AND id IN "
            f"({placeholders(len(ids))}) AND status IN ({placeholders(len(FINISHED_STATUSES))}) "
            f"RETURNING id, status", [queue_id, *ids, *FINISHED_STATUSES])
        gone = cursor.fetchall()
        if not gone:
            return deleted
        gone_ids = [pk for pk, _ in gone]
        marks = placeholders(len(gone_ids))
        history = [DeadLetter, *([Attempt] if with_attempts else []),
                   *([ItemEvent] if with_events else [])]
        for model in history:
            cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE item_id IN ({marks})",
                           gone_ids)
            deleted[model._meta.verbose_name_plural] += cursor.rowcount
        by_status = Counter(status for _, status in gone)
        counters.record({(queue_id, status): -n for status, n in by_status.items()},
                        timezone.now())
        deleted["items"] += len(gone)
    return deleted


def event_id_range() -> tuple[int, int]:
    """(one below the oldest event id, the newest): where a pass of retention's batches starts
    and ends. Both ends of the id index, so cheap however many events there are."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MIN(id), MAX(id) FROM {ItemEvent._meta.db_table}")
        oldest, newest = cursor.fetchone()
    return (oldest - 1, newest) if oldest is not None else (0, 0)


def delete_events_before(queue_ids: list[int], before: datetime, limit: int, *,
                         after_id: int, up_to_id: int) -> list[int]:
    """Up to `limit` events of these queues older than `before` with ids in (after_id,
    up_to_id], oldest ids first: events are written in time order, so these lie on neighbouring
    pages (deleting by item instead touched pages all over the table), and the id span bounds
    how many index entries of rows deleted before (which stay until vacuum) the batch walks
    past. Returns the ids deleted."""
    if not queue_ids:
        return []
    table = ItemEvent._meta.db_table
    moment = to_db_datetime(before)
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # `at` in the outer condition too: PostgreSQL then looks only in the old partitions.
        cursor.execute(
            f"DELETE FROM {table} WHERE at < %s AND (id, at) IN (SELECT id, at FROM {table} "
            f"WHERE at < %s AND id > %s AND id <= %s "
            f"AND queue_id IN ({placeholders(len(queue_ids))}) ORDER BY id LIMIT %s) "
            f"RETURNING id", [moment, moment, after_id, up_to_id, *queue_ids, limit])
        return [pk for (pk,) in cursor.fetchall()]


def rescue_lost(queue: Queue, attempts: Mapping[int, int], *, actor: str = "sweeper",
                error: str = WORKER_LOST, guard: tuple[str, list] | None = None
                ) -> dict[str, TransitionResult]:
    """Dispatched or running items whose worker vanished: the attempt counts, then retry or fail.
    `guard` re-checks, under the row lock, what the caller chose the items by (their status and
    age): a dispatched item that started meanwhile keeps its attempt number, so the number alone
    would let its running handler be declared lost."""
    outcomes = [Outcome(item_id=pk, attempt=n, error=error) for pk, n in attempts.items()]
    return _settle(queue, outcomes, lost=True, worker="", actor=actor, guard=guard)


def hand_back(clusters: list[str], why: str, whose: str) -> tuple[Counter, list[tuple]]:
    """What these clusters hold, handed back: dispatched items released, running ones retried
    or dead-lettered with the attempt counted (error "worker lost: cluster ... {why}"). Returns
    the counts by action and the lost items as (queue, cluster, "retry" or "fail", row)."""
    changed: Counter = Counter()
    lost: list[tuple] = []
    held = Item.objects.filter(status__in=IN_FLIGHT_STATUSES, cluster__in=clusters).values_list(
        "queue_id", "cluster", "status", "id", "attempts")[:BATCH_LIMIT]
    groups: dict[tuple, dict[int, int]] = {}
    for queue_id, cluster, status, pk, attempts in held:
        groups.setdefault((queue_id, cluster, status), {})[pk] = attempts
    queues = Queue.objects.in_bulk({queue_id for queue_id, _, _ in groups})
    for (queue_id, cluster, status), attempts in groups.items():
        queue = queues[queue_id]
        if status == Status.DISPATCHED:
            result = apply("release", list(attempts), actor="selector",
                           expected_attempts=attempts,
                           reason=f"cluster {cluster} {why} before starting it",
                           guard=("cluster = %s", [cluster]))
            changed[f"dispatched items of {whose} released"] += len(result.changed)
            continue
        results = rescue_lost(queue, attempts, actor="selector",
                              error=f"{WORKER_LOST}: cluster {cluster} {why}",
                              guard=("cluster = %s", [cluster]))
        for kind, result in results.items():
            changed[f"running items of {whose} lost, "
                    f"{'retried' if kind == 'retry' else 'failed'}"] += len(result.changed)
            lost += [(queue, cluster, kind, row) for row in result.changed]
    return changed, lost


def claim(batch: Iterable[Sequence[int]], cluster: str) -> dict[int, int]:
    """A worker task's claim on its dispatched batch, before it starts anything: the items still
    dispatched under the batch's token (attempt number and dispatch token) and claimed by no
    one take the cluster's name, so that a cluster that stops beating can be told what it held.
    Entries are [id, attempt, token], or [id, attempt] from tasks queued before tokens existed.
    Returns {item id: attempt number} of what this batch now holds."""
    groups: dict[tuple, list[int]] = {}
    for entry in batch:
        groups.setdefault(tuple(entry[1:3]), []).append(int(entry[0]))
    if not groups:
        return {}
    fence, params = [], [cluster, Status.DISPATCHED]
    for key, members in groups.items():
        token = "AND dispatch_token = %s" if len(key) > 1 else ""
        fence.append(f"(attempts = %s {token} AND id IN ({placeholders(len(members))}))")
        params += [*key, *members]
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Item._meta.db_table} SET cluster = %s WHERE status = %s AND cluster = '' "
            f"AND ({' OR '.join(fence)}) RETURNING id, attempts", params)
        return dict(cursor.fetchall())


def claim_waiting(queue_id: int, cluster: str, limit: int) -> list[list[int]]:
    """Items of the queue dispatched to a batch that no worker has picked up yet (all worker
    processes busy), claimed for a running batch with idle threads: the waiting batch finds them
    claimed and does nothing. Oldest dispatch first. Returns [id, attempt, dispatch token]."""
    table = Item._meta.db_table
    waiting = (f"SELECT id FROM {table} WHERE queue_id = %s AND status = %s AND cluster = '' "
               f"ORDER BY dispatched_at, id LIMIT %s")
    # Run once, as apply_selected's selection is: SKIP LOCKED run again per updated row would
    # find rows past the LIMIT.
    chosen = (f"id = ANY(ARRAY({waiting} FOR UPDATE SKIP LOCKED))" if is_postgres()
              else f"id IN ({waiting})")
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET cluster = %s WHERE cluster = '' AND status = %s AND {chosen} "
            f"RETURNING id, attempts, dispatch_token",
            [cluster, Status.DISPATCHED, queue_id, Status.DISPATCHED, limit])
        return [list(row) for row in cursor.fetchall()]


def start_claimed(ids: list[int], *, cluster: str, expected_attempts: Mapping[int, int],
                  tokens: Iterable[int]) -> list[dict]:
    """A worker starts items its cluster claimed: returns what their handlers need, for the
    items that moved (a stale one, rescued or released meanwhile, does not)."""
    guard = claimed_by(cluster, tokens)
    if not is_postgres():
        result = apply("start", ids, actor="worker", expected_attempts=expected_attempts,
                       guard=guard)
        return list(Item.objects.filter(pk__in=result.changed_ids).values(
            "id", "account", "identifier", "payload", "attempts", "task_path",
            token=F("dispatch_token")))
    # The UPDATE returns what the handlers need: no second read of the rows.
    with transaction.atomic(savepoint=False):
        changed = _update_recorded(TRANSITIONS["start"], "id = ANY(%s::bigint[])", [ids], ids,
                                   timezone.now(), "worker", "", expected_attempts, guard,
                                   returning=", payload, task_path")
    return _handler_rows(changed)


def _handler_rows(changed: list[Changed]) -> list[dict]:
    payload = Item._meta.get_field("payload")
    return [{"id": row.id, "account": row.account, "identifier": row.identifier,
             "attempts": row.attempts, "task_path": row.extra[1], "token": row.token,
             "payload": payload.from_db_value(row.extra[0], None, connection)}
            for row in changed]


def claimed_by(cluster: str, tokens: Iterable[int] = ()) -> tuple[str, list]:
    """The guard of a worker's own transitions on items it claimed (see `claim`)."""
    tokens = sorted(set(tokens))
    if not tokens:
        return "cluster = %s", [cluster]
    return f"cluster = %s AND dispatch_token IN ({placeholders(len(tokens))})", [cluster, *tokens]


def _settle(queue: Queue, outcomes: list[Outcome], *, lost: bool, worker: str,
            actor: str, guard: tuple[str, list] | None) -> dict[str, TransitionResult]:
    now = timezone.now()
    # Two outcomes of one item (a rescued item taken back by the batch still running its earlier
    # attempt): only the later attempt can be current, the earlier one is stale.
    latest: dict[int, Outcome] = {}
    for outcome in outcomes:
        if outcome.attempt >= latest.get(outcome.item_id, outcome).attempt:
            latest[outcome.item_id] = outcome
    groups: dict[str, dict[int, dict]] = {"complete": {}, "retry": {}, "fail": {}}
    fences: dict[int, int] = {}
    for outcome in latest.values():
        fences[outcome.item_id] = outcome.attempt
        data = {"worker": outcome.worker or worker, "error": outcome.error,
                "traceback": storable_text(outcome.traceback or ""), "result": outcome.result,
                "started_at": outcome.started_at, "finished_at": outcome.finished_at}
        exhausted = outcome.attempt >= 1 + queue.max_retries
        if outcome.error is None:
            groups["complete"][outcome.item_id] = data
        elif outcome.permanent or exhausted:
            data["dead_reason"] = ("permanent" if outcome.permanent
                                   else WORKER_LOST if lost else "exhausted")
            groups["fail"][outcome.item_id] = data
        else:
            delay = outcome.delay
            if delay is None:
                delay = retry_delay(queue.backoff_seconds, outcome.attempt)
            data["run_at"] = now + timedelta(seconds=delay)
            groups["retry"][outcome.item_id] = data
    results = {}
    with transaction.atomic(savepoint=False):
        for kind, items in groups.items():
            if not items:
                continue
            action = f"lost_{kind}" if lost else kind
            results[kind] = apply(action, list(items), actor=actor, expected_attempts=fences,
                                  values=items, guard=guard)
    return results
