"""queues.tasks_backend: Django's tasks framework enqueueing items for tenants, validated like
the JSON API, inside the caller's transaction, and read back through get_result()."""

import sys
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from queues.engine import selector
from queues.engine.handlers import TASK_HANDLER
from queues.engine.lifecycle import EnqueueError, UnknownQueue
from queues.engine.tasks import (
    InvalidTask,
    Task,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from queues.models import Item, ItemEvent, Queue, Status
from queues.tasks_backend import QueueAdminBackend, tenant
from tests import tasks
from tests.factories import QueueFactory, run_one_round

pytestmark = pytest.mark.django_db
BACKEND = "queues.tasks_backend.QueueAdminBackend"


def tasks_setting(**options):
    return override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": [],
                                                "OPTIONS": options}})


def written():
    return Item.objects.count(), ItemEvent.objects.count(), Queue.objects.count()


# --- enqueue ---------------------------------------------------------------------------------

def test_enqueue_puts_an_item_for_the_tenant_on_the_queue_the_task_names():
    with tenant("acme"):
        result = tasks.multiply.enqueue(6, b=7)

    item = Item.objects.get()
    queue = item.queue
    assert (queue.key, queue.name, queue.handler) == ("maths", "maths", TASK_HANDLER)
    assert (item.account, item.identifier, item.priority, item.status) == (
        "acme", result.id, 7, Status.QUEUED)
    assert item.payload == {"args": [6], "kwargs": {"b": 7}}
    assert item.task_path == "tests.tasks.multiply"
    assert item.run_at == item.created_at == result.enqueued_at
    assert ItemEvent.objects.get().actor == "django.tasks"
    assert (result.status, result.task, result.args, result.kwargs, result.backend) == (
        TaskResultStatus.READY, tasks.multiply, [6], {"b": 7}, "default")
    assert (result.attempts, result.errors, result.started_at, result.finished_at) == (
        0, [], None, None)


def test_every_enqueue_is_a_new_item_with_its_own_result_id():
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(1, 1)
    assert first.id != second.id
    assert Item.objects.count() == 2


def test_priority_and_run_after_are_stored_as_given():
    run_after = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(priority=-100, run_after=run_after).enqueue(1, 2)
    item = Item.objects.get(identifier=result.id)
    assert (item.priority, item.run_at) == (-100, run_after)


def test_a_deferred_task_waits_for_its_time():
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    result = selector.run_round(Queue.objects.get(key="default"))
    assert result.item_ids == []


def test_work_without_a_tenant_goes_to_the_default_account():
    tasks.add.enqueue(1, 2)
    assert Item.objects.get().account == "default"


def test_the_innermost_tenant_block_wins_and_ends_with_its_block():
    with tenant("acme"):
        with tenant("globex"):
            tasks.add.enqueue(1, 1)
        tasks.add.enqueue(2, 2)
    tasks.add.enqueue(3, 3)
    accounts = Item.objects.order_by("id").values_list("account", flat=True)
    assert list(accounts) == ["globex", "acme", "default"]


@tasks_setting(TENANT="tests.tasks.tenant_of")
def test_a_tenant_callable_named_in_the_options_is_asked_when_no_block_is_active():
    tasks.multiply.enqueue(1, 2)
    with tenant("acme"):
        tasks.multiply.enqueue(3, 4)
    accounts = Item.objects.order_by("id").values_list("account", flat=True)
    assert list(accounts) == ["tenant-of-maths", "acme"]


@tasks_setting(DEFAULT_TENANT=None)
def test_work_without_a_tenant_is_refused_when_there_is_no_default():
    with pytest.raises(EnqueueError, match="has no tenant") as refused:
        tasks.add.enqueue(1, 2)
    assert refused.value.fields == {"account": "is required"}
    assert written() == (0, 0, 0)


@pytest.mark.parametrize("account", ["", "a" * 201, "line\nbreak"])
def test_a_tenant_the_api_would_refuse_is_refused(account):
    with tenant(account), pytest.raises(EnqueueError) as refused:
        tasks.add.enqueue(1, 2)
    assert "account" in refused.value.fields
    assert written() == (0, 0, 0)


@tasks_setting(CREATE_QUEUES=False)
def test_a_missing_queue_is_refused_when_queues_must_exist():
    with pytest.raises(UnknownQueue, match="there is no queue 'maths'"):
        tasks.multiply.enqueue(1, 2)
    assert written() == (0, 0, 0)
    QueueFactory(key="maths", handler=TASK_HANDLER)
    tasks.multiply.enqueue(1, 2)
    assert Item.objects.count() == 1


