import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ

from queues.engine import bulk, counters, lifecycle, selector
from queues.engine.handlers import TASK_HANDLER
from queues.models import AuditEntry, BulkOperation, Item, ItemEvent, Status
from tests.factories import QueueFactory, enqueued, items_in_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails")


@pytest.fixture(autouse=True, params=["counted in range", "counted from the totals"])
def counting(request, monkeypatch):
    """Every test once as the preview counts big ranges: from the first item on, whichever of
    the items in range and the status's total less those out of range turns out smaller."""
    if request.param == "counted from the totals":
        monkeypatch.setattr(bulk, "COUNT_PROBE", 1)


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(bulk, "STEP_SIZE", 10)


def a_filter(queue, kind, statuses, **extra):
    now = timezone.now()
    return bulk.BulkFilter.build(queue, kind, statuses, now - timedelta(days=7),
                                 now + timedelta(minutes=1), **extra)


def confirm(preview, actor="ops"):
    return bulk.start(preview.filter, expected=preview.eligible,
                      filter_hash=preview.filter.digest(), actor=actor)


def run_to_end(operation):
    while bulk.step(operation.pk):
        pass
    operation.refresh_from_db()
    return operation


@pytest.mark.parametrize(("changes", "field"), [
    ({"kind": "destroy"}, "kind"),
    ({"statuses": []}, "statuses"),
    ({"statuses": ["failed", "lost"]}, "statuses"),
    ({"created_to": timezone.now() - timedelta(days=30)}, "created_to"),
    ({"created_from": timezone.now().replace(tzinfo=None)}, "created_from"),
])
def test_it_refuses_a_bad_filter_naming_the_field(queue, changes, field):
    now = timezone.now()
    args = {"kind": "retry", "statuses": ["failed"], "created_from": now - timedelta(days=1),
            "created_to": now} | changes
    with pytest.raises(bulk.BulkError) as error:
        bulk.BulkFilter.build(queue, **args)
    assert field in error.value.fields


def test_preview_counts_eligible_and_explains_the_ineligible(queue):
    items_in_status(queue, "queued", 3, prefix="q")
    items_in_status(queue, "running", 2, prefix="r")
    items_in_status(queue, "complete", 1, prefix="c")
    preview = bulk.preview(a_filter(queue, "cancel", ["queued", "running"]))
    assert preview.eligible == 3
    assert preview.ineligible == {
        "running items are not cancelled mid-flight; they finish on their own": 2}
    assert preview.matching == 5
    assert len(preview.sample) == 3
    assert preview.filter.snapshot_at is not None and preview.filter.max_id


def test_preview_of_a_retry_counts_identifiers_live_again_as_ineligible(queue):
    [failed] = items_in_status(queue, "failed", prefix="order")
    items_in_status(queue, "failed", 2, prefix="other")
    lifecycle.enqueue_many(queue.key, [{"account": "acme", "identifier": failed.identifier}])
    preview = bulk.preview(a_filter(queue, "retry", ["failed"]))
    assert preview.eligible == 2
    assert preview.ineligible == {"its identifier is live again on another item": 1}


def test_a_count_from_the_totals_equals_the_items_in_range_and_snapshot(queue, monkeypatch):
    in_range = items_in_status(queue, "failed", 3, prefix="in")
    [old] = items_in_status(queue, "failed", 1, prefix="old")
    Item.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=30))
    items_in_status(queue, "complete", 2, prefix="done")
    counters.rollup()  # some counts folded, the next ones still deltas
    more = items_in_status(queue, "failed", 2, prefix="more")
    [late] = items_in_status(queue, "running", 1, prefix="late")
    frozen = a_filter(queue, "retry", ["failed"]).frozen(timezone.now())
    # Enqueued on a host whose clock runs ahead: an id inside the snapshot, a time past it.
    Item.objects.filter(pk=more[0].pk).update(created_at=frozen.snapshot_at + timedelta(
        seconds=30))
    items_in_status(queue, "failed", 2, prefix="after")  # enqueued past the snapshot
    lifecycle.finish(queue, [lifecycle.Outcome(item_id=late.pk, attempt=1, error="x",
                                               permanent=True)], worker="w")  # failed past it
    monkeypatch.setattr(bulk, "COUNT_PROBE", 1)
    assert bulk._total_and_outside(frozen, ["failed"], 100) == (9, 5)
    assert bulk.count_items(frozen, ["failed"], 100) == 4 == frozen.items(["failed"]).count()
    assert bulk.count_items(frozen, ["failed", "complete"], 100) == 6
    assert bulk.count_items(frozen, ["failed"], 2) == 3  # stops past the limit
    lifecycle.apply("requeue", [in_range[0].pk], actor="ops")
    assert bulk.count_items(frozen, ["failed"], 100) == 3


