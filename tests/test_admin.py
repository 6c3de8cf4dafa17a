"""Django's admin site edits a queue's settings: each is refused at the door when no worker,
sweeper or page could use it, and a refused form writes nothing."""

import json
from datetime import timedelta

import pytest

from queues.models import Queue
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue():
    return QueueFactory(key="emails", name="Emails")


def form_data(queue: Queue, **changes) -> dict:
    def duration(value: timedelta) -> str:
        return f"{value.days} {value.seconds // 3600:02}:{value.seconds // 60 % 60:02}:" \
               f"{value.seconds % 60:02}"

    data = {
        "key": queue.key, "name": queue.name, "handler": queue.handler,
        "handler_options": json.dumps(queue.handler_options),
        "batch_size": queue.batch_size, "concurrency": queue.concurrency,
        "rate_limit_per_minute": "", "max_retries": queue.max_retries,
        "backoff_seconds": json.dumps(queue.backoff_seconds),
        "dispatch_timeout": duration(queue.dispatch_timeout),
        "stale_threshold": duration(queue.stale_threshold),
        "handler_timeout": duration(queue.handler_timeout),
        "retention_days": queue.retention_days, "max_ready": queue.max_ready,
        "paused_by": "", "paused_at_0": "", "paused_at_1": "",
        "sensitive_keys": json.dumps(queue.sensitive_keys),
    }
    return data | changes


def test_a_queue_with_sensible_settings_is_saved(role_client, queue):
    response = role_client("Admin").post(
        f"/django-admin/queues/queue/{queue.pk}/change/",
        form_data(queue, name="Outgoing e-mail", backoff_seconds="[30, 2592000]",
                  retention_days="3650", rate_limit_per_minute="1"))
    assert response.status_code == 302
    queue.refresh_from_db()
    assert (queue.name, queue.backoff_seconds, queue.retention_days) == (
        "Outgoing e-mail", [30, 2_592_000], 3650)


@pytest.mark.parametrize(("field", "value", "says"), [
    # A retry delay past 30 days reaches past 2100 or past what a datetime can add: the batch
    # recording the failure failed, its items left running.
    ("backoff_seconds", "[99999999999]", "each at most 2,592,000"),
    ("backoff_seconds", f"[{10**30}]", "out of range"),
    ("backoff_seconds", "[" + ", ".join(["60"] * 102) + "]", "a list of 1 to 101"),
    ("retention_days", "2147483647", "less than or equal to 3650"),
    ("dispatch_timeout", "-1 00:00:00", "greater than or equal to"),
    ("dispatch_timeout", "00:00:00", "greater than or equal to"),
    ("stale_threshold", "999999999 00:00:00", "less than or equal to"),
    ("rate_limit_per_minute", "0", "greater than or equal to 1"),
    ("max_ready", "0", "greater than or equal to 1"),
    ("handler", "no-such-handler", "Select a valid choice"),
    ("name", "Emails\u202egnp.exe", "printable"),
    ("name", "Emails\u2028Outgoing", "printable"),
    ("handler_options", '{"url": "a\\u0000b"}', "strings must not contain"),
    ("handler_options", '{"k": "\\ud800"}', "lone surrogates"),
    ("handler_options", "[" * 3000 + "]" * 3000, "nested deeper than 32 levels"),
    ("handler_options", '{"a": 1, "a": 2}', "duplicate key"),
    ("sensitive_keys", '["\\ud800"]', "lone surrogates"),
])
def test_a_setting_no_worker_could_use_is_refused_and_nothing_is_written(
        role_client, queue, field, value, says):
    before = Queue.objects.filter(pk=queue.pk).values().get()
    response = role_client("Admin").post(f"/django-admin/queues/queue/{queue.pk}/change/",
                                         form_data(queue, **{field: value}))
    assert response.status_code == 200  # the form again, with the error beside the field
    errors = response.context["adminform"].form.errors
    assert field in errors and says in " ".join(errors[field])
    assert Queue.objects.filter(pk=queue.pk).values().get() == before


def test_an_account_policy_added_in_the_admin_names_the_account_as_items_store_it(
        role_client, queue):
    from queues.models import AccountPolicy

    response = role_client("Admin").post("/django-admin/queues/accountpolicy/add/", {
        "queue": queue.pk, "account": "cafe\u0301", "weight": 2, "paused_by": "",
        "paused_at_0": "", "paused_at_1": ""})

    assert response.status_code == 302
    assert AccountPolicy.objects.get().account == "café"


# --- users, roles and django-q2's schedules ---------------------------------------------------

def user_form(user, **changes) -> dict:
    return {"username": user.username, "first_name": "", "last_name": "", "email": "",
            "is_active": "on", "is_staff": "", "groups": [g.pk for g in user.groups.all()],
            "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00"} | changes


def test_an_admin_cannot_make_anyone_superuser_or_grant_permissions(role_client):
    """A superuser may edit django-q2's schedules, which name any function for the workers to
    run: an Admin promoting themselves would take what the role withholds."""
    from django.contrib.auth.models import Permission

    client = role_client("Admin")
    admin_user = client.user
    permission = Permission.objects.get(codename="add_schedule")
    response = client.post(f"/django-admin/auth/user/{admin_user.pk}/change/", user_form(
        admin_user, is_superuser="on", user_permissions=[permission.pk]))
    assert response.status_code == 302
    admin_user.refresh_from_db()
    assert not admin_user.is_superuser and not admin_user.user_permissions.exists()
    assert client.get("/django-admin/django_q/schedule/add/").status_code == 403


def test_an_admin_cannot_change_or_delete_a_superuser(role_client):
    from django.contrib.auth.models import User

    root = User.objects.create_superuser("root", password="root-pw-1-long-enough")
    client = role_client("Admin")
    assert client.get(f"/django-admin/auth/user/{root.pk}/change/").status_code == 200  # view
    response = client.post(f"/django-admin/auth/user/{root.pk}/change/",
                           user_form(root, is_active=""))
    assert response.status_code == 403
    assert client.post(f"/django-admin/auth/user/{root.pk}/password/", {
        "password1": "taken-over-9-long", "password2": "taken-over-9-long"}).status_code == 403
    assert client.post(f"/django-admin/auth/user/{root.pk}/delete/",
                       {"post": "yes"}).status_code == 403
    root.refresh_from_db()
    assert root.is_active and root.check_password("root-pw-1-long-enough")


def test_an_admin_cannot_grant_permissions_to_a_role(role_client):
    from django.contrib.auth.models import Group, Permission

    group = Group.objects.get(name="Viewer")
    before = set(group.permissions.values_list("pk", flat=True))
    permission = Permission.objects.get(codename="add_schedule")
    role_client("Admin").post(f"/django-admin/auth/group/{group.pk}/change/", {
        "name": "Viewer", "permissions": [*before, permission.pk]})
    assert set(group.permissions.values_list("pk", flat=True)) == before


def test_schedules_are_read_only_in_the_admin_even_for_a_superuser(client):
    from django.contrib.auth.models import User
    from django_q.models import Schedule

    client.force_login(User.objects.create_superuser("root", password="root-pw-1-long-enough"))
    schedule = Schedule.objects.first()
    assert client.get("/django-admin/django_q/schedule/").status_code == 200
    assert client.get("/django-admin/django_q/schedule/add/").status_code == 403
    response = client.post(f"/django-admin/django_q/schedule/{schedule.pk}/change/", {
        "name": schedule.name, "func": "os.system", "schedule_type": "I", "repeats": "-1"})
    assert response.status_code == 403
    schedule.refresh_from_db()
    assert schedule.func != "os.system"
