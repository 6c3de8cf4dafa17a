"""Login throttling (django-axes) per username and per address, the lockout page, and the
production security settings with Django's deploy checks."""

import json
import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-password-1"


@pytest.fixture
def ada():
    user = User.objects.create_user("ada", password=PASSWORD)
    user.groups.add(Group.objects.get(name="Viewer"))
    return user


def login(username, password, address="10.0.0.1"):
    return Client(REMOTE_ADDR=address).post(
        "/accounts/login/", {"username": username, "password": password})


def fail(times, username, address="10.0.0.1"):
    """Wrong passwords; the one that reaches the limit is answered with the lockout page."""
    statuses = [login(username, "wrong", address).status_code for _ in range(times)]
    return statuses[-1]


def test_five_failures_lock_the_username_from_every_address(ada):
    assert fail(settings.AXES_FAILURE_LIMIT - 1, "ada", address="10.0.0.1") == 200
    assert fail(1, "ada", address="10.0.0.1") == 429
    locked = login("ada", PASSWORD, address="10.9.9.9")
    assert locked.status_code == 429
    assert b"Too many failed logins" in locked.content and b"Traceback" not in locked.content
    # Another user from a fresh address is not affected.
    User.objects.create_user("bob", password=PASSWORD).groups.add(Group.objects.get(name="Viewer"))
    assert login("bob", PASSWORD, address="10.8.8.8").status_code == 302


def test_five_failures_from_one_address_lock_that_address_for_every_username(ada):
    for n in range(settings.AXES_FAILURE_LIMIT):
        fail(1, f"guess-{n}", address="10.6.6.6")
    assert login("ada", PASSWORD, address="10.6.6.6").status_code == 429
    assert login("ada", PASSWORD, address="10.7.7.7").status_code == 302


def test_fewer_failures_than_the_limit_then_success_resets_the_count(ada):
    fail(settings.AXES_FAILURE_LIMIT - 1, "ada")
    assert login("ada", PASSWORD).status_code == 302
    fail(settings.AXES_FAILURE_LIMIT - 1, "ada")
    assert login("ada", PASSWORD).status_code == 302


def test_lockout_has_a_cool_off():
    assert settings.AXES_COOLOFF_TIME.total_seconds() >= 60


def test_force_login_is_not_throttled(role_client):
    fail(settings.AXES_FAILURE_LIMIT, "viewer-user", address="127.0.0.1")
    assert role_client("Viewer").get("/").status_code == 200


def test_a_forwarded_for_header_names_no_address_even_in_production(settings, rf):
    """uvicorn --proxy-headers puts a trusted proxy's client in REMOTE_ADDR; a header sent by a
    client reaching the app directly would escape its lock or lock out the address it names."""
    from queues.web.security import client_ip

    request = rf.get("/", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.7", REMOTE_ADDR="10.0.0.2")
    assert client_ip(request) == "10.0.0.2"


def test_a_spoofed_forwarded_for_does_not_lift_the_address_lock(client):
    for n in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": f"nobody-{n}", "password": "wrong"},
                    REMOTE_ADDR="198.51.100.9", HTTP_X_FORWARDED_FOR=f"10.9.{n}.1")
    response = client.post("/accounts/login/", {"username": "other", "password": "wrong"},
                           REMOTE_ADDR="198.51.100.9", HTTP_X_FORWARDED_FOR="10.9.99.1")
    assert response.status_code == 429


PRODUCTION_ENV = {
    "QUEUEADMIN_ENV": "production",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "queues.example.com",
    # Never connected to: settings and checks only.
    "DATABASE_URL": "postgres://app@127.0.0.1:1/queueadmin",
    "DJANGO_SETTINGS_MODULE": "queueadmin.settings",
}
SHOWN = ["DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
         "SESSION_COOKIE_HTTPONLY", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
         "X_FRAME_OPTIONS", "SECURE_REFERRER_POLICY", "SECURE_CONTENT_TYPE_NOSNIFF"]


def run_production(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DATABASE_URL")}
    return subprocess.run([sys.executable, *args], env=env | PRODUCTION_ENV,  # noqa: S603
                          cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)


def test_production_settings_secure_cookies_hsts_and_headers():
    code = ("import django, json; django.setup(); from django.conf import settings as s; "
            f"print(json.dumps({{k: getattr(s, k) for k in {SHOWN!r}}}))")
    result = run_production("-c", code)
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values == {
        "DEBUG": False, "SECURE_SSL_REDIRECT": True, "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True, "SESSION_COOKIE_HTTPONLY": True,
        "SECURE_HSTS_SECONDS": 31536000, "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "X_FRAME_OPTIONS": "DENY", "SECURE_REFERRER_POLICY": "same-origin",
        "SECURE_CONTENT_TYPE_NOSNIFF": True}


def test_deploy_checks_pass_with_production_settings():
    result = run_production("manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
