"""queues.engine.partitions and migration 0025: the event table by week on PostgreSQL."""

import importlib
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from queues import enqueue_many
from queues.engine import lifecycle, partitions, sweeper
from queues.models import Item, ItemEvent
from tests.factories import QueueFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
MIGRATION = importlib.import_module("queues.migrations.0025_partition_item_events")


def partition_of(event_id):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {partitions.TABLE} WHERE id = %s",
                       [event_id])
        return cursor.fetchone()[0]


def names():
    with connection.cursor() as cursor:
        return [p.name for p in partitions.partitions(cursor)]


def event_at(queue, at):
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": f"at-{at:%s}"}])
    ItemEvent.objects.filter(item_id=item.pk).delete()
    return ItemEvent.objects.create(item_id=item.pk, queue=queue, account="acme",
                                    identifier=item.identifier, transition="enqueued",
                                    to_status="queued", at=at, actor="test")


def test_a_week_starts_on_monday_at_midnight_utc():
    thursday = datetime(2026, 11, 26, 23, 30, tzinfo=UTC)
    assert partitions.week_start(thursday) == datetime(2026, 11, 23, tzinfo=UTC)
    assert partitions.week_name(partitions.week_start(thursday)) == "queues_itemevent_p20261123"


def test_an_event_lands_in_its_weeks_partition_and_one_far_off_in_the_default():
    queue = QueueFactory()
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": "now"}])
    enqueued = ItemEvent.objects.get(item_id=item.pk)
    assert partition_of(enqueued.pk) == partitions.week_name(
        partitions.week_start(timezone.now()))
    far_off = event_at(queue, timezone.now() + timedelta(days=400))
    assert partition_of(far_off.pk) == partitions.DEFAULT_PARTITION


def test_the_sweeper_creates_the_coming_weeks_that_are_missing():
    coming = partitions.week_start(timezone.now()) + 3 * partitions.WEEK
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {partitions.week_name(coming)}")
    assert partitions.week_name(coming) not in names()
    assert partitions.ensure_weeks_ahead(timezone.now()) == [partitions.week_name(coming)]
    assert partitions.ensure_weeks_ahead(timezone.now()) == []


def test_a_week_past_every_queues_retention_is_dropped_whole_and_others_kept():
    QueueFactory(retention_days=60)
    other = QueueFactory(retention_days=90)
    now = timezone.now()
    with connection.cursor() as cursor:
        created = partitions.create_weeks(cursor, now - timedelta(days=120),
                                          now - timedelta(days=80))
    old_week, kept_week = partitions.week_name(partitions.week_start(now - timedelta(days=120))), \
        partitions.week_name(partitions.week_start(now - timedelta(days=80)))
    assert old_week in created and kept_week in created
    gone = event_at(other, now - timedelta(days=119))
    changed, _ = sweeper.step(now)
    assert changed["event partitions dropped"] >= 1
    assert old_week not in names() and kept_week in names()
    assert not ItemEvent.objects.filter(pk=gone.pk).exists()


def expired_tables():
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE starts_with(relname, %s)",
                       [partitions.EXPIRED_PREFIX])
        return [name for (name,) in cursor.fetchall()]


def old_weeks(now, *days_ago):
    with connection.cursor() as cursor:
        partitions.create_weeks(cursor, now - timedelta(days=max(days_ago)),
                                now - timedelta(days=min(days_ago)))
    return [partitions.week_name(partitions.week_start(now - timedelta(days=d)))
            for d in days_ago]


def test_a_week_is_detached_before_it_is_dropped_and_nothing_detached_stays_behind():
    now = timezone.now()
    [week] = old_weeks(now, 120)
    assert partitions.drop_older_than(now - timedelta(days=60)) == [week]
    assert week not in names() and expired_tables() == []


