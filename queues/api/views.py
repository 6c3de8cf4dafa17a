"""The JSON API (at /api/v1/ in the standalone project): bearer tokens, no session, no CSRF,
and a strict bad-input contract: every refusal is a JSON error with a 4xx status, and nothing
is written."""

import functools
import json
from datetime import datetime, timedelta

from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from queues.api import openapi as openapi_document
from queues.conf import setting
from queues.engine import (
    accounts,
    bulk,
    counters,
    forecast,
    lifecycle,
    pausing,
    strictjson,
    tokens,
)
from queues.engine.errors import MESSAGE_LIMIT
from queues.models import (
    LIVE_STATUSES,
    MAX_ACCOUNT_LENGTH,
    MAX_ID,
    TIME_BOUNDS_TEXT,
    AccountPolicy,
    BulkOperation,
    Item,
    Queue,
    Status,
    canonical,
    time_in_bounds,
)

ITEM_FIELDS = {"account", "identifier", "payload", "run_at", "priority"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: dict | None = None,
                 **extra):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.fields = fields or {}
        self.extra = extra


# Escaped as in Django's json_script: a response rendered as HTML by mistake runs nothing.
HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def json_response(data, status: int = 200) -> HttpResponse:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(HTML_SAFE)
    return HttpResponse(body, status=status, content_type="application/json")


