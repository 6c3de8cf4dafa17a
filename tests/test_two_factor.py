"""queues.engine.two_factor: an authenticator works only once confirmed, a code is accepted
once, wrong codes back off, recovery codes are single-use and replaceable, and every change,
recovery code spent and wrong code lands in the audit log."""

import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from queues.engine import two_factor
from queues.models import AuditEntry

pytestmark = pytest.mark.django_db


def code(device, steps=0) -> str:
    """The code the authenticator shows now, or `steps` time steps from now."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + steps * device.step
    return f"{totp.token():0{device.digits}d}"


def wrong(device) -> str:
    """A code of the right shape that the device refuses (none of the accepted time steps)."""
    accepted = {code(device, steps) for steps in (-1, 0, 1)}
    return next(f"{n:06d}" for n in range(1_000_000) if f"{n:06d}" not in accepted)


def actions():
    return list(AuditEntry.objects.order_by("id").values_list("action", flat=True))


@pytest.fixture
def ada():
    return User.objects.create_user("ada", password="a-long-password-1")


@pytest.fixture
def enrolled(ada):
    """ada with a confirmed authenticator; returns (device, recovery codes)."""
    device = two_factor.start(ada)
    return two_factor.confirm(ada, code(device))


@pytest.fixture
def no_backoff(settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    settings.OTP_STATIC_THROTTLE_FACTOR = 0


def test_a_started_authenticator_is_unconfirmed_and_not_a_login_device(ada):
    device = two_factor.start(ada)
    assert device.confirmed is False and two_factor.authenticator(ada) is None
    with pytest.raises(two_factor.CodeRefused, match="no authenticator"):
        two_factor.verify(ada, code(device))


def test_starting_again_replaces_the_unconfirmed_key(ada):
    first = two_factor.start(ada)
    second = two_factor.start(ada)
    assert list(TOTPDevice.objects.filter(user=ada)) == [second] and first.key != second.key


def test_a_wrong_first_code_leaves_it_unconfirmed(ada):
    device = two_factor.start(ada)
    with pytest.raises(two_factor.CodeRefused, match="wrong"):
        two_factor.confirm(ada, wrong(device))
    assert two_factor.authenticator(ada) is None and "two_factor.enrol" not in actions()


def test_the_right_first_code_confirms_it_with_ten_recovery_codes_and_is_audited(ada):
    device = two_factor.start(ada)
    confirmed, codes = two_factor.confirm(ada, code(device))
    assert confirmed.pk == device.pk and two_factor.authenticator(ada) == device
    assert len(set(codes)) == two_factor.RECOVERY_CODES == two_factor.recovery_codes_left(ada)
    entry = AuditEntry.objects.get(action="two_factor.enrol")
    assert (entry.actor, entry.target, entry.counts) == (ada, "user:ada", {"recovery_codes": 10})


def test_the_key_is_shown_in_base32_groups_an_app_accepts(ada):
    device = two_factor.start(ada)
    assert two_factor.secret_text(device).replace(" ", "") in device.config_url


def test_a_code_is_accepted_once(ada, enrolled):
    device, _ = enrolled
    later = code(device, 1)  # the confirming code used this time step
    assert two_factor.verify(ada, later) == device
    with pytest.raises(two_factor.CodeRefused, match="already used"):
        two_factor.verify(ada, later)


def test_codes_are_read_as_typed_with_spaces(ada, enrolled, no_backoff):
    device, codes = enrolled
    typed = code(device, 1)
    assert two_factor.verify(ada, f" {typed[:3]} {typed[3:]} ") == device
    assert two_factor.verify(ada, f"{codes[0][:4].upper()}-{codes[0][4:]}").pk is not None


def test_wrong_codes_back_off_and_are_audited_while_refusals_in_the_back_off_are_not(
        ada, enrolled):
    device, _ = enrolled
    with pytest.raises(two_factor.CodeRefused, match="wrong"):
        two_factor.verify(ada, wrong(device))
    # Within the back-off even the right code is not checked, and nothing more is recorded.
    with pytest.raises(two_factor.CodeRefused, match="Too many wrong codes: wait"):
        two_factor.verify(ada, code(device, 1))
    assert actions().count("two_factor.failed") == 1
    entry = AuditEntry.objects.get(action="two_factor.failed")
    assert entry.filter == {"kind": "authenticator"} and entry.counts == {"failures": 1}


def test_a_recovery_code_signs_in_once_and_is_audited_with_what_is_left(ada, enrolled):
    _, codes = enrolled
    assert isinstance(two_factor.verify(ada, codes[0]), StaticDevice)
    assert AuditEntry.objects.get(action="two_factor.recovery_code_used").counts == {"left": 9}
    with pytest.raises(two_factor.CodeRefused):
        two_factor.verify(ada, codes[0])
    assert two_factor.recovery_codes_left(ada) == 9


def test_new_recovery_codes_replace_the_old_ones(ada, enrolled, no_backoff):
    _, old = enrolled
    new = two_factor.regenerate_recovery_codes(ada)
    assert not set(old) & set(new) and StaticToken.objects.count() == 10
    with pytest.raises(two_factor.CodeRefused):
        two_factor.verify(ada, old[1])
    assert isinstance(two_factor.verify(ada, new[1]), StaticDevice)
    assert "two_factor.recovery_codes_replaced" in actions()


def test_a_code_of_another_user_is_refused(ada, enrolled):
    device, codes = enrolled
    bob = User.objects.create_user("bob")
    with pytest.raises(two_factor.CodeRefused):
        two_factor.verify(bob, code(device, 1))
    with pytest.raises(two_factor.CodeRefused):
        two_factor.verify(bob, codes[0])


def test_removing_deletes_the_authenticator_and_the_codes_audited_as_removal(ada, enrolled):
    assert two_factor.remove(ada, actor=ada) == 12  # two devices and the ten codes
    assert not TOTPDevice.objects.exists() and not StaticDevice.objects.exists()
    entry = AuditEntry.objects.get(action="two_factor.remove")
    assert entry.actor == ada and entry.counts == {"rows": 12}


def test_an_admin_reset_is_audited_as_a_reset_by_the_admin(ada, enrolled):
    admin = User.objects.create_user("root")
    two_factor.remove(ada, actor=admin)
    entry = AuditEntry.objects.get(action="two_factor.reset")
    assert (entry.actor, entry.target) == (admin, "user:ada")


def test_a_wrong_password_is_audited_as_a_failed_second_factor_change(ada):
    two_factor.record_failed_password(ada)
    assert AuditEntry.objects.get(action="two_factor.failed").filter == {"kind": "password"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_one_code_sent_twice_at_once_is_accepted_once():
    ada = User.objects.create_user("ada")
    device, _ = two_factor.confirm(ada, code(two_factor.start(ada)))
    typed = code(device, 1)
    barrier, answers = threading.Barrier(2), []

    def send():
        try:
            barrier.wait()
            two_factor.verify(ada, typed)
            answers.append(True)
        except two_factor.CodeRefused:
            answers.append(False)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [False, True]
