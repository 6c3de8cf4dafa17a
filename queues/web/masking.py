"""Masking of sensitive payload values for readers below Operator. Each queue lists its
sensitive keys (Queue.sensitive_keys); a value is replaced at any depth when its key names one
of them by meaning, not by exact spelling: case, separators and camelCase do not count, and a
key containing a sensitive name counts ("db_password", "apiKey", "X-Auth-Token")."""

import re

from queues.engine import payloads
from queues.permissions import can_operate

MASK = "••••••"
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[\W_]+")


def normalised_key(key) -> str:
    """'apiKey', 'API_KEY', 'api-key' and 'api key' all read 'apikey'."""
    return _SEPARATORS.sub("", _CAMEL.sub("_", str(key))).lower()


def mask_payload(value, sensitive_keys):
    """A copy of a JSON value with the values of sensitive keys replaced by MASK."""
    names = {normalised_key(key) for key in sensitive_keys or ()} - {""}
    return _mask(value, names) if names else value


def _sensitive(key, names: set[str]) -> bool:
    key = normalised_key(key)
    return any(name in key for name in names)


def is_sensitive(key, sensitive_keys) -> bool:
    """Whether a payload key names one of the sensitive keys, by meaning (as masking reads it)."""
    return _sensitive(key, {normalised_key(name) for name in sensitive_keys or ()} - {""})


def mask_filter(stored: dict, sensitive_keys) -> dict:
    """An audit entry's filter with its payload condition's value masked when the path names a
    sensitive key: the log is read by Viewers, and the value is what the operator typed."""
    text = (stored or {}).get("payload")
    if not text:
        return stored
    try:
        path = payloads.parse(text).path
    except payloads.PayloadFilterError:
        return stored
    if not any(is_sensitive(key, sensitive_keys) for key in path):
        return stored
    return {**stored, "payload": f"{'.'.join(path)} = {MASK}"}


def masked_keys(user, queue) -> list[str]:
    """The queue's sensitive keys if this user sees them masked, else none."""
    return [] if can_operate(user) else list(queue.sensitive_keys or ())


def _mask(value, names: set[str]):
    if isinstance(value, dict):
        return {k: MASK if _sensitive(k, names) else _mask(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, names) for v in value]
    return value


def payload_for(user, item):
    """The payload as this user may see it: whole for Operators and Admins, masked for Viewers."""
    return value_for(user, item.queue, item.payload)


def value_for(user, queue, value):
    """A JSON value of one of the queue's items (its payload, what a task returned) as this user
    may see it."""
    if can_operate(user):
        return value
    return mask_payload(value, queue.sensitive_keys)
