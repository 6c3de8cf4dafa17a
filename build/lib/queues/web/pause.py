"""Pause and resume buttons: per queue, per account of a queue, and for every queue. Each
answers htmx with the updated control and an event that refreshes counts and badges."""

from django import forms
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST
from django_htmx.http import trigger_client_event

from queues.engine import pausing
from queues.models import MAX_ACCOUNT_LENGTH, Queue
from queues.permissions import operator_required, render_page

CHANGED_EVENT = "queueadmin:changed"


class AccountForm(forms.Form):
    account = forms.CharField(max_length=MAX_ACCOUNT_LENGTH)


def _answer(request, template: str, context: dict, fallback: str):
    if not request.htmx:
        return redirect(fallback)
    return trigger_client_event(render_page(request, template, context), CHANGED_EVENT, {})


@require_POST
@operator_required
def queue_pause(request, key, action):
    queue = get_object_or_404(Queue, key=key)
    pausing.set_queue_paused(queue, action == "pause", actor=request.user)
    return _answer(request, "queues/_queue_pause.html", {"queue": queue},
                   request.POST.get("next") or f"/queues/{queue.key}/")


@require_POST
@operator_required
def account_pause(request, key, action):
    queue = get_object_or_404(Queue, key=key)
    form = AccountForm(request.POST)
    if not form.is_valid():
        return render_page(request, "queues/_form_errors.html", {"form": form}, status=422)
    account = form.cleaned_data["account"]
    pausing.set_account_paused(queue, account, action == "pause", actor=request.user)
    return _answer(request, "queues/_account_pause.html",
                   {"queue": queue, "account": account, "paused": action == "pause"},
                   f"/queues/{queue.key}/accounts/")


@require_POST
@operator_required
def global_pause(request, action):
    pausing.set_global_paused(action == "pause", actor=request.user)
    return _answer(request, "queues/_global_pause.html",
                   {"global_pause": pausing.global_pause()}, "/")
