"""Input limits: time ranges of at most 366 days on the item browser and bulk forms, text fields
with a maximum length, unknown query parameters ignored, and the request size caps."""

import pytest
from django.conf import settings

from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def queue():
    return QueueFactory(key="q")


def test_item_browser_refuses_a_range_over_366_days(role_client):
    response = role_client("Viewer").get("/queues/q/", {
        "period": "custom", "created_from": "2024-01-01T00:00", "created_to": "2025-06-01T00:00"})
    assert response.status_code == 400
    assert "at most 366 days" in response.content.decode()


def test_item_browser_accepts_a_year(role_client):
    response = role_client("Viewer").get("/queues/q/", {
        "period": "custom", "created_from": "2024-01-01T00:00", "created_to": "2024-12-31T00:00"})
    assert response.status_code == 200


def test_bulk_preview_refuses_a_range_over_366_days(role_client):
    response = role_client("Operator").get("/queues/q/bulk/", {
        "preview": "1", "kind": "retry", "status": ["failed"], "period": "custom",
        "created_from": "2020-01-01T00:00", "created_to": "2025-01-01T00:00"})
    assert response.status_code == 422
    assert "at most 366 days" in response.content.decode()


@pytest.mark.parametrize("query", [{"account": "a" * 201}, {"identifier": "i" * 256},
                                   {"error": "e" * 201}, {"before": "x" * 61}])
def test_item_browser_refuses_overlong_fields(role_client, query):
    assert role_client("Viewer").get("/queues/q/", query).status_code == 400


def test_item_browser_ignores_parameters_it_does_not_know(role_client):
    response = role_client("Viewer").get("/queues/q/", {"status__in": "x", "order_by": "-id",
                                                        "queue__key": "other"})
    assert response.status_code == 200


def test_too_many_form_fields_are_refused_before_any_view(role_client):
    fields = {f"f{n}": "x" for n in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1)}
    assert role_client("Viewer").post("/preferences/", fields).status_code == 400


def test_an_oversized_form_body_is_refused(role_client):
    body = "time_zone=" + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    response = role_client("Viewer").post("/preferences/", body,
                                          content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
