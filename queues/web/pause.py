"""Pause and resume buttons: per queue, per account of a queue, and for every queue. Each
answers htmx with the updated control and an event that refreshes counts and badges."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from queues.engine import pausing
from queues.models import Queue
from queues.permissions import operator_required, render_page
from queues.web import feedback
from queues.web.forms import AccountForm
from queues.web.security import page_to_return_to


def _answer(request, template: str, context: dict, fallback: str, said: str):
    if not request.htmx:
        # Back to the page the button was on, if that is a page of this site, which says
        # what was done: the account paused may be on no row of that page.
        messages.success(request, said)
        return redirect(page_to_return_to(request, fallback))
    return feedback.changed_and_said(render_page(request, template, context), said)


def _done(action: str) -> str:
    return "paused: running items finish, nothing new starts" if action == "pause" \
        else "resumed"


@require_POST
@operator_required
def queue_pause(request, key, action):
    queue = get_object_or_404(Queue, key=key)
    pausing.set_queue_paused(queue, action == "pause", actor=request.user)
    return _answer(request, "queues/_queue_pause.html", {"queue": queue},
                   reverse("queues:queue_items", args=[queue.key]),
                   f"Queue {queue.key} {_done(action)}.")


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
                   reverse("queues:queue_accounts", args=[queue.key]),
                   f"Account {account} on {queue.key} {_done(action)}.")


@require_POST
@operator_required
def global_pause(request, action):
    pausing.set_global_paused(action == "pause", actor=request.user)
    return _answer(request, "queues/_global_pause.html",
                   {"global_pause": pausing.global_pause()}, reverse("queues:overview"),
                   f"Every queue {_done(action)}.")
