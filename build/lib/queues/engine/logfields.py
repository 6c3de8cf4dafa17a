"""Fields of a log line about an item.

Lines about an item pass `extra=item_fields(...)`: with the JSON log format (queues.ops.logs)
queue, item and account become fields of that line, so a log pipeline can filter by them.
"""


def item_fields(queue: str, item: int, account: str, **more) -> dict:
    return {"queue": queue, "item": item, "account": account, **more}
