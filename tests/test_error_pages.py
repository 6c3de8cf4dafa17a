"""Error pages in the dashboard's look, with a way back, and never a traceback."""

import re

import pytest
from django.test import RequestFactory
from django.views import defaults

pytestmark = pytest.mark.django_db


def test_a_missing_item_answers_the_dashboards_404_page(role_client):
    response = role_client("Viewer").get("/items/987654/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Not found" in html and 'class="brand"' in html and "Back to the queues" in html


def test_a_server_error_answers_the_dashboards_500_page_without_details():
    response = defaults.server_error(RequestFactory().get("/queues/emails/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in html and 'class="brand"' in html
    assert "Traceback" not in html


def test_a_database_out_of_reach_answers_503_with_retry_after_not_500(role_client, monkeypatch):
    """Under load every pooled connection was busy and the dashboard answered 500 with a
    traceback in the log, where the API answers 503 (bench operators found it)."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import OperationalError
    from django.test import Client

    client = role_client("Viewer")
    browser = Client(raise_request_exception=False)
    browser.cookies = client.cookies

    def pool_exhausted(self):
        raise OperationalError("couldn't get a connection after 3.00 sec")

    monkeypatch.setattr(SessionStore, "load", pool_exhausted)  # in a middleware, not a view
    response = browser.get("/")
    html = response.content.decode()
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert "Busy for a moment" in html and "Traceback" not in html and "3.00 sec" not in html


def test_other_server_errors_still_answer_500():
    from queues.web import unavailable

    try:
        raise ValueError("a bug")
    except ValueError:
        response = unavailable.server_error(RequestFactory().get("/"))
    assert response.status_code == 500 and "Something went wrong" in response.content.decode()


def test_filter_errors_name_fields_as_the_page_labels_them(role_client):
    from tests.factories import QueueFactory

    QueueFactory(key="emails")
    response = role_client("Viewer").get("/queues/emails/", {
        "period": "custom", "created_from": "2026-01-02T00:00", "created_to": "2026-01-01T00:00"})
    html = response.content.decode()
    assert response.status_code == 400
    errors = html.split('class="message error" role="alert"')[1].split("</div>")[0]
    # What the page says, not the ids that tie each error to its field.
    words = re.sub(r"<[^>]+>", "", errors)
    assert "To: Must be after From." in words and "created_to" not in words