def error_response(error: ApiError) -> HttpResponse:
    body = {"error": {"code": error.code, "message": error.message, "fields": error.fields,
                      **error.extra}}
    response = json_response(body, status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="queueadmin"'
    elif error.status == 503:
        response["Retry-After"] = "5"
    elif error.status == 429:
        response["Retry-After"] = str(error.extra.get("retry_after", 60))
    return response


def api_view(*methods):
    """Wraps an API view: method check, bearer authentication, JSON errors, and 503 when the
    database cannot be reached (never a 500 or an HTML page)."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    response = error_response(ApiError(
                        405, "method_not_allowed",
                        f"{request.method} is not allowed here; use {', '.join(methods)}"))
                    response["Allow"] = ", ".join(methods)
                    return response
                request.token = _authenticate(request)
                return view(request, *args, **kwargs)
            except ApiError as error:
                return error_response(error)
            except (OperationalError, InterfaceError):
                return error_response(ApiError(
                    503, "unavailable", "the database is unavailable; try again shortly"))

        wrapped.allowed_methods = methods  # read by the OpenAPI test
        return wrapped

    return decorate


def _authenticate(request):
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "unauthorized", "send a token: Authorization: Bearer <token>")
    token = tokens.authenticate(secret.strip())
    if token is None:
        raise ApiError(401, "unauthorized", "the token is unknown or revoked")
    return token


def _require(token, scope: str):
    if not tokens.may(token, scope):
        raise ApiError(403, "forbidden", f"this token's scopes ({', '.join(token.scopes)}) do not "
                                         f"include {scope}")


def _bulk_scope(kind) -> str:
    """Purging deletes for good and has its own scope; the other bulk kinds operate."""
    return tokens.PURGE if kind == BulkOperation.Kind.PURGE else tokens.OPERATE


def _queue_for(token, key: str) -> Queue:
    # A queue outside the token's scope answers as one that does not exist, so that keys
    # cannot be enumerated with a token for another queue.
    queue = Queue.objects.filter(key=key).first()
    if queue is None or not tokens.allows(token, queue.pk):
        raise ApiError(404, "unknown_queue", f"there is no queue {key!r}", {"queue": "unknown"})
    return queue


def _read_json(request):
    if request.content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "send Content-Type: application/json")
    limit = setting("API_MAX_BODY_BYTES")
    too_large = ApiError(413, "too_large", f"the body is over {limit} bytes")
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            raise too_large
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number") from None
    # Read one byte past the limit: a body without Content-Length is still refused, unread.
    body = request.read(limit + 1)
    if len(body) > limit:
        raise too_large
    try:
        return strictjson.decode(body)
    except strictjson.JSONBodyError as exc:
        raise ApiError(400, "invalid_json", exc.message, {exc.field[:200]: exc.message}) from None


def _invalid(fields: dict) -> ApiError:
    first = next(iter(fields.items()))
    more = f" (and {len(fields) - 1} more)" if len(fields) > 1 else ""
    return ApiError(422, "invalid", f"{first[0]}: {first[1]}{more}", fields)


def _iso_datetime(value) -> datetime:
    """ISO 8601 with an offset; raises ValueError with the reason."""
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 string with a time-zone offset")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("is not an ISO 8601 date-time, e.g. 2026-01-31T09:30:00Z") from None
    if timezone.is_naive(parsed):
        raise ValueError("has no time-zone offset; add Z or +HH:MM")
    if not time_in_bounds(parsed):
        raise ValueError(TIME_BOUNDS_TEXT)
    return parsed


def _parse_run_at(value, now: datetime) -> datetime | None:
    if value is None:
        return None
    parsed = _iso_datetime(value)
    horizon = setting("API_MAX_DELAY_DAYS")
    if parsed - now > timedelta(days=horizon):
        raise ValueError(f"is more than {horizon} days ahead")
    return parsed


def _parse_item(document, prefix: str, now: datetime) -> dict:
    """One item of a request as lifecycle.normalise_item wants it; fields named with `prefix`."""
    if not isinstance(document, dict):
        raise _invalid({prefix.rstrip(".") or "body": "must be an object"})
    fields = {}
    for name in sorted(set(document) - ITEM_FIELDS):
        fields[prefix + name] = "unknown field"
    for name in ("account", "identifier"):
        if name not in document:
            fields[prefix + name] = "is required"
        elif not isinstance(document[name], str):
            fields[prefix + name] = "must be a string"
    # Only the fields given: an explicit null is refused where the schema says integer.
    item = {name: document[name] for name in ITEM_FIELDS if name in document}
    try:
        item["run_at"] = _parse_run_at(document.get("run_at"), now)
    except ValueError as exc:
        fields[prefix + "run_at"] = str(exc)
    limit = setting("API_MAX_PAYLOAD_BYTES")
    size = len(json.dumps(document.get("payload"), ensure_ascii=False).encode())
    if size > limit:
        fields[prefix + "payload"] = f"is {size} bytes; at most {limit}"
    if not fields:
        try:
            lifecycle.normalise_item(item, now)
        except lifecycle.EnqueueError as exc:
            fields.update({prefix + name: reason for name, reason in exc.fields.items()})
    if fields:
        raise _invalid(fields)
    return item


def _parse_items(document, now: datetime) -> tuple[list[dict], bool]:
    """The items of a request body, and whether it was a batch."""
    if not isinstance(document, dict):
        raise _invalid({"body": "must be a JSON object: one item, or {\"items\": [...]}"})
    if "items" not in document:
        return [_parse_item(document, "", now)], False
    if set(document) != {"items"}:
        extra = sorted(set(document) - {"items"})
        raise _invalid({name: "unknown field beside items" for name in extra})
    items = document["items"]
    limit = lifecycle.BATCH_LIMIT
    if not isinstance(items, list):
        raise _invalid({"items": "must be an array"})
    if not 1 <= len(items) <= limit:
        raise _invalid({"items": f"must hold 1 to {limit} items; got {len(items)}"})
    return [_parse_item(item, f"items[{index}].", now) for index, item in enumerate(items)], True


def _time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _retries_left(item: Item, queue: Queue) -> int | None:
    """Failed attempts still retried: attempts counts runs, and the first run is no retry.
    0 for a dead letter, None once complete or cancelled."""
    if item.status == Status.FAILED:
        return 0
    if item.status not in LIVE_STATUSES:
        return None
    # Not below 0 when the queue's max_retries was lowered after the item's attempts.
    return max(0, queue.max_retries - max(0, item.attempts - 1))


def item_json(item: Item, queue: Queue, now: datetime, next_runs: dict | None = None) -> dict:
    """`next_runs` (queues.engine.forecast) is computed once for a batch of items."""
    waiting = item.status in (Status.QUEUED, Status.RETRY)
    if next_runs is None:
        next_runs = forecast.next_runs(queue, [item], now)
    next_run = next_runs.get(item.pk)
    return {
        "id": item.pk,
        "queue": queue.key,
        "account": item.account,
        "identifier": item.identifier,
        "status": item.status,
        "priority": item.priority,
        "payload": item.payload,
        "attempts": item.attempts,
        "retries_left": _retries_left(item, queue),
        "last_error": item.last_error or None,
        # When the selector may next pick the item: its retry time, or a delayed start; and
        # why it has not run yet if that time is past (queues.engine.forecast).
        "next_run_at": _time(item.run_at) if waiting else None,
        "next_run_reason": next_run.reason if next_run else None,
        "delayed": waiting and item.run_at > now,
        "run_at": _time(item.run_at),
        "created_at": _time(item.created_at),
        "updated_at": _time(item.updated_at),
        "dispatched_at": _time(item.dispatched_at),
        "started_at": _time(item.started_at),
        "finished_at": _time(item.finished_at),
    }


@api_view("POST")
def enqueue(request, key):
    queue = _queue_for(request.token, key)
    _require(request.token, tokens.ENQUEUE)
    now = timezone.now()
    items, batch = _parse_items(_read_json(request), now)
    try:
        saved = lifecycle.enqueue_many(queue.key, items, actor=f"api:{request.token.name}")
    except lifecycle.IdentifierConflict as exc:
        raise ApiError(409, "identifier_conflict", exc.message, exc.fields,
                       item_id=exc.existing_id) from None
    except lifecycle.OverLimit as exc:
        raise ApiError(429, "over_limit", exc.message, exc.fields,
                       retry_after=exc.retry_after) from None
    except lifecycle.UnknownQueue:  # deleted between the scope check and the insert
        raise ApiError(404, "unknown_queue", f"there is no queue {key!r}",
                       {"queue": "unknown"}) from None
    except lifecycle.EnqueueError as exc:
        raise _invalid(exc.fields or {"body": exc.message}) from None
    except DatabaseError as exc:
        if isinstance(exc, OperationalError | InterfaceError):
            raise
        raise ApiError(422, "invalid", "the database refused the item", {"body": str(exc)[:200]}
                       ) from None
    created = sum(1 for item in saved if item.created)
    status = 201 if created else 200
    if not batch:
        return json_response({**item_json(saved[0], queue, now), "created": saved[0].created},
                            status=status)
    runs = forecast.next_runs(queue, saved, now)
    return json_response({
        "created": created,
        "existing": len(saved) - created,
        "items": [{**item_json(item, queue, now, runs), "created": item.created}
                  for item in saved],
    }, status=status)


def _require_reading(token):
    """Items and queues are read with enqueue or operate; a purge-only token deletes dead
    letters it is told of and reads nothing, as its holder may not see payloads."""
    if not (tokens.may(token, tokens.ENQUEUE) or tokens.may(token, tokens.OPERATE)):
        raise ApiError(403, "forbidden", f"this token's scopes ({', '.join(token.scopes)}) do not "
                                         "include enqueue or operate, which reading needs")


@api_view("GET")
def item_detail(request, item_id):
    _require_reading(request.token)
    item = Item.objects.select_related("queue").filter(pk=item_id).first()
    if item is None or not tokens.allows(request.token, item.queue_id):
        raise ApiError(404, "not_found", f"there is no item {item_id}")
    return json_response(item_json(item, item.queue, timezone.now()))


@api_view("GET")
def queue_list(request):
    _require_reading(request.token)
    queues = Queue.objects.order_by("key")
    allowed = tokens.queue_ids(request.token)
    if allowed is not None:
        queues = queues.filter(pk__in=allowed)
    queues = list(queues)
    counts = counters.status_counts([queue.pk for queue in queues])
    return json_response({"queues": [
        {
            "key": queue.key,
            "name": queue.name,
            "handler": queue.handler,
            "paused": queue.paused,
            "counts": {status: counts.get(queue.pk, {}).get(status, 0) for status in Status.values},
        }
        for queue in queues
    ]})


# --- bulk operations, dead letters, pause and resume ------------------------------------------

BULK_FIELDS = {"kind", "statuses", "clock", "from", "to", "created_from", "created_to",
               "account", "identifier_prefix", "error_contains", "error_group", "payload_filter",
               "reason", "ids"}


def _object(document, allowed: set[str]) -> dict:
    if not isinstance(document, dict):
        raise _invalid({"body": "must be a JSON object"})
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise _invalid({name: "unknown field" for name in unknown})
    return document


def _text(document: dict, name: str, fields: dict, limit: int = 200) -> str:
    value = document.get(name, "")
    if not isinstance(value, str) or len(value) > limit:
        fields[name] = f"must be a string of at most {limit} characters"
        return ""
    return value


def _aware(document: dict, name: str, fields: dict) -> datetime | None:
    try:
        return _iso_datetime(document.get(name))
    except ValueError:
        fields[name] = "must be an ISO 8601 date-time with a time-zone offset"
        return None


def _bulk_range(document: dict, clock: str, fields: dict):
    """`from` and `to` bound the `clock` (the kind's natural one when absent);
    `created_from`/`created_to` are the older names of a range over the enqueued clock."""
    aliases = "created_from" in document or "created_to" in document
    if aliases and ("from" in document or "to" in document):
        fields["from"] = "give from/to or created_from/created_to, not both"
        return None, None, clock
    if aliases:
        if clock not in ("", "enqueued"):
            fields["clock"] = "created_from/created_to range over the enqueued clock; use from/to"
        return (_aware(document, "created_from", fields), _aware(document, "created_to", fields),
                "enqueued")
    return _aware(document, "from", fields), _aware(document, "to", fields), clock


def _bulk_filter(queue: Queue, document) -> bulk.BulkFilter:
    """A bulk request's filter, checked field by field (422 naming each bad one)."""
    document = _object(document, BULK_FIELDS)
    fields: dict[str, str] = {}
    kind = document.get("kind")
    ids = document.get("ids", [])
    if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 < i <= MAX_ID for i in ids):
        fields["ids"] = "must be an array of item ids"
        ids = []
    statuses = document.get("statuses", [])
    if not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses):
        fields["statuses"] = "must be an array of statuses"
        statuses = []
    clock = _text(document, "clock", fields)
    if ids:
        # A selection is not chosen by time: a range beside it would be dropped, so refuse it.
        for name in sorted({"from", "to", "created_from", "created_to", "clock"} & set(document)):
            fields[name] = "a selection of ids takes no time range"
        statuses = statuses or list(Status.values)
        start, end = bulk.selection_range()
    else:
        start, end, clock = _bulk_range(document, clock, fields)
    account = _text(document, "account", fields)
    identifier_prefix = _text(document, "identifier_prefix", fields)
    error_contains = _text(document, "error_contains", fields)
    error_group = _text(document, "error_group", fields, limit=MESSAGE_LIMIT)
    payload_filter = _text(document, "payload_filter", fields, limit=300)
    reason = _text(document, "reason", fields)
    if fields:
        raise _invalid(fields)
    try:
        return bulk.BulkFilter.build(queue, kind, statuses, start, end, account,
                                     error_contains, ids=ids, reason=reason, clock=clock,
                                     identifier_prefix=identifier_prefix,
                                     error_group=error_group, payload=payload_filter)
    except bulk.BulkError as exc:
        fields = exc.fields or {"body": exc.message}
        if "from" in document or "to" in document:
            # The engine names its range created_from/created_to; this request said from/to.
            fields = {{"created_from": "from", "created_to": "to"}.get(name, name): message
                      for name, message in fields.items()}
        raise _invalid(fields) from None