def test_past_the_check_limit_a_retry_preview_leaves_live_identifiers_to_the_steps(
        queue, monkeypatch):
    [failed] = items_in_status(queue, "failed", prefix="order")
    items_in_status(queue, "failed", 2, prefix="other")
    lifecycle.enqueue_many(queue.key, [{"account": "acme", "identifier": failed.identifier}])
    monkeypatch.setattr(bulk, "LIVE_AGAIN_CHECK_MAX", 2)
    preview = bulk.preview(a_filter(queue, "retry", ["failed"]))
    assert (preview.eligible, preview.ineligible, preview.live_again_counted) == (3, {}, False)
    operation = run_to_end(confirm(preview))
    assert (operation.changed, operation.skipped) == (
        2, {"its identifier is live again on another item": 1})
    assert Item.objects.get(pk=failed.pk).status == Status.FAILED


def test_a_cancel_preview_has_no_live_identifiers_to_count(queue, monkeypatch):
    monkeypatch.setattr(bulk, "LIVE_AGAIN_CHECK_MAX", 0)
    items_in_status(queue, "queued", 2)
    assert bulk.preview(a_filter(queue, "cancel", ["queued"])).live_again_counted


def test_preview_filters_by_account_and_error_text(queue):
    items_in_status(queue, "failed", 2, account="acme", prefix="a")
    items_in_status(queue, "failed", 3, account="globex", prefix="g")
    assert bulk.preview(a_filter(queue, "retry", ["failed"], account="globex")).eligible == 3
    Item.objects.filter(identifier="g-0").update(last_error="Partner said 503 Unavailable")
    assert bulk.preview(a_filter(queue, "retry", ["failed"], error_contains="503 unavail")
                        ).eligible == 1


def test_confirming_runs_the_operation_in_steps_and_audits_it(
        queue, small_steps, django_capture_on_commit_callbacks):
    items_in_status(queue, "failed", 25)
    with django_capture_on_commit_callbacks(execute=True):
        operation = confirm(bulk.preview(a_filter(queue, "retry", ["failed"])))
    assert OrmQ.objects.count() == 1  # the first step is scheduled on commit
    operation = run_to_end(operation)
    assert (operation.state, operation.changed, operation.steps) == ("done", 25, 4)
    assert Item.objects.filter(queue=queue, status=Status.QUEUED).count() == 25
    entry = AuditEntry.objects.get(action="bulk.retry")
    assert entry.counts == {"eligible": 25}
    assert entry.filter["statuses"] == ["failed"]


def test_each_step_commits_on_its_own_and_a_failure_leaves_earlier_steps_applied(
        queue, small_steps, monkeypatch):
    items_in_status(queue, "queued", 25)
    operation = confirm(bulk.preview(a_filter(queue, "cancel", ["queued"])))
    real_apply = lifecycle.apply
    calls = Counter()

    def apply_failing_on_the_second_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("database went away")
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "apply", apply_failing_on_the_second_step)
    bulk.run(operation.pk)
    operation.refresh_from_db()
    assert operation.state == "failed"
    assert "database went away" in operation.error
    assert operation.changed == 10
    assert Item.objects.filter(queue=queue, status=Status.CANCELLED).count() == 10


