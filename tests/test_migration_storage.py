"""Migration 0028: autovacuum's triggers on the items table, set and reset on PostgreSQL."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def options(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        return set(cursor.fetchone()[0] or [])


def test_the_items_table_is_vacuumed_after_one_percent_of_it_changed_or_was_inserted():
    assert {"autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_vacuum_insert_scale_factor=0.01",
            "autovacuum_analyze_scale_factor=0.02"} <= options("queues_item")
    assert {"autovacuum_vacuum_scale_factor=0",
            "autovacuum_vacuum_threshold=10000"} <= options("queues_counterdelta")


# Going back past 0029 drops its index concurrently, which no transaction may hold.
@pytest.mark.django_db(transaction=True)
def test_migrating_back_gives_the_tables_postgresqls_defaults_again():
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")
    executor.migrate([("queues", "0027_partition_attempts")])
    try:
        assert options("queues_item") == set()
        assert options("queues_counterdelta") == set()
    finally:
        MigrationExecutor(connection).migrate(latest)
    assert "autovacuum_vacuum_insert_scale_factor=0.01" in options("queues_item")
