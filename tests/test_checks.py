from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from queues import checks
from tests.factories import QueueFactory


def test_the_project_settings_pass_the_queue_checks():
    assert checks.django_q_leaves_retries_to_queueadmin(None) == []


@pytest.mark.parametrize(
    ("override", "check_id"),
    [
        ({"max_attempts": 0}, "queues.E001"),
        ({"ack_failures": False}, "queues.E001"),
        ({"catch_up": True}, "queues.E001"),
        ({"retry": 300, "timeout": 300}, "queues.E002"),
    ],
)
def test_it_refuses_django_q_settings_that_redeliver_on_their_own(settings, override, check_id):
    settings.Q_CLUSTER = settings.Q_CLUSTER | override
    errors = checks.django_q_leaves_retries_to_queueadmin(None)
    assert [e.id for e in errors] == [check_id]


@pytest.mark.django_db
def test_a_queue_stale_threshold_below_the_task_timeout_fails_the_database_check():
    QueueFactory(key="hasty", stale_threshold=timedelta(seconds=120))
    with pytest.raises(SystemCheckError, match="Queue 'hasty': stale threshold must be more"):
        call_command("check", "--database", "default")


@pytest.mark.django_db
def test_a_queue_form_refuses_a_stale_threshold_below_the_task_timeout():
    queue = QueueFactory.build(key="hasty", name="Hasty", stale_threshold=timedelta(minutes=2))
    with pytest.raises(ValidationError, match="stale threshold must be more than"):
        queue.full_clean()


def test_it_refuses_a_task_timeout_the_selector_loop_cannot_run_in(settings):
    assert checks.the_selector_loop_fits_in_the_task_timeout(None) == []
    settings.Q_CLUSTER = settings.Q_CLUSTER | {"timeout": 45, "retry": 105}
    [error] = checks.the_selector_loop_fits_in_the_task_timeout(None)
    assert error.id == "queues.E004" and "at least 120 s" in error.msg


@pytest.mark.django_db
def test_a_queue_handler_timeout_longer_than_the_task_allows_fails_the_database_check():
    QueueFactory(key="patient", handler_timeout=timedelta(seconds=290))
    with pytest.raises(SystemCheckError,
                       match=r"Queue 'patient': handler timeout must be at most the worker task "
                             r"timeout less 30 s \(270 s\)"):
        call_command("check", "--database", "default")


@pytest.mark.django_db
def test_a_queue_form_refuses_a_handler_timeout_the_batch_cannot_give():
    queue = QueueFactory.build(key="patient", name="Patient",
                               handler_timeout=timedelta(seconds=290))
    with pytest.raises(ValidationError, match="handler timeout must be at most"):
        queue.full_clean()


def test_the_project_settings_provide_what_the_app_uses():
    assert checks.the_project_provides_what_the_app_uses(None) == []


def test_it_names_the_missing_htmx_middleware_and_request_context_processor(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "htmx" not in m]
    settings.TEMPLATES = [{**engine, "OPTIONS": {"context_processors": []}}
                          for engine in settings.TEMPLATES]
    assert [e.id for e in checks.the_project_provides_what_the_app_uses(None)] == [
        "queues.E007", "queues.E008"]


def test_the_recommended_django_q_settings_pass_the_queue_checks(settings):
    from queues.conf import q_cluster

    settings.Q_CLUSTER = q_cluster(timeout=200)
    assert checks.django_q_leaves_retries_to_queueadmin(None) == []
    assert checks.the_selector_loop_fits_in_the_task_timeout(None) == []


def test_two_factor_login_is_complete_in_the_project_settings():
    assert checks.two_factor_login_is_complete(None) == []


def test_two_factor_login_without_the_otp_middleware_is_refused(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "django_otp" not in m]
    assert [e.id for e in checks.two_factor_login_is_complete(None)] == ["queues.E010"]


def test_requiring_two_factor_for_admins_without_django_otp_is_refused(settings, monkeypatch):
    settings.QUEUEADMIN = {**settings.QUEUEADMIN, "REQUIRE_TWO_FACTOR_FOR_ADMINS": True}
    monkeypatch.setattr(checks, "two_factor_installed", lambda: False)
    assert [e.id for e in checks.two_factor_login_is_complete(None)] == ["queues.E009"]


@pytest.mark.postgres
@pytest.mark.django_db
def test_it_warns_when_the_items_table_is_not_autovacuumed():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')")
        server_off = cursor.fetchone()[0] == "off"  # CI servers may run without it
        cursor.execute("ALTER TABLE queues_item SET (autovacuum_enabled = false)")
    [warning] = checks.postgresql_vacuums_the_items_table(None, databases=["default"])
    assert warning.id == "queues.W001"
    assert warning.msg.endswith("on this server." if server_off else "for queues_item.")


@pytest.mark.parametrize(("server", "table_off", "where"), [
    ("off", False, "on this server"),
    ("off", True, "on this server"),
    ("on", True, "for queues_item"),
    ("on", False, ""),
])
def test_it_names_where_autovacuum_is_off(server, table_off, where):
    assert checks.autovacuum_off_where(server, table_off, "queues_item") == where


def test_the_autovacuum_check_needs_a_database():
    assert checks.postgresql_vacuums_the_items_table(None, databases=None) == []


@pytest.mark.django_db
def test_it_says_nothing_of_autovacuum_on_sqlite():
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("SQLite has no autovacuum of this kind")
    assert checks.postgresql_vacuums_the_items_table(None, databases=["default"]) == []