def test_a_queue_running_another_handler_takes_no_tasks():
    QueueFactory(key="default", handler="noop")
    with pytest.raises(EnqueueError, match="runs handler 'noop'"):
        tasks.add.enqueue(1, 2)
    assert Item.objects.count() == 0


def test_a_rollback_of_the_callers_transaction_leaves_no_item_and_no_queue():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.multiply.enqueue(1, 2)
        assert Item.objects.count() == 1
        raise RuntimeError("the caller's work failed")
    assert written() == (0, 0, 0)


def test_enqueue_sends_the_frameworks_task_enqueued_signal():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [(QueueAdminBackend, result.id)]


def test_aenqueue_and_aget_result_work_from_async_code():
    async def enqueue_and_read():
        with tenant("acme"):
            result = await tasks.greet.aenqueue("ada")
        return result, await tasks.greet.aget_result(result.id)

    result, read = async_to_sync(enqueue_and_read)()
    assert read.id == result.id and read.status == TaskResultStatus.READY
    assert Item.objects.get().account == "acme"


# --- arguments: the JSON API's rules ---------------------------------------------------------

def nested(levels):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(("args", "kwargs", "field", "words"), [
    ((object(),), {}, "args[0]", "not a JSON value"),
    ((b"bytes",), {}, "args[0]", "not a JSON value"),
    ((float("nan"),), {}, "args[0]", "not valid JSON"),
    ((2**53,), {}, "args[0]", "out of range"),
    (({1: "one"},), {}, "args[0]", "keys must be strings"),
    (("a\x00b",), {}, "args[0]", "\\u0000"),
    (("\ud800",), {}, "args[0]", "lone surrogates"),
    ((), {"deep": nested(31)}, "kwargs.deep" + "[0]" * 31, "nested deeper"),
    ((), {"note": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}, "kwargs.note.when",
     "not a JSON value"),
])
def test_arguments_json_cannot_hold_exactly_are_refused_naming_the_argument(args, kwargs, field,
                                                                            words):
    with pytest.raises(EnqueueError) as refused:
        tasks.add.enqueue(*args, **kwargs)
    assert words in refused.value.fields[field], refused.value.fields
    assert written() == (0, 0, 0)


def test_a_list_that_contains_itself_is_refused_not_walked_forever():
    loop = []
    loop.append(loop)
    with pytest.raises(EnqueueError, match="nested deeper"):
        tasks.add.enqueue(loop, 1)


def test_tuples_are_stored_as_arrays():
    result = tasks.add.enqueue((1, 2), {"pair": (3, 4)})
    assert Item.objects.get().payload == {"args": [[1, 2], {"pair": [3, 4]}], "kwargs": {}}
    assert result.args == [[1, 2], {"pair": [3, 4]}]


@override_settings(QUEUEADMIN={"API_MAX_PAYLOAD_BYTES": 1000})
def test_arguments_over_the_apis_payload_limit_are_refused():
    tasks.add.enqueue("x" * 900, 1)
    with pytest.raises(EnqueueError) as refused:
        tasks.add.enqueue("x" * 1000, 1)
    assert refused.value.fields["payload"].endswith("at most 1000")
    assert Item.objects.count() == 1


def test_run_after_past_the_apis_horizon_is_refused():
    late = tasks.add.using(run_after=timezone.now() + timedelta(days=91))
    with pytest.raises(EnqueueError) as refused:
        late.enqueue(1, 2)
    assert refused.value.fields == {"run_after": "is more than 90 days ahead"}
    assert written() == (0, 0, 0)


# --- validate_task ---------------------------------------------------------------------------

def test_the_backend_supports_defer_priority_async_tasks_and_results():
    backend = tasks.add.get_backend()
    assert isinstance(backend, QueueAdminBackend)
    assert (backend.supports_defer, backend.supports_priority, backend.supports_async_task,
            backend.supports_get_result) == (True, True, True, True)


def test_a_task_whose_function_is_not_at_module_level_is_invalid():
    def nested():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        Task(func=nested)


