"""Two-factor login with django-otp: one TOTP authenticator per user, confirmed by a first code,
and single-use recovery codes beside it. Every change, every recovery code spent and every
wrong code is audited here.

django-otp keeps what makes codes safe: a TOTP code is accepted once (the device remembers the
last time step it accepted) and each device backs off exponentially after wrong codes (1, 2, 4,
8 ... seconds). A code refused during the back-off is not even checked, so the audit entries for
wrong codes are as rate-limited as the guesses themselves.
"""

import re
from base64 import b32encode

from django.db import transaction
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from queues.engine import audit

RECOVERY_CODES = 10
DEVICE_NAME = "Authenticator"
RECOVERY_NAME = "Recovery codes"
# django-otp's recovery codes (StaticToken.random_token) are 8 base32 characters; a code of
# digits of any other length is an authenticator's.
RECOVERY_CODE_LENGTH = 8
SEPARATORS = re.compile(r"[\s-]+")
WRONG = "That code is wrong or was already used."
NO_AUTHENTICATOR = "You have no authenticator."
NOTHING_PENDING = "Start the set-up again: there is no authenticator waiting."


class CodeRefused(Exception):
    """A code that was wrong, already used, or sent while wrong codes are being throttled."""


def authenticator(user, *, confirmed: bool = True) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=confirmed).first()


def recovery_codes_left(user) -> int:
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


def secret_text(device: TOTPDevice) -> str:
    """The key as authenticator apps take it typed in: base32, in groups of four."""
    key = b32encode(device.bin_key).decode()
    return " ".join(key[i:i + 4] for i in range(0, len(key), 4))


@transaction.atomic
def start(user) -> TOTPDevice:
    """A fresh, unconfirmed authenticator with a new key, replacing any unconfirmed one. It does
    nothing (no login asks for it, no code of it is accepted at login) until confirm()."""
    TOTPDevice.objects.filter(user=user, confirmed=False).delete()
    return TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=False)


def confirm(user, code: str) -> tuple[TOTPDevice, list[str]]:
    """Confirm the user's pending authenticator with a code it shows; returns it and the new
    recovery codes, to be shown once."""
    with transaction.atomic():
        device = (TOTPDevice.objects.select_for_update()
                  .filter(user=user, confirmed=False).first())
        refusal = NOTHING_PENDING if device is None else _backing_off(device)
        accepted = refusal is None and device.verify_token(_normal(code))
        if accepted:
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            codes = _new_recovery_codes(user)
            audit.record(user, "two_factor.enrol", target=_target(user),
                         counts={"recovery_codes": len(codes)})
    if not accepted:
        raise CodeRefused(refusal or WRONG)
    return device, codes


def verify(user, code: str):
    """The device that accepts `code`: a code of the user's authenticator, or one of their
    recovery codes (spent by this call). Raises CodeRefused otherwise."""
    code = _normal(code)
    is_totp = code.isdigit() and len(code) != RECOVERY_CODE_LENGTH
    model = TOTPDevice if is_totp else StaticDevice
    with transaction.atomic():
        device = model.objects.select_for_update().filter(user=user, confirmed=True).first()
        if device is None:
            refusal = NO_AUTHENTICATOR if is_totp else WRONG
        else:
            refusal = _backing_off(device)
        accepted = refusal is None and device.verify_token(code)
        if accepted and not is_totp:
            audit.record(user, "two_factor.recovery_code_used", target=_target(user),
                         counts={"left": device.token_set.count()})
        elif refusal is None and not accepted:
            audit.record(user, "two_factor.failed", target=_target(user),
                         filter={"kind": "authenticator" if is_totp else "recovery code"},
                         counts={"failures": device.throttling_failure_count})
    if not accepted:
        raise CodeRefused(refusal or WRONG)
    return device


def record_failed_password(user):
    """A wrong password given to confirm a change of the second factor (django-axes throttles
    these as it throttles logins)."""
    audit.record(user, "two_factor.failed", target=_target(user),
                 filter={"kind": "password"})


@transaction.atomic
def regenerate_recovery_codes(user) -> list[str]:
    """New recovery codes; the old ones stop working."""
    codes = _new_recovery_codes(user)
    audit.record(user, "two_factor.recovery_codes_replaced", target=_target(user),
                 counts={"recovery_codes": len(codes)})
    return codes


@transaction.atomic
def remove(user, *, actor) -> int:
    """Turn two-factor login off for `user`: the authenticator and recovery codes are deleted,
    so sessions verified with them are no longer verified. `actor` is the user themself or an
    Admin resetting it (audited as such). Returns the rows deleted (devices and codes)."""
    deleted = (TOTPDevice.objects.filter(user=user).delete()[0]
               + StaticDevice.objects.filter(user=user).delete()[0])
    action = "two_factor.remove" if actor == user else "two_factor.reset"
    audit.record(actor, action, target=_target(user), counts={"rows": deleted})
    return deleted


def _new_recovery_codes(user) -> list[str]:
    # The same device keeps the new codes, so that a session verified with an old code stays
    # verified (its device is still there) while the old codes stop working.
    device = (StaticDevice.objects.filter(user=user, confirmed=True).first()
              or StaticDevice.objects.create(user=user, name=RECOVERY_NAME, confirmed=True))
    StaticDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
    StaticToken.objects.filter(device__user=user).delete()
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


def _target(user) -> str:
    return f"user:{user.get_username()}"


def _normal(code: str) -> str:
    """Codes as people type them: spaces and dashes ignored, recovery codes in any case."""
    return SEPARATORS.sub("", code).lower()


def _backing_off(device) -> str | None:
    """Why the device checks no code now (it backs off after wrong ones), or None."""
    allowed, throttle = device.verify_is_allowed()
    if allowed:
        return None
    wait = max(1, round((throttle["locked_until"] - timezone.now()).total_seconds()))
    return f"Too many wrong codes: wait {wait} s before the next try."
