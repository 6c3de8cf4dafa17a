"""The history charts: throughput, failures, depth, wait and run time of one queue or of every
queue, and the share of a queue's top accounts, over 1 h, 24 h, 7 d or 30 d, read from
queues.engine.history (never from the items) and drawn by queues.web.svg; and the errors page's
small trend of each error group's failures.

Each chart has a URL of its own that answers an htmx request with its fragment (_chart.html),
so pages show a panel of placeholders (_history.html) that load their charts once the page is
there; without htmx the same URL is a page with the chart drawn in it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode, urlsplit

from django import forms
from django.http import QueryDict
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from queues.engine import history
from queues.engine.errors import group_key
from queues.models import OTHER_ERROR_GROUP, MetricHour, Queue
from queues.permissions import render_page, viewer_required
from queues.templatetags.queueadmin import duration_words
from queues.web.svg import Line, LineChart, bars, line_chart


@dataclass(frozen=True)
class Range:
    key: str
    label: str
    span: timedelta
    step: timedelta
    per: str  # the step in words: what each value of a count counts
    time_format: str  # a step's start in the table and the hover text

    @property
    def words(self) -> str:
        return f"last {self.label}, {self.per}"


RANGES = {r.key: r for r in (
    Range("1h", "1 h", timedelta(hours=1), timedelta(minutes=1), "per minute", "%H:%M"),
    Range("24h", "24 h", timedelta(hours=24), timedelta(minutes=15), "per 15 min", "%a %H:%M"),
    Range("7d", "7 d", timedelta(days=7), timedelta(hours=1), "per hour", "%a %d %H:%M"),
    Range("30d", "30 d", timedelta(days=30), timedelta(hours=6), "per 6 h", "%b %d %H:%M"),
)}
DEFAULT_RANGE = "24h"
SHARE_ACCOUNTS = 5  # accounts drawn in the share chart; the rest are "other accounts"
NO_HISTORY = ("No history for this range yet. The rollup writes each minute's figures a minute "
              "after it ends, once it runs (every minute, with the worker clusters).")


@dataclass
class Chart:
    name: str
    title: str
    url: str
    range: Range
    as_of: datetime
    drawing: LineChart | None = None
    empty: str = ""  # why nothing is drawn
    summary: str = ""  # the drawing in words, for screen readers
    headers: list[str] = field(default_factory=list)
    rows: list[tuple[str, list[str]]] = field(default_factory=list)

    def table_rows(self) -> str:
        """The table's rows, joined here rather than in a template loop (see queues.web.svg)."""
        return format_html_join("", '<tr><th scope="row">{}</th>{}</tr>', (
            (label, format_html_join("", '<td class="num">{}</td>', ((cell,) for cell in cells)))
            for label, cells in self.rows))


@dataclass(frozen=True)
class Measure:
    """One line of a chart: its name, colour, and value in a step's totals (None: unknown)."""

    name: str
    tone: str
    value: Callable[[dict], float | None]


def _column(name: str):
    return lambda totals: totals[name]


def _percentile(kind: str, fraction: float):
    return lambda totals: history.percentile([totals[c] for c in history.BUCKETS[kind]], fraction)


def _in_flight(totals: dict) -> int | None:
    if totals["depth_dispatched"] is None:
        return None
    return totals["depth_dispatched"] + totals["depth_running"]


@dataclass(frozen=True)
class Spec:
    title: str
    measures: tuple[Measure, ...]
    columns: tuple[str, ...]  # what the measures read from the history
    durations: bool = False
    unit: str = "items"
    nothing: str = ""  # why a range with history has nothing to draw

    def y_label(self, range_: Range) -> str:
        # The ticks of a duration carry their own units ("3 h", "45 s").
        return "duration" if self.durations else f"{self.unit} {range_.per}"