def _preview_json(preview: bulk.Preview) -> dict:
    return {"eligible": preview.eligible, "matching": preview.matching,
            "ineligible": preview.ineligible, "too_many": preview.too_many,
            "live_again_counted": preview.live_again_counted,
            "sample": [item.pk for item in preview.sample],
            "filter": preview.filter.as_json(), "confirmation": bulk.confirmation(preview)}


def operation_json(operation: BulkOperation) -> dict:
    return {"id": operation.pk, "queue": operation.queue.key, "kind": operation.kind,
            "state": operation.state, "actor": operation.actor_name,
            "filter": operation.filter, "expected": operation.expected,
            "changed": operation.changed, "skipped": operation.skipped,
            "steps": operation.steps, "error": operation.error or None,
            "created_at": _time(operation.created_at),
            "finished_at": _time(operation.finished_at)}


@api_view("POST")
def bulk_preview(request, key):
    queue = _queue_for(request.token, key)
    bulk_filter = _bulk_filter(queue, _read_json(request))
    _require(request.token, _bulk_scope(bulk_filter.kind))
    return json_response(_preview_json(bulk.preview(bulk_filter)))


@api_view("POST")
def bulk_start(request, key):
    queue = _queue_for(request.token, key)
    document = _object(_read_json(request), {"frozen", "filter_hash", "expected"})
    if not isinstance(document.get("frozen"), str) or not isinstance(
            document.get("filter_hash"), str) or not isinstance(document.get("expected"), int):
        raise _invalid({"body": "send the confirmation of a preview: frozen, filter_hash and "
                                "expected"})
    try:
        confirmed = bulk.from_confirmation(document["frozen"])
        if confirmed.filter.queue_id != queue.pk:
            raise bulk.BulkError("the confirmation is for another queue", {"frozen": "queue"})
        _require(request.token, _bulk_scope(confirmed.filter.kind))
        operation, started = bulk.start_confirmed(
            confirmed, expected=document["expected"], filter_hash=document["filter_hash"],
            actor=request.token)
    except bulk.ConfirmationExpired as exc:
        raise ApiError(410, "expired", exc.message, exc.fields) from None
    except bulk.StalePreview as stale:
        raise ApiError(409, "stale_preview", stale.message,
                       preview=_preview_json(stale.fresh)) from None
    except bulk.BulkError as exc:
        raise _invalid(exc.fields or {"body": exc.message}) from None
    # A repeated confirmation started nothing: the operation it had started.
    return json_response(operation_json(operation), status=202 if started else 200)