def test_new_items_after_the_preview_do_not_invalidate_it_and_are_left_alone(queue):
    items_in_status(queue, "queued", 5, prefix="old")
    preview = bulk.preview(a_filter(queue, "cancel", ["queued"]))
    enqueued(queue, 3, prefix="new")
    operation = run_to_end(confirm(preview))
    assert operation.changed == 5
    assert set(Item.objects.filter(identifier__startswith="new").values_list(
        "status", flat=True)) == {Status.QUEUED}


def test_confirming_a_changed_snapshot_answers_with_a_fresh_preview(queue):
    items = items_in_status(queue, "queued", 5)
    preview = bulk.preview(a_filter(queue, "cancel", ["queued"]))
    lifecycle.apply("cancel", [items[0].pk], actor="someone else")
    with pytest.raises(bulk.StalePreview) as stale:
        confirm(preview)
    assert stale.value.fresh.eligible == 4
    assert not BulkOperation.objects.exists()


def test_confirming_an_altered_filter_is_refused(queue):
    items_in_status(queue, "queued", 2)
    preview = bulk.preview(a_filter(queue, "cancel", ["queued"]))
    with pytest.raises(bulk.BulkError, match="does not match"):
        bulk.start(preview.filter, expected=2, filter_hash="0" * 64, actor="ops")


def test_an_operation_over_the_maximum_is_refused(queue, settings):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "BULK_MAX_ITEMS": 3}
    items_in_status(queue, "queued", 5)
    preview = bulk.preview(a_filter(queue, "cancel", ["queued"]))
    assert preview.too_many
    with pytest.raises(bulk.BulkError, match="more than 3"):
        confirm(preview)