SPECS = {
    "throughput": Spec("Throughput", (Measure("Completed", "ok", _column("completed")),
                                      Measure("Enqueued", "link", _column("enqueued"))),
                       ("completed", "enqueued")),
    "failures": Spec("Failures", (Measure("Failed for good", "bad", _column("failed")),
                                  Measure("Scheduled for retry", "warn", _column("retried"))),
                     ("failed", "retried"), unit="failures"),
    "depth": Spec("Depth", (Measure("Queued", "queued", _column("depth_queued")),
                            Measure("Retry", "warn", _column("depth_retry")),
                            Measure("In flight", "running", _in_flight),
                            Measure("Dead letters", "bad", _column("depth_failed"))),
                  history.DEPTHS, unit="items, peak",
                  nothing="No depth was sampled in this range yet."),
    "wait": Spec("Wait time", (Measure("p50", "link", _percentile("wait", 0.5)),
                               Measure("p95", "paused", _percentile("wait", 0.95))),
                 history.BUCKETS["wait"], durations=True,
                 nothing="No item finished in this range, so there is no wait time."),
    "run": Spec("Run time", (Measure("p50", "link", _percentile("run", 0.5)),
                             Measure("p95", "paused", _percentile("run", 0.95))),
                history.BUCKETS["run"], durations=True,
                nothing="No item finished in this range, so there is no run time."),
}
CHARTS = (*SPECS, "accounts")
TITLES = {name: spec.title for name, spec in SPECS.items()} | {"accounts": "Share of accounts"}
PAGE_CHARTS = ("throughput", "failures", "depth", "wait")  # the overview's and a queue page's
QUEUE_ONLY = {"accounts"}
ACCOUNT_TONES = ("link", "ok", "warn", "paused", "running")


class ChartForm(forms.Form):
    range = forms.ChoiceField(required=False, label="Range",
                              choices=[(key, r.label) for key, r in RANGES.items()])
    show = forms.MultipleChoiceField(required=False, label="Charts",
                                     choices=[(name, TITLES[name]) for name in CHARTS])


# --- views -------------------------------------------------------------------------------------

@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def chart(request, name: str, key: str | None = None):
    """One chart, of the queue `key` or of every queue: the fragment for htmx, else a page
    holding it."""
    form = ChartForm(request.GET)
    queue, range_, _ = _parse(form, key, [name])
    if form.errors:
        return _refused(request, form)
    built = build(name, queue, range_, timezone.now())
    if request.htmx:
        return render_page(request, "queues/_chart.html", {"chart": built})
    return _page(request, queue, panel(request, queue, [name], range_, {name: built}))


@require_GET
@viewer_required
@vary_on_headers("HX-Request")
def history_panel(request, key: str | None = None):
    """The range picker and the charts' placeholders, as the range links swap them in; without
    htmx a page with every chart drawn."""
    form = ChartForm(request.GET)
    queue, range_, names = _parse(form, key)
    if form.errors:
        return _refused(request, form)
    if request.htmx:
        return render_page(request, "queues/_history.html",
                           {"panel": panel(request, queue, names, range_)})
    now = timezone.now()
    drawn = {name: build(name, queue, range_, now) for name in names}
    return _page(request, queue, panel(request, queue, names, range_, drawn))


def _parse(form: ChartForm, key: str | None, names: list[str] | None = None
           ) -> tuple[Queue | None, Range, list[str]]:
    """The queue (404 when it does not exist), the range and the charts (`names`, else those
    the query shows, else the page's four); errors stay on the form."""
    queue = get_object_or_404(Queue, key=key) if key else None
    if not form.is_valid():
        return queue, RANGES[DEFAULT_RANGE], []
    names = names or form.cleaned_data["show"] or list(PAGE_CHARTS)
    if queue is None and QUEUE_ONLY.intersection(names):
        form.add_error("show", "The share of accounts is a chart of one queue.")
    return queue, RANGES[form.cleaned_data["range"] or DEFAULT_RANGE], names


def _refused(request, form: ChartForm):
    """400 with the form's errors: the fragment for htmx, else a page saying them."""
    template = "queues/_chart_refused.html" if request.htmx else "queues/history.html"
    return render_page(request, template, {"form": form, "panel": None}, status=400)


def _page(request, queue: Queue | None, built_panel: "Panel"):
    return render_page(request, "queues/history.html", {"queue": queue, "panel": built_panel})


# --- the panel ---------------------------------------------------------------------------------

@dataclass
class RangeLink:
    label: str
    href: str  # the page in this range
    panel_url: str  # the panel in this range, for htmx
    current: bool


@dataclass
class Slot:
    name: str
    title: str
    url: str
    chart: Chart | None  # drawn already, or loaded by the placeholder


@dataclass
class Panel:
    title: str
    range: Range
    links: list[RangeLink]
    slots: list[Slot]


def page_panel(request, queue: Queue | None, names: Sequence[str]) -> "Panel":
    """The panel a page includes: in the range its URL names (the default if none or another),
    with placeholders that load each chart."""
    key = request.GET.get("range")
    return panel(request, queue, names, RANGES.get(key) or RANGES[DEFAULT_RANGE])


