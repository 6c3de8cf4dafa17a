"""Export of a queue's filtered items as CSV or JSON: streamed in keyset chunks (each its own
short query, nothing held open while the client downloads) and bounded."""

import csv
import itertools
import json
from collections.abc import Iterable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from queues.models import Item, Queue
from queues.web import queries
from queues.web.masking import mask_payload

# Narrow the filter for more: a spreadsheet holds 1,048,576 rows. The rows stream in keyset
# chunks, so the web process's memory stays flat however many there are (bench soak).
MAX_ROWS = 1_000_000
CHUNK = 1000
BLOCK_CHARACTERS = 256 * 1024  # what one hop to the request's thread reads under ASGI
COLUMNS = ("id", "queue", "account", "identifier", "status", "priority", "attempts", "run_at",
           "last_error", "created_at", "updated_at", "finished_at", "payload")
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
# Also after blanks, which an import may trim, and in full width, which some read as ASCII.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def streaming(request, parts: Iterable[str], **kwargs) -> StreamingHttpResponse:
    """A download that streams in constant memory under ASGI as under WSGI. Under ASGI Django
    reads a synchronous iterator whole before it sends a byte (a 1,000,000-row export held 290
    MB in the web process); there it gets an asynchronous one that reads a block at a time in
    the request's own thread, where the database connection is."""
    if isinstance(request, ASGIRequest):
        return StreamingHttpResponse(_blocks(iter(parts)), **kwargs)
    return StreamingHttpResponse(parts, **kwargs)


async def _blocks(parts: Iterator[str]):
    read = sync_to_async(_next_block, thread_sensitive=True)
    while block := await read(parts):
        yield block


def _next_block(parts: Iterator[str]) -> str:
    """The next parts joined, up to about BLOCK_CHARACTERS; "" once there are none."""
    block, size = [], 0
    for part in parts:
        block.append(part)
        size += len(part)
        if size >= BLOCK_CHARACTERS:
            break
    return "".join(block)


def csv_download(request, rows: Iterable[str]) -> StreamingHttpResponse:
    """A CSV download that spreadsheets open as UTF-8: Excel reads a CSV without a byte order
    mark in the system's code page, and "café" or a Cyrillic account come out garbled."""
    return streaming(request, itertools.chain(["\ufeff"], rows),
                     content_type="text/csv; charset=utf-8")


def csv_cell(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "'" + text if text.lstrip(" \t\r\n\u3000").startswith(FORMULA_START) else text


class Echo:
    """A file-like object for csv.writer that hands each row back instead of storing it."""

    def write(self, value):
        return value


def items(queue: Queue, data: dict):
    """The filtered items in the list's order (newest first), chunk by chunk, at most MAX_ROWS;
    then None if more were left out."""
    order = queries.list_order(data)
    base = queries.filtered_items(queue, data)
    position, sent = None, 0
    while sent < MAX_ROWS:
        wanted = min(CHUNK, MAX_ROWS - sent)
        chunk = queries.listed(base, data, order, position, wanted + 1)
        yield from chunk[:wanted]
        if len(chunk) <= wanted:
            return
        sent += wanted
        position = queries.position_of(chunk[wanted - 1], order)
    yield None


def _record(item: Item, queue: Queue, masked: bool) -> dict:
    payload = mask_payload(item.payload, queue.sensitive_keys) if masked else item.payload
    return {
        "id": item.pk, "queue": queue.key, "account": item.account,
        "identifier": item.identifier, "status": item.status, "priority": item.priority,
        "attempts": item.attempts, "run_at": _time(item.run_at), "last_error": item.last_error,
        "created_at": _time(item.created_at), "updated_at": _time(item.updated_at),
        "finished_at": _time(item.finished_at), "payload": payload,
    }


def _time(value):
    return value.isoformat() if value else None


def csv_rows(queue: Queue, data: dict, *, masked: bool):
    writer = csv.writer(Echo())
    yield writer.writerow(COLUMNS)
    for item in items(queue, data):
        if item is None:
            yield writer.writerow([f"# stopped at {MAX_ROWS} rows; narrow the filter"])
            return
        record = _record(item, queue, masked)
        yield writer.writerow([csv_cell(record[c]) if isinstance(record[c], str | dict | list)
                               else record[c] for c in COLUMNS])


def json_chunks(queue: Queue, data: dict, *, masked: bool):
    """A JSON object with the items and whether the export was cut at MAX_ROWS."""
    yield '{"items": ['
    first, truncated = True, False
    for item in items(queue, data):
        if item is None:
            truncated = True
            break
        yield ("" if first else ",\n") + json.dumps(_record(item, queue, masked),
                                                    ensure_ascii=False)
        first = False
    yield f'], "truncated": {json.dumps(truncated)}, "limit": {MAX_ROWS}}}\n'
