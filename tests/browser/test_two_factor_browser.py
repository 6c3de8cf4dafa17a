"""Two-factor login in Debian's headless Chromium, as a person does it: an Admin opens
"Two-factor login" from the header, scans (here: reads) the QR code's key, types the app's
code, keeps the recovery codes, and from then on signs in with password and code. Every page
passes axe-core, and the QR code, a data: image, loads under the Content-Security-Policy."""

import time
from base64 import b32decode

from django_otp.oath import TOTP

from tests.browser.seed import PASSWORD
from tests.browser.support import check_accessibility, playwright_or_skip, sign_in

playwright_sync = playwright_or_skip()
SEED = "users"  # the dashboard_server fixture's seed (tests/browser/conftest.py)


def app_code(key_text: str, steps: int = 0) -> str:
    """What an authenticator app shows for the key typed in, `steps` time steps from now."""
    totp = TOTP(b32decode(key_text.replace(" ", "")))
    totp.time = time.time() + steps * totp.step
    return f"{totp.token():06d}"


def test_an_admin_turns_on_two_factor_login_and_signs_in_with_a_code(dashboard_server, chromium,
                                                                    axe):
    server = dashboard_server
    expect = playwright_sync.expect
    problems = []
    page = chromium.new_page()
    page.on("pageerror", lambda e: problems.append(str(e)))
    # A CSP refusal (of the QR code's data: image, say) is a console error.
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    sign_in(page, server, "admin")

    page.get_by_role("link", name="Two-factor login").click()
    page.get_by_role("button", name="Set up an authenticator app").click()
    qr = page.get_by_role("img", name="QR code of the authenticator's set-up key")
    expect(qr).to_be_visible()
    assert qr.evaluate("img => img.complete && img.naturalWidth > 0")
    check_accessibility(page, axe, "two-factor-setup")
    key = page.get_by_label("Or type the key").input_value()
    page.get_by_label("Code shown by the app").fill(app_code(key))
    page.get_by_role("button", name="Turn on two-factor login").click()
    expect(page.get_by_role("heading", name="Two-factor login is on")).to_be_visible()
    expect(page.locator("main li code")).to_have_count(10)
    check_accessibility(page, axe, "two-factor-recovery-codes")

    page.get_by_role("button", name="Log out").click()
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server}/accounts/login/code/?next=/")
    check_accessibility(page, axe, "two-factor-code")
    # The code that turned it on is spent; the app's next one is accepted.
    page.get_by_label("Code from your authenticator app, or a recovery code").fill(
        app_code(key, 1))
    page.get_by_role("button", name="Continue").click()
    page.wait_for_url(f"{server}/")
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    assert not problems, problems
