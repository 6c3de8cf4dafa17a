"""The alerts page: the firing alerts and the latest ones that ended, the installation's rules
and a line per queue; a queue's own page (?queue=key) shows its rules and its firings.
Operators acknowledge a firing and mute or unmute a rule; Admins, who edit queue settings, edit
a rule's threshold, window, channels and recipients.
queues.engine.alerts does the work and writes the audit entries."""

from urllib.parse import urlencode

from django.db.models import Count, Exists, F, OuterRef, Q
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from queues.engine import alerts
from queues.models import AlertFiring, AlertRule, Queue
from queues.permissions import (
    admin_required,
    can_administer,
    can_operate,
    operator_required,
    render_page,
    viewer_required,
)
from queues.web import feedback
from queues.web.forms import AlertRuleForm, AlertScopeForm, MuteForm

# Firings listed, open and ended lately, a screenful each: an installation of 100 queues had 202
# firing, and their rows alone took 120 ms of each live refresh. A queue's page lists all of its
# open ones.
FIRINGS_LISTED = 20
RECENT = 20


def _firings(now, queue: Queue | None = None) -> dict:
    open_firings = (AlertFiring.objects.filter(ended_at__isnull=True)
                    .select_related("rule__queue").order_by("-started_at"))
    recent = (AlertFiring.objects.filter(ended_at__isnull=False)
              .select_related("rule__queue").order_by("-started_at"))
    if queue is not None:
        open_firings, recent = (firings.filter(rule__queue=queue)
                                for firings in (open_firings, recent))
    listed = list(open_firings[:FIRINGS_LISTED + 1])
    more = open_firings.count() - FIRINGS_LISTED if len(listed) > FIRINGS_LISTED else 0
    # Each row's two links, reversed once for all: per row, they were half of its time.
    acknowledge = reverse("queues:alert_acknowledge", args=[0]).replace("/0/", "/{}/")
    for firing in listed:
        firing.rule_url = _rule_url(firing.rule)
        firing.acknowledge_url = acknowledge.format(firing.pk) + _scope_query(queue)
    return {"open_firings": listed[:FIRINGS_LISTED], "more_firing": more,
            "recent_firings": list(recent[:RECENT]), "now": now, "scope": queue}


def _rule_row(request, rule: AlertRule, now, firing: bool,
              form: AlertRuleForm | None = None) -> dict:
    """A rule's row, with the forms of what the user may do: a Viewer's page of 5 rules spent
    half its time making forms it never showed."""
    if form is None and can_administer(request.user):
        form = AlertRuleForm(rule=rule)
    mute_form = MuteForm(auto_id=f"mute-{rule.pk}-%s") if can_operate(request.user) else None
    return {"rule": rule, "form": form, "firing": firing, "mute_form": mute_form, "now": now}


def _firing(rule: AlertRule) -> bool:
    return AlertFiring.objects.filter(rule=rule, ended_at__isnull=True).exists()


def _queue_rule_counts(now) -> list[dict]:
    """One line per queue: how many of its rules fire, are muted or are disabled. At 100 queues
    their 500 rules in full made a page of 1.2 MB that took 3.5 s to render for an Admin."""
    open_firing = AlertFiring.objects.filter(rule=OuterRef("pk"), ended_at__isnull=True)
    return list(AlertRule.objects.filter(queue__isnull=False)
                .values(key=F("queue__key")).order_by("queue__key")
                .annotate(rules=Count("id"), disabled=Count("id", filter=Q(enabled=False)),
                          muted=Count("id", filter=Q(muted_until__gt=now)),
                          firing=Count("id", filter=Exists(open_firing))))


