"""Forms that parse the dashboard's query strings and posts: each one an allow-list of fields,
so a view never passes request data to the ORM as it came."""

import re
import zoneinfo
from datetime import timedelta
from html import escape
from urllib.parse import urlencode

from django import forms
from django.core.validators import validate_email
from django.forms.utils import flatatt
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from queues.engine import accounts, alerts, payloads
from queues.engine.bulk import KINDS, MAX_SELECTION, selection_range
from queues.engine.errors import MESSAGE_LIMIT
from queues.engine.payloads import PayloadCondition
from queues.models import (
    ANY_TIME_END,
    FINISHED_STATUSES,
    MAX_ACCOUNT_LENGTH,
    MAX_ID,
    MAX_IDENTIFIER_LENGTH,
    MAX_TASK_PATH_LENGTH,
    AlertRule,
    Queue,
    Status,
    UserPreference,
    canonical,
    time_in_bounds,
)
from queues.web import masking
from queues.web.queries import ACCOUNT_ORDERS, list_order, parse_account_cursor, parse_cursor

PERIODS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
MAX_RANGE = timedelta(days=366)
DEAD_LETTER_REASONS = [
    ("", "Any reason"), ("permanent", "Permanent error"), ("exhausted", "Retries exhausted"),
    ("worker lost", "Worker lost")]
DATETIME_LOCAL = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"]
TASK_PATH = re.compile(r"^[^\W\d]\w*(\.[^\W\d]\w*)+$")
# Which time a range bounds; an empty choice means the natural one for what is asked.
CLOCK_CHOICES = [("enqueued", "Enqueued"), ("finished", "Finished / failed"),
                 ("updated", "Last updated"), ("next_run", "Next run")]


class LongSelect(forms.Select):
    """A select of many options (every queue, every time zone), rendered in Python: Django's
    template per option took 20 ms of each page that offers 100 queues. Flat choices only, no
    option groups."""

    def render(self, name, value, attrs=None, renderer=None):
        chosen = set(self.format_value(value))
        # The standard library's escape, as in the overview's rows: format_html per option
        # cost as much as the rest of the select.
        options = "".join(
            f'<option value="{escape(key)}"{" selected" if key in chosen else ""}>'
            f"{escape(label)}</option>" for key, label in self.choices)
        return format_html('<select name="{}"{}>{}</select>', name,
                           flatatt(self.build_attrs(self.attrs, attrs)),
                           mark_safe(options))  # noqa: S308 - every text above is escaped


def check_range(form, start, end, start_field="created_from", end_field="created_to"):
    """From before To, at most MAX_RANGE apart (an open To means now): a mistyped year becomes
    a form error instead of a count or a bulk change over every item ever enqueued."""
    for field, moment in ((start_field, start), (end_field, end)):
        if moment and not time_in_bounds(moment):
            form.add_error(field, "Must lie between 1970 and 2100.")
            return
    if start and end and start >= end:
        form.add_error(end_field, "Must be after From.")
    elif start and (end or timezone.now()) - start > MAX_RANGE:
        form.add_error(start_field, f"A time range covers at most {MAX_RANGE.days} days.")


class TimeRangeForm(forms.Form):
    """From / to fields in the user's time zone (typed, or filled in from a preset)."""

    created_from = forms.DateTimeField(required=False, input_formats=DATETIME_LOCAL,
                                       label="From", widget=forms.DateTimeInput(
                                           attrs={"type": "datetime-local"}))
    created_to = forms.DateTimeField(required=False, input_formats=DATETIME_LOCAL, label="To",
                                     widget=forms.DateTimeInput(
                                         attrs={"type": "datetime-local"}))


class QueueFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=100, label="Find a queue")
    show = forms.ChoiceField(required=False, choices=[
        ("", "All queues"), ("alerting", "With alerts"), ("paused", "Paused")], label="Show")
    sort = forms.ChoiceField(required=False, label="Sort by", choices=[
        ("", "Key"), ("queued", "Most queued"), ("retry", "Most retrying"),
        ("dead", "Most dead letters"), ("failing", "Most failures, last hour"),
        ("waiting", "Longest waiting")])


