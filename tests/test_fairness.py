import math
from bisect import bisect_right
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queues.engine.fairness import plan_batch

account_names = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=6)
demands = st.dictionaries(account_names, st.integers(min_value=0, max_value=300), max_size=60)


def greedy_reference(demand, batch_size, cursor, weights=None):
    """The spec's definition, slot by slot: smallest (taken + 1) / weight, ties by ring order."""
    weights = weights or {}
    accounts = sorted(a for a, d in demand.items() if d > 0)
    if not accounts:
        return {}, cursor
    start = bisect_right(accounts, cursor) if cursor is not None else 0
    ring = {a: (i - start) % len(accounts) for i, a in enumerate(accounts)}
    taken = dict.fromkeys(accounts, 0)
    last = cursor
    for _ in range(min(batch_size, sum(demand[a] for a in accounts))):
        open_ = [a for a in accounts if taken[a] < demand[a]]
        pick = min(open_, key=lambda a: (Fraction(taken[a] + 1, weights.get(a, 1)), ring[a]))
        taken[pick] += 1
        last = pick
    return {a: n for a, n in taken.items() if n}, last


def assert_contract(demand, batch_size, weights, taken):
    weights = weights or {}
    w = lambda a: weights.get(a, 1)  # noqa: E731
    total = sum(d for d in demand.values() if d > 0)
    assert sum(taken.values()) == min(batch_size, total)  # work-conserving
    for account, n in taken.items():
        assert 0 < n <= demand[account]  # nobody gets more than it asked for
    for u, d in demand.items():  # max-min fair
        if d > taken.get(u, 0):
            for v in demand:
                assert taken.get(v, 0) / w(v) <= (taken.get(u, 0) + 1) / w(u) + 1e-12


@settings(max_examples=300, deadline=None)
@given(demands, st.integers(min_value=1, max_value=200), st.one_of(st.none(), account_names))
def test_it_matches_the_slot_by_slot_definition(demand, batch_size, cursor):
    planned = plan_batch(demand, batch_size, cursor)
    taken, next_cursor = greedy_reference(demand, batch_size, cursor)
    assert planned[0] == taken
    if sum(demand.values()) > batch_size:  # when all demand is met the cursor does not matter
        assert planned[1] == next_cursor


@settings(max_examples=300, deadline=None)
@given(demands, st.integers(min_value=1, max_value=200), st.one_of(st.none(), account_names),
       st.data())
def test_it_matches_the_definition_with_weights(demand, batch_size, cursor, data):
    weights = {a: data.draw(st.integers(min_value=1, max_value=9)) for a in demand}
    planned = plan_batch(demand, batch_size, cursor, weights)
    taken, next_cursor = greedy_reference(demand, batch_size, cursor, weights)
    assert planned[0] == taken
    if sum(demand.values()) > batch_size:
        assert planned[1] == next_cursor


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(account_names, st.one_of(st.integers(min_value=0, max_value=40),
                                             st.integers(min_value=10**6, max_value=10**12)),
                    max_size=30),
    st.integers(min_value=1, max_value=300),
    st.one_of(st.none(), account_names),
    st.data(),
)
def test_it_matches_the_definition_with_huge_demands_and_weights(demand, batch_size, cursor,
                                                                  data):
    # Water levels far above the batch, and weights whose slot keys differ by less than a
    # float can tell apart.
    weights = {a: data.draw(st.one_of(st.integers(min_value=1, max_value=9),
                                      st.integers(min_value=2**60, max_value=2**60 + 3)))
               for a in demand}
    planned = plan_batch(demand, batch_size, cursor, weights)
    taken, next_cursor = greedy_reference(demand, batch_size, cursor, weights)
    assert planned[0] == taken
    if sum(demand.values()) > batch_size:
        assert planned[1] == next_cursor


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=5000),
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=0, max_value=5000),
    st.data(),
)
def test_it_is_work_conserving_and_max_min_fair_at_scale(sizes, batch_size, cursor_index, data):
    demand = {f"acct-{i:05d}": n for i, n in enumerate(sizes)}
    weights = None
    if data.draw(st.booleans()):
        weights = {a: 1 + (i * 7919) % 5 for i, a in enumerate(demand)}
    taken, _ = plan_batch(demand, batch_size, f"acct-{cursor_index:05d}", weights)
    assert_contract(demand, batch_size, weights, taken)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=400), st.integers(min_value=1, max_value=60))
def test_every_backlogged_account_is_served_within_ceil_accounts_over_batch_rounds(
    accounts, batch_size
):
    demand = {f"a{i:04d}": 1000 for i in range(accounts)}
    window = math.ceil(accounts / batch_size)
    cursor, served = None, []
    for _ in range(3 * window):
        taken, cursor = plan_batch(demand, batch_size, cursor)
        served.append(set(taken))
    for start in range(len(served) - window + 1):
        assert set().union(*served[start:start + window]) == set(demand)


def test_the_seed_hang_case_completes_seven_accounts_of_twenty():
    taken, _ = plan_batch({f"a{i}": 20 for i in range(7)}, 60, None)
    assert sum(taken.values()) == 60
    assert sorted(taken.values()) == [8, 8, 8, 9, 9, 9, 9]


def test_it_fills_the_batch_with_accounts_before_the_cursor():
    # The seed only looked at accounts above the cursor and left most of the batch empty.
    assert plan_batch({"a": 100, "b": 100, "c": 1}, 60, "b") == ({"a": 30, "b": 29, "c": 1}, "a")


def test_small_demand_is_met_in_full_and_keeps_the_cursor():
    assert plan_batch({"a": 2, "b": 3}, 60, "a") == ({"a": 2, "b": 3}, "a")


def test_weights_scale_the_share():
    taken, _ = plan_batch({"big": 1000, "small": 1000}, 60, None, {"big": 2})
    assert taken == {"big": 40, "small": 20}


@pytest.mark.parametrize("weight", [0, -1, 1.5, True])
def test_it_refuses_weights_that_are_not_positive_integers(weight):
    with pytest.raises(ValueError, match="weight"):
        plan_batch({"a": 5}, 10, None, {"a": weight})


def test_empty_demand_and_zero_batch_take_nothing():
    assert plan_batch({}, 60, "x") == ({}, "x")
    assert plan_batch({"a": 0}, 60, None) == ({}, None)
    assert plan_batch({"a": 5}, 0, None) == ({}, None)


def test_it_is_total_for_huge_batches_and_demands():
    demand = {"a": 10**12, "b": 10**12 + 1, "c": 3}
    taken, cursor = plan_batch(demand, 10**9 + 1, None)
    assert taken == {"a": 5 * 10**8 - 1, "b": 5 * 10**8 - 1, "c": 3}
    assert cursor == "b"
