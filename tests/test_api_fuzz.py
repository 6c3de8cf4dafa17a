"""The API against a schema-driven fuzzer: schemathesis generates requests from the served
OpenAPI document (every operation, coverage, fuzzing and stateful phases, fixed seed) against a
uvicorn server on a PostgreSQL database of its own, and every check must pass: no 5xx, no
status code, content type, header or body the document does not describe, and no refused
request that wrote to the database (tests/fuzz_hooks.py).

One check is excluded: `positive_data_acceptance` (a schema-valid request must be accepted).
The document cannot say everything the server refuses for good reasons: a bulk confirmation is a
signed token that only a preview makes, an identifier must be printable text, a time must lie
between 1970 and 2100, a number must be exact. Those refusals are 4xx with a JSON error, which
the other checks hold to the document.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from queues.bench import processes
from tests.browser.support import ServerDatabase, run

pytestmark = pytest.mark.postgres
SEED = "1"
EXAMPLES = "30"


def test_the_api_holds_to_its_openapi_document_under_fuzzing(tmp_path):
    database = ServerDatabase(tmp_path, "fuzz")
    env = database.env()
    web = None
    try:
        run(env, "manage.py", "migrate", "--noinput", "-v0")
        secret = run(env, "-c", (
            "import django; django.setup()\n"
            "from tests.factories import QueueFactory\n"
            "from queues.engine import tokens\n"
            "QueueFactory(key='emails')\n"
            "from queues.models import ApiToken\n"
            "from datetime import datetime, UTC\n"
            "print(tokens.create('fuzz', all_queues=True, scopes=tokens.SCOPES)[1])\n"
            # Its once-a-minute last-use write would look like a write by whichever request
            # it came with.
            "ApiToken.objects.update(last_used_at=datetime(2099, 1, 1, tzinfo=UTC))"
        )).splitlines()[-1]
        port = processes.free_port()
        web = processes.start_web(port, env=env)
        fuzz = subprocess.run(  # noqa: S603
            [str(Path(sys.executable).with_name("schemathesis")), "run",
             f"http://127.0.0.1:{port}/api/v1/openapi.json",
             "-H", f"Authorization: Bearer {secret}", "--checks", "all",
             "--exclude-checks", "positive_data_acceptance", "--seed", SEED,
             "--max-examples", EXAMPLES, "--workers", "1", "--no-color"],
            capture_output=True, text=True, timeout=180,
            env=os.environ | {"NO_COLOR": "1", "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
                              "FUZZ_DATABASE_URL": env["DATABASE_URL"],
                              "PYTHONPATH": str(settings.BASE_DIR)},
            # A fresh directory each run: schemathesis keeps a cache of past crashes in its
            # working directory and would replay them, so runs would differ.
            cwd=tmp_path)
    finally:
        if web is not None:
            processes.stop([web])
        database.drop()
    assert fuzz.returncode == 0, fuzz.stdout[-6000:]
    assert " passed" in fuzz.stdout
