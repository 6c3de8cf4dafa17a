import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db.models import Count

from queues.bench import scenarios as bench
from queues.engine import counters
from queues.models import AccountPolicy, Item, Queue
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_demo_creates_five_queues_items_in_every_status_and_an_admin(tmp_path, monkeypatch):
    from queues.bench.management.commands import demo

    monkeypatch.setattr(demo, "CREDENTIALS_FILE", tmp_path / "creds.txt")
    output = run("demo", "--items", "3000", "--accounts", "210")
    assert Queue.objects.count() == 5
    assert Queue.objects.filter(paused=True).count() == 1
    assert AccountPolicy.objects.count() == 3
    assert Item.objects.values("status").distinct().count() == 7
    assert Item.objects.values("account").distinct().count() == 210
    password = (tmp_path / "creds.txt").read_text().split()[1]
    assert f"admin / {password}" in output
    assert get_user_model().objects.get(username="admin").check_password(password)
    ids = list(Queue.objects.values_list("pk", flat=True))
    assert counters.status_counts(ids) == counters.exact_counts(ids)


@pytest.mark.django_db(transaction=True)
def test_demo_run_twice_keeps_data_and_credentials(tmp_path, monkeypatch):
    from queues.bench.management.commands import demo

    monkeypatch.setattr(demo, "CREDENTIALS_FILE", tmp_path / "creds.txt")
    first = run("demo", "--items", "500", "--accounts", "20")
    second = run("demo", "--items", "500", "--accounts", "20")
    assert Item.objects.count() == 500
    assert "already present" in second
    assert first.splitlines()[-1] == second.splitlines()[-1]


def test_enqueue_command_puts_an_item_on_the_queue():
    QueueFactory(key="emails")
    out = run("enqueue", "emails", "--account", "acme", "--identifier", "msg-1",
              "--payload", '{"to": "a@example.com"}')
    assert "enqueued: item" in out
    assert Item.objects.get(identifier="msg-1").payload == {"to": "a@example.com"}
    assert "already live" in run("enqueue", "emails", "--account", "acme", "--identifier",
                                 "msg-1", "--payload", '{"to": "a@example.com"}')


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "--account", "a", "--identifier", "i"], "unknown queue 'nope'"),
        (["emails", "--account", "a", "--identifier", "i", "--payload", "{"], "not valid JSON"),
        (["emails", "--account", "a", "--identifier", "i", "--run-at", "2026-01-01T09:00"],
         "has no time zone"),
        (["emails", "--account", "a", "--identifier", "i", "--run-at", "2026-13-01T00:00Z"],
         "not a valid time: month must be in 1..12"),
        (["emails", "--account", "a", "--identifier", "i", "--run-at", "2026-01-01T00:00+25:00"],
         "not a valid time"),
        (["emails", "--account", "a", "--identifier", "i", "--payload", '{"a": 1, "a": 2}'],
         "duplicate key 'a'"),
        (["emails", "--account", "a", "--identifier", "i", "--payload", '{"a": "\\u0000"}'],
         "at a: strings must not contain"),
        (["emails", "--account", "a", "--identifier", "i", "--payload", "[" * 5000 + "]" * 5000],
         "nested deeper than 32 levels"),
    ],
)
def test_enqueue_command_explains_bad_input(args, message):
    QueueFactory(key="emails")
    with pytest.raises(CommandError, match=message):
        run("enqueue", *args)
    assert not Item.objects.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--rate", "nan"], "give a rate above 0"), (["--rate", "inf"], "give a rate above 0"),
    (["--rate", "0"], "give a rate above 0"), (["--accounts", "0"], "give at least 1"),
    (["--accounts", "-5"], "give at least 1"), (["--accounts", "many"], "not a whole number")])
def test_the_producer_refuses_a_rate_or_account_count_it_cannot_use(args, message):
    with pytest.raises(CommandError, match=message):
        run("produce", "--seconds", "0.1", *args)


def test_bench_enqueue_reports_throughput_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    out = run("bench", "enqueue", "--items", "300", "--batch", "100", "--accounts", "7")
    assert "throughput" in out
    data = json.loads((tmp_path / "enqueue.json").read_text())
    assert data["parameters"] == {"items": 300, "batch": 100, "accounts": 7}
    names = [name for name, _, _ in data["figures"]]
    assert {"throughput", "batch latency p50", "batch latency p95"} <= set(names)
    assert Item.objects.count() == 300


