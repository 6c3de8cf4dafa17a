"""System checks for settings that would otherwise fail quietly in production."""

from django.conf import settings
from django.core import checks

from queues.conf import (
    MIN_TASK_TIMEOUT_SECONDS,
    handler_timeout_error,
    setting,
    stale_threshold_error,
)
from queues.permissions import TWO_FACTOR_APPS, two_factor_installed


@checks.register()
def django_q_leaves_retries_to_queueadmin(app_configs, **kwargs):
    """QueueAdmin owns attempts, backoff and dead letters; a broker that redelivers on its own
    would run items twice or forever (django-q2's defaults do)."""
    q = getattr(settings, "Q_CLUSTER", {})
    problems = []
    expected = {"max_attempts": 1, "ack_failures": True, "catch_up": False}
    for key, value in expected.items():
        if q.get(key) != value:
            problems.append(checks.Error(
                f"Q_CLUSTER[{key!r}] must be {value!r}, not {q.get(key)!r}.",
                hint="QueueAdmin records attempts and retries itself.", id="queues.E001"))
    if q.get("retry", 0) <= q.get("timeout", 0):
        problems.append(checks.Error(
            f"Q_CLUSTER['retry'] ({q.get('retry')}) must exceed Q_CLUSTER['timeout'] "
            f"({q.get('timeout')}), or a slow batch is handed to a second worker.",
            id="queues.E002"))
    return problems


@checks.register()
def the_selector_loop_fits_in_the_task_timeout(app_configs, **kwargs):
    """The selector loop runs until the next scheduled tick takes over; a task timeout shorter
    than a tick's interval plus django-q2's scheduler lag would kill it first and leave gaps."""
    timeout = getattr(settings, "Q_CLUSTER", {}).get("timeout") or 0
    if timeout < MIN_TASK_TIMEOUT_SECONDS:
        return [checks.Error(
            f"Q_CLUSTER['timeout'] ({timeout}) must be at least {MIN_TASK_TIMEOUT_SECONDS} s: the "
            f"selector loop runs until the next minute's tick takes over from it.",
            id="queues.E004")]
    return []


@checks.register(checks.Tags.database)
def queue_timeouts_fit_the_task_timeout(app_configs, databases=None, **kwargs):
    from django.db import connection

    from queues.models import Queue

    # migrate runs database checks before it creates the tables.
    if not databases or Queue._meta.db_table not in connection.introspection.table_names():
        return []
    problems = [
        checks.Error(f"Queue {key!r}: stale threshold {error}.", id="queues.E003")
        for key, threshold in Queue.objects.values_list("key", "stale_threshold")
        if (error := stale_threshold_error(threshold.total_seconds()))
    ]
    return problems + [
        checks.Error(f"Queue {key!r}: handler timeout {error}.", id="queues.E005")
        for key, timeout in Queue.objects.values_list("key", "handler_timeout")
        if (error := handler_timeout_error(timeout.total_seconds()))
    ]


@checks.register()
def the_project_provides_what_the_app_uses(app_configs, **kwargs):
    """A host project includes QueueAdmin with a few lines of its own settings; name the one
    missing rather than fail on a page with an AttributeError."""
    from django.apps import apps

    problems = [
        checks.Error(f"{app!r} must be in INSTALLED_APPS: QueueAdmin {why}.", id="queues.E006")
        for app, why in (("django_q", "runs its worker tasks and schedules on django-q2"),
                         ("django_htmx", "serves htmx from django-htmx's static files"))
        if not apps.is_installed(app)
    ]
    if "django_htmx.middleware.HtmxMiddleware" not in settings.MIDDLEWARE:
        problems.append(checks.Error(
            "'django_htmx.middleware.HtmxMiddleware' must be in MIDDLEWARE: the dashboard "
            "answers htmx requests with fragments.", id="queues.E007"))
    processors = [processor for engine in settings.TEMPLATES
                  for processor in engine.get("OPTIONS", {}).get("context_processors", ())]
    if "django.template.context_processors.request" not in processors:
        problems.append(checks.Error(
            "'django.template.context_processors.request' must be among the template context "
            "processors: the dashboard's templates read the request.", id="queues.E008"))
    return problems


@checks.register()
def two_factor_login_is_complete(app_configs, **kwargs):
    """Without django-otp's middleware no session is ever verified, so every user with an
    authenticator would be refused; without its apps no Admin could meet the requirement."""
    problems = []
    if setting("REQUIRE_TWO_FACTOR_FOR_ADMINS") and not two_factor_installed():
        problems.append(checks.Error(
            f"REQUIRE_TWO_FACTOR_FOR_ADMINS needs {', '.join(TWO_FACTOR_APPS)} in "
            "INSTALLED_APPS.", id="queues.E009"))
    if two_factor_installed() and "django_otp.middleware.OTPMiddleware" not in settings.MIDDLEWARE:
        problems.append(checks.Error(
            "'django_otp.middleware.OTPMiddleware' must be in MIDDLEWARE (after "
            "AuthenticationMiddleware): two-factor login reads whether a session gave its code.",
            id="queues.E010"))
    return problems


@checks.register(checks.Tags.database)
def postgresql_vacuums_the_items_table(app_configs, databases=None, **kwargs):
    """Items are updated several times each: without autovacuum their dead versions pile up,
    the selector's index scans slow down, and every exact count (the bulk preview's) reads the
    heap page of each row (docs/benchmarks.md, session 14). Shown by migrate at each deploy."""
    from django.db import connection

    from queues.models import Item

    if not databases or connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('autovacuum'), "
            "(SELECT 'autovacuum_enabled=false' = ANY(reloptions) FROM pg_class "
            " WHERE oid = to_regclass(%s))", [Item._meta.db_table])
        server, table_off = cursor.fetchone()
    where = autovacuum_off_where(server, bool(table_off), Item._meta.db_table)
    if not where:
        return []
    return [checks.Warning(
        f"PostgreSQL's autovacuum is off {where}.",
        hint="Dead item versions pile up and counts read the heap: the selector and the bulk "
             "preview slow down as items change. Turn it on (docs/deploy.md).",
        id="queues.W001")]


def autovacuum_off_where(server: str, table_off: bool, table: str) -> str:
    """Where autovacuum is off for `table`: the whole server, the table alone, or nowhere."""
    if server == "off":
        return "on this server"
    return f"for {table}" if table_off else ""
