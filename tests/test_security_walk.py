"""A walk over the whole URLconf: every URL has a rule saying who may use it and how, and every
rule is checked over HTTP. Dashboard pages need a login (anonymous users go to the login page)
and the role in their rule; mutations are POSTs with CSRF that refuse GET; the only exceptions
are the ones the spec lists (login, logout, the bearer-token API, health and metrics; static
files are served by WhiteNoise before the URLconf).

Adding a URL: add one line to RULES below, or the walk fails and names the URL."""

from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from queues.models import AuditEntry
from queues.permissions import ADMIN, OPERATOR, ROLES, VIEWER
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db
LOGIN = "/accounts/login/"


@dataclass(frozen=True)
class Rule:
    """kind: "page" (GET, read), "action" (POST, mutation), "self" (GET page and POST of the
    user's own settings), "own_action" (POST only, on the user's own settings, any role),
    "second_factor" (the code asked after the password: with nothing due it sends the user
    on), or an exception kind: "public", "login", "logout", "token_api",
    "stream" (an EventSource: 401 instead of a login redirect), "not_found" (the API's JSON
    404 for any other path). role: the lowest role allowed."""

    kind: str
    role: str | None = VIEWER
    kwargs: dict = field(default_factory=dict)
    query: str = ""
    data: dict = field(default_factory=dict)  # a valid POST, which must write an audit entry


def page(role=VIEWER, query="", **kwargs):
    return Rule("page", role, kwargs, query)


def action(role=OPERATOR, data=None, **kwargs):
    return Rule("action", role, kwargs, data=data or {})


# One line per URL name. "$item", "$bulk", "$token", "$rule" and "$firing" are replaced by the
# ids of sample rows.
RULES = {
    "queues:overview": page(),
    "queues:queue_items": page(),
    "queues:queue_errors": page(),
    "queues:queue_accounts": page(),
    "queues:queue_counts": page(),
    "queues:queue_export": page(fmt="csv"),
    "queues:queue_stream": page(),
    "queues:queue_stream_rows": page(query="?after=0"),
    "queues:queue_stream_events": Rule("stream"),
    "queues:all_stream": page(),
    "queues:all_stream_rows": page(query="?after=0"),
    "queues:all_stream_events": Rule("stream"),
    "queues:bulk": page(),
    "queues:bulk_operation": page(pk="$bulk"),
    "queues:bulk_start": action(),
    "queues:bulk_stop": action(pk="$bulk"),
    "queues:queue_pause": action(action="pause"),
    "queues:account_pause": action(action="pause"),
    "queues:global_pause": action(action="pause"),
    "queues:item_detail": page(pk="$item"),
    "queues:item_action": action(pk="$item", action="retry"),
    "queues:history": page(),
    "queues:queue_history": page(query="?range=7d&show=accounts&show=wait"),
    "queues:chart_throughput": page(),
    "queues:chart_failures": page(query="?range=1h"),
    "queues:chart_depth": page(),
    "queues:chart_wait": page(query="?range=30d"),
    "queues:chart_run": page(),
    "queues:queue_chart_throughput": page(),
    "queues:queue_chart_failures": page(),
    "queues:queue_chart_depth": page(query="?range=1h"),
    "queues:queue_chart_wait": page(),
    "queues:queue_chart_run": page(query="?range=7d"),
    "queues:queue_chart_accounts": page(),
    "queues:search": page(),
    "queues:activity": page(),
    "queues:run_selector": action(data={"queue": "q"}),
    "queues:run_sweeper": action(),
    "queues:workers": page(),
    "queues:audit": page(),
    "queues:audit_export": page(),
    "queues:dead_letters": page(),
    "queues:alerts": page(),
    "queues:alert_acknowledge": action(pk="$firing"),
    "queues:alert_rule_mute": action(pk="$rule", action="mute", data={"duration": "1h"}),
    "queues:alert_rule": action(ADMIN, pk="$rule", data={"threshold": "7"}),
    "queues:preferences": Rule("self"),
    "two_factor": Rule("self"),
    "two_factor_setup": Rule("own_action"),
    "two_factor_confirm": Rule("own_action", data={"code": "000000"}),
    "two_factor_recovery_codes": Rule("own_action"),
    "two_factor_remove": Rule("own_action", data={"password": "wrong"}),
    "two_factor_verify": Rule("second_factor"),
    "queues:tokens": page(ADMIN),
    "queues:tenant_data": page(ADMIN, query="?account=acme"),
    "queues:tenant_export": page(ADMIN, query="?account=acme"),
    "queues:tenant_erase": action(ADMIN, data={"account": "nobody"}),
    "queues:token_create": action(ADMIN, data={"name": "walk", "all_queues": "on"}),
    "queues:token_revoke": action(ADMIN, pk="$token"),
    # Exceptions listed by the spec, and only these.
    "login": Rule("login", None),
    "logout": Rule("logout", None),
    "queues_api:queues": Rule("token_api", None),
    "queues_api:enqueue": Rule("token_api", None),
    "queues_api:item": Rule("token_api", None, {"item_id": "$item"}),
    "queues_api:openapi": Rule("public", None),
    "queues_api:not-found": Rule("not_found", None, {"path": "nope"}),
    "queues_api:bulk-preview": Rule("token_api", None),
    "queues_api:bulk-start": Rule("token_api", None),
    "queues_api:bulk": Rule("token_api", None, {"pk": "$bulk"}),
    "queues_api:bulk-stop": Rule("token_api", None, {"pk": "$bulk"}),
    "queues_api:queue-pause": Rule("token_api", None, {"action": "pause"}),
    "queues_api:account-pause": Rule("token_api", None, {"action": "pause"}),
    "queues_api:global-pause": Rule("token_api", None, {"action": "pause"}),
}
# Django's admin site checks the Admin role itself (queues.admin_site) for every URL it makes.
NAMESPACE_RULES = {"admin": Rule("admin_site", ADMIN)}
EXCEPTION_KINDS = {"public", "login", "logout", "token_api", "not_found"}
# The spec's exceptions: login, logout, the bearer-token API under /api/v1/, health, metrics.
SPEC_EXCEPTIONS = {"login", "logout", "healthz", "metrics"}
SAMPLE_KWARGS = {"key": "q"}


