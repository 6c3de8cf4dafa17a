"""The OpenAPI 3.1 description of the JSON API, served beside it as openapi.json.

tests/test_api_openapi.py keeps it true: every route is described, and every response the tests
receive validates against the schema described for its status.
"""


from queues.conf import DEFAULTS, setting
from queues.engine.bulk import LIVE_AGAIN_CHECK_MAX
from queues.engine.forecast import REASONS
from queues.engine.lifecycle import BATCH_LIMIT, PRIORITY_RANGE
from queues.models import MAX_ACCOUNT_LENGTH, MAX_IDENTIFIER_LENGTH, Status

DATE_TIME = {"type": "string", "format": "date-time"}
NULLABLE_DATE_TIME = {"type": ["string", "null"], "format": "date-time"}


def _error(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(description: str, schema_name: str) -> dict:
    return {"description": description, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}}}


KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}}
PK = {"name": "pk", "in": "path", "required": True, "schema": {"type": "integer"}}
ACTION = {"name": "action", "in": "path", "required": True,
          "schema": {"type": "string", "enum": ["pause", "resume"]}}
ERROR_MEANINGS = {
    400: "Malformed JSON (see the enqueue operation).",
    404: "Unknown queue or operation.",
    413: "Body over the size limit.",
    415: "Content-Type is not application/json.",
    422: "Invalid fields; `fields` names each.",
}


def _errors(*codes: int) -> dict:
    return {str(code): _error(ERROR_MEANINGS[code]) for code in codes}


def _body(schema_name: str) -> dict:
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema_name}"}}}}


COMMON_ERRORS = {
    "401": _error("No token, or an unknown or revoked token."),
    "404": _error("No such queue, item or operation for this token, or a path the API does "
                  "not have (a JSON 404, never an HTML page)."),
    "403": _error("The token's scopes do not include this action (enqueue; operate: bulk "
                  "retry, cancel, replay, pause; purge; reading items and queues needs enqueue "
                  "or operate, a bulk operation the scope that starts its kind), or pausing "
                  "every queue without a token for all queues. A queue, item or operation outside "
                  "the token's queues answers 404, exactly like one that does not exist."),
    "405": _error("Method not allowed."),
    "503": _error("The database is unavailable; retry after the Retry-After seconds."),
}


