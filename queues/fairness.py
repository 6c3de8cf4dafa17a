"""The fair selector's allocation: a pure function, no database.

Slot k of account a has the key k / weight(a); a round takes the `batch_size` smallest keys,
ties going to the account that comes first in the ring of sorted account keys starting right
after the cursor. That is exactly "each next slot goes to the account with the smallest
(taken + 1) / weight", computed without handing out slots one by one:

1. an integer water level m: every account takes min(demand, m * weight), the largest m that
   stays within the batch (binary search; exact integer arithmetic);
2. the few slots left go one at a time from a heap ordered by (key, ring position).

Cost: O(A log A) for A accounts with demand (plus the sum of weights of the accounts still
unmet after step 1, times log A, when weights are above 1).
"""

import heapq
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
    weight = {account: _weight(weights, account) for account in accounts}
    if sum(demand[account] for account in accounts) <= batch_size:
        return {account: demand[account] for account in accounts}, cursor

    level = _water_level(demand, weight, accounts, batch_size)
    taken = {account: min(demand[account], level * weight[account]) for account in accounts}
    left = batch_size - sum(taken.values())

    start = bisect_right(accounts, cursor) if cursor is not None else 0
    count = len(accounts)

    def ring(index: int) -> int:
        return (index - start) % count

    if left == 0:
        # The batch ended exactly at the level: the last account (in ring order) that took a
        # slot at that level is the cursor.
        at_level = [i for i, a in enumerate(accounts) if level * weight[a] <= demand[a]]
        next_cursor = accounts[max(at_level, key=ring)]
        return _nonzero(taken), next_cursor

    heap = [
        ((taken[a] + 1) / weight[a], ring(i), a)
        for i, a in enumerate(accounts)
        if taken[a] < demand[a]
    ]
    heapq.heapify(heap)
    last = cursor
    for _ in range(left):
        _, position, account = heapq.heappop(heap)
        taken[account] += 1
        last = account
        if taken[account] < demand[account]:
            heapq.heappush(heap, ((taken[account] + 1) / weight[account], position, account))
    return _nonzero(taken), last


def _weight(weights: Mapping[str, int], account: str) -> int:
    value = weights.get(account, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"weight of {account!r} must be a positive integer, not {value!r}")
    return value


def _water_level(demand, weight, accounts, batch_size) -> int:
    """Largest integer m with sum(min(demand, m * weight)) <= batch_size."""
    low, high = 0, max(-(-demand[a] // weight[a]) for a in accounts)
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(demand[a], middle * weight[a]) for a in accounts) <= batch_size:
            low = middle
        else:
            high = middle - 1
    return low


def _nonzero(taken: dict[str, int]) -> dict[str, int]:
    return {account: n for account, n in taken.items() if n}
