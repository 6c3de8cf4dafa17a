"""What the dashboard pages show, read with a fixed number of short, indexed queries per page.

Nothing here counts millions of rows: status counts come from queues.engine.counters, item
lists walk an index by keyset, filtered totals stop counting at 10,001, accounts are ordered by
a loose index scan or the sweeper's ranking, and per-account figures are read only for the
accounts on the page.
"""

from collections import Counter, defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlencode

from django.core import signing
from django.db import connection
from django.db.models import Exists, Min, OuterRef, Q

from queues.engine import counters, forecast, history
from queues.engine.account_stats import recent_service
from queues.engine.bulk import CLOCKS, PREFIX_END, keyset_after, newest_first
from queues.engine.db import from_db_datetime, is_postgres, sorts_off, to_db_datetime
from queues.engine.errors import group_key, group_pattern, normalise_error
from queues.engine.forecast import NextRun
from queues.engine.lifecycle import retry_delay
from queues.engine.selector import READY_ORDER_SQL
from queues.models import (
    FINISHED_STATUSES,
    IN_FLIGHT_STATUSES,
    MAX_ACCOUNT_LENGTH,
    MAX_ID,
    READY_STATUSES,
    AccountPolicy,
    AccountStat,
    AlertFiring,
    Attempt,
    DeadLetter,
    ErrorGroupHour,
    Item,
    ItemEvent,
    Queue,
    SelectorState,
    Status,
    alert_condition,
    alert_summary,
)

if TYPE_CHECKING:
    from queues.web.charts import Trend

PAGE_SIZE = 50
EXACT_COUNT_LIMIT = 10_000
CHART_MINUTES = 60
# The wait and run time percentiles cover the minutes of history begun this long ago or since.
TIMING_WINDOW = timedelta(minutes=15)
ERROR_SAMPLE = 1_000  # newest failing items per status that the errors view groups
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- overview ----------------------------------------------------------------------------------

@dataclass
class QueueSummary:
    queue: Queue
    counts: dict[str, int]
    completed: list[int]  # per minute, oldest first
    failed: list[int]  # retryable and permanent failures per minute
    oldest_waiting: datetime | None
    wait: tuple[float, float] | None  # p50, p95 in seconds
    run: tuple[float, float] | None
    alerts: list[str] = field(default_factory=list)

    @property
    def dead_letters(self) -> int:
        # A failed item always has exactly one open dead letter: replaying requeues the item,
        # purging deletes it.
        return self.counts[Status.FAILED]

    @property
    def depth(self) -> int:
        return self.counts[Status.QUEUED] + self.counts[Status.RETRY]

    @property
    def failures_last_hour(self) -> int:
        return sum(self.failed)


# Overview orders: the busiest or most troubled queue first; ties keep the key order.
SUMMARY_ORDERS = {
    "queued": lambda s: -s.counts[Status.QUEUED],
    "retry": lambda s: -s.counts[Status.RETRY],
    "dead": lambda s: -s.dead_letters,
    "failing": lambda s: -sum(s.failed),
    "waiting": lambda s: s.oldest_waiting or datetime.max.replace(tzinfo=UTC),
}


def queue_summaries(queues: list[Queue], now: datetime,
                    alerts: dict[int, list[str]]) -> list[QueueSummary]:
    """`alerts`: each queue's firing alerts in words (open_alerts)."""
    ids = [q.pk for q in queues]
    if not ids:
        return []
    counts = counters.status_counts(ids)
    completed, failed = _outcomes_per_minute(ids, now)
    oldest = counters.oldest_waiting(ids, now)
    timings = _timings(ids, now)
    summaries = []
    for queue in queues:
        wait, run = timings.get(queue.pk, (None, None))
        summary = QueueSummary(
            queue=queue, counts=counts[queue.pk], completed=completed[queue.pk],
            failed=failed[queue.pk], oldest_waiting=oldest.get(queue.pk), wait=wait, run=run,
            alerts=alerts.get(queue.pk, []))
        summaries.append(summary)
    return summaries