def natural_list_clock(statuses) -> str:
    """A list of ended items ranges over when they ended; any other list over when its items
    were enqueued (the time every item has)."""
    if statuses and set(statuses) <= set(FINISHED_STATUSES):
        return "finished"
    return "enqueued"


class CanonicalField(forms.CharField):
    """An identifier or account as stored (models.canonical), however the browser composed it.
    Taken exactly, spaces at either end included: stripped, a filter, a bulk operation or an
    erasure named "acme " would act on another tenant, "acme"."""

    def __init__(self, *args, strip=False, **kwargs):
        super().__init__(*args, strip=strip, **kwargs)

    def to_python(self, value):
        return canonical(super().to_python(value))


class ItemFilters(forms.Form):
    """The filters an item list and a bulk operation share, so that "all N matching" carries
    every one of them."""

    account = CanonicalField(required=False, max_length=MAX_ACCOUNT_LENGTH)
    identifier = CanonicalField(required=False, max_length=MAX_IDENTIFIER_LENGTH,
                                 label="Identifier starts with")
    error = forms.CharField(required=False, max_length=200, label="Error contains")
    group = forms.CharField(required=False, max_length=MESSAGE_LIMIT, label="Error group")
    payload = forms.CharField(required=False, max_length=300, label="Payload field",
                              help_text="path = value, e.g. customer.id = 42")
    task = forms.CharField(required=False, max_length=MAX_TASK_PATH_LENGTH, label="Task",
                           help_text="a django.tasks task's path, e.g. billing.tasks.send_invoice")

    def clean_task(self) -> str:
        task = self.cleaned_data["task"]
        if task and not TASK_PATH.match(task):
            raise forms.ValidationError("Name a task by its module path, e.g. "
                                        "billing.tasks.send_invoice.")
        return task

    def __init__(self, *args, masked_keys=(), **kwargs):
        """`masked_keys`: the queue's sensitive keys when the reader sees them masked."""
        super().__init__(*args, **kwargs)
        self.masked_keys = masked_keys

    def clean_payload(self) -> PayloadCondition | None:
        text = self.cleaned_data["payload"]
        if not text.strip():
            return None
        try:
            condition = payloads.parse(text)
        except payloads.PayloadFilterError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None
        # A filter on a masked value would confirm it, one guess a request.
        if any(masking.is_sensitive(key, self.masked_keys) for key in condition.path):
            raise forms.ValidationError("That field is one of this queue's sensitive keys, "
                                        "masked for Viewers: only Operators filter by it.")
        return condition