def _page(request, now, scope: AlertScopeForm, status=200,
          edited: tuple[AlertRule, AlertRuleForm] | None = None):
    queue = scope.cleaned_data.get("queue") if scope.is_valid() else None
    rules = (AlertRule.objects.select_related("queue").filter(queue=queue).order_by("kind"))
    firing_rules = set(AlertFiring.objects.filter(ended_at__isnull=True, rule__queue=queue)
                       .values_list("rule_id", flat=True))
    rows = [_rule_row(request, rule, now, rule.pk in firing_rules,
                      edited[1] if edited and edited[0].pk == rule.pk else None)
            for rule in rules]
    return render_page(request, "queues/alerts.html", {
        "rows": rows, "scope_form": scope, **_firings(now, queue),
        "queue_rule_counts": None if queue else _queue_rule_counts(now),
    }, status=status if scope.is_valid() else 400)


def _scope_of(rule: AlertRule) -> AlertScopeForm:
    return AlertScopeForm({"queue": rule.queue.key if rule.queue else ""})


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def alerts_page(request):
    """Firing alerts, the installation's rules and a line per queue; ?queue=key narrows the
    firings to that queue and shows its rules to edit."""
    now = timezone.now()
    scope = AlertScopeForm(request.GET)
    if request.htmx and scope.is_valid():
        return render_page(request, "queues/_alert_firings.html",
                           _firings(now, scope.cleaned_data["queue"]))
    return _page(request, now, scope)


@require_POST
@admin_required
def rule_edit(request, pk):
    rule = get_object_or_404(AlertRule.objects.select_related("queue"), pk=pk)
    form = AlertRuleForm(request.POST, rule=rule)
    now = timezone.now()
    if not form.is_valid():
        if request.htmx:
            return render_page(request, "queues/_alert_rule.html",
                               _rule_row(request, rule, now, _firing(rule), form), status=422)
        return _page(request, now, _scope_of(rule), status=422, edited=(rule, form))
    changed = alerts.update_rule(rule, actor=request.user, **form.rule_fields())
    return _answer(request, "queues/_alert_rule.html",
                   _rule_row(request, rule, now, _firing(rule)),
                   _rule_url(rule), f"Rule saved ({', '.join(changed)} changed)." if changed
                   else "Nothing changed.")


@require_POST
@operator_required
def rule_mute(request, pk, action):
    rule = get_object_or_404(AlertRule.objects.select_related("queue"), pk=pk)
    now = timezone.now()
    if action == "mute":
        form = MuteForm(request.POST)
        if not form.is_valid():
            return render_page(request, "queues/_form_errors.html", {"form": form}, status=422)
        alerts.mute(rule, form.until(now), actor=request.user)
        said = f"Muted until {timezone.localtime(rule.muted_until):%Y-%m-%d %H:%M %Z}: " \
               "firings are recorded, nothing is sent."
    else:
        alerts.mute(rule, None, actor=request.user)
        said = "Unmuted."
    return _answer(request, "queues/_alert_rule.html",
                   _rule_row(request, rule, now, _firing(rule)), _rule_url(rule),
                   said)


@require_POST
@operator_required
def firing_acknowledge(request, pk):
    firing = get_object_or_404(AlertFiring.objects.select_related("rule__queue"), pk=pk)
    done = alerts.acknowledge(firing, actor=request.user)
    said = "Acknowledged: no reminders for this alert." if done else \
        "Already acknowledged, or it has ended."
    # The firings of the page it was acknowledged on: every queue's, or one queue's.
    scope = AlertScopeForm(request.GET)
    queue = scope.cleaned_data["queue"] if scope.is_valid() else None
    return _answer(request, "queues/_alert_firings.html", _firings(timezone.now(), queue),
                   _page_url(queue), said, ok=done)


def _scope_query(queue: Queue | None) -> str:
    return f"?{urlencode({'queue': queue.key})}" if queue else ""


def _page_url(queue: Queue | None) -> str:
    return reverse("queues:alerts") + _scope_query(queue)


def _rule_url(rule: AlertRule) -> str:
    """The page that shows the rule's row, at its row."""
    return f"{_page_url(rule.queue)}#rule-{rule.pk}"


def _answer(request, template: str, context: dict, url: str, said: str, ok: bool = True):
    if not request.htmx:
        return redirect(url)
    response = render_page(request, template, context, status=200 if ok else 409)
    return feedback.changed_and_said(response, said, ok=ok)