@pytest.mark.django_db(transaction=True)
def test_bench_seed_reports_each_step(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    out = run("bench", "seed", "--items", "2000", "--accounts", "30", "--queues", "2")
    assert "items per second" in out
    data = json.loads((tmp_path / "seed.json").read_text())
    rows = {name: value for name, value, _ in data["figures"]}
    assert rows["items rows"] == 2000
    assert Item.objects.count() == 2000


def test_bench_refuses_a_batch_over_the_enqueue_limit():
    with pytest.raises(CommandError, match="--batch"):
        run("bench", "enqueue", "--items", "10", "--batch", "5000")


def test_the_producer_puts_a_seconds_worth_of_items_on_open_queues():
    import random

    from queues.bench.management.commands.produce import Producer

    queues = [QueueFactory(key="mail").key, QueueFactory(key="hooks").key]
    producer = Producer(queues, rate=40, accounts=50, rng=random.Random(3))
    made = sum(producer.step() for _ in range(5))
    assert Item.objects.count() == made >= 100
    assert set(Item.objects.values_list("queue__key", flat=True)) == {"mail", "hooks"}
    per_account = sorted(
        Item.objects.values("account").annotate(n=Count("id")).values_list("n", flat=True))
    assert per_account[-1] > 3 * per_account[len(per_account) // 2]


def test_produce_refuses_to_run_without_queues():
    with pytest.raises(CommandError, match="run manage.py demo first"):
        run("produce", "--seconds", "0")


def test_reset_two_factor_turns_it_off_for_a_user_and_is_audited():
    from queues.engine import two_factor
    from queues.models import AuditEntry
    from tests.test_two_factor import code

    user = get_user_model().objects.create_user("locked-out")
    two_factor.confirm(user, code(two_factor.start(user)))
    assert "reset for 'locked-out'" in run("reset_two_factor", "locked-out")
    assert two_factor.authenticator(user) is None
    entry = AuditEntry.objects.get(action="two_factor.reset")
    assert (entry.actor_name, entry.target) == ("command:reset_two_factor", "user:locked-out")
    with pytest.raises(CommandError, match="has no authenticator"):
        run("reset_two_factor", "locked-out")
    with pytest.raises(CommandError, match="no user named"):
        run("reset_two_factor", "nobody")


# Each command's text and time arguments, with what a shell can pass that the database, the
# audit log or time.sleep cannot take: refused with a usage error before anything runs.
HOSTILE_TEXT = ["\x00", "line\nbreak", "\u2028", "\x1b[31m"]
HOSTILE_SECONDS = ["nan", "-1", "0", "inf", "1e309", "x"]
TEXT_ARGUMENTS = [("account_data", "{}"), ("account_data", "{}", "--export"),
                  ("account_data", "{}", "--erase", "--yes"),
                  ("create_api_token", "{}", "--all-queues"),
                  ("create_api_token", "walker", "--queue", "{}"),
                  ("create_api_token", "{}", "--revoke"), ("reset_two_factor", "{}"),
                  ("select", "--queue", "{}"),
                  ("enqueue", "{}", "--account", "a", "--identifier", "i")]
SECONDS_ARGUMENTS = [("select", "--loop", "--interval", "{}"),
                     ("alerts", "--loop", "--interval", "{}"), ("sweep", "--seconds", "{}")]


@pytest.mark.parametrize("value", HOSTILE_TEXT + HOSTILE_SECONDS)
def test_every_command_refuses_text_and_seconds_it_cannot_use_before_it_runs(value, monkeypatch):
    import time

    from queues.models import AuditEntry

    QueueFactory(key="q")
    monkeypatch.setattr(time, "sleep", lambda seconds: pytest.fail("ran with a bad argument"))
    cases = TEXT_ARGUMENTS if value in HOSTILE_TEXT else SECONDS_ARGUMENTS
    for case in cases:
        with pytest.raises(CommandError, match="invalid|printable|seconds"):
            run(*(part.format(value) for part in case))
    assert not AuditEntry.objects.exists() and not Item.objects.exists()


def test_the_loops_take_a_fraction_of_a_second_and_a_day_at_most():
    from queues.management.arguments import seconds

    assert seconds("0.05") == 0.05 and seconds("86400") == 86400
    with pytest.raises(Exception, match="at most 86,400"):
        seconds("86401")
