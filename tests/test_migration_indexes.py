"""The items table's indexes on PostgreSQL: every one the model declares exists, including
those the migrations build concurrently there (0011, 0029, 0031, 0035, 0038), and the one 0039
drops (0026's) is gone."""

import pytest
from django.db import connection

from queues.models import Item
from tests.migrating import migrated_back_to

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def indexes() -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Item._meta.db_table)
    return {name for name, info in found.items() if info["index"]}


def test_every_index_the_item_model_declares_exists():
    assert {index.name for index in Item._meta.indexes} <= indexes()


@pytest.mark.django_db(transaction=True)
def test_migrating_back_drops_the_finished_status_index_and_forth_builds_it():
    with migrated_back_to("0028_item_autovacuum"):
        assert "item_finished_status_idx" not in indexes()
    assert "item_finished_status_idx" in indexes()


@pytest.mark.django_db(transaction=True)
def test_migrating_back_gives_the_account_index_without_the_finish_order_and_forth_with_it():
    with migrated_back_to("0037_compose_stored_names"):
        assert {"item_account_idx"} == indexes() & {"item_account_idx", "item_account_finish_idx"}
    assert {"item_account_finish_idx"} == indexes() & {"item_account_idx",
                                                       "item_account_finish_idx"}


@pytest.mark.django_db(transaction=True)
def test_the_cluster_is_in_no_index_and_migrating_back_builds_the_in_flight_one_by_cluster():
    # A claim writes only the cluster: with the column in no index it is a HOT update.
    assert not [name for name in indexes() if "cluster" in definition(name).split(" USING ")[-1]]
    with migrated_back_to("0038_item_account_finish_idx"):
        assert "item_in_flight_cluster_idx" in indexes()
    assert "item_in_flight_cluster_idx" not in indexes()


def definition(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        row = cursor.fetchone()
    return row[0] if row else ""


def test_the_payload_index_leaves_out_items_in_flight():
    # A dispatch and a start then write nothing to it: the payload never changes.
    assert "WHERE ((status)::text = ANY" in definition("item_payload_at_rest_gin")
    for status in ("'dispatched'", "'running'"):
        assert status not in definition("item_payload_at_rest_gin")
    assert not definition("item_payload_gin")


@pytest.mark.django_db(transaction=True)
def test_migrating_back_gives_the_whole_payload_index_again_and_forth_the_partial_one():
    with migrated_back_to("0030_item_payload_gin_fastupdate_off"):
        assert "WHERE" not in definition("item_payload_gin")
        assert not definition("item_payload_at_rest_gin")
    assert not definition("item_payload_gin")
    assert definition("item_payload_at_rest_gin")


def valid(name: str) -> bool | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = "
                       "c.oid WHERE c.relname = %s", [name])
        row = cursor.fetchone()
    return row[0] if row else None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("left", ["valid", "invalid"])
def test_a_concurrent_build_finds_its_index_built_ahead_or_left_invalid(left):
    """docs/deploy.md lets an operator build a big index before the deploy, and a deploy stopped
    while the build waited leaves it built (or invalid) with the migration not recorded: the
    next migrate failed with "already exists"."""
    with migrated_back_to("0034_account_share_live"), connection.cursor() as cursor:
        cursor.execute("CREATE INDEX item_ready_due_idx ON queues_item (queue_id, run_at) "
                       "WHERE status IN ('queued', 'retry')")
        if left == "invalid":
            cursor.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                           "'item_ready_due_idx'::regclass")
    assert valid("item_ready_due_idx") is True
