"""queues.engine.partitions and migrations 0025 and 0027: the event and attempt tables by day on
PostgreSQL."""

import importlib
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from queues import enqueue_many
from queues.engine import lifecycle, partitions, selector, sweeper
from queues.engine.partitions import ATTEMPTS, EVENTS
from queues.engine.worker import run_batch
from queues.models import Attempt, Item, ItemEvent
from tests.factories import QueueFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
MIGRATION = importlib.import_module("queues.migrations.0025_partition_item_events")
ATTEMPTS_MIGRATION = importlib.import_module("queues.migrations.0027_partition_attempts")


def partition_of(row_id, table=EVENTS):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table.name} WHERE id = %s",
                       [row_id])
        return cursor.fetchone()[0]


def file_of(table_name):
    with connection.cursor() as cursor:
        cursor.execute("SELECT relfilenode FROM pg_class WHERE relname = %s", [table_name])
        return cursor.fetchone()[0]


def back_to_fresh_days(latest, table, legacy):
    """A legacy partition left behind would hold every past row of later tests (the flush
    between tests keeps tables, not partitions)."""
    MigrationExecutor(connection).migrate(latest)
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{legacy}"')
        partitions.create_days_ahead(cursor, table, timezone.now())


def names(table=EVENTS):
    with connection.cursor() as cursor:
        return [p.name for p in partitions.partitions(cursor, table)]


def event_at(queue, at):
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": f"at-{at:%s}"}])
    ItemEvent.objects.filter(item_id=item.pk).delete()
    return ItemEvent.objects.create(item_id=item.pk, queue=queue, account="acme",
                                    identifier=item.identifier, transition="enqueued",
                                    to_status="queued", at=at, actor="test")


def test_a_day_starts_at_midnight_utc():
    late_in_berlin = datetime(2026, 11, 27, 0, 30, tzinfo=timezone.get_fixed_timezone(60))
    assert partitions.day_start(late_in_berlin) == datetime(2026, 11, 26, tzinfo=UTC)
    assert EVENTS.partition_name(partitions.day_start(late_in_berlin)) == \
        "queues_itemevent_p20261126"


def test_an_event_lands_in_its_days_partition_and_one_far_off_in_the_default():
    queue = QueueFactory()
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": "now"}])
    enqueued = ItemEvent.objects.get(item_id=item.pk)
    assert partition_of(enqueued.pk) == EVENTS.partition_name(
        partitions.day_start(timezone.now()))
    far_off = event_at(queue, timezone.now() + timedelta(days=400))
    assert partition_of(far_off.pk) == EVENTS.default_partition


def test_the_sweeper_creates_the_coming_days_that_are_missing():
    coming = partitions.day_start(timezone.now()) + 3 * partitions.DAY
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {EVENTS.partition_name(coming)}")
    assert EVENTS.partition_name(coming) not in names()
    assert partitions.ensure_days_ahead(timezone.now()) == [EVENTS.partition_name(coming)]
    assert partitions.ensure_days_ahead(timezone.now()) == []


def test_a_day_past_every_queues_retention_is_dropped_whole_and_others_kept():
    QueueFactory(retention_days=60)
    other = QueueFactory(retention_days=90)
    now = timezone.now()
    with connection.cursor() as cursor:
        created = partitions.create_days(cursor, EVENTS, now - timedelta(days=120),
                                         now - timedelta(days=80))
    old_day, kept_day = EVENTS.partition_name(partitions.day_start(now - timedelta(days=119))), \
        EVENTS.partition_name(partitions.day_start(now - timedelta(days=80)))
    assert len(created) == 41 and old_day in created and kept_day in created
    gone = event_at(other, now - timedelta(days=119))
    changed, _ = sweeper.step(now)
    assert changed["event partitions dropped"] >= 1
    assert old_day not in names() and kept_day in names()
    assert not ItemEvent.objects.filter(pk=gone.pk).exists()


def expired_tables():
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE starts_with(relname, %s)",
                       [partitions.EXPIRED_PREFIX])
        return [name for (name,) in cursor.fetchall()]


def old_days(now, *days_ago):
    with connection.cursor() as cursor:
        partitions.create_days(cursor, EVENTS, now - timedelta(days=max(days_ago)),
                               now - timedelta(days=min(days_ago)))
    return [EVENTS.partition_name(partitions.day_start(now - timedelta(days=d)))
            for d in days_ago]


def test_a_day_is_detached_before_it_is_dropped_and_nothing_detached_stays_behind():
    now = timezone.now()
    [day] = old_days(now, 120)
    assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == [day]
    assert day not in names() and expired_tables() == []


