"""Masking of sensitive payload values for readers below Operator. Each queue lists its
sensitive keys (Queue.sensitive_keys); a value under such a key is replaced at any depth, and
key names compare case-insensitively so that "Password" and "PASSWORD" are caught too."""

from queues.permissions import can_operate

MASK = "••••••"


def mask_payload(value, sensitive_keys):
    """A copy of a JSON value with the values of sensitive keys replaced by MASK."""
    keys = {str(key).lower() for key in sensitive_keys or ()}
    return _mask(value, keys) if keys else value


def _mask(value, keys: set[str]):
    if isinstance(value, dict):
        return {k: MASK if str(k).lower() in keys else _mask(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, keys) for v in value]
    return value


def payload_for(user, item):
    """The payload as this user may see it: whole for Operators and Admins, masked for Viewers."""
    if can_operate(user):
        return item.payload
    return mask_payload(item.payload, item.queue.sensitive_keys)
