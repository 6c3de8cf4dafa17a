"""One tenant's data, for Admins: what there is on every queue, all of it as a download, and
its erasure (queues.engine.accounts does the work and writes the audit entries)."""

from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from queues.engine import accounts, audit
from queues.permissions import admin_required, render_page
from queues.web.export import streaming
from queues.web.forms import AccountForm


@require_GET
@admin_required
def tenant_data(request):
    form = AccountForm(request.GET or None)
    footprint = accounts.footprint(form.cleaned_data["account"]) if form.is_valid() else None
    return render_page(request, "queues/tenant.html", {"form": form, "footprint": footprint,
                                                        **_limits()},
                       status=400 if form.is_bound and not form.is_valid() else 200)


def _limits() -> dict:
    return {"count_limit": accounts.COUNT_LIMIT,
            "attempts_counted_items": accounts.ATTEMPTS_COUNTED_ITEMS}


@require_GET
@admin_required
def tenant_export(request):
    form = AccountForm(request.GET)
    if not form.is_valid():
        return render_page(request, "queues/tenant.html", {"form": form}, status=400)
    account = form.cleaned_data["account"]
    audit.record(request.user, "account.export", target=f"account {account}")
    response = streaming(request, accounts.export_lines(account),
                         content_type="application/x-ndjson")
    name = slugify(account)[:60] or "account"
    response["Content-Disposition"] = f'attachment; filename="{name}.jsonl"'
    return response


@require_POST
@admin_required
def tenant_erase(request):
    form = AccountForm(request.POST)
    if not form.is_valid():
        return render_page(request, "queues/tenant.html", {"form": form}, status=400)
    account = form.cleaned_data["account"]
    erased = accounts.erase(account, actor=request.user)
    return render_page(request, "queues/tenant.html", {
        "form": form, "footprint": accounts.footprint(account), "erased": list(erased.items()),
        **_limits()})
