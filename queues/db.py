"""Small helpers for the raw SQL that the ORM cannot express (UPDATE ... RETURNING, upserts on a
partial unique index), kept portable between PostgreSQL and SQLite."""

from datetime import UTC, datetime

from django.db import connection
from django.utils.dateparse import parse_datetime


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def to_db_datetime(value: datetime | None):
    """SQLite stores naive UTC text; PostgreSQL takes the aware datetime as it is."""
    if value is None:
        return None
    return connection.ops.adapt_datetimefield_value(value)


def from_db_datetime(value) -> datetime | None:
    """Raw cursors on SQLite return naive UTC datetimes or text; make them aware."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def typed(sql_param: str, pg_type: str) -> str:
    """A placeholder with a cast on PostgreSQL, where CASE branches need a declared type."""
    return f"{sql_param}::{pg_type}" if is_postgres() else sql_param


def chunked(values: list, size: int):
    for start in range(0, len(values), size):
        yield values[start:start + size]