def document(server: str = "/api/v1") -> dict:
    """The description of the API as mounted at `server` (the path its routes are included at,
    without the trailing slash)."""
    limits = {key: setting(key) for key in DEFAULTS}
    new_item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["account", "identifier"],
        "properties": {
            "account": {"type": "string", "minLength": 1, "maxLength": MAX_ACCOUNT_LENGTH,
                        "description": "The tenant the item belongs to; fairness is per account."},
            "identifier": {"type": "string", "minLength": 1, "maxLength": MAX_IDENTIFIER_LENGTH,
                           "description": "Unique among the queue's live items: enqueueing a "
                                          "live identifier again returns the existing item."},
            "payload": {"description": "Any JSON value; at most "
                                       f"{limits['API_MAX_PAYLOAD_BYTES']} bytes encoded.",
                        "default": {}},
            "run_at": {**NULLABLE_DATE_TIME,
                       "description": "Not before this time (with an offset); at most "
                                      f"{limits['API_MAX_DELAY_DAYS']} days ahead."},
            "priority": {"type": "integer", "minimum": PRIORITY_RANGE[0],
                         "maximum": PRIORITY_RANGE[1], "default": 0,
                         "description": "Higher first, within the item's account."},
        },
    }
    item = {
        "type": "object",
        "required": ["id", "queue", "account", "identifier", "status", "priority", "payload",
                     "attempts", "retries_left", "last_error", "next_run_at", "next_run_reason",
                     "delayed", "run_at", "created_at", "updated_at", "dispatched_at", "started_at",
                     "finished_at"],
        "properties": {
            "id": {"type": "integer"},
            "queue": {"type": "string"},
            "account": {"type": "string"},
            "identifier": {"type": "string"},
            "status": {"type": "string", "enum": list(Status.values)},
            "priority": {"type": "integer"},
            "payload": {},
            "attempts": {"type": "integer", "minimum": 0},
            "retries_left": {"type": ["integer", "null"], "minimum": 0,
                             "description": "Failed attempts still retried before the item "
                                            "moves to the dead letters: max_retries minus the "
                                            "attempts after the first, for queued, dispatched, "
                                            "running and retry items (a new item has all of "
                                            "them); 0 once failed; null once complete or "
                                            "cancelled."},
            "last_error": {"type": ["string", "null"]},
            "next_run_at": {**NULLABLE_DATE_TIME,
                            "description": "Estimated next run for waiting items (queued or "
                                           "retry): the retry time or a delayed start."},
            "next_run_reason": {
                "type": ["string", "null"], "enum": [*REASONS, None],
                "description": "For waiting items: `scheduled` (next_run_at is ahead), `due` "
                "(just reached), or why it has not run although due: `backlog ahead`, `queue "
                "full`; or what holds it whatever the time: `every queue paused`, `queue "
                "paused`, `account paused`, `account at cap`."},
            "delayed": {"type": "boolean"},
            "run_at": DATE_TIME,
            "created_at": DATE_TIME,
            "updated_at": DATE_TIME,
            "dispatched_at": NULLABLE_DATE_TIME,
            "started_at": NULLABLE_DATE_TIME,
            "finished_at": NULLABLE_DATE_TIME,
            "created": {"type": "boolean",
                        "description": "Enqueue responses only: false for a deduplicated item."},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "QueueAdmin API",
            "version": "1",
            "description": "Put work on queues and read its progress. Errors are "
                           "`{\"error\": {\"code\", \"message\", \"fields\"}}` with a 4xx "
                           "status, and a refused request writes nothing.",
        },
        "servers": [{"url": server}],
        "security": [{"bearer": []}],
        "paths": {
            "/queues": {"get": {
                "operationId": "listQueues",
                "summary": "Queues the token may use, with item counts per status.",
                "responses": {"200": _json("The queues.", "QueueList"), **COMMON_ERRORS},
            }},
            "/queues/{key}/items": {"post": {
                "operationId": "enqueue",
                "summary": f"Enqueue one item, or up to {BATCH_LIMIT} all or nothing.",
                "parameters": [{"name": "key", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "oneOf": [{"$ref": "#/components/schemas/NewItem"},
                              {"$ref": "#/components/schemas/NewItemBatch"}]}}}},
                "responses": {
                    "201": _json("Created (for a batch: at least one item was new).",
                                 "EnqueueResult"),
                    "200": _json("Every identifier was already live with the same payload.",
                                 "EnqueueResult"),
                    "400": _error("Malformed JSON, invalid UTF-8, a byte order mark, NaN, "
                                  "duplicate keys, out-of-range numbers, \\u0000 or lone "
                                  "surrogates, or nesting deeper than 32 levels."),
                    "404": _error("Unknown queue."),
                    "409": _error("A live item holds the identifier with a different payload."),
                    "429": _error("The queue (Queue.max_ready), or the account on it "
                                  "(its policy's max_ready), holds its most ready items; "
                                  "nothing was written. Retry after Retry-After seconds."),
                    "413": _error("Body over "
                                  f"{limits['API_MAX_BODY_BYTES']} bytes."),
                    "415": _error("Content-Type is not application/json."),
                    "422": _error("Well-formed JSON with invalid items; `fields` names each."),
                    **COMMON_ERRORS,
                },
            }},
            "/queues/{key}/bulk/preview": {"post": {
                "operationId": "previewBulk",
                "summary": "What a bulk retry, cancel, dead-letter replay or purge would change; "
                           "changes nothing and freezes a snapshot.",
                "parameters": [KEY],
                "requestBody": _body("BulkRequest"),
                "responses": {"200": _json("The preview and its confirmation.", "BulkPreview"),
                              **_errors(400, 404, 413, 415, 422), **COMMON_ERRORS},
            }},
            "/queues/{key}/bulk": {"post": {
                "operationId": "startBulk",
                "summary": "Confirm a preview: the operation runs in the background.",
                "description": "A confirmation starts one operation at most and expires 15 "
                               "minutes after its preview.",
                "parameters": [KEY],
                "requestBody": _body("Confirmation"),
                "responses": {
                    "202": _json("Started.", "BulkOperation"),
                    "200": _json("This confirmation was used before: the operation it started; "
                                 "nothing new starts.", "BulkOperation"),
                    "410": _error("The preview is older than 15 minutes; preview again."),
                    "409": _error("The eligible items inside the snapshot changed; `preview` "
                                  "holds the fresh counts and confirmation."),
                    **_errors(400, 404, 413, 415, 422), **COMMON_ERRORS},
            }},
            "/bulk/{pk}": {"get": {
                "operationId": "getBulk",
                "summary": "A bulk operation's progress and result.",
                "parameters": [PK],
                "responses": {"200": _json("The operation.", "BulkOperation"),
                              **_errors(404), **COMMON_ERRORS},
            }},
            "/bulk/{pk}/stop": {"post": {
                "operationId": "stopBulk",
                "summary": "Stop after the current step; finished steps stay applied.",
                "parameters": [PK],
                "responses": {"200": _json("The operation.", "BulkOperation"),
                              **_errors(404), **COMMON_ERRORS},
            }},
            "/queues/{key}/{action}": {"post": {
                "operationId": "pauseQueue",
                "summary": "Pause (drain mode) or resume a queue.",
                "parameters": [KEY, ACTION],
                "responses": {"200": _json("The queue's pause state.", "PauseState"),
                              **_errors(404), **COMMON_ERRORS},
            }},
            "/queues/{key}/accounts/{action}": {"post": {
                "operationId": "pauseAccount",
                "summary": "Pause or resume one account of a queue.",
                "parameters": [KEY, ACTION],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "required": ["account"],
                    "properties": {"account": {"type": "string", "minLength": 1,
                                               "maxLength": MAX_ACCOUNT_LENGTH}}}}}},
                "responses": {"200": _json("The account's pause state.", "PauseState"),
                              **_errors(400, 404, 413, 415, 422), **COMMON_ERRORS},
            }},
            "/{action}-all": {"post": {
                "operationId": "pauseAll",
                "summary": "Pause or resume every queue (a token for all queues only).",
                "parameters": [ACTION],
                "responses": {"200": _json("The global pause state.", "PauseState"),
                              **COMMON_ERRORS},
            }},
            "/items/{id}": {"get": {
                "operationId": "getItem",
                "summary": "One item: status, attempts, last error and next run estimate.",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "integer"}}],
                "responses": {"200": _json("The item.", "Item"),
                              "404": _error("No such item."), **COMMON_ERRORS},
            }},
        },
        "components": {
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token from `manage.py create_api_token`, scoped to queues."}},
            "schemas": {
                "NewItem": new_item,
                "NewItemBatch": {
                    "type": "object", "additionalProperties": False, "required": ["items"],
                    "properties": {"items": {"type": "array", "minItems": 1,
                                             "maxItems": BATCH_LIMIT,
                                             "items": {"$ref": "#/components/schemas/NewItem"}}},
                },
                "Item": item,
                "EnqueueResult": {"oneOf": [
                    {"allOf": [{"$ref": "#/components/schemas/Item"},
                               {"required": ["created"]}]},
                    {"type": "object", "required": ["created", "existing", "items"],
                     "properties": {
                         "created": {"type": "integer"}, "existing": {"type": "integer"},
                         "items": {"type": "array",
                                   "items": {"$ref": "#/components/schemas/Item"}}}},
                ]},
                "QueueList": {"type": "object", "required": ["queues"], "properties": {
                    "queues": {"type": "array", "items": {
                        "type": "object",
                        "required": ["key", "name", "handler", "paused", "counts"],
                        "properties": {
                            "key": {"type": "string"}, "name": {"type": "string"},
                            "handler": {"type": "string"}, "paused": {"type": "boolean"},
                            "counts": {"type": "object", "required": list(Status.values),
                                       "additionalProperties": {"type": "integer"}},
                        }}}}},
                "BulkRequest": {
                    "type": "object", "additionalProperties": False, "required": ["kind"],
                    "properties": {
                        "kind": {"type": "string",
                                 "enum": ["retry", "cancel", "replay", "purge"]},
                        "statuses": {"type": "array", "items": {"type": "string",
                                                                "enum": list(Status.values)},
                                     "description": "Ignored for replay and purge (failed)."},
                        "clock": {"type": "string",
                                  "enum": ["enqueued", "finished", "updated", "next_run"],
                                  "description": "Which time `from` and `to` bound: when "
                                  "items were enqueued, finished (failed, completed or "
                                  "cancelled), last updated, or are due to run. Default "
                                  "`finished` for retry, replay and purge, `enqueued` for "
                                  "cancel."},
                        "from": {**DATE_TIME, "description": "Start of the range on `clock` "
                                 "(inclusive), with a time-zone offset. A range of any length: "
                                 "the dashboard refuses typed ranges over 366 days to catch a "
                                 "mistyped year, and here a start must confirm the preview's "
                                 "count (`expected`), which shows such a slip first."},
                        "to": {**DATE_TIME, "description": "End of the range on `clock` "
                               "(exclusive), with a time-zone offset."},
                        "created_from": {**DATE_TIME, "description": "Older name of a range "
                                         "over the enqueued clock: same as `from` with "
                                         "`clock: enqueued`; not with `from`/`to`."},
                        "created_to": {**DATE_TIME, "description": "Older name of `to` over "
                                       "the enqueued clock."},
                        "account": {"type": "string"},
                        "identifier_prefix": {"type": "string",
                                              "description": "Identifiers starting with it."},
                        "error_contains": {"type": "string"},
                        "error_group": {"type": "string", "maxLength": 300,
                                        "description": "An error group's message as the "
                                        "errors page shows it: ids, numbers and quoted values "
                                        "as <uuid>, <hex>, <n> and '…'."},
                        "payload_filter": {"type": "string", "maxLength": 300,
                                           "description": "A payload field: `path = value` "
                                           "(`customer.id = 42`); the value reads as JSON, "
                                           "else as text."},
                        "reason": {"type": "string",
                                   "enum": ["", "permanent", "exhausted", "worker lost"]},
                        "ids": {"type": "array", "maxItems": 1000, "items": {"type": "integer"},
                                "description": "A selection instead of a time range."},
                    }},
                "Confirmation": {
                    "type": "object", "additionalProperties": False,
                    "required": ["frozen", "filter_hash", "expected"],
                    "properties": {"frozen": {"type": "string"},
                                   "filter_hash": {"type": "string"},
                                   "expected": {"type": "integer"}}},
                "BulkPreview": {
                    "type": "object",
                    "required": ["eligible", "matching", "ineligible", "too_many",
                                 "live_again_counted", "sample", "filter", "confirmation"],
                    "properties": {
                        "eligible": {"type": "integer"}, "matching": {"type": "integer"},
                        "ineligible": {"type": "object",
                                       "additionalProperties": {"type": "integer"}},
                        "too_many": {"type": "boolean"},
                        "live_again_counted": {
                            "type": "boolean",
                            "description": f"false past {LIVE_AGAIN_CHECK_MAX:,} eligible "
                                           "items: those whose identifier is live again are "
                                           "then among the eligible, and the operation "
                                           "skips them"},
                        "sample": {"type": "array", "items": {"type": "integer"}},
                        "filter": {"type": "object"},
                        "confirmation": {"$ref": "#/components/schemas/Confirmation"}}},
                "BulkOperation": {
                    "type": "object",
                    "required": ["id", "queue", "kind", "state", "expected", "changed",
                                 "skipped", "steps"],
                    "properties": {
                        "id": {"type": "integer"}, "queue": {"type": "string"},
                        "kind": {"type": "string"},
                        "state": {"type": "string", "enum": ["running", "stopping", "stopped",
                                                             "done", "failed"]},
                        "actor": {"type": "string"}, "filter": {"type": "object"},
                        "expected": {"type": "integer"}, "changed": {"type": "integer"},
                        "skipped": {"type": "object",
                                    "additionalProperties": {"type": "integer"}},
                        "steps": {"type": "integer"}, "error": {"type": ["string", "null"]},
                        "created_at": DATE_TIME, "finished_at": NULLABLE_DATE_TIME}},
                "PauseState": {
                    "type": "object", "required": ["paused", "paused_by", "paused_at"],
                    "properties": {"queue": {"type": "string"}, "account": {"type": "string"},
                                   "paused": {"type": "boolean"},
                                   "paused_by": {"type": ["string", "null"]},
                                   "paused_at": NULLABLE_DATE_TIME}},
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["code", "message", "fields"],
                    "properties": {
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "fields": {"type": "object",
                                   "additionalProperties": {"type": "string"}},
                        "item_id": {"type": ["integer", "null"]},
                        "preview": {"$ref": "#/components/schemas/BulkPreview"},
                    }}}},
            },
        },
    }