class ItemFilterForm(TimeRangeForm, ItemFilters):
    status = forms.MultipleChoiceField(required=False, choices=Status.choices,
                                       widget=forms.CheckboxSelectMultiple)
    period = forms.ChoiceField(required=False, label="Time", choices=[
        ("", "Any time"), ("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days"),
        ("custom", "From / to")])
    clock = forms.ChoiceField(required=False, label="Range over", choices=[
        ("", "Finished for ended items, else enqueued"), *CLOCK_CHOICES])
    before = forms.CharField(required=False, max_length=60, widget=forms.HiddenInput)
    after = forms.CharField(required=False, max_length=60, widget=forms.HiddenInput)

    def clean_before(self):
        return self._page_position("before")

    def clean_after(self):
        return self._page_position("after")

    def _page_position(self, name: str) -> str:
        raw = self.cleaned_data[name]
        if raw and parse_cursor(raw) is None:
            raise forms.ValidationError("Not a page position.")
        return raw

    def clean(self):
        data = super().clean()
        period = data.get("period")
        typed = data.get("created_from") or data.get("created_to")
        if period in PERIODS and typed:
            # Typed dates are never dropped in silence.
            self.add_error("period", "Choose From / to to use the dates you typed, or clear "
                                     "them.")
        elif period in PERIODS:
            data["created_from"] = timezone.now() - PERIODS[period]
            data["created_to"] = None
        elif period != "custom" and typed:
            data["period"] = "custom"  # dates typed under "Any time" mean From / to
        elif period != "custom":
            data["created_from"] = data["created_to"] = None
        check_range(self, data.get("created_from"), data.get("created_to"))
        data["clock"] = data.get("clock") or natural_list_clock(data.get("status"))
        # Older pages come after "before", newer ones before "after".
        for name, key in (("before", "cursor"), ("after", "newer_than")):
            data[key] = parse_cursor(data[name]) if data.get(name) else None
            if data[key] and len(data[key]) != len(list_order(data)):
                # A page of this list in another order (its clock or range changed).
                self.add_error(name, "Not a page position of this list; start again from its "
                                     "first page.")
        if data.get("cursor") and data.get("newer_than"):
            self.add_error("after", "A page is either older or newer than another, not both.")
        return data

    def bulk_takes_all(self, kind: str) -> bool:
        """Whether the kind applies to every listed status: only then is the list's count the
        number of items it would change."""
        statuses = self.cleaned_data.get("status") or list(Status.values)
        return set(statuses) <= set(KINDS[kind][1])

    def bulk_query(self, kind: str) -> str | None:
        """The bulk page's query string for acting on every item this list matches, with its
        statuses, clock, range and text filters carried over; None when the kind applies to
        none of the listed statuses."""
        data = self.cleaned_data
        statuses = data.get("status") or list(Status.values)
        if not set(statuses) & set(KINDS[kind][1]):
            return None
        query = {"kind": kind, "preview": "1", "status": statuses, "clock": data["clock"],
                 "account": data.get("account", ""), "identifier": data.get("identifier", ""),
                 "error": data.get("error", ""), "group": data.get("group", ""),
                 "payload": data["payload"].text if data.get("payload") else "",
                 "task": data.get("task", "")}
        period = data.get("period")
        if period in PERIODS:
            query["period"] = period
        elif data.get("created_from"):
            query |= {"period": "custom", "created_from": _local(data["created_from"])}
            if data.get("created_to"):
                query["created_to"] = _local(data["created_to"])
        else:
            query["period"] = "all"
        return urlencode({k: v for k, v in query.items() if v}, doseq=True)


