"""The dashboard's pages. Each view is thin: a form parses the query, queues.web.queries reads,
and one template renders the page or, for htmx requests, just the fragment that changes."""

from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from queues.engine import audit, counters, history, lifecycle, pausing, selector, sweeper
from queues.models import (
    DeadLetter,
    Item,
    Queue,
    SelectorRound,
    SweepRun,
    UserPreference,
)
from queues.permissions import can_operate, operator_required, render_page, viewer_required
from queues.web import charts, export, feedback, masking, queries
from queues.web.forms import (
    PERIODS,
    AccountsForm,
    DeadLetterFilterForm,
    ItemFilterForm,
    PreferencesForm,
    QueueFilterForm,
    RunSelectorForm,
    SearchForm,
)
from queues.web.middleware import SESSION_KEY, THEME_SESSION_KEY

# Buttons on the item page -> lifecycle transitions.
ITEM_ACTIONS = {"retry": "requeue", "cancel": "cancel", "run-now": "run_now"}
LIST_SIZE = 50


def _page_or_fragment(request, page: str, fragment: str, context: dict, status: int = 200):
    return render_page(request, fragment if request.htmx else page, context, status=status)


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def overview(request):
    form = QueueFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    queues = Queue.objects.all()
    if data.get("q"):
        queues = queues.filter(key__icontains=data["q"]) | queues.filter(name__icontains=data["q"])
    if data.get("show") == "paused":
        queues = queues.filter(paused=True)
    now = timezone.now()
    listed = list(queues.order_by("key"))
    alerts = queries.open_alerts([queue.pk for queue in listed])
    summaries = queries.queue_summaries(listed, now, alerts.by_queue)
    if data.get("show") == "alerting":
        summaries = [s for s in summaries if s.alerts]
    if data.get("sort"):
        summaries.sort(key=queries.SUMMARY_ORDERS[data["sort"]])
    return _page_or_fragment(request, "queues/overview.html", "queues/_queue_table.html",
                             {"form": form, "summaries": summaries, "now": now,
                              "installation_alerts": alerts.installation,
                              "timing_minutes": int(queries.TIMING_WINDOW.total_seconds() // 60),
                              "global_pause": pausing.global_pause()})


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def queue_items(request, key):
    queue = get_object_or_404(Queue, key=key)
    form = ItemFilterForm(request.GET, masked_keys=masking.masked_keys(request.user, queue))
    now = timezone.now()
    page = queries.item_page(queue, form.cleaned_data, now) if form.is_valid() else None
    context = {"queue": queue, "form": form, "page": page, "now": now}
    if not request.htmx:  # the counts strip refreshes itself
        context["queue_counts"] = counters.status_counts([queue.pk])[queue.pk]
    if page and page.total_count and can_operate(request.user):
        # "Retry / Cancel all N matching": the bulk preview of exactly this list.
        context |= {"retry_query": form.bulk_query("retry"),
                    "cancel_query": form.bulk_query("cancel"),
                    "retry_takes_all": form.bulk_takes_all("retry"),
                    "cancel_takes_all": form.bulk_takes_all("cancel")}
    return _page_or_fragment(request, "queues/items.html", "queues/_item_list.html", context,
                             status=200 if page else 400)


@require_GET
@viewer_required
def item_detail(request, pk):
    item = get_object_or_404(Item.objects.select_related("queue"), pk=pk)
    now = timezone.now()
    if request.htmx:
        return render_page(request, "queues/_item_summary.html",
                      {"detail": queries.item_detail(item, now), "now": now})
    detail = queries.item_detail(item, now)
    return render_page(request, "queues/item_detail.html", {
        "detail": detail, "now": now,
        "payload": masking.payload_for(request.user, item),
        "result": masking.value_for(request.user, item.queue, detail.result),
        "queue_counts": counters.status_counts([item.queue_id])[item.queue_id]})


@require_POST
@operator_required
def item_action(request, pk, action):
    if action not in ITEM_ACTIONS:
        raise Http404("No such action.")
    item = get_object_or_404(Item.objects.select_related("queue"), pk=pk)
    with transaction.atomic():
        result = lifecycle.apply(ITEM_ACTIONS[action], [pk], actor=request.user.get_username())
        audit.record(request.user, f"item.{action}", queue_key=item.queue.key,
                     target=f"item {pk} ({item.identifier})",
                     counts={"changed": len(result.changed), "skipped": len(result.skipped)})
    done = bool(result.changed)
    message = (f"{action.replace('-', ' ').capitalize()}: done." if done else
               f"Cannot {action.replace('-', ' ')} this item: {result.skipped.get(pk)}.")
    if not request.htmx:
        (messages.success if done else messages.error)(request, message)
        return redirect("queues:item_detail", pk=pk)
    item.refresh_from_db()
    now = timezone.now()
    response = render_page(request, "queues/_item_summary.html",
                      {"detail": queries.item_detail(item, now), "now": now,
                       "message": message, "message_ok": done}, status=200 if done else 409)
    # The summary says what happened in place; other regions refresh themselves.
    return feedback.changed(response, item=pk)


@require_GET
@viewer_required
def queue_counts(request, key):
    """The queue's counts strip; pages re-fetch it after an action and on every tick."""
    queue = get_object_or_404(Queue, key=key)
    return render_page(request, "queues/_queue_counts.html", {
        "queue": queue, "counts": counters.status_counts([queue.pk])[queue.pk],
        "now": timezone.now()})


@require_GET
@viewer_required
def queue_errors(request, key):
    queue = get_object_or_404(Queue, key=key)
    groups, read = queries.error_groups(queue)
    trends = charts.error_trends(request, queue, groups, timezone.now())
    # The failures of the trend's range first: the items read are the newest enqueued, and an
    # error failing right now on older items would otherwise come last, with few of them read.
    groups.sort(key=lambda group: (-(group.trend.total if group.trend else 0), -group.count))
    return render_page(request, "queues/errors.html",
                  {"queue": queue, "groups": groups, "read": read, "trends": trends,
                   "sample": queries.ERROR_SAMPLE, "kept_groups": history.ERROR_GROUPS})


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def queue_accounts(request, key):
    queue = get_object_or_404(Queue, key=key)
    form = AccountsForm(request.GET)
    now = timezone.now()
    page = queries.accounts_page(queue, form.cleaned_data, now) if form.is_valid() else None
    return _page_or_fragment(request, "queues/accounts.html", "queues/_account_table.html",
                             {"queue": queue, "form": form, "page": page, "now": now},
                             status=200 if page else 400)


@require_GET
@viewer_required
def search(request):
    form = SearchForm(request.GET or None)
    results, exact, account_queues = [], True, []
    if form.is_valid():
        # One more than shown, to say when there are more than the page lists.
        results, exact = queries.search_identifier(form.cleaned_data["q"], LIST_SIZE + 1)
        account_queues = queries.search_account(form.cleaned_data["q"])
    return render_page(request, "queues/search.html", {
        "form": form, "results": results[:LIST_SIZE], "more": len(results) > LIST_SIZE,
        "exact": exact, "account_queues": account_queues, "now": timezone.now()})


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def activity(request):
    rounds = SelectorRound.objects.select_related("queue").order_by("-id")[:LIST_SIZE // 2]
    sweeps = SweepRun.objects.order_by("-started_at")[:LIST_SIZE // 2]
    return _page_or_fragment(request, "queues/activity.html", "queues/_activity_tables.html",
                             {"rounds": rounds, "sweeps": sweeps, "queues": Queue.objects.all(),
                              "now": timezone.now()})


@require_POST
@operator_required
def run_selector(request):
    form = RunSelectorForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a queue.")
        return redirect("queues:activity")
    queue = form.cleaned_data["queue"]
    result = selector.run_round(queue)
    audit.record(request.user, "selector.run", queue_key=queue.key, target=f"queue {queue.key}",
                 counts={"dispatched": result.total, "accounts": len(result.taken)})
    messages.info(request, f"Selector round on {queue.key}: dispatched {result.total} items"
                  + (f" ({result.skipped})" if result.skipped else "") + ".")
    return redirect("queues:activity")


@require_POST
@operator_required
def run_sweeper(request):
    # A short run: a request should not hold a worker for the scheduled run's four minutes.
    counts = sweeper.run(seconds=5)
    audit.record(request.user, "sweeper.run", target="sweeper", counts=counts or {})
    messages.info(request, "Another sweeper run is in progress." if counts is None else
                  f"Sweeper run: {counts or 'nothing to do'}.")
    return redirect("queues:activity")


@require_GET
@viewer_required
def dead_letters(request):
    form = DeadLetterFilterForm(request.GET)
    if not form.is_valid():
        # A mistyped queue or account would otherwise list every dead letter as if filtered.
        return render_page(request, "queues/dead_letters.html",
                           {"form": form, "letters": [], "total": 0, "total_exact": True},
                           status=400)
    data = form.cleaned_data
    letters = DeadLetter.objects.filter(replayed_at__isnull=True).select_related("queue", "item")
    queue = Queue.objects.filter(key=data["queue"]).first() if data.get("queue") else None
    if queue is not None:
        letters = letters.filter(queue=queue)
    if data.get("account"):
        letters = letters.filter(account=data["account"])
    if data.get("reason"):
        letters = letters.filter(reason=data["reason"])
    if data.get("period"):
        letters = letters.filter(created_at__gte=timezone.now() - PERIODS[data["period"]])
    total = letters.values("id")[:queries.EXACT_COUNT_LIMIT + 1].count()
    page = queries.id_page(letters, before=data.get("before"), after=data.get("after"),
                           size=LIST_SIZE)
    return render_page(request, "queues/dead_letters.html", {
        "letters": page.rows, "form": form, "now": timezone.now(), "queue": queue,
        "total": min(total, queries.EXACT_COUNT_LIMIT),
        "total_exact": total <= queries.EXACT_COUNT_LIMIT, "page": page})


@require_http_methods(["GET", "POST"])
@viewer_required
def preferences(request):
    form = PreferencesForm(request.POST or None, initial={
        "time_zone": request.session.get(SESSION_KEY, "UTC"),
        "theme": request.session.get(THEME_SESSION_KEY, UserPreference.Theme.SYSTEM)})
    if request.method == "POST" and form.is_valid():
        chosen = form.cleaned_data
        UserPreference.objects.update_or_create(user=request.user, defaults=chosen)
        request.session[SESSION_KEY] = chosen["time_zone"]
        request.session[THEME_SESSION_KEY] = chosen["theme"]
        theme = UserPreference.Theme(chosen["theme"]).label
        messages.success(request, f"Saved. Times are shown in {chosen['time_zone']}; "
                                  f"theme: {theme}.")
        return redirect("queues:preferences")
    return render_page(request, "queues/preferences.html", {"form": form},
                       status=400 if form.is_bound else 200)


@require_GET
@viewer_required
def queue_export(request, key, fmt):
    """The item browser's filter as a download; Viewers get sensitive payload keys masked."""
    queue = get_object_or_404(Queue, key=key)
    form = ItemFilterForm(request.GET, masked_keys=masking.masked_keys(request.user, queue))
    if not form.is_valid():
        return render_page(request, "queues/items.html", {
            "queue": queue, "form": form, "page": None, "now": timezone.now(),
            "queue_counts": counters.status_counts([queue.pk])[queue.pk]}, status=400)
    masked = not can_operate(request.user)
    if fmt == "csv":
        response = export.csv_download(
            request, export.csv_rows(queue, form.cleaned_data, masked=masked))
    else:
        response = export.streaming(
            request, export.json_chunks(queue, form.cleaned_data, masked=masked),
            content_type="application/json")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="{queue.key}-items-{stamp}.{fmt}"'
    return response
