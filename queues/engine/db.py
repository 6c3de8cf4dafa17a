"""Small helpers for the raw SQL that the ORM cannot express (UPDATE ... RETURNING, upserts on a
partial unique index), kept portable between PostgreSQL and SQLite."""

from contextlib import contextmanager
from datetime import UTC, datetime

from django.db import connection, transaction
from django.utils.dateparse import parse_datetime


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@contextmanager
def sorts_off():
    """Statements run inside read their ORDER BY from an index rather than sort. For a statement
    whose order an index gives exactly: on a queue the statistics do not know yet (a new
    queue's first items, before autoanalyze) PostgreSQL estimates one row and rates a smaller
    index plus a sort as cheap, and that plan reads the queue's whole set (410,183 entries for
    a page of 20 accounts beside 10,000 ready items; 190 ms for a list's first page beside
    50,000 queued items at 10M). As in the selector's rounds, sorts are ruled out for the
    statements inside only, then set back."""
    if not is_postgres():
        yield
        return
    if not connection.in_atomic_block:
        # A transaction of its own, whose end ends the setting.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('enable_sort', 'off', true)")
            yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort'), "
                       "set_config('enable_sort', 'off', true)")
        before = cursor.fetchone()[0]
        yield
        # Set back for the rest of the caller's transaction. (After an error it is not: the
        # transaction is rolled back, and that undoes the setting too.)
        cursor.execute("SELECT set_config('enable_sort', %s, true)", [before])


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


def insert_rows(model, columns: tuple[str, ...], rows: list[tuple], *, suffix: str = "",
                returning: str = "") -> list[tuple]:
    """Multi-row INSERT of values prepared for the database; returns the RETURNING rows.

    The hot paths write thousands of rows a second. Django's bulk_create spends more time
    compiling each statement than the database spends running it, and a VALUES list of 1000
    rows has 12,000 placeholders for the driver to parse; on PostgreSQL, unnest() of one array
    per column takes the whole batch in a dozen parameters.
    """
    if not rows:
        return []
    table = model._meta.db_table
    tail = f" {suffix}" + (f" RETURNING {returning}" if returning else "")
    results: list[tuple] = []
    with connection.cursor() as cursor:
        if is_postgres():
            arrays = ", ".join(f"%s::{_column_type(model, column)}[]" for column in columns)
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays}){tail}",
                [list(column) for column in zip(*rows, strict=True)],
            )
            return cursor.fetchall() if returning else []
        for part in chunked(rows, 1000):
            values = ", ".join([f"({placeholders(len(columns))})"] * len(part))
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}{tail}",
                [value for row in part for value in row],
            )
            if returning:
                results += cursor.fetchall()
    return results


def _column_type(model, column: str) -> str:
    field = next(f for f in model._meta.concrete_fields if f.column == column)
    if field.is_relation:
        return field.target_field.rel_db_type(connection)
    return field.cast_db_type(connection).split("(")[0]  # varchar(200)[] -> varchar[]
