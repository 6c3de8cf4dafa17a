"""The colour theme kept in the user's preferences: the page links the dark palette always
(dark), only under prefers-color-scheme: dark (following the system), or not at all (light), so
that the first paint is already in the right theme."""

import re

import pytest
from django.contrib.auth.models import User

from queues.models import UserPreference

pytestmark = pytest.mark.django_db
DARK_CSS = re.compile(rb'<link rel="stylesheet" href="[^"]*/dark\.css"( media="[^"]*")?>')


def dark_stylesheet(client, path="/"):
    """The media attribute of the dark palette's link (b"" when it has none), or None."""
    found = DARK_CSS.search(client.get(path).content)
    return None if found is None else (found.group(1) or b"")


def test_a_new_user_follows_the_system(role_client):
    assert dark_stylesheet(role_client("Viewer")) == b' media="(prefers-color-scheme: dark)"'


@pytest.mark.parametrize(("theme", "media"), [
    ("dark", b""), ("light", None), ("system", b' media="(prefers-color-scheme: dark)"')])
def test_the_chosen_theme_decides_how_the_dark_palette_is_linked(role_client, theme, media):
    client = role_client("Viewer")
    response = client.post("/preferences/", {"time_zone": "UTC", "theme": theme})
    assert response.status_code == 302
    assert dark_stylesheet(client) == media
    assert UserPreference.objects.get(user=client.user).theme == theme


def test_the_theme_is_kept_for_the_next_login(role_client):
    client = role_client("Operator")
    client.post("/preferences/", {"time_zone": "Europe/Paris", "theme": "dark"})
    client.logout()
    client.force_login(User.objects.get(username="operator-user"))
    assert dark_stylesheet(client, "/preferences/") == b""
    page = client.get("/preferences/").content.decode()
    assert re.search(r'value="dark"[^>]*checked', page)
    assert 'value="Europe/Paris" selected' in page


def test_the_login_page_follows_the_system(client):
    assert dark_stylesheet(client, "/accounts/login/") == b' media="(prefers-color-scheme: dark)"'


def test_an_unknown_theme_is_refused_and_nothing_is_saved(role_client):
    client = role_client("Viewer")
    response = client.post("/preferences/", {"time_zone": "UTC", "theme": "neon"})
    assert response.status_code == 400
    assert not UserPreference.objects.filter(user=client.user).exists()
    assert dark_stylesheet(client) == b' media="(prefers-color-scheme: dark)"'
