"""Argument types the commands share, so that what a shell passes is refused at the door with
a usage error, never a traceback from the database or the sleep that comes later."""

import argparse
import math

from queues.models import PRINTABLE_TEXT, printable

LONGEST_WAIT_SECONDS = 86_400


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
