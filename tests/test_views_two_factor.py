"""Two-factor login in the dashboard (queues.web.two_factor, queues.permissions): setting up an
authenticator from its QR code, the code asked after the password before any page or mutation,
recovery codes, turning it off, the Admin requirement, and the reset by an Admin."""

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.test import Client
from django_otp.plugins.otp_static.models import StaticDevice
from django_otp.plugins.otp_totp.models import TOTPDevice

from queues.engine import tokens, two_factor
from queues.models import ApiToken, AuditEntry, UserPreference
from tests.factories import QueueFactory
from tests.test_two_factor import code, wrong

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-password-1"
VERIFY = "/accounts/login/code/"
SETTINGS = "/accounts/two-factor/"


def make_user(name, role="Viewer"):
    user = User.objects.create_user(name, password=PASSWORD)
    user.groups.add(Group.objects.get(name=role))
    return user


def enrol(user):
    """A confirmed authenticator for `user`; returns (device, recovery codes). Its current code
    is spent: the next one is code(device, 1)."""
    return two_factor.confirm(user, code(two_factor.start(user)))


def sign_in(username, address="10.0.0.1"):
    """A client past the password step of the login form."""
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": username, "password": PASSWORD})
    assert response.status_code == 302
    return client


def codes_on(response) -> list[str]:
    return re.findall(r"<li><code>([a-z2-7]{8})</code></li>", response.content.decode())


@pytest.fixture
def ada():
    return make_user("ada")


