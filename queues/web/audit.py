"""The audit log: read-only for every role, newest first, filtered by a form (actor, action,
queue, time range) and exported as CSV with the same filter. Entries are written only by
queues.engine.audit.record; nothing here or in Django's admin site edits them."""

import csv

from django import forms
from django.utils import timezone
from django.views.decorators.http import require_GET

from queues.models import MAX_ID, AuditEntry, Queue
from queues.permissions import can_operate, render_page, viewer_required
from queues.web import masking, queries
from queues.web.export import Echo, csv_cell, csv_download
from queues.web.forms import DATETIME_LOCAL, check_range

LIST_SIZE = 50
EXPORT_MAX_ROWS = 100_000  # a year of a busy team's changes; narrow the filter for more
EXPORT_CHUNK = 1000


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=150, label="Who")
    action = forms.CharField(required=False, max_length=50, label="Action starts with",
                             help_text="e.g. item., bulk., token.")
    queue = forms.CharField(required=False, max_length=64, label="Queue key")
    since = forms.DateTimeField(required=False, input_formats=DATETIME_LOCAL, label="From",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, input_formats=DATETIME_LOCAL, label="To",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    before = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                                label="Page position", widget=forms.HiddenInput)
    after = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                               label="Page position", widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        check_range(self, data.get("since"), data.get("until"), "since", "until")
        return data

    def entries(self):
        """The filtered entries, newest first; only fields named above reach the query."""
        data = self.cleaned_data
        entries = AuditEntry.objects.order_by("-id")
        if data["actor"]:
            entries = entries.filter(actor_name=data["actor"])
        if data["action"]:
            entries = entries.filter(action__startswith=data["action"])
        if data["queue"]:
            entries = entries.filter(queue_key=data["queue"])
        if data["since"]:
            entries = entries.filter(at__gte=data["since"])
        if data["until"]:
            entries = entries.filter(at__lt=data["until"])
        return entries


@require_GET
@viewer_required
def audit_log(request):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return render_page(request, "queues/audit.html", {"form": form, "entries": []}, status=400)
    page = queries.id_page(form.entries(), before=form.cleaned_data["before"],
                           after=form.cleaned_data["after"], size=LIST_SIZE)
    mask = _filter_masker(request.user)
    for entry in page.rows:
        entry.filter = mask(entry)
    return render_page(request, "queues/audit.html", {
        "entries": page.rows, "form": form, "page": page})


def _filter_masker(user):
    """entry -> its filter as this user may read it: payload values of sensitive keys masked
    for Viewers, by the sensitive keys of the entry's queue."""
    if can_operate(user):
        return lambda entry: entry.filter
    sensitive = dict(Queue.objects.values_list("key", "sensitive_keys"))
    return lambda entry: masking.mask_filter(entry.filter, sensitive.get(entry.queue_key))


def _rows(entries, mask):
    writer = csv.writer(Echo())
    yield writer.writerow(["id", "at", "actor", "action", "queue", "target", "filter", "counts"])
    sent, before = 0, None
    # Keyset chunks, each its own short query: no transaction or cursor held open while the
    # client downloads.
    while sent < EXPORT_MAX_ROWS:
        chunk_query = entries.filter(id__lt=before) if before else entries
        wanted = min(EXPORT_CHUNK, EXPORT_MAX_ROWS - sent)
        chunk = list(chunk_query[:wanted])
        for entry in chunk:
            yield writer.writerow([entry.pk, entry.at.isoformat(), csv_cell(entry.actor_name),
                                   csv_cell(entry.action), csv_cell(entry.queue_key),
                                   csv_cell(entry.target), csv_cell(mask(entry)),
                                   csv_cell(entry.counts)])
        if len(chunk) < wanted:
            return
        sent += len(chunk)
        before = chunk[-1].pk
    if entries.filter(id__lt=before).exists():
        yield writer.writerow([f"# stopped at {EXPORT_MAX_ROWS} rows; narrow the filter"])


@require_GET
@viewer_required
def audit_export(request):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return render_page(request, "queues/audit.html", {"form": form, "entries": []}, status=400)
    response = csv_download(request, _rows(form.entries(), _filter_masker(request.user)))
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
    return response
