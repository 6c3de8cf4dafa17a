"""Bulk retry and cancel pages: the form and its preview, confirmation, and each operation's
progress. The work itself is queues.engine.bulk; these views parse, check roles and render."""

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect

from queues.engine import bulk
from queues.models import BulkOperation, Queue
from queues.permissions import (
    can_administer,
    can_operate,
    operator_required,
    render_page,
    viewer_required,
)
from queues.web import feedback
from queues.web.forms import BulkConfirmForm, BulkForm

RECENT_OPERATIONS = 20


def _check_purge_role(user, kind: str):
    """Operators retry, cancel and replay; deleting dead letters for good is for Admins."""
    if kind == BulkOperation.Kind.PURGE and not can_administer(user):
        raise PermissionDenied("Purging dead letters needs the Admin role.")


def _preview_context(queue, preview: bulk.Preview) -> dict:
    confirm = BulkConfirmForm(initial=bulk.confirmation(preview))
    return {"queue": queue, "preview": preview, "confirm": confirm,
            "live_again_check_max": bulk.LIVE_AGAIN_CHECK_MAX}


def _initial(query) -> dict:
    fields = BulkForm.base_fields
    return {name: query.getlist(name) if isinstance(fields[name], forms.MultipleChoiceField)
            else query[name] for name in query if name in fields}


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def bulk_page(request, key):
    """The form; with `preview=1` (Operators) also what it would change, as of now."""
    queue = get_object_or_404(Queue, key=key)
    previewing = bool(request.GET.get("preview")) and can_operate(request.user)
    # Without a preview the query only fills the form in: bound, its empty required fields
    # would be marked invalid before the operator did anything.
    form = BulkForm(request.GET) if previewing else BulkForm(initial=_initial(request.GET))
    context = {"queue": queue, "form": form, "operations": BulkOperation.objects.filter(
        queue=queue).order_by("-created_at")[:RECENT_OPERATIONS]}
    status = 200
    if previewing:
        if form.is_valid():
            data = form.cleaned_data
            _check_purge_role(request.user, data["kind"])
            try:
                bulk_filter = bulk.BulkFilter.build(
                    queue, data["kind"], data["status"], data["created_from"],
                    data["created_to"], data["account"], data["error"], ids=data["ids"],
                    reason=data["reason"], clock=data["clock"],
                    identifier_prefix=data["identifier"], error_group=data["group"],
                    payload=data["payload"].text if data["payload"] else "", task=data["task"])
            except bulk.BulkError as error:
                context["error"], status = error.message, 422
            else:
                context |= _preview_context(queue, bulk.preview(bulk_filter))
        else:
            status = 422
    if request.htmx:
        return render_page(request, "queues/_bulk_preview.html", context, status=status)
    return render_page(request, "queues/bulk.html", context, status=status)


@require_POST
@operator_required
def bulk_start(request, key):
    queue = get_object_or_404(Queue, key=key)
    form = BulkConfirmForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("The confirmation is incomplete; preview again.")
    try:
        confirmed = bulk.from_confirmation(form.cleaned_data["frozen"])
    except bulk.ConfirmationExpired as expired:
        return render_page(request, "queues/_bulk_preview.html",
                           {"queue": queue, "error": expired.message.capitalize() + "."},
                           status=410)
    except bulk.BulkError:
        return HttpResponseBadRequest("The confirmation was altered; preview again.")
    if confirmed.filter.queue_id != queue.pk:
        return HttpResponseBadRequest("The confirmation is for another queue.")
    _check_purge_role(request.user, confirmed.filter.kind)
    try:
        # A second submission of the same confirmation shows the operation the first started.
        operation, _ = bulk.start_confirmed(
            confirmed, expected=form.cleaned_data["expected"],
            filter_hash=form.cleaned_data["filter_hash"], actor=request.user)
    except bulk.StalePreview as stale:
        context = _preview_context(queue, stale.fresh) | {"stale": True}
        return render_page(request, "queues/_bulk_preview.html", context, status=409)
    except bulk.BulkError as error:
        return render_page(request, "queues/_bulk_preview.html",
                           {"queue": queue, "error": error.message}, status=422)
    if request.htmx:
        return HttpResponseClientRedirect(operation_url(operation))
    return redirect(operation_url(operation))


def operation_url(operation: BulkOperation) -> str:
    return reverse("queues:bulk_operation", args=[operation.queue.key, operation.pk])


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def bulk_operation(request, key, pk):
    operation = get_object_or_404(BulkOperation.objects.select_related("queue"), pk=pk,
                                  queue__key=key)
    context = {"queue": operation.queue, "operation": operation}
    template = "queues/_bulk_progress.html" if request.htmx else "queues/bulk_operation.html"
    response = render_page(request, template, context)
    if request.htmx and operation.finished:
        response = feedback.changed_and_said(
            response, f"{operation.get_kind_display()} #{operation.pk}: "
            f"{operation.get_state_display().lower()}, {operation.changed:,} changed.", bulk=pk)
    return response


@require_POST
@operator_required
def bulk_stop(request, key, pk):
    operation = get_object_or_404(BulkOperation.objects.select_related("queue"), pk=pk,
                                  queue__key=key)
    bulk.stop(operation, actor=request.user)
    operation.refresh_from_db()
    if request.htmx:
        return render_page(request, "queues/_bulk_progress.html",
                           {"queue": operation.queue, "operation": operation})
    return redirect(operation_url(operation))
