import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    # Concurrency guarantees are proven on PostgreSQL; .ci/run runs the suite there too.
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
