"""The fair selector's allocation: a pure function, no database.

Slot k of account a has the key k / weight(a); a round takes the `batch_size` smallest keys,
ties going to the account that comes first in the ring of sorted account keys starting right
after the cursor. That is exactly "each next slot goes to the account with the smallest
(taken + 1) / weight", computed without handing out slots one by one:

1. an integer water level m: every account takes min(demand, m * weight), the largest m that
   stays within the batch. An account is met from the level ceil(demand / weight) on, so
   between two such levels the total is linear in m: one walk over the accounts sorted by that
   level, with running sums, finds m by integer division, whatever the demands;
2. the slots left, all with keys in (m, m + 1], go one at a time from a heap ordered by
   (key, ring position), with exact integer keys.

Cost: O(A log A) for A accounts with demand, plus O(left log left) for step 2, where the slots
left are at most batch_size and fewer than the sum of the weights of the accounts unmet at
level m (so fewer than A when every weight is 1).
"""

import heapq
import math
from bisect import bisect_right
from collections.abc import Mapping


def plan_batch(
    demand: Mapping[str, int],
    batch_size: int,
    cursor: str | None,
    weights: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], str | None]:
    """demand: ready items per account. Returns (items to take per account, next cursor)."""
    if batch_size < 0:
        raise ValueError("batch_size must not be negative")
    weights = weights or {}
    accounts = sorted(account for account, wanted in demand.items() if wanted > 0)
    if not accounts or batch_size == 0:
        return {}, cursor
    _check_weights(weights, demand)
    weight = [weights.get(account, 1) for account in accounts]
    wanted = [demand[account] for account in accounts]
    if sum(wanted) <= batch_size:
        return dict(zip(accounts, wanted, strict=True)), cursor

    level = _water_level(wanted, weight, batch_size)
    taken = [min(d, level * w) for d, w in zip(wanted, weight, strict=True)]
    left = batch_size - sum(taken)
    start = bisect_right(accounts, cursor) if cursor is not None else 0
    ring_order = [*range(start, len(accounts)), *range(start)]
    if left == 0:
        # The batch ended exactly at the level: the last account (in ring order) that took a
        # slot at that level is the cursor.
        last = next(i for i in reversed(ring_order) if level * weight[i] <= wanted[i])
    else:
        last = _hand_out_the_rest(left, ring_order, wanted, weight, taken)
    return _nonzero(accounts, taken), accounts[last]


def _check_weights(weights: Mapping[str, int], demand: Mapping[str, int]):
    # Only the sparse explicit weights are checked, and only where they take part.
    for account, value in weights.items():
        if demand.get(account, 0) > 0 and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"weight of {account!r} must be a positive integer, not {value!r}")


def _water_level(wanted: list[int], weight: list[int], batch_size: int) -> int:
    """Largest integer m with sum(min(demand, m * weight)) <= batch_size < sum(demand).

    Between `low` (the level at which every account walked so far is met) and the next
    account's level minus one, the total is met_demand + m * unmet_weight exactly; walking in
    order keeps the invariant total(low - 1) <= batch_size."""
    met_demand, unmet_weight, low = 0, sum(weight), 0
    met_from = [-(-d // w) for d, w in zip(wanted, weight, strict=True)]
    for account_met_from, d, w in sorted(zip(met_from, wanted, weight, strict=True)):
        fits = (batch_size - met_demand) // unmet_weight
        if fits < account_met_from - 1:
            # Level fits + 1 overshoots within this stretch; when fits is below the stretch,
            # its first level already overshoots, since every unmet account takes more there.
            return max(fits, low - 1)
        low = account_met_from
        met_demand += d
        unmet_weight -= w
    return low - 1


def _hand_out_the_rest(left: int, ring_order: list[int], wanted: list[int], weight: list[int],
                       taken: list[int]) -> int:
    """Gives the `left` slots above the level (adding them to `taken`) and returns the index
    of the account that got the last one."""
    unmet = [i for i in ring_order if taken[i] < wanted[i]]
    # The key of an account's first slot above the level is level + 1 / weight: only the `left`
    # accounts with the smallest such keys (heaviest first, then in ring order; nsmallest is
    # stable) can get a slot, which bounds the heap by the batch whatever the number of accounts.
    heaviest_first = [-weight[i] for i in unmet]
    candidates = heapq.nsmallest(left, range(len(unmet)), key=heaviest_first.__getitem__)
    # Slot level * w + j has the key level + j / w: j * (scale // w) orders the slots exactly,
    # where floats would merge close fractions of large weights.
    scale = math.lcm(*{weight[unmet[p]] for p in candidates})
    heap = [(scale // weight[unmet[p]], p) for p in candidates]
    heapq.heapify(heap)
    for _ in range(left):
        key, position = heapq.heappop(heap)
        account = unmet[position]
        taken[account] += 1
        if taken[account] < wanted[account]:
            heapq.heappush(heap, (key + scale // weight[account], position))
    return account


def _nonzero(accounts: list[str], taken: list[int]) -> dict[str, int]:
    return {account: n for account, n in zip(accounts, taken, strict=True) if n}
