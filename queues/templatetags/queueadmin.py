"""Template helpers for the dashboard. What they return is built with format_html, so the hostile
strings it carries (identifiers, errors, payloads) are escaped; the overview's row and chart,
drawn 100 times a page, escape their few strings with the standard library instead."""

import functools
import html
import json
import re
from datetime import datetime, timedelta

from django import template
from django.urls import get_script_prefix, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from queues.engine import forecast
from queues.models import ANY_TIME_END, ANY_TIME_START, Status

register = template.Library()

RECT = '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>'
STATUS_CLASSES = {s: f"badge badge-{s}" for s in Status.values}


@register.simple_tag
def relative(moment: datetime | None, now: datetime | None = None):
    """A <time> that reads "in 4 min" or "12 s ago", with the exact local time on hover."""
    if moment is None:
        return "—"
    now = now or timezone.now()
    exact = timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")
    # Lists show two per row: the standard library's escape, as in queue_row, for the one
    # string that is not made of digits here (the time zone's abbreviation).
    return mark_safe(f'<time datetime="{moment.isoformat()}" title="{html.escape(exact)}">'  # noqa: S308
                     f"{relative_words(moment - now)}</time>")


@register.simple_tag
def when(moment: datetime | str | None, now: datetime | None = None):
    """A time shown one way everywhere: absolute in the user's time zone with the zone named,
    and relative beside it. Takes a datetime or the ISO text a stored filter keeps. The page
    keeps the relative part true as it ages (data-relative: dashboard.js rewrites it from the
    datetime attribute in these words)."""
    if isinstance(moment, str):
        moment = parse_datetime(moment)
    if moment is None:
        return "—"
    now = now or timezone.now()
    exact = timezone.localtime(moment)
    return format_html('<time datetime="{}">{} <span class="muted" data-relative>({})</span>'
                       '</time>', moment.isoformat(), exact.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       relative_words(moment - now))


@register.simple_tag
def next_run(run, now: datetime | None = None):
    """A waiting item's estimate (queues.engine.forecast), the same words on every page."""
    if not run:  # not waiting (get_item gives "" for items without an estimate)
        return ""
    now = now or timezone.now()
    exact = timezone.localtime(run.at).strftime("%Y-%m-%d %H:%M:%S %Z")
    if run.held:
        return format_html('<span class="badge badge-hold">held: {}</span>', run.reason)
    if run.reason == forecast.SCHEDULED:
        return relative(run.at, now)
    if run.reason == forecast.DUE:
        return format_html('<time datetime="{}" title="{}">due now</time>', run.at.isoformat(),
                           exact)
    return format_html('<time datetime="{}" title="{}">overdue {}</time> · {}',
                       run.at.isoformat(), exact, duration_words((now - run.at).total_seconds()),
                       run.reason)


TARGET_ITEM = re.compile(r"^item (\d+)\b")
TARGET_BULK = re.compile(r"^bulk operation (\d+)$")
# Filter keys of an audit entry, in the words of the pages that set them.
FILTER_WORDS = {"kind": "action", "statuses": "statuses", "clock": "range over",
                "created_from": "from", "created_to": "to", "snapshot_at": "as of",
                "account": "account", "identifier_prefix": "identifier starts with",
                "error_contains": "error contains", "error_group": "error group",
                "payload": "payload field", "task": "task", "reason": "dead-letter reason",
                "ids": "selected items"}


@register.simple_tag
def audit_target(entry):
    """The entry's target, linked to what it names when that is a page of the dashboard."""
    if match := TARGET_ITEM.match(entry.target):
        return format_html('<a href="{}">{}</a>', reverse("queues:item_detail",
                                                          args=[int(match.group(1))]), entry.target)
    if (match := TARGET_BULK.match(entry.target)) and entry.queue_key:
        return format_html('<a href="{}">{}</a>', reverse(
            "queues:bulk_operation", args=[entry.queue_key, int(match.group(1))]), entry.target)
    return entry.target