@pytest.fixture
def no_backoff(settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    settings.OTP_STATIC_THROTTLE_FACTOR = 0


@pytest.fixture
def admins_need_it(settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "REQUIRE_TWO_FACTOR_FOR_ADMINS": True}


# --- Setting it up ----------------------------------------------------------------------------


def test_the_header_links_every_user_to_their_two_factor_settings(role_client):
    assert f'href="{SETTINGS}"' in role_client("Viewer").get("/").content.decode()


def test_setting_up_shows_a_qr_code_and_the_key_in_a_response_never_cached(client, ada):
    client.force_login(ada)
    page = client.get(SETTINGS)
    assert page.status_code == 200 and b"Set up an authenticator app" in page.content
    assert client.post("/accounts/two-factor/setup/")["Location"] == SETTINGS
    page = client.get(SETTINGS)
    device = TOTPDevice.objects.get(user=ada)
    html = page.content.decode()
    assert '<img src="data:image/svg+xml' in html and 'alt="QR code' in html
    assert two_factor.secret_text(device) in html
    assert "no-store" in page["Cache-Control"]


def test_a_wrong_first_code_is_refused_and_two_factor_stays_off(client, ada):
    client.force_login(ada)
    client.post("/accounts/two-factor/setup/")
    device = TOTPDevice.objects.get(user=ada)
    response = client.post("/accounts/two-factor/confirm/", {"code": wrong(device)})
    assert response.status_code == 400 and b"wrong or was already used" in response.content
    assert two_factor.authenticator(ada) is None


def test_the_right_first_code_turns_it_on_and_shows_ten_recovery_codes_once(client, ada):
    client.force_login(ada)
    client.post("/accounts/two-factor/setup/")
    device = TOTPDevice.objects.get(user=ada)
    response = client.post("/accounts/two-factor/confirm/", {"code": code(device)})
    shown = codes_on(response)
    assert response.status_code == 200 and len(shown) == 10
    assert "no-store" in response["Cache-Control"]
    assert set(shown) == set(StaticDevice.objects.get(user=ada).token_set
                             .values_list("token", flat=True))
    # This session gave the code, so it goes on; the codes are not shown again.
    page = client.get(SETTINGS)
    assert page.status_code == 200 and b"10 recovery codes left" in page.content
    assert not set(shown) & set(re.findall(r"[a-z2-7]{8}", page.content.decode()))
    assert client.get("/").status_code == 200
    assert AuditEntry.objects.filter(action="two_factor.enrol", actor=ada).exists()


def test_an_unconfirmed_authenticator_asks_for_nothing_at_login(ada):
    two_factor.start(ada)
    assert sign_in("ada").get("/").status_code == 200


def test_a_second_setup_is_refused_while_one_is_on(client, ada):
    device, _ = enrol(ada)
    client.force_login(ada)
    client.post(VERIFY, {"code": code(device, 1)})
    client.post("/accounts/two-factor/setup/")
    assert list(TOTPDevice.objects.filter(user=ada)) == [device]


# --- Signing in -------------------------------------------------------------------------------


def test_after_the_password_every_page_waits_for_the_code(ada):
    device, _ = enrol(ada)
    client = sign_in("ada")
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == f"{VERIFY}?next=/"
    page = client.get(response["Location"])
    assert page.status_code == 200 and b'name="code"' in page.content
    done = client.post(VERIFY, {"code": code(device, 1), "next": "/"})
    assert done.status_code == 302 and done["Location"] == "/"
    assert client.get("/").status_code == 200


def test_mutations_wait_for_the_code_and_change_nothing(ada):
    enrol(ada)
    client = sign_in("ada")
    response = client.post("/preferences/", {"time_zone": "Europe/Paris"})
    assert response.status_code == 302 and response["Location"].startswith(VERIFY)
    assert not UserPreference.objects.filter(user=ada).exists()


def test_htmx_requests_move_the_whole_page_to_the_code(ada):
    enrol(ada)
    response = sign_in("ada").get("/", HTTP_HX_REQUEST="true",
                                  HTTP_HX_CURRENT_URL="http://testserver/audit/")
    assert response["HX-Redirect"] == f"{VERIFY}?next=/audit/"


def test_the_live_stream_and_the_admin_site_wait_for_the_code_too():
    user = make_user("root", "Admin")
    enrol(user)
    client = sign_in("root")
    assert client.get("/stream/events/").status_code == 403
    response = client.get("/django-admin/", follow=True)
    assert response.redirect_chain[-1][0].startswith(VERIFY)


def test_the_code_starts_a_new_session_key(ada):
    device, _ = enrol(ada)
    client = sign_in("ada")
    before = client.cookies["sessionid"].value
    client.post(VERIFY, {"code": code(device, 1)})
    assert client.cookies["sessionid"].value != before


def test_a_replayed_code_is_refused(ada):
    device, _ = enrol(ada)  # the confirming code used this time step
    typed = code(device, 1)
    assert sign_in("ada").post(VERIFY, {"code": typed}).status_code == 302
    replay = sign_in("ada", address="10.0.0.2").post(VERIFY, {"code": typed})
    assert replay.status_code == 400 and b"wrong or was already used" in replay.content


def test_wrong_codes_are_throttled_and_audited(ada):
    device, _ = enrol(ada)
    client = sign_in("ada")
    assert client.post(VERIFY, {"code": wrong(device)}).status_code == 400
    throttled = client.post(VERIFY, {"code": code(device, 1)})
    assert throttled.status_code == 400 and b"Too many wrong codes: wait" in throttled.content
    assert client.get("/").status_code == 302
    entry = AuditEntry.objects.get(action="two_factor.failed")
    assert entry.actor == ada and entry.filter == {"kind": "authenticator"}


def test_a_recovery_code_signs_in_once(ada):
    _, codes = enrol(ada)
    client = sign_in("ada")
    response = client.post(VERIFY, {"code": codes[0]}, follow=True)
    assert response.status_code == 200 and b"recovery code; 9 left" in response.content
    again = sign_in("ada", address="10.0.0.2").post(VERIFY, {"code": codes[0]})
    assert again.status_code == 400
    assert AuditEntry.objects.get(action="two_factor.recovery_code_used").counts == {"left": 9}


@pytest.mark.parametrize("target", ["https://evil.example/", "²", "queues:audit"])
def test_the_code_page_goes_only_to_pages_of_this_site(ada, target):
    device, _ = enrol(ada)
    response = sign_in("ada").post(VERIFY, {"code": code(device, 1), "next": target})
    assert (response.status_code, response["Location"]) == (302, "/")


def test_the_code_page_sends_a_user_with_nothing_to_give_on(role_client):
    response = role_client("Viewer").get(f"{VERIFY}?next=/audit/")
    assert response.status_code == 302 and response["Location"] == "/audit/"


def test_a_session_signed_in_before_the_setup_elsewhere_must_give_the_code(ada):
    earlier = sign_in("ada")
    assert earlier.get("/").status_code == 200
    enrol(ada)
    assert earlier.get("/")["Location"].startswith(VERIFY)


# --- Recovery codes and turning it off ---------------------------------------------------------


@pytest.fixture
def verified(ada, no_backoff):
    """ada signed in with password and code; returns (client, device, recovery codes)."""
    device, codes = enrol(ada)
    client = sign_in("ada")
    client.post(VERIFY, {"code": codes[-1]})
    return client, device, codes


def test_new_recovery_codes_need_a_code_and_replace_the_old_ones(verified, ada):
    client, device, old = verified
    refused = client.post("/accounts/two-factor/recovery-codes/", {})
    assert refused.status_code == 400 and b"Type a code or your password" in refused.content
    response = client.post("/accounts/two-factor/recovery-codes/", {"code": code(device, 1)})
    new = codes_on(response)
    assert response.status_code == 200 and len(new) == 10 and not set(new) & set(old)
    with pytest.raises(two_factor.CodeRefused):
        two_factor.verify(ada, old[0])
    assert AuditEntry.objects.filter(action="two_factor.recovery_codes_replaced").exists()


def test_new_recovery_codes_keep_a_session_signed_in_with_an_old_one(verified):
    client, _, _ = verified  # signed in with the last recovery code
    response = client.post("/accounts/two-factor/recovery-codes/", {"password": PASSWORD})
    assert len(codes_on(response)) == 10
    assert client.get("/").status_code == 200


def test_turning_it_off_with_a_wrong_password_is_refused_and_audited(verified, ada):
    client, _, _ = verified
    response = client.post("/accounts/two-factor/remove/", {"password": "not-it"})
    assert response.status_code == 400 and b"That password is wrong" in response.content
    assert two_factor.authenticator(ada) is not None
    assert AuditEntry.objects.get(action="two_factor.failed").filter == {"kind": "password"}


def test_turning_it_off_with_the_password_leaves_the_password_alone(verified, ada):
    client, _, _ = verified
    response = client.post("/accounts/two-factor/remove/", {"password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == SETTINGS
    assert not TOTPDevice.objects.filter(user=ada).exists()
    assert not StaticDevice.objects.filter(user=ada).exists()
    assert AuditEntry.objects.get(action="two_factor.remove").actor == ada
    assert sign_in("ada", address="10.0.0.2").get("/").status_code == 200


def test_turning_it_off_with_a_code(verified, ada):
    client, device, _ = verified
    client.post("/accounts/two-factor/remove/", {"code": code(device, 1)})
    assert two_factor.authenticator(ada) is None


def test_own_settings_wait_for_the_code_as_well(ada):
    enrol(ada)
    client = sign_in("ada")
    for url in ("/accounts/two-factor/remove/", "/accounts/two-factor/recovery-codes/"):
        assert client.post(url, {"password": PASSWORD})["Location"].startswith(VERIFY)
    assert client.get(SETTINGS)["Location"].startswith(VERIFY)
    assert two_factor.authenticator(ada) is not None


# --- Required for Admins ----------------------------------------------------------------------


def test_required_an_admin_without_an_authenticator_can_only_set_one_up(admins_need_it):
    make_user("root", "Admin")
    client = sign_in("root")
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == f"{SETTINGS}?next=/"
    page = client.get(SETTINGS)
    assert page.status_code == 200 and b"Your role needs two-factor login" in page.content
    created = client.post("/tokens/create/", {"name": "sneaky", "all_queues": "on"})
    assert created.status_code == 302 and created["Location"].startswith(SETTINGS)
    assert not ApiToken.objects.exists()
    assert client.get("/django-admin/", follow=True).redirect_chain[-1][0].startswith(SETTINGS)
    assert client.get("/stream/events/").status_code == 403


def test_required_an_admin_goes_on_once_enrolled(admins_need_it):
    make_user("root", "Admin")
    client = sign_in("root")
    client.post("/accounts/two-factor/setup/")
    device = TOTPDevice.objects.get(user__username="root")
    assert len(codes_on(client.post("/accounts/two-factor/confirm/",
                                    {"code": code(device)}))) == 10
    assert client.get("/").status_code == 200
    assert client.get("/tokens/").status_code == 200


def test_required_it_applies_to_admins_only(admins_need_it, ada):
    assert sign_in("ada").get("/").status_code == 200


def test_required_api_tokens_keep_working(admins_need_it):
    QueueFactory(key="q")
    _, secret = tokens.create("producer", all_queues=True, scopes=tokens.SCOPES)
    response = Client().post("/api/v1/queues/q/items", {"account": "acme", "identifier": "a-1"},
                             content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 201


# --- Reset by an Admin ------------------------------------------------------------------------


def test_an_admin_resets_another_users_second_factor_from_the_users_list(role_client, ada):
    enrol(ada)
    client = role_client("Admin")
    listing = client.get("/django-admin/auth/user/")
    assert b"Two-factor login" in listing.content and b"reset_two_factor" in listing.content
    response = client.post("/django-admin/auth/user/", {
        "action": "reset_two_factor", "_selected_action": [ada.pk]})
    assert response.status_code == 302
    assert two_factor.authenticator(ada) is None
    assert not StaticDevice.objects.filter(user=ada).exists()
    entry = AuditEntry.objects.get(action="two_factor.reset")
    assert entry.actor == client.user and entry.target == "user:ada"
    assert sign_in("ada").get("/").status_code == 200


def test_device_secrets_are_not_in_the_admin_site():
    assert not admin.site.is_registered(TOTPDevice)
    assert not admin.site.is_registered(StaticDevice)
