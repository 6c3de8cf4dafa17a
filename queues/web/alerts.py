"""The alerts page: every rule per queue (and the installation's), its firing alerts and the
latest ones that ended. Operators acknowledge a firing and mute or unmute a rule; Admins, who
edit queue settings, edit a rule's threshold, window, channels and recipients.
queues.engine.alerts does the work and writes the audit entries."""

from itertools import groupby

from django.db.models import F
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from queues.engine import alerts
from queues.models import AlertFiring, AlertRule
from queues.permissions import admin_required, operator_required, render_page, viewer_required
from queues.web import feedback
from queues.web.forms import AlertRuleForm, MuteForm

RECENT = 50  # ended firings listed


def _firings(now) -> dict:
    open_firings = list(AlertFiring.objects.filter(ended_at__isnull=True)
                        .select_related("rule__queue").order_by("-started_at"))
    recent = list(AlertFiring.objects.filter(ended_at__isnull=False)
                  .select_related("rule__queue").order_by("-started_at")[:RECENT])
    return {"open_firings": open_firings, "recent_firings": recent, "now": now}


def _rule_row(rule: AlertRule, now, form: AlertRuleForm | None = None) -> dict:
    firing = AlertFiring.objects.filter(rule=rule, ended_at__isnull=True).exists()
    return {"rule": rule, "form": form or AlertRuleForm(rule=rule), "firing": firing,
            "mute_form": MuteForm(auto_id=f"mute-{rule.pk}-%s"), "now": now}


def _page(request, now, status=200, edited: tuple[AlertRule, AlertRuleForm] | None = None):
    rules = list(AlertRule.objects.select_related("queue")
                 .order_by(F("queue__key").asc(nulls_first=True), "kind"))
    firing_rules = set(AlertFiring.objects.filter(ended_at__isnull=True)
                       .values_list("rule_id", flat=True))
    rows = []
    for rule in rules:
        form = edited[1] if edited and edited[0].pk == rule.pk else AlertRuleForm(rule=rule)
        rows.append({"rule": rule, "form": form, "firing": rule.pk in firing_rules,
                     "mute_form": MuteForm(auto_id=f"mute-{rule.pk}-%s"), "now": now})
    groups = [(queue, list(group)) for queue, group
              in groupby(rows, key=lambda row: row["rule"].queue)]
    return render_page(request, "queues/alerts.html",
                       {"groups": groups, **_firings(now)}, status=status)


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def alerts_page(request):
    now = timezone.now()
    if request.htmx:
        return render_page(request, "queues/_alert_firings.html", _firings(now))
    return _page(request, now)


@require_POST
@admin_required
def rule_edit(request, pk):
    rule = get_object_or_404(AlertRule.objects.select_related("queue"), pk=pk)
    form = AlertRuleForm(request.POST, rule=rule)
    now = timezone.now()
    if not form.is_valid():
        if request.htmx:
            return render_page(request, "queues/_alert_rule.html", _rule_row(rule, now, form),
                               status=422)
        return _page(request, now, status=422, edited=(rule, form))
    changed = alerts.update_rule(rule, actor=request.user, **form.rule_fields())
    return _answer(request, "queues/_alert_rule.html", _rule_row(rule, now),
                   f"Rule saved ({', '.join(changed)} changed)." if changed
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
    return _answer(request, "queues/_alert_rule.html", _rule_row(rule, now), said)


@require_POST
@operator_required
def firing_acknowledge(request, pk):
    firing = get_object_or_404(AlertFiring.objects.select_related("rule__queue"), pk=pk)
    done = alerts.acknowledge(firing, actor=request.user)
    said = "Acknowledged: no reminders for this alert." if done else \
        "Already acknowledged, or it has ended."
    return _answer(request, "queues/_alert_firings.html", _firings(timezone.now()), said,
                   ok=done)


def _answer(request, template: str, context: dict, said: str, ok: bool = True):
    if not request.htmx:
        return redirect("queues:alerts")
    response = render_page(request, template, context, status=200 if ok else 409)
    return feedback.changed_and_said(response, said, ok=ok)