def walk(patterns=None, namespace="", kwargs=()):
    """(name, namespace, route, kwarg names) for every URL pattern, however deeply included."""
    for pattern in patterns if patterns is not None else get_resolver().url_patterns:
        names = (*kwargs, *pattern.pattern.regex.groupindex)
        if isinstance(pattern, URLResolver):
            inner = ":".join(filter(None, [namespace, pattern.namespace or ""]))
            yield from walk(pattern.url_patterns, inner, names)
        else:
            assert isinstance(pattern, URLPattern)
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name
            yield name, namespace, str(pattern.pattern), names


def rule_for(name, namespace) -> Rule | None:
    if namespace in NAMESPACE_RULES:
        return NAMESPACE_RULES[namespace]
    return RULES.get(name)


URLS = [(name, namespace, kwargs) for name, namespace, _, kwargs in walk()
        if name and not namespace.startswith("admin")]
ADMIN_URLS = [name for name, namespace, _, kwargs in walk()
              if namespace == "admin" and name and not kwargs]


def test_every_url_has_a_rule_and_every_rule_a_url():
    missing = [f"{name or '(unnamed)'} -> {route}" for name, namespace, route, _ in walk()
               if not (namespace and rule_for(name, namespace))
               and not (name and rule_for(name, namespace))]
    assert not missing, (
        "URLs without a security rule: add a line to RULES in tests/test_security_walk.py "
        f"(page(), action(), page(ADMIN), ...) and name the URL: {missing}")
    stale = set(RULES) - {name for name, *_ in walk()}
    assert not stale, f"RULES lists URLs that no longer exist: {sorted(stale)}"


def test_the_spec_exceptions_are_the_only_urls_open_without_a_login():
    open_urls = {name: reverse(name, kwargs={k: "1" if k != "action" else "pause"
                                             for k in kwargs})
                 for name, _, _, kwargs in walk() if name in RULES
                 and RULES[name].kind in EXCEPTION_KINDS}
    unexpected = {name: url for name, url in open_urls.items()
                  if name not in SPEC_EXCEPTIONS and not url.startswith("/api/v1/")}
    assert not unexpected, f"open without a login but not a spec exception: {unexpected}"


@pytest.fixture
def clients(db):
    """A signed-in client per role, with and without CSRF checks."""
    made = {}
    for role in ROLES:
        user = User.objects.create_user(f"walk-{role.lower()}")
        user.groups.add(Group.objects.get(name=role))
        for csrf in (False, True):
            client = Client(enforce_csrf_checks=csrf)
            client.force_login(user)
            made[role, csrf] = client
    return made


def url_of(name, kwarg_names, rule, sample):
    values = SAMPLE_KWARGS | rule.kwargs
    return reverse(name, kwargs={key: sample.get(values[key], values[key])
                                 for key in kwarg_names}) + rule.query


def below(role):
    return ROLES[:ROLES.index(role)]


def at_or_above(role):
    return ROLES[ROLES.index(role):]


def header_problems(response) -> list[str]:
    """The security headers every dashboard response carries, CSP included."""
    policy = response.get("Content-Security-Policy", "")
    expected = {"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
                "X-Content-Type-Options": "nosniff"}
    problems = [f"{header} is {response.get(header)!r}" for header, value in expected.items()
                if response.get(header) != value]
    if not ("script-src 'self'" in policy and "frame-ancestors 'none'" in policy
            and "unsafe-inline" not in policy and "unsafe-eval" not in policy):
        problems.append(f"CSP is {policy!r}")
    return problems


