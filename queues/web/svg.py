"""Line charts as server-rendered SVG: scales, axis ticks (times in the user's time zone), paths
that break where data is missing, and a hover column per step; and the bars of a small trend.
It computes geometry and words; queues/_chart.html draws them, except the hover columns, which
format_html_join (escaping each text) writes here: a template loop over a week's 168 steps costs
more than the rest of a chart."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta

from django.utils import timezone
from django.utils.html import format_html_join

WIDTH, HEIGHT = 480, 210
LEFT, RIGHT, TOP, BOTTOM = 58, 10, 10, 40  # margins around the plot: room for the axes' words
COUNT_STEPS = (1, 2, 5)  # nice tick steps of counts, times a power of ten
DURATION_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60,
                  120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass
class Line:
    name: str
    values: list[float | None]
    tone: str  # a palette colour of dashboard.css (charts.css: tone-ok, tone-bad, ...)
    path: str = ""
    dots: list[tuple[float, float]] = field(default_factory=list)  # points without neighbours


@dataclass
class Tick:
    position: float
    label: str


@dataclass
class Column:
    """A step's hover target: the whole plot height, its values in a <title>."""

    x: float
    width: float
    title: str


@dataclass
class LineChart:
    lines: list[Line]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    columns: list[Column]
    x_label: str
    y_label: str
    # The last step's column when that step is still under way: shaded, since its lower
    # figures are a count so far, not a drop.
    partial: Column | None = None
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    right: int = WIDTH - RIGHT
    bottom: int = HEIGHT - BOTTOM

    @property
    def plot_height(self) -> int:
        return self.bottom - self.top

    def hover_columns(self) -> str:
        """Each step's column, its values in an SVG <title>: what a pointer shows on hover."""
        return format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title>'
                                    "</rect>", ((c.x, self.top, c.width, self.plot_height, c.title)
                                                for c in self.columns))

    @property
    def tick_y_x(self) -> int:
        return self.left - 6

    @property
    def tick_end(self) -> int:
        return self.bottom + 4

    @property
    def label_y(self) -> int:
        return self.bottom + 16

    @property
    def axis_title_y(self) -> int:
        return self.height - 4

    @property
    def middle_x(self) -> float:
        return (self.left + self.right) / 2

    @property
    def middle_y(self) -> float:
        return (self.top + self.bottom) / 2


def line_chart(start: datetime, end: datetime, lines: list[Line], *, hover: list[str],
               y_label: str, y_format: Callable[[float], str], durations: bool = False,
               last_partial: bool = False) -> LineChart:
    """Lines of len(hover) steps from `start` to `end`, each point in the middle of its step;
    `hover` is each step's text; `last_partial` when the last step is still under way."""
    steps = len(hover)
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    highest = max((v for line in lines for v in line.values if v is not None), default=0)
    step, top = nice_scale(highest, DURATION_STEPS if durations else None)
    slot = plot_width / max(1, steps)

    def x(index: int) -> float:
        return LEFT + (index + 0.5) * slot

    def y(value: float) -> float:
        return TOP + plot_height * (1 - value / top)

    for line in lines:
        _trace(line, x, y)
    y_ticks = [Tick(round(y(step * n), 1), y_format(step * n))
               for n in range(round(top / step) + 1)]
    span = (end - start).total_seconds()
    x_ticks = [Tick(round(LEFT + plot_width * (moment - start).total_seconds() / span, 1), label)
               for moment, label in time_ticks(start, end)]
    columns = [Column(round(LEFT + i * slot, 2), round(slot, 2), text)
               for i, text in enumerate(hover)]
    return LineChart(lines=lines, x_ticks=x_ticks, y_ticks=y_ticks, columns=columns,
                     x_label=f"Time ({timezone.get_current_timezone_name()})", y_label=y_label,
                     partial=columns[-1] if last_partial and columns else None)


def _trace(line: Line, x, y):
    """The line's path, broken where a value is missing; a point with no neighbour is a dot."""
    parts, run = [], []
    for index, value in enumerate([*line.values, None]):
        if value is not None:
            run.append((round(x(index), 1), round(y(value), 1)))
            continue
        if len(run) == 1:
            line.dots.append(run[0])
        elif run:
            parts.append("M" + " L".join(f"{px},{py}" for px, py in run))
        run = []
    line.path = " ".join(parts)


def nice_scale(highest: float, steps: Sequence[float] | None = None) -> tuple[float, float]:
    """(tick step, top of the axis): at most five ticks from 0 reaching `highest`, on round
    numbers (1, 2 or 5 times a power of ten) or, for durations, round durations."""
    if highest <= 0:
        return 1.0, 1.0
    rough = highest / 4
    if steps is not None and rough <= steps[-1]:
        step = next(s for s in steps if s >= rough)
    else:
        magnitude = 10 ** math.floor(math.log10(rough))
        step = next((m * magnitude for m in COUNT_STEPS if m * magnitude >= rough),
                    10 * magnitude)
    return step, step * math.ceil(highest / step - 1e-9)


def time_ticks(start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Ticks on round times of the user's clock: every 10 minutes within two hours, every 3
    hours within two days (midnight named by its day), each day within ten days, else every
    fifth day."""
    zone = timezone.get_current_timezone()
    span = end - start
    if span <= timedelta(days=2):
        every = 10 if span <= timedelta(hours=2) else 180  # minutes
        # Walked on the wall clock, so that ticks fall on round local times in any zone.
        wall = timezone.localtime(start, zone).replace(tzinfo=None, minute=0, second=0,
                                                       microsecond=0)
        ticks = []
        while (moment := wall.replace(tzinfo=zone)) < end:
            minutes = wall.hour * 60 + wall.minute
            if moment >= start and minutes % every == 0:
                midnight = minutes == 0 and every > 60
                ticks.append((moment, wall.strftime("%a %d" if midnight else "%H:%M")))
            wall += timedelta(minutes=10)
        return ticks
    every_days = 1 if span <= timedelta(days=10) else 5
    day = timezone.localtime(start, zone).date()
    ticks = []
    while (moment := datetime.combine(day, time(0), tzinfo=zone)) < end:
        if moment >= start and day.toordinal() % every_days == 0:
            ticks.append((moment, moment.strftime("%a %d" if every_days == 1 else "%b %d")))
        day += timedelta(days=1)
    return ticks


def bars(values: Sequence[int], width: float, height: float) -> str:
    """A path of one bar per value, side by side across `width`, the highest `height` tall; a
    value above zero is at least a pixel tall, so that a lone failure shows."""
    highest = max(values, default=0)
    slot = width / max(1, len(values))
    parts = []
    for index, value in enumerate(values):
        if value > 0:
            top = height - max(1.0, height * value / highest)
            left = index * slot
            parts.append(f"M{left:.1f} {height}V{top:.1f}H{left + slot * 0.8:.1f}V{height}Z")
    return "".join(parts)