@pytest.mark.parametrize(("changes", "words"), [
    ({"priority": 101}, "between -100 and 100"),
    ({"priority": -101}, "between -100 and 100"),
    ({"queue_name": "Not A Key"}, "is not a queue key"),
    ({"queue_name": "x" * 65}, "is not a queue key"),
    ({"run_after": datetime(2026, 1, 1)}, "aware"),  # noqa: DTZ001
    ({"run_after": datetime(2100, 1, 1, tzinfo=UTC)}, "between 1970-01-01 and 2100-01-01"),
    ({"run_after": datetime(1969, 12, 31, tzinfo=UTC)}, "between 1970-01-01 and 2100-01-01"),
])
def test_a_task_the_backend_cannot_run_is_invalid(changes, words):
    with pytest.raises(InvalidTask, match=words):
        tasks.add.using(**changes)


def test_a_context_task_needs_a_first_argument_named_context():
    with pytest.raises(InvalidTask, match="context"):
        Task(func=tasks.plain_function, takes_context=True)


@override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["emails"]}})
def test_the_frameworks_queues_setting_limits_the_queue_names():
    with pytest.raises(InvalidTask, match="not valid for backend"):
        tasks.add.enqueue(1, 2)
    tasks.add.using(queue_name="emails").enqueue(1, 2)


def test_a_task_the_worker_would_not_find_at_its_module_path_is_refused():
    # tests.tasks.plain_function is a plain function: the worker would find no task there.
    with pytest.raises(InvalidTask, match="not this task"):
        Task(func=tasks.plain_function).enqueue()
    assert written() == (0, 0, 0)


def test_a_task_of_a_scripts_main_module_is_refused(monkeypatch):
    def script_task():
        pass

    script_task.__module__, script_task.__qualname__ = "__main__", "script_task"
    monkeypatch.setattr(sys.modules["__main__"], "script_task", Task(func=script_task),
                        raising=False)
    with pytest.raises(InvalidTask, match="__main__.script_task is not this task"):
        sys.modules["__main__"].script_task.enqueue()


@pytest.mark.parametrize(("options", "words"), [
    ({"CREATE_QUEUE": True}, "unknown options CREATE_QUEUE"),
    ({"CREATE_QUEUES": "yes"}, "True or False"),
    ({"DEFAULT_TENANT": 42}, "an account or None"),
    ({"TENANT": len}, "dotted path"),
])
def test_bad_options_stop_the_backend_with_their_name(options, words):
    with pytest.raises(ImproperlyConfigured, match=words):
        QueueAdminBackend("default", {"OPTIONS": options})


# --- get_result ------------------------------------------------------------------------------

def test_get_result_reads_back_what_enqueue_returned():
    with tenant("acme"):
        result = tasks.greet.enqueue("ada", punctuation="?")
    read = tasks.greet.get_result(result.id)
    assert (read.id, read.status, read.args, read.kwargs, read.enqueued_at, read.task) == (
        result.id, TaskResultStatus.READY, ["ada"], {"punctuation": "?"}, result.enqueued_at,
        tasks.greet)


def test_refresh_follows_the_item_through_the_worker():
    result = tasks.add.enqueue(20, 22)
    assert run_one_round("default") == {"complete": 1}
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL, 42, 1)


@pytest.mark.parametrize("result_id", ["no-such-id", "", "a\x00b", "x" * 300, "12"])
def test_an_unknown_result_id_does_not_exist(result_id):
    tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_backend().get_result(result_id)


def test_an_item_enqueued_without_the_framework_has_no_result():
    from queues import enqueue

    QueueFactory(key="emails")
    item = enqueue("emails", account="acme", identifier="shared-id")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_backend().get_result(item.identifier)


# --- fairness --------------------------------------------------------------------------------

def test_small_tenants_finish_within_the_first_rounds_beside_a_big_one():
    """1 tenant with 1,000 tasks and 10 with 10 each, enqueued through django.tasks: rounds of
    60 share slots evenly, so every small tenant is done after two rounds."""
    with transaction.atomic():
        with tenant("big"):
            for n in range(1000):
                tasks.add.enqueue(n, 1)
        for small in range(10):
            with tenant(f"small-{small}"):
                for n in range(10):
                    tasks.add.enqueue(n, 1)
    assert run_one_round("default") == {"complete": 60}
    assert run_one_round("default") == {"complete": 60}
    done = Item.objects.filter(status=Status.COMPLETE)
    assert done.exclude(account="big").count() == 100
    assert done.filter(account="big").count() == 20