def panel(request, queue: Queue | None, names: Sequence[str], range_: Range,
          drawn: dict[str, Chart] | None = None) -> Panel:
    drawn = drawn or {}
    page_path, page_query = _hosting_page(request)
    links = []
    for key, option in RANGES.items():
        query = page_query.copy()
        query["range"] = key
        links.append(RangeLink(
            label=option.label, href=f"{page_path}?{query.urlencode()}",
            panel_url=_url("queues:queue_history" if queue else "queues:history",
                           [queue.key] if queue else [], {"range": key, "show": list(names)}),
            current=option is range_))
    slots = [Slot(name, TITLES[name], chart_url(name, queue, range_), drawn.get(name))
             for name in names]
    where = f"of {queue.name}" if queue else "of every queue"
    return Panel(title=f"History {where}", range=range_, links=links, slots=slots)


def _hosting_page(request) -> tuple[str, QueryDict]:
    """The page the panel sits on: this request's, or for an htmx request the page that asked
    (so that the range links and the pushed URL are the page's own)."""
    current = request.htmx.current_url_abs_path if request.htmx else None
    if current:
        parts = urlsplit(current)
        return parts.path, QueryDict(parts.query, mutable=True)
    return request.path, request.GET.copy()


def chart_url(name: str, queue: Queue | None, range_: Range) -> str:
    if queue is None:
        return _url(f"queues:chart_{name}", [], {"range": range_.key})
    return _url(f"queues:queue_chart_{name}", [queue.key], {"range": range_.key})


def _url(name: str, args: list, query: dict) -> str:
    return f"{reverse(name, args=args)}?{urlencode(query, doseq=True)}"


# --- building a chart --------------------------------------------------------------------------