def _operation_for(token, pk: int) -> BulkOperation:
    operation = BulkOperation.objects.select_related("queue").filter(pk=pk).first()
    if operation is None or not tokens.allows(token, operation.queue_id):
        raise ApiError(404, "not_found", f"there is no bulk operation {pk}")
    return operation


@api_view("GET")
def bulk_detail(request, pk):
    operation = _operation_for(request.token, pk)
    _require(request.token, _bulk_scope(operation.kind))  # the scope that could start it
    return json_response(operation_json(operation))


@api_view("POST")
def bulk_stop(request, pk):
    operation = _operation_for(request.token, pk)
    _require(request.token, _bulk_scope(operation.kind))
    bulk.stop(operation, actor=request.token)
    operation.refresh_from_db()
    return json_response(operation_json(operation))


def _pause_json(target) -> dict:
    return {"paused": target.paused, "paused_by": target.paused_by or None,
            "paused_at": _time(target.paused_at)}


@api_view("POST")
def queue_pause(request, key, action):
    queue = _queue_for(request.token, key)
    _require(request.token, tokens.OPERATE)
    pausing.set_queue_paused(queue, action == "pause", actor=request.token)
    return json_response({"queue": queue.key, **_pause_json(queue)})


@api_view("POST")
def account_pause(request, key, action):
    queue = _queue_for(request.token, key)
    _require(request.token, tokens.OPERATE)
    document = _object(_read_json(request), {"account"})
    account = document.get("account")
    # Measured as stored: composing (NFC) can lengthen text.
    if (not isinstance(account, str) or not account.strip()
            or len(canonical(account)) > MAX_ACCOUNT_LENGTH):
        raise _invalid({"account": "must be a non-empty string of at most "
                                   f"{MAX_ACCOUNT_LENGTH} characters"})
    account = canonical(account)
    # As an item's account (no item could belong to another), or a padded name an earlier
    # release stored, while it holds data.
    if why := accounts.refusal(account):
        raise _invalid({"account": why})
    pausing.set_account_paused(queue, account, action == "pause", actor=request.token)
    policy = AccountPolicy.objects.filter(queue=queue, account=account).first()
    return json_response({"queue": queue.key, "account": account,
                          **(_pause_json(policy) if policy else
                             {"paused": False, "paused_by": None, "paused_at": None})})


@api_view("POST")
def global_pause(request, action):
    # Every queue at once: only a token that may use every queue.
    if not request.token.all_queues:
        raise ApiError(403, "forbidden", "pausing every queue needs a token for all queues")
    _require(request.token, tokens.OPERATE)
    pausing.set_global_paused(action == "pause", actor=request.token)
    return json_response(_pause_json(pausing.global_pause()))


@csrf_exempt
def not_found(request, path=""):
    """Any other path under the API: a JSON 404, as a client reading JSON expects."""
    return error_response(ApiError(404, "not_found", "there is no such API endpoint; see "
                                                     "openapi.json"))


@csrf_exempt
def openapi(request):
    """The API's description; public like any API reference, and it reads no data."""
    if request.method != "GET":
        return error_response(ApiError(405, "method_not_allowed", "use GET"))
    # The API is wherever the project included its routes, so the document says where.
    root = reverse("queues_api:openapi").removesuffix("/openapi.json")
    return json_response(openapi_document.document(server=root))
