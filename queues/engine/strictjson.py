"""Strict JSON: one meaning per document or value, or a precise error.

Python's json module is lenient where producers in other languages would disagree with us: it
accepts NaN and Infinity, duplicate keys (last wins), integers of any size, lone surrogates and
NUL characters. Each of those is refused here with the path of the offending value.
`check_python` holds Python values (the django.tasks backend's arguments) to the same rules.
"""

import json
import math
from decimal import Decimal

# JavaScript and many JSON libraries lose precision above 2**53; refuse rather than round.
MAX_SAFE_INTEGER = 2**53 - 1
# PostgreSQL's jsonb writes every number without an exponent: 1e20 would read back as an
# integer of 21 digits, which this module refuses (and JavaScript rounds).
BIG_FLOAT_WHY = (f" (at most ±{MAX_SAFE_INTEGER}: a larger number reads back from the database "
                 f"as an integer of its every digit)")
# PostgreSQL's numbers have no sign of zero: -0.0 reads back as 0.0, which a client comparing
# what it sent with what it reads (or a payload filter on SQLite against one on PostgreSQL) sees.
NEGATIVE_ZERO_WHY = "is a negative zero, which the database reads back as 0; send 0"
MAX_DEPTH = 32
UTF8_BOM = b"\xef\xbb\xbf"


class JSONBodyError(ValueError):
    def __init__(self, message: str, field: str = "body"):
        super().__init__(message)
        self.message = message
        self.field = field


def _parse_int(text: str) -> int:
    # Checked on the digits before int() so a 100,000-digit number costs nothing.
    if len(text.lstrip("-")) > 16 or abs(int(text)) > MAX_SAFE_INTEGER:
        raise JSONBodyError(f"integer {text[:20]}{'…' if len(text) > 20 else ''} is out of range "
                            f"(at most ±{MAX_SAFE_INTEGER})")
    return int(text)


class _Refused(float):
    """A number the API refuses (`why`), refused by check_values, which knows its path."""

    text: str
    why: str


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONBodyError(f"number {text[:20]} is out of range")
    if abs(value) > MAX_SAFE_INTEGER:
        why = f"is out of range{BIG_FLOAT_WHY}"
    elif _negative_zero(value):
        why = NEGATIVE_ZERO_WHY
    # Stored as given or refused: 0.10000000000000000555 would silently read back as 0.1. The
    # smallest float PostgreSQL writes back in 330 digits (it never uses an exponent), which
    # must be accepted again.
    elif len(text) > 400 or Decimal(text) != Decimal(repr(value)):
        why = f"cannot be stored exactly; it would read back as {value!r}"
    else:
        return value
    refused = _Refused(value)
    refused.text, refused.why = text[:40], why
    return refused


def _refuse_constant(name: str):
    raise JSONBodyError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise JSONBodyError(f"duplicate key {key!r}")
        result[key] = value
    return result


def decode(body: bytes):
    """Decode a request body; raises JSONBodyError with a message fit for the client."""
    if body.startswith(UTF8_BOM):
        raise JSONBodyError("the body starts with a byte order mark; send UTF-8 without one")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONBodyError(f"the body is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise JSONBodyError("the body is empty; send a JSON object")
    try:
        document = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float,
            parse_constant=_refuse_constant, object_pairs_hook=_no_duplicate_keys,
        )
    except RecursionError:
        raise JSONBodyError(f"the document is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise JSONBodyError(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                            ) from None
    check_values(document)
    return document


def decode_text(text: str):
    """decode() for text already read (a form field, a shell argument); a lone surrogate in it
    reaches check_values' refusal instead of failing the encoding."""
    return decode(text.encode("utf-8", "surrogatepass"))


def check_values(document, path: str = ""):
    """Refuse too-deep nesting, NUL characters and lone surrogates anywhere in the document,
    naming the first offending path. Iterative, so depth cannot exhaust the stack."""
    stack = [(document, path, 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise JSONBodyError(f"the document is nested deeper than {MAX_DEPTH} levels",
                                where or "body")
        if isinstance(value, str):
            _check_string(value, where)
        elif isinstance(value, _Refused):
            raise JSONBodyError(f"number {value.text} {value.why}", where or "body")
        elif isinstance(value, dict):
            for key, child in value.items():
                child_path = f"{where}.{key}" if where else str(key)
                _check_string(key, child_path)
                stack.append((child, child_path, depth + 1))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{index}]", depth + 1)
                         for index, child in enumerate(value))


def check_python(value, path: str = "", *, negative_zero: bool = False):
    """The same rules for a Python value that never was JSON text, such as the arguments of a
    django.tasks task: JSON types only (a tuple reads as an array), string keys, integers and
    finite floats within ±MAX_SAFE_INTEGER other than -0.0 (unless `negative_zero`), then
    check_values' rules, so that it stores and reads back as the API would have it. Raises
    JSONBodyError naming the first offending path."""
    stack = [(value, path, 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:  # also ends a list that contains itself
            raise JSONBodyError(f"the value is nested deeper than {MAX_DEPTH} levels",
                                where or "body")
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):
                    raise JSONBodyError(f"keys must be strings, not {type(key).__name__}",
                                        where or "body")
                child_path = f"{where}.{key}" if where else key
                _check_string(key, child_path)
                stack.append((child, child_path, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((child, f"{where}[{index}]", depth + 1)
                         for index, child in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, where)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_SAFE_INTEGER:
                raise JSONBodyError(f"integer {value} is out of range "
                                    f"(at most ±{MAX_SAFE_INTEGER})", where or "body")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise JSONBodyError(f"number {value} is not valid JSON", where or "body")
            if abs(value) > MAX_SAFE_INTEGER:
                raise JSONBodyError(f"number {value} is out of range{BIG_FLOAT_WHY}",
                                    where or "body")
            if not negative_zero and _negative_zero(value):
                raise JSONBodyError(f"number {value} {NEGATIVE_ZERO_WHY}", where or "body")
        else:
            raise JSONBodyError(f"a {type(value).__name__} is not a JSON value",
                                where or "body")


def _negative_zero(value: float) -> bool:
    return value == 0 and math.copysign(1.0, value) < 0


def _check_string(value: str, where: str):
    if "\x00" in value:
        raise JSONBodyError("strings must not contain \\u0000", where or "body")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise JSONBodyError("strings must not contain lone surrogates (\\ud800-\\udfff)",
                            where or "body") from None
