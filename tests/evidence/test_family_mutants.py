"""The family's laws, plan and power statements, which a mutation campaign over
``pp3cli/evidence/family.py`` (functions other than the recomputer) found unpinned.

The mixture weights of an ``invalid_row`` target (ceil(n/2) valid, floor(n/2) invalidated
requests: the module docstring), one request being a valid family, each member's kind and
its malformed outcome; a target's stated TV being exactly its weakest member's at
alpha / m; the controls' size (the verifier's, or fewer with a ``control_tv``).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from pp3cli.evidence.exact import marginal_laws
from pp3cli.evidence.family import (
    MemberLaw,
    MemberRecord,
    control_requests_for,
    member_laws,
    plan_samples,
    requests_for,
    target_power,
)
from pp3cli.evidence.profiles import MIN_EXPECTED, POWER, PROFILES
from pp3cli.evidence.stats import MemberResult, detectable_tv, pool_cells, samples_for_tv
from pp3cli.evidence.targets import TARGETS, target_by_name

ALPHA = 1e-5
MIXED = next(t for t in TARGETS if t.invalid_row is not None)


def _by_key(target_name: str, n: int) -> dict[str, MemberLaw]:
    return {law.name.split("/")[1]: law for law in member_laws(target_by_name(target_name), n)}


@pytest.mark.parametrize(
    ("n", "invalidated"), [(1, 0), (2, 1), (3, 1), (7, 3)], ids=["n1", "n2", "n3", "n7"]
)
def test_an_invalid_row_targets_law_is_the_request_weighted_mixture(
    n: int, invalidated: int
) -> None:
    """n requests: floor(n/2) invalidated (odd indices), the rest valid; each member's law
    is that exact mixture of the two chains' laws, then "malformed" at probability 0. One
    request is a family of its own (valid only)."""
    valid = marginal_laws(MIXED.steps(invalid=False))
    invalid = marginal_laws(MIXED.steps(invalid=True))
    laws = _by_key(MIXED.name, n)
    assert laws.keys() == valid.keys()
    for key, law in laws.items():
        expected = [
            (Fraction(n - invalidated) * a + Fraction(invalidated) * b) / n
            for a, b in zip(valid[key], invalid[key], strict=True)
        ]
        assert law.probs == (*expected, Fraction(0)), key
        assert sum(law.probs) == 1


def test_no_requests_is_refused() -> None:
    """n = 0 has no mixture (and no family): a ValueError naming n."""
    with pytest.raises(ValueError, match="n = 0: expected at least one request"):
        member_laws(MIXED, 0)


def test_members_are_named_by_target_and_kind() -> None:
    """Every slot member is of kind "slot"; "accepted" and "joint" are their own kinds."""
    target = TARGETS[0]
    laws = member_laws(target, 4)
    kinds = {law.name: law.kind for law in laws}
    slots = [f"{target.name}/slot{j}" for j in range(target.k + 1)]
    assert kinds == {
        **{name: "slot" for name in slots},
        f"{target.name}/accepted": "accepted",
        f"{target.name}/joint": "joint",
    }
    assert {law.target for law in laws} == {target.name}


def _record(target: str, member: str, n: int, df: int) -> MemberRecord:
    probs = (Fraction(1, 2), Fraction(1, 2), Fraction(0))
    law = MemberLaw(f"{target}/{member}", target, member, probs)
    result = MemberResult(law.name, n, 0.0, df, 1.0, 0, False, df + 1)
    return MemberRecord(law, (n // 2, n - n // 2, 0), pool_cells(probs, n, 20.0), result)


def test_a_targets_stated_tv_is_its_weakest_members_at_alpha_over_m() -> None:
    """Two targets, five members (m = 5, + 2 pairing tests): each target states its
    requests and the largest of its members' detectable TVs, each at alpha / m."""
    records = [
        _record("a", "slot0", 1000, 3),
        _record("a", "accepted", 1000, 7),
        _record("a", "joint", 1000, 1),
        _record("b", "slot0", 400, 2),
        _record("b", "joint", 400, 5),
    ]
    for extra, m in ((0, 5), (2, 7)):
        stated = target_power(records, ALPHA, extra_members=extra)
        assert stated == [
            {"name": "a", "requests": 1000, "tv": detectable_tv(1000, 7, ALPHA / m, POWER)},
            {"name": "b", "requests": 400, "tv": detectable_tv(400, 5, ALPHA / m, POWER)},
        ]
        # the weakest member (most df) detects the least: its TV is the largest
        assert stated[0]["tv"] > detectable_tv(1000, 3, ALPHA / m, POWER)


def test_a_member_pooled_to_one_cell_is_sized_at_one_degree_of_freedom() -> None:
    """df = 0 (everything in one cell) has no chi-square law: the statement uses df 1."""
    stated = target_power([_record("a", "slot0", 500, 0)], ALPHA)
    assert stated == [{"name": "a", "requests": 500, "tv": detectable_tv(500, 1, ALPHA, POWER)}]


def test_controls_run_at_the_verifiers_size_unless_a_control_tv_asks_for_fewer() -> None:
    """Without ``control_tv`` the controls get the verifier's requests; with one, the
    smaller of the verifier's and what that TV needs (never more than the verifier)."""
    seed = replace(PROFILES["seed"], requests=10**7)  # fixed requests, no TV
    assert control_requests_for(seed, ALPHA) == 10**7
    for_tv = requests_for(seed, ALPHA, tv=0.1)
    assert for_tv < 10**7  # TV 0.1 needs fewer
    assert control_requests_for(replace(seed, control_tv=0.1), ALPHA) == for_tv
    few = replace(seed, requests=10, control_tv=0.1)
    assert control_requests_for(few, ALPHA) == 10


def test_a_stated_tv_uses_at_least_one_sample() -> None:
    """n = 1 (one request) is sized as it is, not rounded up: sqrt(lambda / 4)."""
    stated = target_power([_record("a", "slot0", 1, 2)], ALPHA)
    assert stated == [{"name": "a", "requests": 1, "tv": detectable_tv(1, 2, ALPHA, POWER)}]


def test_the_plan_sizes_the_half_invalidated_mixture_at_its_fixed_point() -> None:
    """docs/qualify.md "Power": df from the pooled cells at the planned n (a fixed point:
    that df needs no more than n), for the law a run of an even number of requests has,
    half of them invalidated; TV 0.1 makes n small enough that some members pool to one
    or two cells."""
    tv = 0.1
    rows = plan_samples(tv, ALPHA)
    laws = {law.name: law for target in TARGETS for law in member_laws(target, 2)}
    assert [row.member for row in rows] == list(laws)
    member_alpha = ALPHA / len(rows)
    for row in rows:
        law = laws[row.member]
        groups = pool_cells(law.probs, row.n_needed, MIN_EXPECTED).groups
        assert row.df == max(1, len(groups) - 1), row
        assert samples_for_tv(tv, row.df, member_alpha, POWER) <= row.n_needed, row
        assert row.outcomes == len(law.probs)