def test_a_day_is_dropped_an_index_at_a_time_before_its_table():
    now = timezone.now()
    [day] = old_days(now, 120)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", [day])
        [indexes] = cursor.fetchone()
    dropped = []

    def record(execute, sql, params, many, context):
        if sql.startswith(("DROP", "ALTER TABLE \"")):
            dropped.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        partitions.drop_older_than(EVENTS, now - timedelta(days=60))
    # The primary key and the three indexes of events, each freed by its own statement.
    assert indexes == 4 and len(dropped) == indexes + 1
    assert all(sql.startswith("DROP INDEX") or " DROP CONSTRAINT " in sql
               for sql in dropped[:-1])
    assert dropped[-1] == f'DROP TABLE "{partitions.EXPIRED_PREFIX}{day}"'


def test_a_day_left_detached_by_a_crash_is_dropped_by_the_next_run():
    now = timezone.now()
    [day] = old_days(now, 120)
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE {EVENTS.name} DETACH PARTITION "{day}"; '
                       f'ALTER TABLE "{day}" RENAME TO "{partitions.EXPIRED_PREFIX}{day}"')
    assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == [day]
    assert expired_tables() == []


def test_a_day_left_half_dropped_by_a_crash_is_finished_by_the_next_run():
    now = timezone.now()
    [day] = old_days(now, 120)
    expired = f"{partitions.EXPIRED_PREFIX}{day}"
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE {EVENTS.name} DETACH PARTITION "{day}"; '
                       f'ALTER TABLE "{day}" RENAME TO "{expired}"')
        cursor.execute("SELECT indexrelid::regclass::text FROM pg_index "
                       "WHERE indrelid = %s::regclass AND NOT indisprimary LIMIT 1", [expired])
        cursor.execute(f"DROP INDEX {cursor.fetchone()[0]}")
    assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == [day]
    assert expired_tables() == []


def test_a_day_an_operator_detached_by_hand_is_left_alone():
    now = timezone.now()
    [day] = old_days(now, 120)
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE {EVENTS.name} DETACH PARTITION "{day}"')
    assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [day])
        assert cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_day_is_not_detached_while_a_long_reader_holds_the_table():
    now = timezone.now()
    [day] = old_days(now, 120)
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
        assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == []
        assert time.monotonic() - started < 2  # gave up after the lock timeout, did not queue
        assert day in names()
    finally:
        done.set()
        reader.join(10)
    assert partitions.drop_older_than(EVENTS, now - timedelta(days=60)) == [day]


def test_a_day_whose_events_the_default_holds_is_left_to_it():
    queue = QueueFactory()
    far_off = timezone.now() + timedelta(days=400)
    event = event_at(queue, far_off)
    with connection.cursor() as cursor:
        assert partitions.create_days(cursor, EVENTS, far_off, far_off) == []
    assert partition_of(event.pk) == EVENTS.default_partition


