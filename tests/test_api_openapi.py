"""The OpenAPI description stays true: valid OpenAPI 3.1, every route described, and every
response the API gives validates against the schema described for its status."""

import json
import re

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource

from queues.api import urls as api_urls
from queues.engine import tokens
from tests.factories import QueueFactory, items_in_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def document(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def test_it_is_a_valid_openapi_document(document):
    validate(document)


def test_every_route_is_described_with_its_method(document):
    described = {(path, method) for path, operations in document["paths"].items()
                 for method in operations}
    routes = set()
    for pattern in api_urls.urlpatterns:
        route = str(pattern.pattern).removeprefix("^").removesuffix("$")
        route = "/" + re.sub(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)",
                             lambda m: "{" + (m.group(1) or m.group(2)) + "}", route)
        if route in ("/openapi.json", "/{path}"):  # the document itself; the JSON 404 of the rest
            continue
        route = route.replace("{item_id}", "{id}")
        routes.update((route, method.lower()) for method in pattern.callback.allowed_methods)
    assert routes == described


def check(document, path, method, response):
    """Validate a real response against the schema described for its status."""
    operation = document["paths"][path][method]
    described = operation["responses"].get(str(response.status_code))
    assert described is not None, f"{response.status_code} is not described for {path}"
    schema = described["content"]["application/json"]["schema"]
    # Component references point into the whole document, registered under a name of its own.
    registry = Registry().with_resource("urn:doc", Resource.opaque(document))
    resolved = json.loads(json.dumps(schema).replace('"#/components', '"urn:doc#/components'))
    Draft202012Validator(resolved, registry=registry).validate(response.json())


def test_real_responses_match_their_described_schemas(client, document):
    queue = QueueFactory(key="emails")
    secret = tokens.create("producer", queue_keys=["emails"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    url = "/api/v1/queues/emails/items"
    path = "/queues/{key}/items"

    def post(body, **extra):
        return client.post(url, body, content_type="application/json", **{**auth, **extra})

    one = {"account": "a", "identifier": "x", "payload": {"n": 1}}
    check(document, path, "post", post(one))  # 201
    check(document, path, "post", post(one))  # 200
    check(document, path, "post", post({"items": [one, {**one, "identifier": "y"}]}))
    check(document, path, "post", post({**one, "payload": {"n": 2}}))  # 409
    check(document, path, "post", post({"account": 1}))  # 422
    check(document, path, "post", client.generic("POST", url, b"{", "application/json", **auth))
    check(document, path, "post", post(one, HTTP_AUTHORIZATION="Bearer qa_wrong"))  # 401
    check(document, path, "post", client.get(url, **auth))  # 405
    [retrying] = items_in_status(queue, "retry")
    check(document, "/items/{id}", "get", client.get(f"/api/v1/items/{retrying.pk}", **auth))
    check(document, "/items/{id}", "get", client.get("/api/v1/items/999999", **auth))
    check(document, "/queues", "get", client.get("/api/v1/queues", **auth))
