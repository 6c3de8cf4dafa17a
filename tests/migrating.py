"""A test's database migrated back, and forward to the latest migration again whatever
happens inside."""

from contextlib import contextmanager

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@contextmanager
def migrated_back_to(migration: str):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")
    executor.migrate([("queues", migration)])
    try:
        yield
    finally:
        MigrationExecutor(connection).migrate(latest)