def window(range_: Range, now: datetime) -> tuple[datetime, datetime]:
    """From `span` before to the end of the step the last whole minute is in (that step may be
    partial): steps fall on multiples of their length since the epoch, as the history's hours
    do."""
    width = int(range_.step.total_seconds())
    last_minute = int(now.replace(second=0, microsecond=0).timestamp())
    end = datetime.fromtimestamp(-(-last_minute // width) * width, tz=now.tzinfo)
    return end - range_.span, end


def build(name: str, queue: Queue | None, range_: Range, now: datetime) -> Chart:
    start, end = window(range_, now)
    steps = [start + i * range_.step for i in range(int(range_.span / range_.step))]
    labels = [timezone.localtime(moment).strftime(range_.time_format) for moment in steps]
    if end > now:
        labels[-1] += " (so far)"  # the step still under way
    chart = Chart(name=name, title=TITLES[name], url=chart_url(name, queue, range_),
                  range=range_, as_of=now)
    if name == "accounts":
        _draw_shares(chart, queue, start, end, labels)
    else:
        # Every queue's chart reads the installation's rows, not a row per queue and step.
        _draw_measures(chart, SPECS[name], [queue.pk] if queue else None, start, end, labels)
    return chart


def _tick_duration(seconds: float) -> str:
    """A round duration as an axis tick: "3 h", not "3 h 0 min", which ran past the margin."""
    words = duration_words(seconds)
    return words.removesuffix(" 0 min").removesuffix(" 0 h")


def _draw_measures(chart: Chart, spec: Spec, ids: list[int] | None, start: datetime,
                   end: datetime, labels: list[str]):
    totals = history.series(ids, start, end, chart.range.step, spec.columns)
    if all(step is None for step in totals):
        chart.empty = NO_HISTORY
        return
    values = [[None if step is None else m.value(step) for step in totals]
              for m in spec.measures]
    if all(v is None for series in values for v in series):
        chart.empty = spec.nothing
        return
    show = duration_words if spec.durations else _count
    chart.headers = [m.name for m in spec.measures]
    chart.rows = [(label, [show(series[i]) if series[i] is not None else "—"
                           for series in values]) for i, label in enumerate(labels)]
    chart.drawing = line_chart(
        start, end, [Line(m.name, series, m.tone) for m, series in zip(spec.measures, values,
                                                                       strict=True)],
        hover=[_hover(label, chart.headers, cells) for label, cells in chart.rows],
        y_label=spec.y_label(chart.range), y_format=_tick_duration if spec.durations else show,
        durations=spec.durations, last_partial=end > chart.as_of)
    chart.summary = "; ".join(_summary(m.name, series, show, chart.range, spec.durations)
                              for m, series in zip(spec.measures, values, strict=True))


def _draw_shares(chart: Chart, queue: Queue, start: datetime, end: datetime, labels: list[str]):
    """Each top account's share of the queue's completed items per step, and the others'."""
    step = chart.range.step
    accounts, per_step = history.top_accounts(queue.pk, start, end, step, SHARE_ACCOUNTS)
    totals = history.series([queue.pk], start, end, step, ["completed"])
    if not accounts:
        chart.empty = (NO_HISTORY if all(t is None for t in totals) else
                       "No account completed items in this range.")
        return
    shares = {account: [] for account in [*accounts, "Other accounts"]}
    for done, total in zip(per_step, totals, strict=True):
        whole = total["completed"] if total else 0
        for account in accounts:
            shares[account].append(100 * done.get(account, 0) / whole if whole else None)
        shares["Other accounts"].append(
            100 * (whole - sum(done.get(a, 0) for a in accounts)) / whole if whole else None)
    chart.headers = list(shares)
    chart.rows = [(label, [_share(series[i]) for series in shares.values()])
                  for i, label in enumerate(labels)]
    tones = [*ACCOUNT_TONES[:len(accounts)], "muted"]
    chart.drawing = line_chart(
        start, end, [Line(name, series, tone) for (name, series), tone in zip(
            shares.items(), tones, strict=True)],
        hover=[_hover(label, chart.headers, cells) for label, cells in chart.rows],
        y_label="% of items completed", y_format=lambda v: f"{v:.0f}%",
        last_partial=end > chart.as_of)
    chart.summary = (f"The {len(accounts)} accounts that completed the most items, "
                     f"{', '.join(accounts)}, and the others: each one's share of the items "
                     f"completed, {chart.range.words}.")


def _hover(label: str, names: list[str], cells: list[str]) -> str:
    return f"{label}: " + "; ".join(f"{name} {cell}" for name, cell in zip(names, cells,
                                                                          strict=True))


def _summary(name: str, series: list, show, range_: Range, durations: bool) -> str:
    known = [v for v in series if v is not None]
    if not known:
        return f"{name}: no data"
    if durations:
        return f"{name} from {show(min(known))} to {show(max(known))}"
    return f"{name}: {show(sum(known))} in all, at most {show(max(known))} {range_.per}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}%"


# --- the errors page's trends ------------------------------------------------------------------

TREND_RANGES = {r.key: r for r in (
    Range("24h", "24 h", timedelta(hours=24), timedelta(hours=1), "per hour", "%H:%M"),
    Range("7d", "7 d", timedelta(days=7), timedelta(hours=6), "per 6 h", "%a %H:%M"),
)}
DEFAULT_TREND = "24h"
TREND_WIDTH, TREND_HEIGHT = 96, 20


@dataclass
class Trend:
    """One error group's failures per step, as bars (an SVG path) and in words."""

    values: list[int]
    total: int
    summary: str
    bars: str


@dataclass
class TrendLink:
    label: str
    href: str
    current: bool


@dataclass
class Trends:
    range: Range
    links: list[TrendLink]
    kept: bool  # the history covers the range: the rollup ran in it
    other: int  # failures of the range outside each hour's largest groups, in no trend
    width: int = TREND_WIDTH
    height: int = TREND_HEIGHT


def error_trends(request, queue: Queue, groups: Sequence, now: datetime) -> Trends:
    """Sets the trend of each of the errors page's groups (queries.ErrorGroup) over the range
    the URL's `trend` names, 24 h unless 7 d: one read of the queue's error history for all of
    them, and when that finds nothing, one more to tell no failures from no history."""
    range_ = TREND_RANGES.get(request.GET.get("trend", "")) or TREND_RANGES[DEFAULT_TREND]
    start, end = window(range_, now)
    per_group = history.error_trends(queue.pk, start, end, range_.step)
    kept = bool(per_group) or MetricHour.objects.filter(
        queue=queue, account="", start__gte=start, start__lt=end).exists()
    steps = int(range_.span / range_.step)
    labels = [timezone.localtime(start + i * range_.step).strftime(range_.time_format)
              for i in range(steps)]
    zone = timezone.get_current_timezone_name()
    for group in groups:
        values = per_group.get(group_key(group.kind, group.message), [0] * steps)
        group.trend = _trend(values, range_, labels, zone) if kept else None
    links = []
    for key, option in TREND_RANGES.items():
        query = request.GET.copy()
        query["trend"] = key
        links.append(TrendLink(option.label, f"{request.path}?{query.urlencode()}",
                               option is range_))
    return Trends(range_, links, kept, sum(per_group.get(OTHER_ERROR_GROUP, [])))


def _trend(values: list[int], range_: Range, labels: list[str], zone: str) -> Trend:
    total = sum(values)
    if total:
        peak = max(values)
        summary = (f"{_count(total)} failure{'s' if total != 1 else ''} in {range_.label}, "
                   f"peak {_count(peak)} {range_.per} at {labels[values.index(peak)]} {zone}")
    else:
        summary = f"No failures in {range_.label}"
    return Trend(values, total, summary, bars(values, TREND_WIDTH, TREND_HEIGHT))