def test_events_in_the_default_partition_are_pruned_by_their_age():
    queue = QueueFactory(retention_days=7)
    old = event_at(queue, timezone.now() - timedelta(days=400))
    assert partition_of(old.pk) == EVENTS.default_partition
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
            assert not partitions.is_partitioned(cursor, EVENTS)
        [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": "before"}])
        before = ItemEvent.objects.get(item_id=item.pk)
        file_before = file_of(EVENTS.name)
        MigrationExecutor(connection).migrate(latest)
        with connection.cursor() as cursor:
            assert partitions.is_partitioned(cursor, EVENTS)
        assert file_of(MIGRATION.LEGACY) == file_before  # the same file: nothing was copied
        assert partition_of(before.pk) == MIGRATION.LEGACY
        assert names()[0] == MIGRATION.LEGACY
        lifecycle.apply("cancel", [item.pk], actor="user:ops")
        after = ItemEvent.objects.filter(item_id=item.pk).order_by("id")
        assert [e.transition for e in after] == ["enqueued", "cancelled"]
        assert after[1].pk > before.pk
        assert Item.objects.get(pk=item.pk).events.count() == 2
    finally:
        back_to_fresh_days(latest, EVENTS, MIGRATION.LEGACY)


def run(queue, pk):
    assert selector.run_round(queue).item_ids == [pk]
    run_batch(queue.pk, [[pk, Item.objects.get(pk=pk).attempts]])


def finished(queue, identifier, days_ago):
    """An item run to completion by its handler, its finish and attempt moved `days_ago`."""
    [item] = enqueue_many(queue.key, [{"account": "acme", "identifier": identifier}])
    run(queue, item.pk)
    at = timezone.now() - timedelta(days=days_ago)
    Item.objects.filter(pk=item.pk).update(finished_at=at)
    Attempt.objects.filter(item_id=item.pk).update(finished_at=at)  # moves it to that day
    return item.pk, Attempt.objects.get(item_id=item.pk).pk


def test_an_attempt_lands_in_its_days_partition_and_one_far_off_in_the_default():
    queue = QueueFactory(handler="noop")
    pk, attempt = finished(queue, "now", 0)
    assert partition_of(attempt, ATTEMPTS) == ATTEMPTS.partition_name(
        partitions.day_start(timezone.now()))
    Attempt.objects.filter(pk=attempt).update(finished_at=timezone.now() + timedelta(days=400))
    assert partition_of(attempt, ATTEMPTS) == ATTEMPTS.default_partition
    assert Item.objects.get(pk=pk).attempt_set.get().pk == attempt


def test_the_sweeper_creates_the_coming_days_of_attempts_too():
    coming = partitions.day_start(timezone.now()) + 2 * partitions.DAY
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {ATTEMPTS.partition_name(coming)}")
    assert sweeper.run()["partitions created"] == 1
    assert ATTEMPTS.partition_name(coming) in names(ATTEMPTS)


def test_a_queue_kept_longest_leaves_its_pruned_items_attempts_to_their_day():
    kept_longest = QueueFactory(retention_days=60, handler="noop")
    kept_shorter = QueueFactory(retention_days=30, handler="noop")
    # Noon: 60 days and an hour before it is 11:00, whose day ends after the cutoff.
    now = partitions.day_start(timezone.now()) - timedelta(hours=12)
    with connection.cursor() as cursor:
        partitions.create_days(cursor, ATTEMPTS, now - timedelta(days=70), now)
    ago = (timezone.now() - now).total_seconds() / 86400
    old_item, old_attempt = finished(kept_longest, "old", ago + 60 + 1 / 24)
    short_item, short_attempt = finished(kept_shorter, "short", ago + 31)
    changed, _ = sweeper.step(now)
    assert changed["items pruned"] == 2
    assert changed["attempts pruned"] == 1  # the shorter queue's, with its item
    assert not Item.objects.filter(pk__in=[old_item, short_item]).exists()
    assert list(Attempt.objects.values_list("pk", flat=True)) == [old_attempt]
    day = ATTEMPTS.partition_name(partitions.day_start(now - timedelta(days=60, hours=1)))
    changed, _ = sweeper.step(now + timedelta(days=1))  # the whole day is past 60 days
    assert changed["attempt partitions dropped"] >= 1
    assert day not in names(ATTEMPTS)
    assert not Attempt.objects.exists()


def test_attempts_in_the_default_partition_are_pruned_by_their_age():
    queue = QueueFactory(retention_days=7, handler="noop")
    kept_pk, kept = finished(queue, "kept", 0)
    Attempt.objects.filter(pk=kept).update(finished_at=timezone.now() + timedelta(days=400))
    pk, attempt = finished(queue, "old", 400)
    assert partition_of(attempt, ATTEMPTS) == ATTEMPTS.default_partition
    changed, _ = sweeper.step()
    assert changed["attempts pruned"] == 1
    assert list(Attempt.objects.values_list("pk", flat=True)) == [kept]


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_existing_attempts_as_the_first_partition_without_a_copy():
    queue = QueueFactory(handler="noop")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")
    executor.migrate([("queues", "0026_item_in_flight_cluster_idx")])
    try:
        with connection.cursor() as cursor:
            assert not partitions.is_partitioned(cursor, ATTEMPTS)
        pk, before = finished(queue, "before", 0)
        file_before = file_of(ATTEMPTS.name)
        MigrationExecutor(connection).migrate(latest)
        with connection.cursor() as cursor:
            assert partitions.is_partitioned(cursor, ATTEMPTS)
        assert file_of(ATTEMPTS_MIGRATION.LEGACY) == file_before  # nothing was copied
        assert partition_of(before, ATTEMPTS) == ATTEMPTS_MIGRATION.LEGACY
        lifecycle.apply("requeue", [pk], actor="user:ops")
        run(queue, pk)
        attempts = list(Attempt.objects.filter(item_id=pk).order_by("id"))
        assert len(attempts) == 2 and attempts[0].pk == before  # a requeue starts a new run
        # The old table holds everything before the next midnight, new attempts of today too.
        assert partition_of(attempts[1].pk, ATTEMPTS) == ATTEMPTS_MIGRATION.LEGACY
        lifecycle.delete_finished(queue.pk, [pk])  # no foreign key is left to hold it up
        assert not Attempt.objects.filter(item_id=pk).exists()
    finally:
        back_to_fresh_days(latest, ATTEMPTS, ATTEMPTS_MIGRATION.LEGACY)


def test_a_week_made_by_an_earlier_release_is_kept_and_days_follow_it():
    monday = partitions.day_start(timezone.now() - timedelta(days=100))
    week = EVENTS.partition_name(monday)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {week} PARTITION OF {EVENTS.name} FOR VALUES FROM (%s) TO "
                       f"(%s)", [monday, monday + 7 * partitions.DAY])
        created = partitions.create_days(cursor, EVENTS, monday - partitions.DAY,
                                         monday + 8 * partitions.DAY)
    before, after = monday - partitions.DAY, monday + 7 * partitions.DAY
    assert created == [EVENTS.partition_name(day)
                       for day in (before, after, after + partitions.DAY)]
    # Dropped whole once its last day is past, like any partition.
    assert partitions.drop_older_than(EVENTS, after - timedelta(hours=1)) == [
        EVENTS.partition_name(before)]
    assert partitions.drop_older_than(EVENTS, after) == [week]
