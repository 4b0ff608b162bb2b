"""A qualification's split over ranks (pp3cli.evidence.shares): merging each battery's
per-rank counts, and the check ``verify-receipts`` runs on a receipt's ``distributed`` block,
one way to break it at a time."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pytest

from pp3cli.evidence.family import MemberLaw
from pp3cli.evidence.shares import VERIFIER, RankShare, check_rank_counts


def _data() -> dict[str, Any]:
    """A consistent two-rank receipt: the verifier judged on members a and b, one control
    judged on a only; each member's observed counts are its two rank vectors' sum."""
    return {
        "members": [
            {"name": "a", "observed": [3, 5, 0]},
            {"name": "b", "observed": [4, 4]},
        ],
        "controls": [{"defect": "accept_ge", "members": [{"name": "a", "observed": [8, 0, 0]}]}],
        "distributed": {
            "world_size": 2,
            "ranks": [{"rank": 0}, {"rank": 1}],
            "counts": {
                VERIFIER: {"a": [[1, 2, 0], [2, 3, 0]], "b": [[4, 0], [0, 4]]},
                "accept_ge": {"a": [[5, 0, 0], [3, 0, 0]]},
            },
        },
    }


def test_a_consistent_block_or_none_has_no_problem() -> None:
    assert check_rank_counts(_data()) == []
    alone = _data()
    del alone["distributed"]
    assert check_rank_counts(alone) == []


def _broken(change: str) -> dict[str, Any]:
    data = _data()
    block = data["distributed"]
    counts = block["counts"]
    if change == "rank lost":
        block["ranks"].pop()
    elif change == "ranks out of order":
        block["ranks"].reverse()
    elif change == "battery lost":
        del counts["accept_ge"]
    elif change == "battery added":
        counts["reused_coin"] = {}
    elif change == "member lost":
        del counts[VERIFIER]["b"]
    elif change == "member added":
        counts["accept_ge"]["b"] = [[4, 0], [0, 4]]
    elif change == "vector lost":
        counts[VERIFIER]["a"].pop()
    elif change == "vector short":
        counts[VERIFIER]["b"][1] = [0]
    elif change == "negative":
        counts[VERIFIER]["a"] = [[-1, 2, 0], [4, 3, 0]]
    elif change == "moved to another outcome":
        counts["accept_ge"]["a"] = [[5, 0, 0], [2, 1, 0]]
    elif change == "one more request":
        counts[VERIFIER]["b"][0][1] += 1
    return data


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("rank lost", "rank records [0] for world size 2"),
        ("ranks out of order", "rank records [1, 0] for world size 2"),
        ("battery lost", "per-rank counts for ['verifier'], judged ['accept_ge', 'verifier']"),
        ("battery added", "per-rank counts for ['accept_ge', 'reused_coin', 'verifier']"),
        ("member lost", "distributed verifier: per-rank members differ from the judged"),
        ("member added", "distributed accept_ge: per-rank members differ from the judged"),
        ("vector lost", "distributed verifier a: expected 2 per-rank vectors of 3 counts"),
        ("vector short", "distributed verifier b: expected 2 per-rank vectors of 2 counts"),
        ("negative", "distributed verifier a: a negative per-rank count"),
        ("moved to another outcome", "accept_ge a: per-rank counts do not add up"),
        ("one more request", "verifier b: per-rank counts do not add up to the judged counts "
         "(9 vs 8 requests)"),
    ],
)  # fmt: skip
def test_each_way_to_break_the_block_is_named(change: str, fragment: str) -> None:
    problems = check_rank_counts(_broken(change))
    assert any(fragment in problem for problem in problems), problems
    if change == "negative":  # the sums still match: the sign alone is the problem
        assert len(problems) == 1, problems


def _law(name: str, outcomes: int) -> MemberLaw:
    return MemberLaw(name, "toy", "slot", (Fraction(1, outcomes),) * outcomes)


@dataclass
class _Group:
    """Three ranks' gather, this process being rank 1; the other two ranks' vectors fixed."""

    rank: int = 1

    def gather_counts(self, own: np.ndarray) -> np.ndarray:
        others = np.arange(own.size, dtype=np.int64)
        return np.stack([others, own, 10 * others])


def test_merge_gathers_every_members_counts_in_law_order_and_sums_them() -> None:
    share = RankShare(cast(Any, _Group()))
    laws = [_law("x", 2), _law("missing", 1), _law("y", 3)]
    merged = share.merge(laws, {"y": np.array([7, 8, 9]), "x": np.array([1, 2])})
    # own vector: x, then zeros for the member this rank did not count, then y
    assert {name: list(v) for name, v in merged.items()} == {
        "x": [0 + 1 + 0, 1 + 2 + 10],
        "missing": [2 + 0 + 20],
        "y": [3 + 7 + 30, 4 + 8 + 40, 5 + 9 + 50],
    }
    assert share.rank == 1
    first = share.take()
    assert first == [
        {
            "x": [[0, 1], [1, 2], [0, 10]],
            "missing": [[2], [0], [20]],
            "y": [[3, 4, 5], [7, 8, 9], [30, 40, 50]],
        }
    ]
    share.merge(laws[:1], {"x": np.array([0, 0])})
    share.merge(laws[:1], {})
    second = share.take()
    assert [entry["x"][1] for entry in second] == [[0, 0], [0, 0]] and share.take() == []