def _local(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M:%S")


class SearchForm(forms.Form):
    # A search only reads: a space typed by mistake is dropped.
    q = CanonicalField(max_length=MAX_IDENTIFIER_LENGTH, label="Identifier", strip=True)


class AccountForm(forms.Form):
    """One tenant account: an account to pause or resume, or whose data to show, export or
    erase. Printable, as an item's account (the audit log reads it); or a padded name an
    earlier release stored, taken exactly while it holds data (accounts.refusal)."""

    account = CanonicalField(max_length=MAX_ACCOUNT_LENGTH, label="Account")

    def clean_account(self):
        account = self.cleaned_data["account"]
        if why := accounts.refusal(account):
            raise forms.ValidationError(why.capitalize() + ".", code="printable")
        return account

    def unpadded(self) -> str:
        """The name without its spaces at either end, if it has any: the account it is not."""
        account = self.cleaned_data["account"]
        stripped = account.strip(" ")
        return stripped if stripped != account else ""


class AccountsForm(forms.Form):
    """The accounts page's order and page position: `after` (an account key) in key order,
    `cursor` (opaque, from queries.account_cursor) in the others."""

    sort = forms.ChoiceField(required=False, label="Order", choices=[("", "Account")] + [
        (key, order.words.capitalize()) for key, order in ACCOUNT_ORDERS.items()],
        error_messages={"invalid_choice": "The list has no order “%(value)s”; choose one by "
                                          "its column header."})
    after = forms.CharField(required=False, max_length=MAX_ACCOUNT_LENGTH,
                            widget=forms.HiddenInput)
    # An account of 200 characters, escaped in JSON and base64-encoded, with its signature.
    cursor = forms.CharField(required=False, max_length=4000, widget=forms.HiddenInput,
                             label="Page position")

    def clean(self):
        data = super().clean()
        if data.get("cursor") and "sort" in data:
            data["cursor"] = parse_account_cursor(data["sort"], data["cursor"])
            if data["cursor"] is None:
                self.add_error("cursor", "Not a page of this list; start again from its first "
                                         "page.")
        return data


class RunSelectorForm(forms.Form):
    queue = forms.ModelChoiceField(queryset=Queue.objects.all(), to_field_name="key")


def _time_zone_choices():
    return [(name, name) for name in sorted(zoneinfo.available_timezones())]


class PreferencesForm(forms.Form):
    time_zone = forms.ChoiceField(choices=_time_zone_choices, label="Time zone",
                                  widget=LongSelect)
    theme = forms.ChoiceField(choices=UserPreference.Theme.choices, widget=forms.RadioSelect,
                              label="Theme")


class BulkForm(TimeRangeForm, ItemFilters):
    """What to change: the action, a time range (a preset becomes absolute times when the
    preview is made), statuses, and optional account, error text and dead-letter reason; or a
    selection of items (`ids`), which needs neither statuses nor a range."""

    kind = forms.ChoiceField(choices=[
        ("retry", "Retry"), ("cancel", "Cancel"), ("replay", "Replay dead letters"),
        ("purge", "Purge dead letters")], widget=forms.RadioSelect, label="Action")
    status = forms.MultipleChoiceField(required=False, choices=Status.choices,
                                       widget=forms.CheckboxSelectMultiple)
    period = forms.ChoiceField(required=False, label="Time range", choices=[
        ("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days"),
        ("custom", "From / to"), ("all", "Any time")])
    clock = forms.ChoiceField(required=False, label="Range over", choices=[
        ("", "When it failed (retry) / was enqueued (cancel)"), *CLOCK_CHOICES])
    reason = forms.ChoiceField(required=False, label="Dead-letter reason",
                               choices=DEAD_LETTER_REASONS)

    def clean(self):
        data = super().clean()
        data["ids"] = self._selected_ids()
        kind = data.get("kind")
        if data["ids"]:
            # A selection: every status, so the preview explains the ineligible ones.
            data["status"] = data.get("status") or list(Status.values)
            data["created_from"], data["created_to"] = selection_range()
            return data
        if not data.get("status") and kind in ("retry", "cancel"):
            self.add_error("status", "Choose at least one status.")
        period = data.get("period")
        typed = data.get("created_from") or data.get("created_to")
        if period in (*PERIODS, "all") and typed:
            # Typed dates are never dropped in silence, as on the item list.
            self.add_error("period", "Choose From / to to use the dates you typed, or clear "
                                     "them.")
        elif period in PERIODS:
            # Open-ended, as on the item list: "Last hour" over the next-run clock keeps the
            # items due later, which the list counted in its "all N matching".
            data["created_from"] = timezone.now() - PERIODS[period]
            data["created_to"] = ANY_TIME_END
            return data
        elif period == "custom":
            # A date that could not be read has said why already. No To: from From on.
            if not data.get("created_from") and "created_from" not in self.errors:
                self.add_error("created_from", "Required for a custom range.")
        elif period == "all":
            # Every item so far; the preview's snapshot and the operation limit still bound it.
            data["created_from"], data["created_to"] = selection_range()
            return data
        else:
            self.add_error("period", "Choose a time range.")
        check_range(self, data.get("created_from"), data.get("created_to"))
        if not self.errors and data.get("created_to") is None:
            data["created_to"] = ANY_TIME_END
        return data

    def _selected_ids(self) -> list[int]:
        raw = self.data.getlist("ids") if hasattr(self.data, "getlist") else []
        if len(raw) > MAX_SELECTION:
            self.add_error(None, f"Select at most {MAX_SELECTION} items.")
            return []
        try:
            ids = sorted({int(value) for value in raw})
        except ValueError:
            ids = None
        if ids is None or not all(0 < pk <= MAX_ID for pk in ids):
            self.add_error(None, "The selection is not a list of item ids.")
            return []
        return ids


class BulkConfirmForm(forms.Form):
    """A preview's frozen filter (signed, so it comes back as it was sent), its hash and the
    eligible count the operator saw."""

    frozen = forms.CharField(widget=forms.HiddenInput, max_length=4000)
    filter_hash = forms.CharField(widget=forms.HiddenInput, max_length=64)
    expected = forms.IntegerField(widget=forms.HiddenInput, min_value=0)


def _queue_choices():
    return [("", "Every queue"), *((key, key) for key in
                                   Queue.objects.order_by("key").values_list("key", flat=True))]


class DeadLetterFilterForm(forms.Form):
    queue = forms.ChoiceField(required=False, choices=_queue_choices, label="Queue",
                              widget=LongSelect)
    account = CanonicalField(required=False, max_length=MAX_ACCOUNT_LENGTH)
    reason = forms.ChoiceField(required=False, choices=DEAD_LETTER_REASONS)
    period = forms.ChoiceField(required=False, label="Failed", choices=[
        ("", "Any time"), ("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days")])
    before = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                                label="Page position", widget=forms.HiddenInput)
    after = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                               label="Page position", widget=forms.HiddenInput)


