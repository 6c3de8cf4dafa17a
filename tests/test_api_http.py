"""The API over real HTTP: uvicorn subprocesses on a database of their own, driven with
requests. Covers what the test client cannot: chunked bodies, concurrent requests in several
server processes, and the database going away."""

import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests
from django.conf import settings
from django.db import connection

from queues.bench import processes

pytestmark = pytest.mark.django_db


def manage(database_url, *args):
    return processes.run_manage(*args, env={"DATABASE_URL": database_url})


@pytest.fixture(scope="module")
def database_url(tmp_path_factory):
    """A migrated database the server subprocesses share: a file for SQLite, a database of its
    own on PostgreSQL (the test database is inside the test's transaction)."""
    if connection.vendor != "postgresql":
        yield f"sqlite:///{tmp_path_factory.mktemp('http') / 'db.sqlite3'}"
        return
    name = f"qa_http_{uuid.uuid4().hex[:8]}"
    params = connection.get_connection_params()
    admin = {"host": params.get("host"), "port": params.get("port"),
             "user": params.get("user"), "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield processes.database_url().rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def secret(database_url):
    manage(database_url, "migrate", "--noinput", "-v0")
    manage(database_url, "shell", "-c",
           "from queues.models import Queue; Queue.objects.get_or_create(key='emails', "
           "defaults={'name': 'Emails'})")
    return manage(database_url, "create_api_token", "producer", "--queue", "emails")


@pytest.fixture(scope="module")
def base_url(database_url, secret):
    port = processes.free_port()
    # Several server processes, so that concurrent requests really run at the same time.
    server = processes.start_web(port, workers=2, env={"DATABASE_URL": database_url})
    yield f"http://127.0.0.1:{port}/api/v1"
    processes.stop([server])


@pytest.fixture
def session(secret):
    with requests.Session() as http:
        http.headers["Authorization"] = f"Bearer {secret}"
        yield http


def test_a_batch_goes_in_and_reads_back_over_http(base_url, session):
    run = uuid.uuid4().hex[:6]
    body = {"items": [{"account": f"a{n % 3}", "identifier": f"{run}-{n}"} for n in range(500)]}
    response = session.post(f"{base_url}/queues/emails/items", json=body, timeout=30)
    assert response.status_code == 201
    assert response.json()["created"] == 500
    first = response.json()["items"][0]
    item = session.get(f"{base_url}/items/{first['id']}", timeout=10).json()
    assert (item["identifier"], item["status"]) == (f"{run}-0", "queued")
    queues = session.get(f"{base_url}/queues", timeout=10).json()["queues"]
    assert queues[0]["key"] == "emails" and queues[0]["counts"]["queued"] >= 500


def test_a_chunked_body_over_the_limit_gets_413(base_url, session):
    limit = settings.QUEUEADMIN["API_MAX_BODY_BYTES"]

    def chunks():  # no Content-Length: requests sends Transfer-Encoding: chunked
        yield b'{"account": "a", "identifier": "big", "payload": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    response = session.post(f"{base_url}/queues/emails/items", data=chunks(),
                            headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    missing = session.get(f"{base_url}/queues", timeout=10).json()
    assert missing["queues"]  # the server is still answering


@pytest.mark.postgres
def test_twenty_concurrent_requests_for_one_identifier_create_one_item(base_url, session):
    identifier = f"dedup-{uuid.uuid4().hex[:6]}"
    body = {"account": "acme", "identifier": identifier, "payload": {"n": 1}}

    def post(_):
        response = session.post(f"{base_url}/queues/emails/items", json=body, timeout=30)
        return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(post, range(20)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 19 + [201]
    assert len({item_id for _, item_id in results}) == 1


@pytest.mark.postgres
def test_concurrent_requests_with_different_payloads_create_one_and_refuse_the_rest(
        base_url, session):
    identifier = f"race-{uuid.uuid4().hex[:6]}"

    def post(n):
        body = {"account": "acme", "identifier": identifier, "payload": {"n": n}}
        return session.post(f"{base_url}/queues/emails/items", json=body, timeout=30).status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = sorted(pool.map(post, range(20)))
    assert statuses == [201] + [409] * 19


def test_the_api_answers_503_in_json_when_the_database_is_down(secret):
    port = processes.free_port()
    # Nothing listens on port 1: every connection attempt fails at once.
    down = ("postgres://postgres@127.0.0.1:1/queueadmin" if connection.vendor == "postgresql"
            else "sqlite:////nonexistent-dir/forbidden/db.sqlite3")
    server = processes.start_web(port, env={"DATABASE_URL": down})
    try:
        response = requests.post(
            f"http://127.0.0.1:{port}/api/v1/queues/emails/items", timeout=30,
            json={"account": "a", "identifier": "x"},
            headers={"Authorization": f"Bearer {secret}"})
    finally:
        processes.stop([server])
    assert response.status_code == 503
    assert response.headers["Retry-After"]
    assert response.json()["error"]["code"] == "unavailable"