def failed_in_reverse_order(queue, n):
    """Failed items that failed in the reverse of the order they were enqueued, one a minute
    apart, some at the same moment: the two walks differ at every step."""
    items = items_in_status(queue, "failed", n)
    now = timezone.now()
    for i, item in enumerate(items):
        Item.objects.filter(pk=item.pk).update(finished_at=now - timedelta(minutes=i // 2))
    return items


def test_a_retry_by_failure_time_walks_in_failure_order_and_changes_each_item_once(
        queue, small_steps):
    items = failed_in_reverse_order(queue, 25)
    earliest_failures = set(Item.objects.filter(queue=queue).order_by(
        "finished_at", "created_at", "id").values_list("id", flat=True)[:10])
    operation = confirm(bulk.preview(a_filter(queue, "retry", ["failed"])))
    assert bulk.step(operation.pk)
    operation.refresh_from_db()
    assert set(operation.position) == {"status", "at", "created_at", "id"}
    first_step = set(ItemEvent.objects.filter(transition="requeued").values_list(
        "item_id", flat=True))
    assert first_step == earliest_failures  # a tie straddles the step's end
    operation = run_to_end(operation)
    assert (operation.changed, operation.steps) == (25, 4)
    assert Counter(ItemEvent.objects.filter(transition="requeued").values_list(
        "item_id", flat=True)) == Counter({item.pk: 1 for item in items})


def test_a_walk_by_enqueue_order_begun_before_the_upgrade_goes_on_in_that_order(
        queue, small_steps):
    failed_in_reverse_order(queue, 25)
    operation = confirm(bulk.preview(a_filter(queue, "retry", ["failed"])))
    first_ten = list(Item.objects.filter(queue=queue).order_by("created_at", "id")[:10])
    lifecycle.apply("requeue", [item.pk for item in first_ten], actor="ops")
    last = first_ten[-1]
    BulkOperation.objects.filter(pk=operation.pk).update(changed=10, position={
        "status": 0, "created_at": last.created_at.isoformat(), "id": last.pk})
    operation = run_to_end(operation)
    assert (operation.changed, operation.state) == (25, "done")
    assert not Item.objects.filter(queue=queue, status=Status.FAILED).exists()


def test_stopping_an_operation_keeps_what_it_did(queue, small_steps):
    items_in_status(queue, "queued", 25)
    operation = confirm(bulk.preview(a_filter(queue, "cancel", ["queued"])))
    assert bulk.step(operation.pk)
    assert bulk.stop(operation, actor="ops")
    assert not bulk.step(operation.pk)
    operation.refresh_from_db()
    assert (operation.state, operation.changed) == ("stopped", 10)
    assert not bulk.step(operation.pk)
    assert Item.objects.filter(queue=queue, status=Status.QUEUED).count() == 15
    assert AuditEntry.objects.filter(action="bulk.stop").exists()


def test_a_lost_step_is_resumed_and_the_operation_finishes(queue, small_steps):
    items_in_status(queue, "queued", 25)
    operation = confirm(bulk.preview(a_filter(queue, "cancel", ["queued"])))
    bulk.step(operation.pk)  # then its worker dies: nothing schedules the next step
    OrmQ.objects.all().delete()
    assert bulk.resume_lost(timezone.now() - timedelta(minutes=2)) == 0
    assert bulk.resume_lost(timezone.now() + timedelta(seconds=1)) == 1
    assert OrmQ.objects.count() == 1
    bulk.run(operation.pk)
    operation.refresh_from_db()
    assert (operation.state, operation.changed) == ("done", 25)


def test_repeating_a_step_neither_skips_nor_repeats_items(queue, small_steps):
    items_in_status(queue, "failed", 15)
    operation = confirm(bulk.preview(a_filter(queue, "retry", ["failed"])))
    run_to_end(operation)
    assert not bulk.step(operation.pk)
    requeued = Counter(ItemEvent.objects.filter(transition="requeued").values_list(
        "item_id", flat=True))
    assert len(requeued) == 15 and set(requeued.values()) == {1}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_bulk_cancel_racing_the_selector_loses_no_update():
    queue = QueueFactory(key="race", batch_size=50, concurrency=1_000_000)
    for offset in range(0, 2000, 1000):
        lifecycle.enqueue_many(queue.key, [
            {"account": f"acct-{n % 40}", "identifier": f"race-{n}"}
            for n in range(offset, offset + 1000)])
    operation = confirm(bulk.preview(a_filter(queue, "cancel", ["queued", "dispatched"])))
    done = threading.Event()

    def select():
        try:
            while not done.is_set():
                selector.run_round(queue)
        finally:
            connection.close()

    racer = threading.Thread(target=select)
    racer.start()
    try:
        run_to_end(operation)
    finally:
        done.set()
        racer.join()
    statuses = Counter(Item.objects.filter(queue=queue).values_list("status", flat=True))
    assert set(statuses) <= {Status.CANCELLED, Status.DISPATCHED}
    assert statuses[Status.CANCELLED] == operation.changed
    events = Counter(ItemEvent.objects.filter(queue_id=queue.pk).values_list(
        "transition", flat=True))
    assert events["cancelled"] == statuses[Status.CANCELLED]
    # An item the selector dispatched after the bulk cancelled it would show both: none does.
    dispatched_then_cancelled = ItemEvent.objects.filter(
        queue_id=queue.pk, transition="dispatched",
        item_id__in=Item.objects.filter(queue=queue, status=Status.CANCELLED).values("id"),
        at__gt=timezone.now() - timedelta(hours=1)).exclude(item_id__in=ItemEvent.objects.filter(
            queue_id=queue.pk, transition="cancelled", from_status=Status.DISPATCHED).values(
            "item_id"))
    assert not dispatched_then_cancelled.exists()


# --- dead letters and selections --------------------------------------------------------------

def test_replay_requeues_failed_items_with_open_dead_letters_and_closes_them(queue):
    from queues.models import DeadLetter

    items_in_status(queue, "failed", 3, prefix="dead")
    items_in_status(queue, "complete", 2, prefix="done")
    preview = bulk.preview(a_filter(queue, "replay", ["complete"]))  # statuses are ignored
    assert preview.filter.statuses == ("failed",)
    assert preview.eligible == 3
    operation = run_to_end(confirm(preview))
    assert (operation.state, operation.changed) == ("done", 3)
    assert not DeadLetter.objects.filter(replayed_at__isnull=True).exists()
    assert set(DeadLetter.objects.values_list("replayed_by", flat=True)) == {
        f"bulk {operation.pk} by ops"}
    assert AuditEntry.objects.filter(action="bulk.replay").exists()


def test_replay_filters_by_dead_letter_reason(queue):
    from queues.models import DeadLetter

    items = items_in_status(queue, "failed", 3)
    DeadLetter.objects.filter(item_id=items[0].pk).update(reason="worker lost")
    preview = bulk.preview(a_filter(queue, "replay", [], reason="worker lost"))
    assert preview.eligible == 1


def test_purge_deletes_dead_items_their_history_and_their_counts(queue):
    from queues.engine import counters
    from queues.models import Attempt, DeadLetter

    items_in_status(queue, "failed", 4)
    items_in_status(queue, "complete", 1, prefix="keep")
    operation = run_to_end(confirm(bulk.preview(a_filter(queue, "purge", []))))
    assert operation.changed == 4
    assert list(Item.objects.values_list("identifier", flat=True)) == ["keep-0"]
    assert not DeadLetter.objects.exists()
    assert not Attempt.objects.filter(item__identifier__startswith="item").exists()
    counters.rollup()
    assert counters.status_counts([queue.pk])[queue.pk] == counters.exact_counts(
        [queue.pk])[queue.pk]


def test_purge_leaves_an_item_that_was_replayed_in_the_meantime(queue):
    items = items_in_status(queue, "failed", 2)
    preview = bulk.preview(a_filter(queue, "purge", []))
    operation = confirm(preview)
    lifecycle.apply("requeue", [items[0].pk], actor="someone")
    operation = run_to_end(operation)
    assert operation.changed == 1
    assert Item.objects.get(pk=items[0].pk).status == Status.QUEUED


def test_a_selection_changes_only_the_selected_items(queue):
    items = items_in_status(queue, "queued", 5)
    chosen = [items[1].pk, items[3].pk]
    preview = bulk.preview(a_filter(queue, "cancel", ["queued"], ids=chosen))
    assert preview.eligible == 2
    run_to_end(confirm(preview))
    assert sorted(Item.objects.filter(status=Status.CANCELLED).values_list("pk", flat=True)) \
        == sorted(chosen)


def test_a_selection_over_the_limit_is_refused(queue):
    with pytest.raises(bulk.BulkError) as error:
        a_filter(queue, "cancel", ["queued"], ids=range(1, 1002))
    assert "ids" in error.value.fields


def enqueued_days_ago_failed_hours_ago(queue, identifier, enqueued_days, failed_hours):
    [item] = items_in_status(queue, "failed", 1, prefix=identifier)
    now = timezone.now()
    Item.objects.filter(pk=item.pk).update(
        created_at=now - timedelta(days=enqueued_days),
        finished_at=now - timedelta(hours=failed_hours))
    return item


def last_24_hours(queue, kind, statuses, **extra):
    now = timezone.now()
    return bulk.BulkFilter.build(queue, kind, statuses, now - timedelta(hours=24), now, **extra)


def test_a_retry_ranges_over_when_items_failed_unless_told_otherwise(queue):
    # The example: enqueued 3 days ago, failed an hour ago.
    old_but_failed_now = enqueued_days_ago_failed_hours_ago(queue, "a", 3, 1)
    failed_yesterday = enqueued_days_ago_failed_hours_ago(queue, "b", 2, 30)
    by_failure = bulk.preview(last_24_hours(queue, "retry", ["failed"]))
    assert by_failure.filter.clock == "finished"
    assert [i.pk for i in by_failure.sample] == [old_but_failed_now.pk]
    by_enqueue = bulk.preview(last_24_hours(queue, "retry", ["failed"], clock="enqueued"))
    assert by_enqueue.eligible == 0
    by_days = bulk.preview(bulk.BulkFilter.build(
        queue, "retry", ["failed"], timezone.now() - timedelta(hours=36),
        timezone.now() - timedelta(hours=24)))
    assert [i.pk for i in by_days.sample] == [failed_yesterday.pk]


def test_the_sample_of_a_range_over_failure_time_shows_the_latest_failures_first(queue):
    failed_early = enqueued_days_ago_failed_hours_ago(queue, "early", 1, 20)
    failed_late = enqueued_days_ago_failed_hours_ago(queue, "late", 3, 2)
    by_failure = bulk.preview(last_24_hours(queue, "retry", ["failed"]))
    assert [i.pk for i in by_failure.sample] == [failed_late.pk, failed_early.pk]
    by_enqueue = bulk.preview(bulk.BulkFilter.build(
        queue, "retry", ["failed"], timezone.now() - timedelta(days=4), timezone.now(),
        clock="enqueued"))
    assert [i.pk for i in by_enqueue.sample] == [failed_early.pk, failed_late.pk]


def test_the_sample_merges_its_statuses_newest_first_and_stops_at_its_size(queue,
                                                                            monkeypatch):
    monkeypatch.setattr(bulk, "SAMPLE_SIZE", 4)
    now = timezone.now()
    for minutes, (status, prefix) in enumerate([("queued", "q0"), ("retry", "r0"),
                                                ("queued", "q1"), ("retry", "r1"),
                                                ("queued", "q2"), ("retry", "r2")]):
        [item] = items_in_status(queue, status, 1, prefix=prefix)
        Item.objects.filter(pk=item.pk).update(created_at=now - timedelta(minutes=minutes + 1))
    preview = bulk.preview(last_24_hours(queue, "cancel", ["queued", "retry"]))
    assert preview.eligible == 6
    assert [i.identifier for i in preview.sample] == ["q0-0", "r0-0", "q1-0", "r1-0"]


def test_a_cancel_ranges_over_when_items_were_enqueued(queue):
    items_in_status(queue, "queued", 2)
    preview = bulk.preview(last_24_hours(queue, "cancel", ["queued"]))
    assert (preview.filter.clock, preview.eligible) == ("enqueued", 2)


def test_an_item_that_fails_after_the_preview_is_left_out_of_a_range_over_failure_time(queue):
    items_in_status(queue, "failed", 1, prefix="before")
    preview = bulk.preview(a_filter(queue, "retry", ["failed"]))
    [late] = items_in_status(queue, "running", 1, prefix="late")
    Item.objects.filter(pk=late.pk).update(created_at=preview.filter.snapshot_at)
    lifecycle.finish(queue, [lifecycle.Outcome(item_id=late.pk, attempt=1, error="x",
                                               permanent=True)], worker="w")
    operation = confirm(preview)
    run_to_end(operation)
    assert Item.objects.get(pk=late.pk).status == Status.FAILED


def test_an_identifier_prefix_narrows_a_bulk_filter(queue):
    items_in_status(queue, "failed", 2, prefix="order")
    items_in_status(queue, "failed", 3, prefix="invoice")
    assert bulk.preview(a_filter(queue, "retry", ["failed"], identifier_prefix="order")
                        ).eligible == 2


def test_a_task_narrows_a_bulk_filter():
    queue = QueueFactory(key="jobs", handler=TASK_HANDLER)
    items_in_status(queue, "failed", 2, prefix="charge", task_path="billing.tasks.charge")
    items_in_status(queue, "failed", 3, prefix="refund", task_path="billing.tasks.refund")
    bulk_filter = a_filter(queue, "retry", ["failed"], task=" billing.tasks.charge ")
    assert bulk_filter.task == "billing.tasks.charge"
    assert bulk.preview(bulk_filter).eligible == 2


def test_an_operation_recorded_before_tasks_selects_every_item(queue):
    data = a_filter(queue, "retry", ["failed"]).as_json()
    del data["task"]
    assert bulk.BulkFilter.from_json(data).task == ""


def test_it_refuses_an_unknown_clock(queue):
    with pytest.raises(bulk.BulkError) as refused:
        a_filter(queue, "retry", ["failed"], clock="yesterday")
    assert "clock" in refused.value.fields


def test_an_operation_recorded_before_clocks_keeps_its_enqueue_time_range(queue):
    data = a_filter(queue, "retry", ["failed"]).as_json()
    del data["clock"], data["identifier_prefix"]
    assert bulk.BulkFilter.from_json(data).clock == "enqueued"
    assert bulk.BulkFilter.from_json({**data, "kind": "replay"}).clock == "finished"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_submissions_of_one_confirmation_start_one_operation():
    queue = QueueFactory(key="twice")
    items_in_status(queue, "failed", 3)
    preview = bulk.preview(a_filter(queue, "retry", ["failed"]))
    sent = bulk.confirmation(preview)
    barrier, answers = threading.Barrier(2), []

    def submit():
        try:
            barrier.wait()
            answers.append(bulk.start_confirmed(
                bulk.from_confirmation(sent["frozen"]), expected=sent["expected"],
                filter_hash=sent["filter_hash"], actor="ops"))
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(started for _, started in answers) == [False, True]
    assert len({operation.pk for operation, _ in answers}) == 1
    assert BulkOperation.objects.count() == 1
    assert AuditEntry.objects.filter(action="bulk.retry").count() == 1


@pytest.mark.parametrize("clock", ["enqueued", "next_run", "finished"])
def test_a_second_retry_of_the_same_range_leaves_what_the_first_ran_and_failed_again(
        queue, clock):
    """Both operators previewed and confirmed the same failures; the items the first retry
    ran failed again after both previews, so the second has nothing left that it saw."""
    from queues.engine.lifecycle import Outcome
    queue.max_retries = 0
    queue.save()
    items = items_in_status(queue, "failed", 4)
    alice = confirm(bulk.preview(a_filter(queue, "retry", ["failed"], clock=clock)), "alice")
    bob = confirm(bulk.preview(a_filter(queue, "retry", ["failed"], clock=clock)), "bob")
    assert run_to_end(alice).changed == 4
    ids = [item.pk for item in items]
    lifecycle.apply("dispatch", ids, actor="selector")
    lifecycle.apply("start", ids, actor="worker", expected_attempts=dict.fromkeys(ids, 1))
    lifecycle.finish(queue, [Outcome(item_id=pk, attempt=1, error="down") for pk in ids],
                     worker="w")

    assert run_to_end(bob).changed == 0
    assert set(Item.objects.values_list("status", flat=True)) == {Status.FAILED}


def test_a_finished_operation_reads_its_queues_head_once_so_an_operator_need_not(
        queue, small_steps, monkeypatch):
    # A cancel of the oldest waiting items leaves their index entries dead at the head, which
    # the first reader walks (and marks); the worker is that reader, not the next overview.
    items_in_status(queue, "queued", 25)
    operation = confirm(bulk.preview(a_filter(queue, "cancel", ["queued"])))
    reads = []
    monkeypatch.setattr(counters, "oldest_waiting", lambda ids, now: reads.append(ids))
    bulk.run(operation.pk)
    assert reads == [[queue.pk]]


@pytest.mark.postgres
def test_a_retry_preview_on_a_queue_the_statistics_do_not_know_looks_each_identifier_up_once(
        queue):
    # As in a database that has run for a while: its statistics know other queues' items.
    known = QueueFactory()
    for batch in range(2):
        enqueued(known, 1000, prefix=f"known-{batch}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_item")
    for batch in range(5):
        enqueued(queue, 1000, prefix=f"waiting-{batch}")
    items_in_status(queue, "failed", 20)

    def live_entries_read():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_stat_get_xact_tuples_returned('item_live_identifier_uniq'::regclass)")
            return cursor.fetchone()[0]

    before = live_entries_read()
    assert bulk.preview(a_filter(queue, "retry", ["failed"])).eligible == 20
    # At most one entry per failure, not the queue's 5,000 live items once per failure.
    assert live_entries_read() - before < 100