def goes_to_login(response):
    return response.status_code == 302 and response["Location"].startswith(f"{LOGIN}?next=")


@pytest.mark.parametrize("name, namespace, kwarg_names", URLS, ids=[url[0] for url in URLS])
def test_url_follows_its_rule(name, namespace, kwarg_names, sample, clients):
    rule = rule_for(name, namespace)
    if rule is None:
        pytest.fail(f"{name} has no rule: add one to RULES")
    url = url_of(name, kwarg_names, rule, sample)
    anonymous = Client(enforce_csrf_checks=True)
    problems = []

    def expect(ok, what, response):
        if not ok:
            problems.append(f"{what}: got {response.status_code} {response.get('Location', '')}")

    if rule.kind == "page":
        response = anonymous.get(url)
        expect(goes_to_login(response), "anonymous GET -> login page", response)
        for role in below(rule.role):
            response = clients[role, False].get(url)
            expect(response.status_code == 403, f"{role} GET -> 403", response)
        for role in at_or_above(rule.role):
            response = clients[role, False].get(url)
            expect(response.status_code == 200, f"{role} GET -> 200", response)
            problems.extend(header_problems(response))
            response = clients[role, False].post(url)
            expect(response.status_code == 405, f"{role} POST -> 405 (a page)", response)
    elif rule.kind == "action":
        response = anonymous.post(url)
        expect(response.status_code == 403, "anonymous POST without CSRF -> 403", response)
        response = Client().post(url)
        expect(goes_to_login(response), "anonymous POST -> login page", response)
        for role in ROLES:
            response = clients[role, False].get(url)
            expect(response.status_code == 405, f"{role} GET -> 405", response)
        for role in below(rule.role):
            response = clients[role, False].post(url)
            expect(response.status_code == 403, f"{role} POST -> 403", response)
        allowed = rule.role
        response = clients[allowed, True].post(url)
        expect(response.status_code == 403, f"{allowed} POST without CSRF -> 403", response)
        before = AuditEntry.objects.count()
        response = clients[allowed, False].post(url, rule.data)
        expect(response.status_code not in (401, 403, 405, 500),
               f"{allowed} POST with CSRF -> allowed", response)
        if response.status_code < 400:
            expect(AuditEntry.objects.count() > before, f"{allowed} POST -> audited", response)
    elif rule.kind == "self":
        expect(goes_to_login(anonymous.get(url)), "anonymous GET -> login page",
               anonymous.get(url))
        for role in ROLES:
            response = clients[role, False].get(url)
            expect(response.status_code == 200, f"{role} GET -> 200", response)
            response = clients[role, True].post(url)
            expect(response.status_code == 403, f"{role} POST without CSRF -> 403", response)
    elif rule.kind == "own_action":
        response = anonymous.post(url)
        expect(response.status_code == 403, "anonymous POST without CSRF -> 403", response)
        response = Client().post(url)
        expect(goes_to_login(response), "anonymous POST -> login page", response)
        for role in ROLES:
            response = clients[role, False].get(url)
            expect(response.status_code == 405, f"{role} GET -> 405", response)
            response = clients[role, True].post(url)
            expect(response.status_code == 403, f"{role} POST without CSRF -> 403", response)
            response = clients[role, False].post(url, rule.data)
            expect(response.status_code not in (401, 403, 405, 500),
                   f"{role} POST with CSRF -> allowed", response)
    elif rule.kind == "second_factor":
        expect(goes_to_login(anonymous.get(url)), "anonymous GET -> login page",
               anonymous.get(url))
        for role in ROLES:
            response = clients[role, False].get(url)
            expect(response.status_code == 302, f"{role} GET -> 302 (nothing due)", response)
            response = clients[role, True].post(url)
            expect(response.status_code == 403, f"{role} POST without CSRF -> 403", response)
    elif rule.kind == "stream":
        response = anonymous.get(url)
        expect(response.status_code == 401, "anonymous GET -> 401", response)
        for role in ROLES:
            response = clients[role, False].get(url)
            # 501: the test client is not an ASGI server; the role check passed before that.
            expect(response.status_code == 501, f"{role} GET -> 501 (allowed)", response)
    elif rule.kind == "login":
        expect(anonymous.get(url).status_code == 200, "anonymous GET -> 200", anonymous.get(url))
        response = anonymous.post(url, {"username": "x", "password": "y"})
        expect(response.status_code == 403, "login POST without CSRF -> 403", response)
    elif rule.kind == "logout":
        response = clients[VIEWER, False].get(url)
        expect(response.status_code == 405, "GET -> 405", response)
        response = clients[VIEWER, True].post(url)
        expect(response.status_code == 403, "POST without CSRF -> 403", response)
    elif rule.kind == "token_api":
        for client, who in ((anonymous, "anonymous"), (clients[ADMIN, True], "Admin session")):
            for method in ("get", "post"):
                response = getattr(client, method)(url)
                expect(response.status_code in (401, 405), f"{who} {method.upper()} without a "
                       "token -> 401 (a session is not a credential here)", response)
    elif rule.kind == "public":
        response = anonymous.get(url)
        expect(response.status_code == 200, "anonymous GET -> 200", response)
    elif rule.kind == "not_found":
        for client, who in ((anonymous, "anonymous"), (clients[ADMIN, True], "Admin session")):
            for method in ("get", "post"):
                response = getattr(client, method)(url)
                expect(response.status_code == 404 and response["Content-Type"] ==
                       "application/json", f"{who} {method.upper()} -> JSON 404", response)
    else:
        pytest.fail(f"unknown rule kind {rule.kind}")
    assert not problems, f"{name} ({url}): {problems}"