def _outcomes_per_minute(ids: list[int], now: datetime):
    """Completed and failed items per minute over the last hour: the rolled-up minutes plus
    the deltas the sweeper has not folded yet."""
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
    completed = defaultdict(lambda: [0] * CHART_MINUTES)
    failed = defaultdict(lambda: [0] * CHART_MINUTES)
    statuses = (Status.COMPLETE, Status.RETRY, Status.FAILED)
    for queue_id, minute, status, count in counters.outcome_rows(first, statuses, ids):
        index = int((minute - first).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            series = completed if status == Status.COMPLETE else failed
            series[queue_id][index] += count
    return completed, failed


def _timings(ids: list[int], now: datetime) -> dict[int, tuple]:
    """Wait and run time percentiles from the history's per-minute histograms, not from the
    items: sampling each queue's latest finished items walked the dead index entries of a bulk
    retry of fresh failures, and the first overview after retrying 100,000 of them at 10M items
    took 0.7 s."""
    return history.timings(ids, now - TIMING_WINDOW, now)


@dataclass
class OpenAlerts:
    by_queue: dict[int, list[str]]  # each firing alert of a queue in words
    installation: list[str]  # the installation-wide ones (no cluster beating, ...)


def open_alerts(queue_ids: list[int]) -> OpenAlerts:
    """The firing alerts that the evaluator (queues.engine.alerts) recorded, of these queues and
    of the installation, in one statement: open firings are few, whatever the items."""
    found = OpenAlerts(by_queue=defaultdict(list), installation=[])
    # The five columns the words need, not two model objects a firing: at 100 queues with
    # four rules each firing, building them took most of the overview's 15 ms for alerts.
    firings = (AlertFiring.objects.filter(ended_at__isnull=True)
               .filter(Q(rule__queue_id__in=queue_ids) | Q(rule__queue__isnull=True))
               .order_by("rule__kind")
               .values_list("rule__queue_id", "rule__kind", "value", "threshold", "rule__window"))
    for queue_id, kind, value, threshold, window in firings:
        if queue_id is None:
            found.installation.append(alert_summary(kind, value, threshold, window))
        else:
            found.by_queue[queue_id].append(alert_condition(kind, value, threshold, window))
    return found


# --- item browser ------------------------------------------------------------------------------

@dataclass
class ItemPage:
    items: list[Item]
    next_cursor: str  # the page of older items; "" on the last page
    newer_cursor: str  # the page of newer items; "" on the first page
    total: str  # "1,234" or "10,000+"
    total_count: int  # the number behind it, for plurals
    next_runs: dict[int, NextRun]  # waiting items: when they run, or what holds them
    by_finish: bool = False  # the latest finished first, else the latest enqueued


def filtered_items(queue: Queue, data: dict):
    """Items matching every filter except status and the page cursor."""
    items = Item.objects.filter(queue=queue)
    if data.get("account"):
        items = items.filter(account=data["account"])
    if data.get("identifier"):
        prefix = data["identifier"]
        items = items.filter(identifier__gte=prefix, identifier__lt=prefix + PREFIX_END,
                             identifier__startswith=prefix)
    if data.get("error"):
        items = items.filter(last_error__icontains=data["error"])
    if data.get("group"):
        items = items.filter(last_error__regex=group_pattern(data["group"]))
    if data.get("payload"):
        items = data["payload"].apply(items)
    if data.get("task"):
        items = items.filter(task_path=data["task"])
    time_field = CLOCKS[data.get("clock") or "enqueued"]
    if data.get("created_from"):
        items = items.filter(**{f"{time_field}__gte": data["created_from"]})
    if data.get("created_to"):
        items = items.filter(**{f"{time_field}__lt": data["created_to"]})
    return items


# The filters besides statuses and a time range.
NARROWING_FILTERS = ("account", "identifier", "error", "group", "payload", "task")
# A list's order, newest first, as the fields of its keyset (the last one unique).
ENQUEUED_ORDER = ("created_at", "id")
# item_finished_status_idx's order, so a page of the latest failures reads an index range
# instead of sorting every failure in the range.
FINISHED_ORDER = ("finished_at", "created_at", "id")


def list_order(data: dict) -> tuple[str, ...]:
    """A range over the finish clock lists by when items ended, the latest first: what "failed
    in the last 24 hours" means (a range holds only items with a finish time). Any other list
    goes by when its items were enqueued, the time every item has."""
    bounded = data.get("created_from") or data.get("created_to")
    if data.get("clock") == "finished" and bounded:
        return FINISHED_ORDER
    return ENQUEUED_ORDER


def listed_statuses(data: dict, order: tuple[str, ...]) -> list[str]:
    statuses = data.get("status") or list(Status.values)
    if order == FINISHED_ORDER:
        # Only ended items have a finish time: a scan of the others would find nothing.
        return [s for s in statuses if s in FINISHED_STATUSES]
    return statuses


def position_of(item: Item, order: tuple[str, ...]) -> tuple:
    return tuple(getattr(item, name) for name in order)


def listed(base, data: dict, order: tuple[str, ...], position: tuple | None,
           limit: int, *, newer: bool = False) -> list[Item]:
    """Up to `limit` of the list's items after `position` (from its start when None), in the
    list's order: a page, or a chunk of its export. `newer` walks back towards the list's
    start instead, nearest to `position` first."""
    if position:
        base = base.filter(keyset_after(order, position, descending=not newer))
    return newest_first(base, listed_statuses(data, order), limit, order,
                        by_status=not data.get("payload"), oldest=newer,
                        index_ordered=_in_index_order(data, order))


def _in_index_order(data: dict, order: tuple[str, ...]) -> bool:
    """Statuses and a range on the list's own clock, nothing else: the browse index (or the
    finish index) then gives the list's order exactly. Any other filter may find its few rows
    faster by its own index and a sort."""
    if any(data.get(name) for name in NARROWING_FILTERS):
        return False
    bounded = data.get("created_from") or data.get("created_to")
    return not bounded or (data.get("clock") or "enqueued") == "enqueued" or order == FINISHED_ORDER


def item_page(queue: Queue, data: dict, now: datetime) -> ItemPage:
    order = list_order(data)
    base = filtered_items(queue, data)
    rows = []
    if data.get("newer_than"):
        # The page just before `newer_than`, read back towards the start. Without a whole page
        # of items newer than it, that page is the list's first one, read from the start so
        # that it is full.
        rows = listed(base, data, order, data["newer_than"], PAGE_SIZE + 1, newer=True)
    if len(rows) > PAGE_SIZE:
        # The page we came from is older than this one.
        items, newer, older = rows[:PAGE_SIZE][::-1], True, True
    else:
        rows = listed(base, data, order, data.get("cursor"), PAGE_SIZE + 1)
        items, newer, older = rows[:PAGE_SIZE], bool(data.get("cursor")), len(rows) > PAGE_SIZE
    next_cursor = page_cursor(position_of(items[-1], order)) if older and items else ""
    newer_cursor = page_cursor(position_of(items[0], order)) if newer and items else ""
    total, exact = _total(queue, base, data)
    return ItemPage(items=items, next_cursor=next_cursor, newer_cursor=newer_cursor,
                    total=f"{total:,}" if exact else f"{total:,}+", total_count=total,
                    next_runs=forecast.next_runs(queue, items, now),
                    by_finish=order == FINISHED_ORDER)


@dataclass
class IdPage:
    rows: list
    older: int | None  # the "before" of the next older page
    newer: int | None  # the "after" of the next newer page


def id_page(rows, *, before: int | None, after: int | None, size: int) -> IdPage:
    """A page of a list ordered by id, the latest first (dead letters, the audit log): the
    `size` rows older than `before`, or newer than `after` read back towards the start. Without
    a whole page newer than `after`, that page is the first one, read from the start."""
    if after:
        back = list(rows.filter(id__gt=after).order_by("id")[:size + 1])
        if len(back) > size:
            page = back[:size][::-1]
            return IdPage(page, page[-1].pk, page[0].pk)
        before = None
    if before:
        rows = rows.filter(id__lt=before)
    page = list(rows.order_by("-id")[:size + 1])
    older = page[size - 1].pk if len(page) > size else None
    page = page[:size]
    return IdPage(page, older, page[0].pk if before and page else None)


def _total(queue: Queue, base, data: dict) -> tuple[int, bool]:
    """How many items match, and whether that is exact (a narrowed count stops past
    EXACT_COUNT_LIMIT)."""
    statuses = data.get("status") or list(Status.values)
    narrowed = any(data.get(k) for k in (*NARROWING_FILTERS, "created_from", "created_to"))
    if not narrowed:
        counts = counters.status_counts([queue.pk])[queue.pk]
        return sum(max(0, counts[s]) for s in statuses), True
    if len(statuses) < len(Status.values):
        base = base.filter(status__in=statuses)
    n = base.values("id")[:EXACT_COUNT_LIMIT + 1].count()
    return (EXACT_COUNT_LIMIT, False) if n > EXACT_COUNT_LIMIT else (n, True)


def _micros(moment: datetime) -> int:
    # Integer arithmetic: a float timestamp can be a microsecond off and skip a row.
    return (moment - EPOCH) // timedelta(microseconds=1)


def page_cursor(position: tuple) -> str:
    *times, pk = position
    return "-".join([*(str(_micros(moment)) for moment in times), str(pk)])


def parse_cursor(raw: str) -> tuple | None:
    """The position page_cursor wrote: its times, then the id."""
    parts = raw.split("-")
    # isascii: str.isdigit also passes digits such as "²" that int() refuses.
    if not (2 <= len(parts) <= len(FINISHED_ORDER) and raw.isascii()
            and all(p.isdigit() for p in parts)):
        return None
    try:
        times = tuple(EPOCH + timedelta(microseconds=int(p)) for p in parts[:-1])
    except OverflowError:
        return None
    pk = int(parts[-1])
    return (*times, pk) if pk <= MAX_ID else None


# --- item detail -------------------------------------------------------------------------------

@dataclass
class ItemDetail:
    item: Item
    events: list[ItemEvent]
    attempts: list[Attempt]
    dead_letters: list[DeadLetter]
    next_run: NextRun | None
    dead_letter_at: datetime | None  # if every remaining attempt fails
    result: object = None  # what the completing attempt returned (a task's return value)
    # Retention removes events by their own age, so a long-lived item loses its oldest ones.
    history_trimmed: bool = False
    # On PostgreSQL attempts go by their own age too: the oldest kept, when earlier ones went.
    first_attempt_kept: int | None = None


EVENT_LIMIT = 200


def item_detail(item: Item, now: datetime) -> ItemDetail:
    queue = item.queue
    # By time: events a transaction writes share its time, and their ids break the tie.
    events = list(item.events.order_by("at", "id")[:EVENT_LIMIT])
    attempts = list(item.attempt_set.order_by("number"))
    letters = list(item.dead_letters.order_by("created_at"))
    next_run, dead_at = None, None
    if item.status in READY_STATUSES:
        next_run = forecast.next_run(item, now)
        # run_at already holds a delay the handler asked for; only the later retries follow
        # the queue's backoff.
        dead_at = dead_letter_estimate(queue, item.attempts, max(item.run_at, now))
    elif item.status in IN_FLIGHT_STATUSES:
        # Attempt number `attempts` is under way (dispatch counts it): were it to fail now,
        # the backoff after it applies.
        dead_at = dead_letter_estimate(queue, item.attempts - 1, now)
    completed = [a for a in attempts if a.outcome == Attempt.Outcome.COMPLETE]
    result = completed[-1].result if completed and item.status == Status.COMPLETE else None
    trimmed = (item.created_at < now - timedelta(days=queue.retention_days)
               and (not events or events[0].transition != "enqueued"))
    # Every run's first attempt is number 1, so an oldest attempt numbered higher had
    # predecessors that retention removed.
    oldest = min(attempts, key=lambda attempt: attempt.pk, default=None)
    return ItemDetail(item=item, events=events, attempts=attempts, dead_letters=letters,
                      next_run=next_run, dead_letter_at=dead_at, result=result,
                      history_trimmed=trimmed,
                      first_attempt_kept=oldest.number if oldest and oldest.number > 1 else None)


def dead_letter_estimate(queue: Queue, attempts_done: int, next_run: datetime) -> datetime:
    """When the item would reach the dead letters if its attempt number attempts_done + 1,
    starting at next_run, and every retry after it failed at once (the backoff without
    jitter; run times not included)."""
    last_attempt = 1 + queue.max_retries
    delay = sum(retry_delay(queue.backoff_seconds, n, _NoJitter)
                for n in range(attempts_done + 1, last_attempt))
    return next_run + timedelta(seconds=delay)


class _NoJitter:
    @staticmethod
    def uniform(low, high):
        return 1.0


# --- errors view -------------------------------------------------------------------------------

@dataclass
class ErrorGroup:
    kind: str
    message: str
    count: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    accounts: set = field(default_factory=set)
    sample_error: str = ""
    trend: "Trend | None" = None  # set by the errors page (charts.error_trends)


def error_groups(queue: Queue) -> tuple[list[ErrorGroup], int]:
    """Groups the newest failing items (retry and failed). Returns (groups, items read)."""
    groups: dict[tuple[str, str], ErrorGroup] = {}
    normalised: dict[str, tuple[str, str]] = {}  # failures repeat: normalise each text once
    read = 0
    for status in (Status.RETRY, Status.FAILED):
        rows = (Item.objects.filter(queue=queue, status=status).order_by("-created_at", "-id")
                .values_list("last_error", "account", "updated_at")[:ERROR_SAMPLE])
        for error, account, updated in rows:
            read += 1
            if error not in normalised:
                normalised[error] = normalise_error(error)
            kind, message = normalised[error]
            group = groups.setdefault((kind, message), ErrorGroup(kind, message,
                                                                  sample_error=error[:2000]))
            group.count += 1
            group.accounts.add(account)
            group.first_seen = min(filter(None, (group.first_seen, updated)))
            group.last_seen = max(filter(None, (group.last_seen, updated)))
    # The items read are the newest; the failure history (30 days by the hour) knows when a
    # group began failing, long before the oldest of them last failed.
    by_key = {group_key(group.kind, group.message): group for group in groups.values()}
    for key, first in (ErrorGroupHour.objects.filter(queue=queue, group_key__in=list(by_key))
                       .order_by().values("group_key").annotate(first=Min("start"))
                       .values_list("group_key", "first")):
        by_key[key].first_seen = min(filter(None, (by_key[key].first_seen, first)))
    return sorted(groups.values(), key=lambda g: -g.count), read


# --- accounts (fairness) view ------------------------------------------------------------------

class AccountOrder(NamedTuple):
    field: str  # of AccountStat (or, for share, of the row); ties go by account
    descending: bool
    words: str


# The accounts page's orders besides the default (account key, live): by share of service
# live, from the recent rounds; the others from the ranking the sweeper keeps
# (queues.engine.account_stats).
ACCOUNT_ORDERS = {
    "backlog": AccountOrder("backlog", True, "backlog"),
    "wait": AccountOrder("first_due", False, "oldest wait"),
    "share": AccountOrder("served", True, "share of service"),
}
ACCOUNT_CURSOR_SALT = "queues.accounts.cursor"
LIVE_LIMIT = 200  # ready items per account a page view reads (50 accounts: 10,000 at most)


@dataclass
class AccountRow:
    account: str
    backlog: int = 0
    due: int = 0
    in_flight: int = 0
    served: int = 0
    share: float = 0.0
    oldest_due: datetime | None = None
    weight: int = 1
    max_in_flight: int | None = None
    paused: bool = False
    at_cap: bool = False
    max_ready: int | None = None
    at_ready_limit: bool = False  # its enqueues are refused (429) until its backlog shrinks
    capped: bool = False  # more than LIVE_LIMIT ready: backlog, due and wait are lower bounds
    ranked_backlog: int | None = None  # when capped: its backlog at the sweeper's ranking
    in_flight_capped: bool = False  # more in flight than the page reads: a lower bound


@dataclass
class AccountsPage:
    rows: list[AccountRow]
    sort: str  # "" (account key) or a key of ACCOUNT_ORDERS
    ranked_at: datetime | None  # when the sweeper ranked the accounts of a sorted page
    next_query: str  # the next page's query string, or ""
    cursor: str  # the selector's
    rounds: int
    served_total: int
    top_served: list[tuple[str, int, float]]  # account, items, share

    @property
    def order_words(self) -> str:
        return ACCOUNT_ORDERS[self.sort].words if self.sort else "account"

    @property
    def capped(self) -> bool:
        return any(row.capped or row.in_flight_capped for row in self.rows)

    @property
    def live_limit(self) -> int:
        return LIVE_LIMIT


def accounts_page(queue: Queue, data: dict, now: datetime) -> AccountsPage:
    """`data`: AccountsForm's cleaned data. The order comes from the live loose index scan (by
    key) or the sweeper's ranking; the figures are read live for the page's accounts only, up
    to LIVE_LIMIT ready items each."""
    sort = data.get("sort") or ""
    ranked_at = None
    served, rounds = recent_service(queue)
    if sort == "share":
        ordered = accounts_by_share(queue, served, data.get("cursor"), PAGE_SIZE + 1)
        accounts = [account for _, account in ordered[:PAGE_SIZE]]
        next_query = (urlencode({"sort": sort, "cursor": account_cursor(sort, *ordered[-2])})
                      if len(ordered) > PAGE_SIZE else "")
    elif sort:
        ranked = ranked_accounts(queue, sort, data.get("cursor"), PAGE_SIZE + 1)
        accounts = [stat.account for stat in ranked[:PAGE_SIZE]]
        position = ranked[-2] if len(ranked) > PAGE_SIZE else None
        next_query = (urlencode({"sort": sort, "cursor": account_cursor(
            sort, getattr(position, ACCOUNT_ORDERS[sort].field), position.account)})
            if position else "")
        ranked_at = max((stat.refreshed_at for stat in ranked), default=None)
    else:
        accounts = accounts_with_backlog(queue, data.get("after", ""), PAGE_SIZE + 1)
        next_query = urlencode({"after": accounts[-2]}) if len(accounts) > PAGE_SIZE else ""
        accounts = accounts[:PAGE_SIZE]
    rows = {a: AccountRow(a) for a in accounts}
    for account, n, due, oldest in live_backlogs(queue, accounts, now):
        target = rows[account]
        target.backlog, target.due, target.oldest_due = min(n, LIVE_LIMIT), due, oldest
        target.capped = n > LIVE_LIMIT
    capped = [row.account for row in rows.values() if row.capped]
    for account, backlog in (AccountStat.objects.filter(queue=queue, account__in=capped)
                             .values_list("account", "backlog") if capped else ()):
        rows[account].ranked_backlog = backlog
    policies = {policy.account: policy
                for policy in AccountPolicy.objects.filter(queue=queue, account__in=accounts)}
    # An account's cap is read whole, so that "at its cap" is exact.
    limits = {account: max(LIVE_LIMIT, getattr(policies.get(account), "max_in_flight", 0) or 0)
              for account in accounts}
    for account, n in live_in_flight(queue, limits):
        rows[account].in_flight = min(n, limits[account])
        rows[account].in_flight_capped = n > limits[account]
    for policy in policies.values():
        row = rows[policy.account]
        row.weight, row.max_in_flight, row.paused = (policy.weight, policy.max_in_flight,
                                                     policy.paused)
        row.at_cap = policy.max_in_flight is not None and row.in_flight >= policy.max_in_flight
        row.max_ready = policy.max_ready
        # Past LIVE_LIMIT the live count stops; the ranking's figure tells more.
        known = max(row.backlog, row.ranked_backlog or 0)
        row.at_ready_limit = policy.max_ready is not None and known >= policy.max_ready
    total = sum(served.values())
    for row in rows.values():
        row.served = served.get(row.account, 0)
        row.share = row.served / total if total else 0.0
    top = [(a, n, n / total) for a, n in served.most_common(20)] if total else []
    state = SelectorState.objects.filter(queue=queue).values_list("cursor", flat=True).first()
    return AccountsPage(rows=list(rows.values()), sort=sort, ranked_at=ranked_at,
                        next_query=next_query, cursor=state or "", rounds=rounds,
                        served_total=total, top_served=top)


def live_backlogs(queue: Queue, accounts: list[str], now: datetime) -> list[tuple]:
    """(account, ready items, due ones, the oldest due time) read now, each account's scan of
    the ready index stopping after LIVE_LIMIT + 1 items: an order by backlog puts the biggest
    accounts on one page, whose every item counted would be millions at scale. Past the limit,
    the figures are lower bounds."""
    moment = to_db_datetime(now)
    # In item_ready_idx's order, which no other index gives (sorts_off says why).
    rows = _per_account_scan(
        queue, dict.fromkeys(accounts, LIVE_LIMIT + 1), READY_STATUSES, "run_at",
        "COUNT(*), SUM(CASE WHEN run_at <= %s THEN 1 ELSE 0 END), "
        "MIN(CASE WHEN run_at <= %s THEN run_at END)", [moment, moment],
        order=READY_ORDER_SQL)
    return [(account, n, due, from_db_datetime(oldest)) for account, n, due, oldest in rows]


def live_in_flight(queue: Queue, limits: dict[str, int]) -> list[tuple[str, int]]:
    """(account, dispatched and running items) read now, each count stopping past the
    account's limit: a queue with a high concurrency can hold tens of thousands of the
    biggest accounts' items in flight (56,795 for one page at 10M items: 553 ms counted
    whole)."""
    return _per_account_scan(queue, {account: most + 1 for account, most in limits.items()},
                             IN_FLIGHT_STATUSES, "1", "COUNT(*)", [])


def _per_account_scan(queue: Queue, limits: dict[str, int], statuses, columns: str,
                      figures: str, figure_params: list, order: str = "") -> list[tuple]:
    """(account, *figures) over at most `limits[account]` of each account's items in
    `statuses` (reading `columns`), in one statement of one short index scan per account."""
    if not limits:
        return []
    listed = ", ".join(f"'{status}'" for status in statuses)
    order_by = f" ORDER BY {order}" if order else ""
    take = (f"SELECT account, {columns} FROM {Item._meta.db_table} WHERE queue_id = %s "
            f"AND account = {{account}} AND status IN ({listed}){order_by} LIMIT {{limit}}")
    if is_postgres():
        # One plan for every account, LATERAL running the scan per account (a UNION ALL of 50
        # parts took PostgreSQL 12 ms to plan).
        sql = (f"SELECT a.account, {figures} FROM unnest(%s::text[], %s::int[]) "
               f"AS a(account, most) CROSS JOIN LATERAL "
               f"({take.format(account='a.account', limit='a.most')}) AS taken "
               f"GROUP BY a.account")
        params = [*figure_params, list(limits), list(limits.values()), queue.pk]
    else:
        # SQLite has no LATERAL; it plans a part per account in microseconds.
        parts = " UNION ALL ".join(
            [f"SELECT * FROM ({take.format(account='%s', limit='%s')})"] * len(limits))
        sql = f"SELECT account, {figures} FROM ({parts}) GROUP BY account"
        params = [*figure_params, *(p for account, most in limits.items()
                                    for p in (queue.pk, account, most))]
    # With an order, read from item_ready_idx only (sorts_off); the in-flight count has none.
    with sorts_off() if order else nullcontext(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def ranked_accounts(queue: Queue, sort: str, after: tuple | None,
                    limit: int) -> list[AccountStat]:
    """The sweeper's ranking in the order `sort` names, after the position `after` (a
    parse_account_cursor result), walked by keyset on its index."""
    field, descending, _ = ACCOUNT_ORDERS[sort]
    stats = AccountStat.objects.filter(queue=queue)
    if after:
        value, account = after
        beyond = "lt" if descending else "gt"
        # The first condition lets the index range start at the position; the second breaks
        # ties.
        stats = stats.filter(Q(**{f"{field}__{beyond}": value}) | Q(**{field: value,
                                                                       "account__gt": account}),
                             **{f"{field}__{beyond}e": value})
    return list(stats.order_by(f"-{field}" if descending else field, "account")[:limit])


def accounts_by_share(queue: Queue, served: Counter, after: tuple | None,
                      limit: int) -> list[tuple[int, str]]:
    """(items served, account) in the order by share, after the position `after`: the
    accounts the recent rounds served, most first, then those with a backlog and no recent
    service, by key. Live, as the figures beside it: a ranking kept by the sweeper showed
    shares minutes newer than its order, so the column looked unsorted."""
    most, last = after or (None, "")
    page = []
    if most is None or most > 0:
        page = [(n, account) for account, n in sorted(served.items(), key=lambda e: (-e[1], e[0]))
                if most is None or (-n, account) > (-most, last)][:limit]
        last = ""
    while len(page) < limit:
        # Long enough to step over the served accounts past the position (few: 20 rounds'
        # worth, and listed above); the loop covers a collation that orders them otherwise.
        wanted = limit - len(page) + sum(1 for account in served if account > last)
        scanned = accounts_with_backlog(queue, last, wanted)
        page += [(0, account) for account in scanned if account not in served][:limit - len(page)]
        if len(scanned) < wanted:
            break
        last = scanned[-1]
    return page


def account_cursor(sort: str, value, account: str) -> str:
    """An opaque page position: signed, so that a position the server did not hand out is
    refused rather than read."""
    if isinstance(value, datetime):
        value = _micros(value)
    return signing.dumps([sort, value, account], salt=ACCOUNT_CURSOR_SALT)


def parse_account_cursor(sort: str, raw: str) -> tuple | None:
    """(value, account) of a position account_cursor made for this order (a sorted one), else
    None."""
    try:
        made_for, value, account = signing.loads(raw, salt=ACCOUNT_CURSOR_SALT)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if made_for != sort:  # a position in another order, or in key order, which has none
        return None
    if ACCOUNT_ORDERS[sort].field == "first_due":
        value = EPOCH + timedelta(microseconds=value)
    return value, account


def accounts_with_backlog(queue: Queue, after: str, limit: int) -> list[str]:
    """Accounts with ready items in key order after `after`: a loose index scan over the ready
    index that jumps from account to account instead of reading every ready row."""
    table = Item._meta.db_table
    step = (f"SELECT account FROM {table} WHERE queue_id = %s AND status IN ('queued', 'retry') "
            f"AND account > {{prev}} ORDER BY account LIMIT 1")
    sql = (f"WITH RECURSIVE accounts(account, n) AS ("
           f" SELECT ({step.format(prev='%s')}), 1"
           f" UNION ALL SELECT ({step.format(prev='accounts.account')}), n + 1 FROM accounts"
           f" WHERE accounts.account IS NOT NULL AND n < %s"
           f") SELECT account FROM accounts WHERE account IS NOT NULL")
    with sorts_off(), connection.cursor() as cursor:
        cursor.execute(sql, [queue.pk, after, queue.pk, limit])
        return [row[0] for row in cursor.fetchall()]


# --- search ------------------------------------------------------------------------------------

def search_account(text: str) -> list[Queue]:
    """Queues on which `text` is an account (it has items there, or a policy such as a pause),
    each with `account_paused`: one probe of the (queue, account, status) index per queue,
    which stops at the first item, however many the account has."""
    if len(text) > MAX_ACCOUNT_LENGTH:
        return []
    policies = AccountPolicy.objects.filter(queue=OuterRef("pk"), account=text)
    return list(Queue.objects.annotate(
        account_paused=Exists(policies.filter(paused=True)),
    ).filter(Exists(Item.objects.filter(queue=OuterRef("pk"), account=text))
             | Exists(policies)).order_by("key"))


def search_identifier(text: str, limit: int) -> tuple[list[Item], bool]:
    """Items whose identifier is `text` on any queue; if none, those it starts. Returns (items,
    exact?). Naming every queue lets the (queue, identifier) index answer with a few probes."""
    queue_ids = list(Queue.objects.values_list("pk", flat=True))
    items = Item.objects.filter(queue_id__in=queue_ids).select_related("queue")
    found = list(items.filter(identifier=text).order_by("-created_at")[:limit])
    if found:
        return found, True
    found = list(items.filter(identifier__gte=text, identifier__lt=text + PREFIX_END,
                              identifier__startswith=text)[:limit])
    return sorted(found, key=lambda i: (i.identifier, i.queue.key, -i.pk)), False
