"""Storage parameters set by migrations on PostgreSQL, and reset going back: autovacuum's
triggers on the items table (0028), the payload index's fastupdate, off (0030, and
its successor of 0031)."""

import threading
import time

import pytest
from django.db import OperationalError, connection

from queues.migrations._operations import SetIndexStorageOnPostgres
from tests.migrating import migrated_back_to

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
    with migrated_back_to("0027_partition_attempts"):
        assert options("queues_item") == set()
        assert options("queues_counterdelta") == set()
    assert "autovacuum_vacuum_insert_scale_factor=0.01" in options("queues_item")


def test_the_payload_index_takes_each_statements_entries_at_once():
    assert options("item_payload_at_rest_gin") == {"fastupdate=off"}


@pytest.mark.django_db(transaction=True)
def test_migrating_back_lets_the_payload_index_gather_its_entries_again():
    with migrated_back_to("0030_item_payload_gin_fastupdate_off"):
        assert options("item_payload_gin") == {"fastupdate=off"}
    with migrated_back_to("0029_item_finished_status_idx"):
        assert options("item_payload_gin") == set()
    assert options("item_payload_at_rest_gin") == {"fastupdate=off"}


def reader_holding_the_items_table(seconds: float) -> threading.Thread:
    """A transaction elsewhere that has read the items table (so it holds a lock on each of its
    indexes) and ends after `seconds`."""
    import psycopg

    params = connection.get_connection_params()
    began = threading.Event()

    def read():
        with psycopg.connect(host=params.get("host"), port=params.get("port"),
                             user=params.get("user"), dbname=params["dbname"]) as other:
            other.execute("SELECT count(*) FROM queues_item")
            began.set()
            time.sleep(seconds)

    thread = threading.Thread(target=read)
    thread.start()
    began.wait(5)
    return thread


def set_fastupdate(value: str, *, attempts: int):
    operation = SetIndexStorageOnPostgres("item_payload_at_rest_gin", {"fastupdate": value})
    operation.attempts, operation.lock_timeout, operation.pause = attempts, "100ms", 0.1
    with connection.schema_editor(atomic=False) as editor:
        operation.database_forwards("queues", editor, None, None)


@pytest.mark.django_db(transaction=True)
def test_changing_an_index_waits_out_a_long_transaction_in_short_tries():
    reader = reader_holding_the_items_table(0.6)
    try:
        set_fastupdate("on", attempts=20)
        assert options("item_payload_at_rest_gin") == {"fastupdate=on"}
    finally:
        reader.join()
        set_fastupdate("off", attempts=1)


@pytest.mark.django_db(transaction=True)
def test_changing_an_index_gives_up_when_a_transaction_holds_it_too_long():
    reader = reader_holding_the_items_table(3)
    try:
        with pytest.raises(OperationalError):
            set_fastupdate("on", attempts=2)
        assert options("item_payload_at_rest_gin") == {"fastupdate=off"}
    finally:
        reader.join()
