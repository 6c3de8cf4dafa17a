"""Find items by a field of their payload: `order = 59526`, `customer.id = 42`.

The value reads as JSON when it is JSON (`42`, `true`, `"42"`, `null`) and as a string
otherwise, and compares for equality at a dotted path. On PostgreSQL the condition is also
written as containment (`payload @> {"customer": {"id": 42}}`), which the GIN index on the
payloads of items at rest answers (the in-flight index finds the others); the path's equality
then rechecks the rows, so both databases select the same items.
"""

import json
import re
from dataclasses import dataclass

from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KeyTransform

from queues.engine import strictjson
from queues.models import AT_REST_STATUSES, IN_FLIGHT_STATUSES

MAX_DEPTH = 8
KEY = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
SYNTAX = "write a payload field as path = value, e.g. order = 59526 or customer.id = 42"


class PayloadFilterError(ValueError):
    pass


@dataclass(frozen=True)
class PayloadCondition:
    path: tuple[str, ...]
    value: object

    @property
    def text(self) -> str:
        return f"{'.'.join(self.path)} = {json.dumps(self.value, ensure_ascii=False)}"

    def apply(self, items):
        """`items` narrowed to this condition. The path is built as key transforms, never as
        a lookup string, so a key named like a lookup ("contains", "gt") stays a key."""
        value_at_path = "payload"
        for key in self.path:
            value_at_path = KeyTransform(key, value_at_path)
        # A None value means JSON null at the path (KeyTransformExact), not a missing key.
        items = items.alias(payload_at_path=value_at_path).filter(payload_at_path=self.value)
        if connection.vendor == "postgresql" and not any(k.isdigit() for k in self.path):
            nested = self.value
            for key in reversed(self.path):
                nested = {key: nested}
            # The GIN index holds only items at rest; the few in flight (at most the queues'
            # concurrency) are found by their own index. Both halves together are every item.
            items = items.filter(Q(payload__contains=nested)
                                 & (Q(status__in=AT_REST_STATUSES)
                                    | Q(status__in=IN_FLIGHT_STATUSES)))
        return items


def parse(text: str) -> PayloadCondition:
    path_text, equals, value_text = text.partition("=")
    if not equals:
        raise PayloadFilterError(SYNTAX)
    path = tuple(part.strip() for part in path_text.strip().split("."))
    if not path or len(path) > MAX_DEPTH or not all(KEY.match(part) for part in path):
        raise PayloadFilterError(
            f"the path is dotted keys of letters, digits, - and _ (at most {MAX_DEPTH}); "
            + SYNTAX)
    value_text = value_text.strip()
    try:
        value = json.loads(value_text, parse_constant=_not_json)
    except ValueError:
        value = value_text  # NaN and Infinity too: words, not JSON numbers
    if isinstance(value, dict | list):
        raise PayloadFilterError("compare with one value (a number, text, true, false or null)")
    try:
        # What no stored payload can hold (the API refuses it), the database cannot compare.
        strictjson.check_python(value)
    except strictjson.JSONBodyError as error:
        raise PayloadFilterError(f"the value: {error.message}") from None
    return PayloadCondition(path, value)


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")
