"""Argument types the commands share, so that what a shell passes is refused at the door with
a usage error, never a traceback from the database or the sleep that comes later."""

import argparse
import math
from datetime import datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from queues.engine import strictjson
from queues.models import PRINTABLE_TEXT, printable

LONGEST_WAIT_SECONDS = 86_400
MOST_PER_SECOND = 100_000


def text(value: str) -> str:
    """Names, accounts and keys: printable, since PostgreSQL's text cannot hold a NUL and the
    audit log and the streams are framed by lines."""
    if not printable(value):
        raise argparse.ArgumentTypeError(PRINTABLE_TEXT)
    return value


def seconds(value: str) -> float:
    """A wait or a time budget: a finite number of seconds above zero and at most a day (zero
    would spin a loop on the database; NaN, a negative or an infinite wait fails time.sleep
    after the first pass)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(number) and 0 < number <= LONGEST_WAIT_SECONDS):
        raise argparse.ArgumentTypeError(
            f"give seconds above 0 and at most {LONGEST_WAIT_SECONDS:,}, not {value!r}")
    return number


def count(value: str) -> int:
    """How many of something: a whole number of at least one."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"give at least 1, not {value!r}")
    return number


def rate(value: str) -> float:
    """Items per second: a finite number above zero (NaN or infinity ends the producer in a
    traceback when it first rounds the second's count)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not (math.isfinite(number) and 0 < number <= MOST_PER_SECOND):
        raise argparse.ArgumentTypeError(
            f"give a rate above 0 and at most {MOST_PER_SECOND:,} a second, not {value!r}")
    return number


def json_document(value: str):
    """A JSON value held to the API's rules (no duplicate keys, NUL, lone surrogates, huge
    numbers or deep nesting), so that the shell stores nothing the API would refuse."""
    try:
        return strictjson.decode_text(value)
    except strictjson.JSONBodyError as exc:
        where = "" if exc.field == "body" else f" at {exc.field}"
        raise argparse.ArgumentTypeError(f"not valid JSON{where}: {exc.message}") from None


def aware_datetime(value: str) -> datetime:
    """An ISO 8601 time with its zone: a time without one would be read in the server's."""
    try:
        moment = parse_datetime(value)
    except ValueError as exc:  # matched the format, but no such day or offset
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid time: {exc}") from None
    if moment is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO 8601 time")
    if timezone.is_naive(moment):
        raise argparse.ArgumentTypeError(f"{value!r} has no time zone; add Z or +01:00")
    return moment