@register.simple_tag
def filter_words(data):
    """A stored filter as words, one "name: value" per line; times one way (see `when`)."""
    if not data:
        return ""
    lines = []
    for key, label in FILTER_WORDS.items():
        value = data.get(key)
        # An end left open, or "Any time": no bound worth a line.
        if value in (None, "", [], (), ANY_TIME_START.isoformat(), ANY_TIME_END.isoformat()):
            continue
        if key in ("created_from", "created_to", "snapshot_at"):
            shown = when(value)
        elif key == "ids":
            shown = f"{len(value):,}"
        elif isinstance(value, list):
            shown = ", ".join(map(str, value))
        else:
            shown = str(value)
        lines.append((label, shown))
    return format_html('<ul class="filter-words">{}</ul>', format_html_join(
        "", "<li>{}: {}</li>", lines))


@register.filter
def estimated_end(operation):
    return operation.estimated_end(timezone.now())


def relative_words(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    words = duration_words(abs(seconds))
    if abs(seconds) < 1:
        return "now"
    return f"in {words}" if seconds > 0 else f"{words} ago"


@register.filter
def duration_words(seconds) -> str:
    if seconds is None or seconds == "":
        return "—"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    seconds = float(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 86400:.0f} d {seconds % 86400 // 3600:.0f} h"


@register.simple_tag
def age(moment: datetime | None, now: datetime | None = None):
    if moment is None:
        return "—"
    return duration_words(((now or timezone.now()) - moment).total_seconds())


@register.simple_tag
def status_badge(item, now: datetime | None = None):
    now = now or timezone.now()
    if item.status == Status.QUEUED and item.run_at > now:
        local = timezone.localtime(item.run_at)
        return format_html('<span class="badge badge-delayed" title="{}">Delayed until {}</span>',
                           local.strftime("%Y-%m-%d %H:%M:%S %Z"), local.strftime("%b %d %H:%M"))
    return status_label(item.status)


# Every list row shows one; built once.
STATUS_LABELS = {status: format_html('<span class="{}">{}</span>', STATUS_CLASSES[status], label)
                 for status, label in Status.choices}


@register.simple_tag
def status_label(status: str):
    return STATUS_LABELS.get(status) or format_html('<span class="badge">{}</span>', status)


# A status as a sentence says it: "retry retry items" read as a stutter.
STATUS_WORDS = {Status.RETRY: "retrying"}


@register.filter
def status_words(statuses) -> str:
    """'queued, dispatched or retrying': statuses in a sentence, the last one after "or"."""
    *rest, last = [STATUS_WORDS.get(status, status) for status in statuses] or [""]
    return f"{', '.join(rest)} or {last}" if rest else last


@register.filter
def first_line(text: str) -> str:
    return (text or "").strip().split("\n", 1)[0]


@register.filter
def has_more_lines(text: str) -> bool:
    return "\n" in (text or "").strip()


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def percent(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


@register.simple_tag
def outcome_chart(completed: list[int], failed: list[int], label: str):
    """Per-minute bars (completed up, failed attempts down: retried or failed for good) as
    inline SVG: no script, no library."""
    width, height, bar = 180, 40, 3
    top = max([*completed, *failed, 1])
    half = height / 2

    def bars(series, css, up):
        return "".join(RECT.format(css, i * bar, f"{half - half * n / top if up else half:.1f}",
                                   bar - 1, f"{half * n / top:.1f}")
                       for i, n in enumerate(series) if n)

    summary = html.escape(
        f"{label}: {sum(completed):,} completed and {sum(failed):,} failed attempts (retried "
        f"or failed for good) in the last hour")
    # Built with str.format, the label escaped by hand and the rest numbers and fixed classes:
    # the overview draws up to 120 bars for each of 100 queues, and format_html's escaping of
    # every piece added up.
    return mark_safe(  # noqa: S308
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{summary}"><title>{summary}</title><line class="axis" x1="0" '
        f'x2="{width}" y1="{half}" y2="{half}"/>{bars(completed, "ok", True)}'
        f'{bars(failed, "bad", False)}</svg>')


@functools.lru_cache(maxsize=4096)
def _reversed(script_prefix: str, name: str, args: tuple) -> str:
    return reverse(name, args=args)  # reverse() adds the script prefix


@register.simple_tag
def page_url(name: str, *args) -> str:
    """{% url %} remembered per script prefix: a list's rows link the same few pages (a queue's
    items, an account's pause form) once each, and a reversal costs more than the row's text."""
    return _reversed(get_script_prefix(), name, tuple(str(arg) for arg in args))


# An id no item reaches, marking where the id goes in the item page's URL reversed once.
ID_MARK = 918_273_645_546_372_819


@functools.cache
def _item_url_with_mark(script_prefix: str) -> str:
    return reverse("queues:item_detail", args=[ID_MARK])  # reverse() adds the script prefix


@register.filter
def item_url(pk) -> str:
    """The item page's address. Lists link every row: 100 reversals were a quarter of the
    item list's render, so the URL is reversed once per script prefix and the id put in."""
    return _item_url_with_mark(get_script_prefix()).replace(str(ID_MARK), str(int(pk)))


# Marks the queue's key in URLs reversed once per page (keys are URL-safe by their validator).
KEY_MARK = "0-queue-key-mark"
ROW = (
    '<tr><th scope="row"><a id="q-{key}" href="{items}">{name}</a> '
    '<span class="muted">{key}</span>{badges} <span class="sublinks">'
    '<a id="q-{key}-failed-24h" href="{items}?status=failed&amp;period=24h&amp;clock=finished">'
    'failed in 24 h</a> · <a id="q-{key}-errors" href="{errors}">errors</a> · '
    '<a id="q-{key}-accounts" href="{accounts}">accounts</a></span></th>'
    '<td class="num"><a id="q-{key}-queued" href="{items}?status=queued">{queued}</a></td>'
    '<td class="num"><a id="q-{key}-retry" href="{items}?status=retry">{retry}</a></td>'
    '<td class="num">{in_flight}</td><td class="num">{complete}</td>'
    '<td class="num"><a id="q-{key}-failed" href="{items}?status=failed">{dead}</a></td>'
    "<td>{chart}</td><td>{wait}</td><td>{run}</td><td>{oldest}</td></tr>"
)


@register.simple_tag(takes_context=True)
def queue_row(context, summary, now: datetime):
    """One row of the overview, built in Python: rendered by the template language, the rows
    of 100 queues took most of the page's 100 ms (four URL reversals and a dozen escaped
    variables each)."""
    urls = context.render_context.get(KEY_MARK)
    if urls is None:
        urls = context.render_context[KEY_MARK] = [
            reverse(name, args=[KEY_MARK])
            for name in ("queues:queue_items", "queues:queue_errors", "queues:queue_accounts")]
    queue, counts = summary.queue, summary.counts
    # The standard library's escape: Django's lazy-aware one cost more than the row's SQL.
    key, name = html.escape(queue.key), html.escape(queue.name)
    badges = "".join(f' <span class="badge badge-alert">{html.escape(alert)}</span>'
                     for alert in summary.alerts)
    if queue.paused:
        badges = ' <span class="badge badge-paused">Paused</span>' + badges
    items, errors, accounts = (html.escape(url.replace(KEY_MARK, queue.key)) for url in urls)
    return mark_safe(ROW.format(  # noqa: S308 - every text above is escaped, the rest are numbers
        key=key, name=name, items=items, errors=errors, accounts=accounts, badges=badges,
        queued=num(counts["queued"]), retry=num(counts["retry"]),
        in_flight=num(counts["dispatched"] + counts["running"]), complete=num(counts["complete"]),
        dead=num(summary.dead_letters),
        chart=outcome_chart(summary.completed, summary.failed, queue.key),
        wait=_percentiles(summary.wait), run=_percentiles(summary.run),
        oldest=_unbroken(age(summary.oldest_waiting, now))))


def _percentiles(pair: tuple[float, float] | None) -> str:
    if not pair:
        return "—"
    return _unbroken(f"{duration_words(pair[0])} /") + " " + _unbroken(duration_words(pair[1]))


def _unbroken(words: str) -> str:
    """Words kept on one line: a narrow column then breaks after the "/" between two
    durations, not inside "7 h 52 min" or before the "/"."""
    return words.replace(" ", "\N{NO-BREAK SPACE}")


@register.simple_tag
def share_bar(fraction: float, label: str):
    width = max(0.0, min(1.0, fraction)) * 100
    return format_html(
        '<svg class="share" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" '
        'aria-label="{}"><rect class="share-bg" width="100" height="10"/>'
        '<rect class="share-fg" width="{}" height="10"/></svg>', label, f"{width:.2f}")



@register.filter
def num(value) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "—"


@register.filter
def get_item(mapping, key):
    return mapping.get(key, "") if mapping else ""