def test_a_week_left_detached_by_a_crash_is_dropped_by_the_next_run():
    now = timezone.now()
    [week] = old_weeks(now, 120)
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE {partitions.TABLE} DETACH PARTITION "{week}"; '
                       f'ALTER TABLE "{week}" RENAME TO "{partitions.EXPIRED_PREFIX}{week}"')
    assert partitions.drop_older_than(now - timedelta(days=60)) == [week]
    assert expired_tables() == []


def test_a_week_an_operator_detached_by_hand_is_left_alone():
    now = timezone.now()
    [week] = old_weeks(now, 120)
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE {partitions.TABLE} DETACH PARTITION "{week}"')
    assert partitions.drop_older_than(now - timedelta(days=60)) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [week])
        assert cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_week_is_not_detached_while_a_long_reader_holds_the_table():
    now = timezone.now()
    [week] = old_weeks(now, 120)
    reading, done = threading.Event(), threading.Event()

    def long_reader():
        with transaction.atomic():
            ItemEvent.objects.count()  # holds ACCESS SHARE on the table until the commit
            reading.set()
            done.wait(10)
        connection.close()

    reader = threading.Thread(target=long_reader)
    reader.start()
    try:
        assert reading.wait(10)
        started = time.monotonic()
        assert partitions.drop_older_than(now - timedelta(days=60)) == []
        assert time.monotonic() - started < 2  # gave up after the lock timeout, did not queue
        assert week in names()
    finally:
        done.set()
        reader.join(10)
    assert partitions.drop_older_than(now - timedelta(days=60)) == [week]


def test_a_week_whose_events_the_default_holds_is_left_to_it():
    queue = QueueFactory()
    far_off = timezone.now() + timedelta(days=400)
    event = event_at(queue, far_off)
    with connection.cursor() as cursor:
        assert partitions.create_weeks(cursor, far_off, far_off) == []
    assert partition_of(event.pk) == partitions.DEFAULT_PARTITION


def test_events_in_the_default_partition_are_pruned_by_their_age():
    queue = QueueFactory(retention_days=7)
    old = event_at(queue, timezone.now() - timedelta(days=400))
    assert partition_of(old.pk) == partitions.DEFAULT_PARTITION
    changed, _ = sweeper.step()
    assert changed["item events pruned"] == 1
    assert not ItemEvent.objects.filter(pk=old.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_existing_events_as_the_first_partition_without_a_copy():
    queue = QueueFactory()
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")
    executor.migrate([("queues", "0024_outcomeminute_minute_idx")])
    try:
        with connection.cursor() as cursor:
            assert not partitions.is_partitioned(cursor)
        [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": "before"}])
        before = ItemEvent.objects.get(item_id=item.pk)
        with connection.cursor() as cursor:
            cursor.execute("SELECT relfilenode FROM pg_class WHERE relname = %s",
                           [partitions.TABLE])
            file_before = cursor.fetchone()[0]
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
        with connection.cursor() as cursor:
            assert partitions.is_partitioned(cursor)
            cursor.execute("SELECT relfilenode FROM pg_class WHERE relname = %s",
                           [MIGRATION.LEGACY])
            assert cursor.fetchone()[0] == file_before  # the same file: nothing was copied
        assert partition_of(before.pk) == MIGRATION.LEGACY
        assert names()[0] == MIGRATION.LEGACY
        lifecycle.apply("cancel", [item.pk], actor="user:ops")
        after = ItemEvent.objects.filter(item_id=item.pk).order_by("id")
        assert [e.transition for e in after] == ["enqueued", "cancelled"]
        assert after[1].pk > before.pk
        assert Item.objects.get(pk=item.pk).events.count() == 2
    finally:
        MigrationExecutor(connection).migrate(latest)
        # Back to a fresh install's weeks: a legacy partition left behind would hold every
        # past event of later tests (the flush between tests keeps tables, not partitions).
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{MIGRATION.LEGACY}"')
            now = timezone.now()
            partitions.create_weeks(cursor, now, now + partitions.WEEKS_AHEAD * partitions.WEEK)