@pytest.fixture
def owes_a_second_factor(db):
    """An Admin with an authenticator, signed in with the password only."""
    from queues.engine import two_factor
    from tests.test_two_factor import code

    user = User.objects.create_user("walk-unverified")
    user.groups.add(Group.objects.get(name=ADMIN))
    two_factor.confirm(user, code(two_factor.start(user)))
    client = Client()
    client.force_login(user)
    return client


# Every URL that needs a login, the user's own two-factor settings included.
SIGNED_IN_URLS = [url for url in URLS if getattr(rule_for(url[0], url[1]), "kind", None)
                  in ("page", "action", "self", "own_action", "stream")]


@pytest.mark.parametrize("name, namespace, kwarg_names", SIGNED_IN_URLS,
                         ids=[url[0] for url in SIGNED_IN_URLS])
def test_a_user_who_owes_a_second_factor_reaches_only_the_code_page(
        name, namespace, kwarg_names, sample, owes_a_second_factor):
    rule = rule_for(name, namespace)
    url = url_of(name, kwarg_names, rule, sample)
    before = AuditEntry.objects.count()
    if rule.kind in ("action", "own_action"):
        response = owes_a_second_factor.post(url, rule.data)
    else:
        response = owes_a_second_factor.get(url)
    if rule.kind == "stream":
        assert response.status_code == 403
    else:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/code/?next=")
    assert AuditEntry.objects.count() == before


def test_django_admin_site_waits_for_the_second_factor(owes_a_second_factor):
    response = owes_a_second_factor.get(reverse("admin:index"), follow=True)
    assert response.request["PATH_INFO"] == "/accounts/login/code/"


# The Admin group's model permissions (queues.permissions) open these; other models' pages
# (django-q's tasks, django-axes' records) stay 403 even for Admins unless a superuser grants them.
ADMIN_PAGES = ["admin:index", "admin:queues_queue_changelist", "admin:queues_queue_add",
               "admin:queues_accountpolicy_changelist", "admin:queues_item_changelist",
               "admin:queues_deadletter_changelist", "admin:auth_user_changelist",
               "admin:auth_group_changelist"]


@pytest.mark.parametrize("name", ADMIN_URLS)
def test_django_admin_site_is_for_admins_only(name, clients):
    url = reverse(name)
    response = Client().get(url, follow=True)
    assert response.status_code == 405 or (
        response.status_code == 200 and response.request["PATH_INFO"] == LOGIN)
    for role in below(ADMIN):
        assert clients[role, False].get(url, follow=True).status_code in (403, 405)
    expected = (200,) if name in ADMIN_PAGES else (200, 403, 405)
    assert clients[ADMIN, False].get(url, follow=True).status_code in expected


def test_django_admin_site_edits_need_csrf(clients, sample):
    queue_id = QueueFactory(key="q").pk
    url = reverse("admin:queues_queue_change", args=[queue_id])
    assert clients[ADMIN, True].post(url, {"name": "x"}).status_code == 403


def test_health_and_metrics_are_the_only_paths_answered_before_the_urlconf():
    """They are served by queues.ops.health.ProbeMiddleware, ahead of sessions and the URLconf."""
    from queues.ops.health import PROBE_PATHS

    assert set(PROBE_PATHS) == {"/healthz", "/metrics"}


def test_health_is_public_and_metrics_refuses_an_unknown_network_without_a_token(db):
    health = Client().get("/healthz")
    assert health.status_code == 200 and "sessionid" not in health.cookies
    metrics = Client(REMOTE_ADDR="203.0.113.9").get("/metrics")
    assert metrics.status_code in (401, 403)
    assert b"queueadmin_" not in metrics.content
