"""Masking of sensitive payload values for readers below Operator. Each queue lists its
sensitive keys (Queue.sensitive_keys); a value is replaced at any depth when its key names one
of them by meaning, not by exact spelling: case, separators and camelCase do not count, and a
key containing a sensitive name counts ("db_password", "apiKey", "X-Auth-Token")."""

import re

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