class AlertScopeForm(forms.Form):
    """Which alerts page: every queue's (nothing chosen) or one queue's."""

    queue = forms.ChoiceField(required=False, choices=_queue_choices, label="Rules of",
                              widget=LongSelect)

    def clean_queue(self) -> Queue | None:
        key = self.cleaned_data["queue"]
        return Queue.objects.get(key=key) if key else None


MUTE_DURATIONS = {"1h": ("1 hour", timedelta(hours=1)), "4h": ("4 hours", timedelta(hours=4)),
                  "24h": ("24 hours", timedelta(hours=24)), "7d": ("7 days", timedelta(days=7))}
MAX_ALERT_EMAILS = 20
MAX_ALERT_WINDOW_MINUTES = 24 * 60  # the metric minutes behind a window are kept for 48 hours


class AlertRuleForm(forms.Form):
    """An alert rule's settings as an Admin edits them on the alerts page."""

    threshold = forms.IntegerField(min_value=0, max_value=2_000_000_000, label="Threshold")
    window_minutes = forms.IntegerField(required=False, min_value=1,
                                        max_value=MAX_ALERT_WINDOW_MINUTES,
                                        label="Window (minutes)")
    enabled = forms.BooleanField(required=False, label="Enabled")
    channels = forms.MultipleChoiceField(
        choices=[("email", "E-mail"), ("webhook", "Webhook")], required=False,
        widget=forms.CheckboxSelectMultiple, label="Channels")
    emails = forms.CharField(required=False, max_length=2000, label="Also e-mail",
                             help_text="Addresses beside the installation's, comma-separated.")

    def __init__(self, *args, rule: AlertRule, **kwargs):
        self.rule = rule
        kwargs.setdefault("initial", {
            "threshold": rule.threshold, "enabled": rule.enabled, "channels": rule.channels,
            "emails": ", ".join(rule.emails),
            "window_minutes": int(rule.window.total_seconds() // 60) if rule.window else None})
        super().__init__(*args, **kwargs)
        if rule.kind not in alerts.WINDOWED:
            del self.fields["window_minutes"]
        # Ids of their own: the page holds one form per rule.
        self.auto_id = f"rule-{rule.pk}-%s"

    def clean_emails(self) -> list[str]:
        addresses = [a.strip() for a in self.cleaned_data["emails"].split(",") if a.strip()]
        if len(addresses) > MAX_ALERT_EMAILS:
            raise forms.ValidationError(f"At most {MAX_ALERT_EMAILS} addresses.")
        for address in addresses:
            try:
                validate_email(address)
            except forms.ValidationError:
                raise forms.ValidationError(
                    "“%(value)s” is not an e-mail address.", params={"value": address}
                ) from None
        return list(dict.fromkeys(addresses))

    def clean(self):
        data = super().clean()
        if "window_minutes" in self.fields and "window_minutes" in data \
                and data["window_minutes"] is None:
            self.add_error("window_minutes", "This rule is measured over a window: give it.")
        return data

    def rule_fields(self) -> dict:
        """The cleaned data as AlertRule fields."""
        data = self.cleaned_data
        fields = {"threshold": data["threshold"], "enabled": data["enabled"],
                  "channels": data["channels"], "emails": data["emails"]}
        if "window_minutes" in self.fields:
            fields["window"] = timedelta(minutes=data["window_minutes"])
        return fields


class MuteForm(forms.Form):
    duration = forms.ChoiceField(
        choices=[(key, label) for key, (label, _) in MUTE_DURATIONS.items()], label="Mute for")

    def until(self, now):
        return now + MUTE_DURATIONS[self.cleaned_data["duration"]][1]
