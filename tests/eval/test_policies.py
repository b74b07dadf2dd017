"""Eviction policies on page tables: the budget is never exceeded and exactly the expected
pages are kept (expected sets derived by hand from each policy's definition)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.eval.policies import EvictionPolicy, make_policy


def drive(
    policy: EvictionPolicy, page_size: int, num_tokens: int, mass_seed: int = 0
) -> list[list[int]]:
    """Open pages token by token as the lab does and apply the policy after each step.

    Returns the resident logical pages while each token t is attended (index t)."""
    rng = np.random.default_rng(mass_seed)
    resident: list[int] = []
    mass = np.zeros(num_tokens // page_size + 1)
    seen = []
    for t in range(num_tokens):
        if t // page_size not in resident:
            resident.append(t // page_size)
        seen.append(list(resident))
        mass[resident] += rng.random(len(resident))
        keep = policy.keep(resident, t + 1, mass if policy.needs_attention else None)
        assert set(keep) <= set(resident) and keep == sorted(keep)
        resident = keep
    return seen


@pytest.mark.parametrize("name", ["window", "sinks", "h2o", "random"])
@pytest.mark.parametrize(("page_size", "budget"), [(4, 16), (8, 24), (4, 30)])
def test_budget_never_exceeded(name: str, page_size: int, budget: int) -> None:
    policy = make_policy(name, page_size=page_size, budget=budget, seed=1)
    for t, pages in enumerate(drive(policy, page_size, 120)):
        assert len(pages) * page_size <= budget, (t, pages)
        assert t // page_size in pages  # the token's own page is resident


def test_window_keeps_exactly_the_pages_of_the_window() -> None:
    # budget 16 tokens, page 4: 4 pages, W = 3 * 4 + 1 = 13 keys p-12..p.
    policy = make_policy("window", page_size=4, budget=16)
    assert policy.sliding_window == 13 and policy.num_sink_tokens == 0
    for t, pages in enumerate(drive(policy, 4, 60)):
        lo = max(t - 12, 0)
        assert pages == list(range(lo // 4, t // 4 + 1)), t


def test_sinks_keep_the_sink_page_and_the_window() -> None:
    # budget 16, page 4, S = 4: page 0 (sinks) + 3 pages of window W = 2 * 4 + 1 = 9.
    policy = make_policy("sinks", page_size=4, budget=16, num_sinks=4)
    assert policy.sliding_window == 9 and policy.num_sink_tokens == 4
    for t, pages in enumerate(drive(policy, 4, 60)):
        window = set(range(max(t - 8, 0) // 4, t // 4 + 1))
        assert pages == sorted({0} | window), t


def test_sinks_spanning_two_pages_count_both() -> None:
    policy = make_policy("sinks", page_size=4, budget=20, num_sinks=5)
    assert policy.sliding_window == (5 - 2 - 1) * 4 + 1
    # 5 pages: sink pages 0, 1 + window 51..59 (pages 12..14).
    assert drive(policy, 4, 60)[59] == [0, 1, 12, 13, 14]


def test_h2o_keeps_recent_pages_and_the_heaviest_older_ones() -> None:
    policy = make_policy("h2o", page_size=4, budget=16)  # 4 pages: 2 recent + 2 heavy
    mass = np.array([5.0, 1.0, 3.0, 0.5, 9.0])
    # 16 tokens written: the next opens page 4, so 3 may stay: page 3 (recent) + 2 heaviest.
    assert policy.keep([0, 1, 2, 3], 16, mass) == [0, 2, 3]
    # Mid-page nothing is evicted.
    assert policy.keep([0, 2, 3, 4], 17, mass) == [0, 2, 3, 4]
    # Next boundary: page 4 stays (recent), then the two heaviest of pages 0, 2, 3.
    assert policy.keep([0, 2, 3, 4], 20, mass) == [0, 2, 4]
    with pytest.raises(ValueError, match="page_mass"):
        policy.keep([0, 1, 2, 3], 16, None)


def test_random_is_seeded() -> None:
    def run(seed: int) -> list[list[int]]:
        return drive(make_policy("random", page_size=4, budget=16, seed=seed), 4, 80)

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_full_keeps_everything() -> None:
    policy = make_policy("full", page_size=4, budget=None)
    assert drive(policy, 4, 30)[29] == list(range(8))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "lru", "budget": 64}, "policy: expected one of"),
        ({"name": "window", "budget": 4}, "budget: window needs at least 1 pages"),
        ({"name": "sinks", "budget": 16}, "budget: sinks needs at least 2 pages"),
        ({"name": "h2o", "budget": 16}, "h2o needs at least 2 pages"),
        ({"name": "h2o", "budget": 64, "position_mode": "shifted"}, "'absolute' positions only"),
        ({"name": "random", "budget": None}, "needs a budget"),
        ({"name": "window", "budget": 64, "position_mode": "rel"}, "position_mode"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object], match: str) -> None:
    name = str(kwargs.pop("name"))
    with pytest.raises(ValueError, match=match):
        make_policy(name, page_size=16, **kwargs)  # type: ignore[arg-type]
