"""API tokens in the dashboard, for Admins: the list, a create form whose response shows the
secret once (never stored, redirected or put in a message), and revoke. queues.engine.tokens
does the work and writes the audit entries."""

from django import forms
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from queues.engine import tokens
from queues.models import ApiToken, Queue, validate_printable
from queues.permissions import admin_required, render_page

LIST_SIZE = 200


class TokenForm(forms.Form):
    # Shown in the audit log, one line per entry.
    name = forms.CharField(max_length=100, validators=[validate_printable],
                           help_text="Who or what uses it, e.g. billing-producer.")
    all_queues = forms.BooleanField(required=False, label="Every queue, present and future")
    queues = forms.ModelMultipleChoiceField(
        queryset=Queue.objects.order_by("key"), to_field_name="key", required=False,
        widget=forms.CheckboxSelectMultiple, label="Or only these queues")
    scopes = forms.MultipleChoiceField(
        choices=[(tokens.ENQUEUE, "Enqueue and read"),
                 (tokens.OPERATE, "Operate: bulk retry, cancel and replay; pause and resume"),
                 (tokens.PURGE, "Purge: delete failed items for good")],
        initial=[tokens.ENQUEUE], required=False, widget=forms.CheckboxSelectMultiple,
        label="May")

    def clean(self):
        data = super().clean()
        if data.get("all_queues") == bool(data.get("queues")):
            raise forms.ValidationError("Choose every queue or some queues (not both).")
        data["scopes"] = data.get("scopes") or [tokens.ENQUEUE]  # the least, when none chosen
        return data


def _list(request, form, status=200):
    listed = (ApiToken.objects.select_related("created_by").prefetch_related("queues")
              .order_by("-created_at")[:LIST_SIZE])
    return render_page(request, "queues/tokens.html", {"tokens": listed, "form": form},
                       status=status)


@require_GET
@admin_required
def token_list(request):
    return _list(request, TokenForm())


@never_cache  # the one response that holds the secret must not stay in any cache
@require_POST
@admin_required
def token_create(request):
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _list(request, form, status=400)
    data = form.cleaned_data
    try:
        token, secret = tokens.create(
            data["name"], queue_keys=[queue.key for queue in data["queues"]],
            all_queues=data["all_queues"], scopes=data["scopes"], actor=request.user)
    except tokens.TokenError as error:  # a queue deleted since the form was drawn
        form.add_error(None, str(error).capitalize() + ".")
        return _list(request, form, status=400)
    return render_page(request, "queues/token_created.html", {"token": token, "secret": secret},
                       status=201)


@require_POST
@admin_required
def token_revoke(request, pk):
    tokens.revoke(get_object_or_404(ApiToken, pk=pk), actor=request.user)
    if request.htmx:
        return HttpResponseClientRedirect(reverse("queues:tokens"))
    return redirect("queues:tokens")
