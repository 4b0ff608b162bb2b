"""Calibration, power and bookkeeping of pp3cli.evidence.stats (G-test, pooling, Holm, power)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom, chi2, chi2_contingency, ncx2, power_divergence

from pp3cli.evidence.exact import marginal_laws
from pp3cli.evidence.family import member_laws
from pp3cli.evidence.stats import (
    FamilyVerdict,
    MemberResult,
    detectable_tv,
    g_test,
    g_test_homogeneity,
    g_test_pooled,
    holm,
    noncentrality_for_power,
    pool_cells,
    power_of,
    samples_for_tv,
)
from pp3cli.evidence.targets import target_by_name

# A 12-outcome law with a small tail (denominator 128).
LAW12 = [Fraction(k, 128) for k in (1, 1, 2, 3, 5, 8, 13, 21, 30, 20, 14, 10)]
# A 16-outcome law whose first 8 outcomes hold exactly half the mass (denominator 64).
LAW16 = [Fraction(k, 64) for k in (1, 2, 3, 4, 5, 6, 5, 6, 6, 5, 6, 5, 4, 3, 2, 1)]


def _floats(law: list[Fraction]) -> np.ndarray:
    return np.array([float(p) for p in law])


def test_laws_are_exact() -> None:
    assert sum(LAW12) == 1
    assert sum(LAW16) == 1
    assert sum(LAW16[:8]) == Fraction(1, 2)


def test_pooling_rule_on_known_example() -> None:
    law = [Fraction(1, 100), Fraction(0), Fraction(2, 100), Fraction(1, 100), Fraction(96, 100)]
    pooling = pool_cells(law, n=1000, min_expected=20.0)
    # sorted positives: idx0 (.01), idx3 (.01), idx2 (.02), idx4 (.96)
    # cell 1: idx0+idx3 -> 20 >= 20 closes; cell 2: idx2 = 20 closes; cell 3: idx4.
    assert pooling.impossible == (1,)
    assert pooling.groups == ((0, 3), (2,), (4,))
    assert pooling.probs == (Fraction(2, 100), Fraction(2, 100), Fraction(96, 100))
    assert sum(pooling.probs) == 1


def test_pooling_remainder_joins_previous_cell() -> None:
    law = [Fraction(1, 2), Fraction(1, 2)]
    # n * 1/2 = 15 < 20: idx0 alone stays open, joins idx1 -> one cell
    assert pool_cells(law, n=30).groups == ((0, 1),)
    # largest-last remainder: [.3 .3 .4] at n=50 -> 15, 30 (closed at idx1), 20 closes
    law3 = [Fraction(3, 10), Fraction(3, 10), Fraction(4, 10)]
    assert pool_cells(law3, n=50).groups == ((0, 1), (2,))
    # [.05, .95] at n=100: idx0 = 5 open, +idx1 closes -> one cell
    law4 = [Fraction(1, 20), Fraction(19, 20)]
    assert pool_cells(law4, n=100).groups == ((0, 1),)
    # remainder case: [.45, .45, .1] at n=100: .1 -> 10, +.45 -> 55 closes, .45 -> 45 closes
    law5 = [Fraction(45, 100), Fraction(45, 100), Fraction(10, 100)]
    assert pool_cells(law5, n=100).groups == ((0, 2), (1,))


def test_pooling_every_cell_meets_threshold() -> None:
    rng = np.random.default_rng(11)
    weights = rng.integers(0, 50, size=40)
    weights[weights < 5] = 0
    law = [Fraction(int(w), int(weights.sum())) for w in weights]
    for n in (100, 1000, 100000):
        pooling = pool_cells(law, n)
        if len(pooling.groups) > 1:
            assert all(n * p >= 20 for p in pooling.probs)
        covered = sorted(i for group in pooling.groups for i in group)
        assert covered == [i for i, p in enumerate(law) if p > 0]
        assert pooling.impossible == tuple(i for i, p in enumerate(law) if p == 0)


def test_pooling_rejects_bad_laws() -> None:
    with pytest.raises(ValueError, match="sum to"):
        pool_cells([Fraction(1, 2), Fraction(1, 3)], 100)
    with pytest.raises(ValueError, match=">= 0"):
        pool_cells([Fraction(3, 2), Fraction(-1, 2)], 100)
    with pytest.raises(ValueError, match="positive"):
        pool_cells([Fraction(1)], 0)


def test_g_statistic_matches_hand_computation() -> None:
    law = [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)]
    result = g_test("hand", [30, 20, 50], law)
    expected = 2 * (30 * np.log(30 / 25) + 20 * np.log(20 / 25) + 50 * np.log(50 / 50))
    assert result.statistic == pytest.approx(expected, rel=1e-12)
    assert result.df == 2
    assert result.cells == 3
    assert not result.failed_outright


def test_pooled_g_test_is_the_g_test_and_refuses_counts_it_was_not_pooled_for() -> None:
    rng = np.random.default_rng(20261202)
    law = [*LAW12, Fraction(0)]  # one impossible outcome, as receipts' "malformed"
    for n in (7, 60, 900):
        observed = [*rng.multinomial(n, _floats(LAW12)).tolist(), int(n == 900)]
        pooling = pool_cells(law, sum(observed), 20.0)
        assert g_test_pooled("m", observed, pooling) == g_test("m", observed, law, 20.0)
    pooling = pool_cells(law, 60, 20.0)
    with pytest.raises(ValueError, match="pooled for n = 60"):
        g_test_pooled("m", [5] * 11 + [4, 0], pooling)
    with pytest.raises(ValueError, match="12 observed counts for 13 outcomes"):
        g_test_pooled("m", [5] * 12, pooling)
    with pytest.raises(ValueError, match="observed count -1"):
        g_test_pooled("m", [-1, 61] + [0] * 11, pooling)


def test_calibration_false_rejection_rate() -> None:
    """(a) Correct samples are rejected at rate alpha, within a 1 - 1e-6 binomial band."""
    rng = np.random.default_rng(20240601)
    runs, n, alpha = 2000, 2000, 0.01
    samples = rng.multinomial(n, _floats(LAW12), size=runs)
    pvals = [g_test("cal", row.tolist(), LAW12).p_value for row in samples]
    rejections = sum(p <= alpha for p in pvals)
    low, high = binom.interval(1 - 1e-6, runs, alpha)
    assert low <= rejections <= high, f"{rejections} rejections of {runs}, band [{low}, {high}]"
    # the p-values are roughly uniform: mean near 1/2
    assert 0.45 < float(np.mean(pvals)) < 0.55


# Kept ahead of the first test that widens the lambda bracket (the planted deviation), so a
# run with -x (as a mutation campaign's) fails here instead of hanging there.
def test_noncentrality_bracket_search_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's bracket [0, upper] starts at max(1, critical) and widens by doubling (giving
    up past 1e12, i.e. after at most 40 doublings), then brentq takes at most its default 100
    iterations: well under 200 evaluations of ncx2.sf in all. Here (df 1, alpha 0.5:
    critical 0.45, power 0.999) the root lies far above the first bracket, so the search must
    widen it; a search that never brackets the root fails this test instead of hanging."""
    from pp3cli.evidence import stats

    calls = 0

    class CountingNcx2:
        @staticmethod
        def sf(x: float, df: int, nc: float) -> float:
            nonlocal calls
            calls += 1
            if calls > 200:
                raise AssertionError("ncx2.sf evaluated more than 200 times: unbounded search")
            return float(ncx2.sf(x, df, nc))

    monkeypatch.setattr(stats, "ncx2", CountingNcx2)
    lam = noncentrality_for_power(1, 0.5, 0.999)
    critical = float(chi2.isf(0.5, 1))
    assert critical < 1.0 < lam
    assert float(ncx2.sf(critical, 1, lam)) == pytest.approx(0.999, abs=1e-9)
    assert 0 < calls <= 200


def test_planted_deviation_is_detected_with_stated_power() -> None:
    """(b) A worst-case TV-eps deviation sized by samples_for_tv is rejected >= 95%."""
    eps, alpha, df = 0.05, 1e-3, len(LAW16) - 1
    n = samples_for_tv(eps, df, alpha, 0.99)
    assert sorted(pool_cells(LAW16, n).groups) == [(i,) for i in range(16)]  # df is really 15
    p = _floats(LAW16)
    q = p.copy()
    q[:8] *= 1 + 2 * eps
    q[8:] *= 1 - 2 * eps
    assert abs(0.5 * np.abs(q - p).sum() - eps) < 1e-12
    rng = np.random.default_rng(7)
    samples = rng.multinomial(n, q / q.sum(), size=200)
    rejected = sum(g_test("planted", row.tolist(), LAW16).p_value <= alpha for row in samples)
    assert rejected >= 190, f"only {rejected}/200 rejected at n={n}"
    # and the same n with no deviation is not rejected more than a handful of times
    clean = rng.multinomial(n, p, size=200)
    assert sum(g_test("clean", row.tolist(), LAW16).p_value <= alpha for row in clean) <= 3


def test_impossible_outcome_fails_outright() -> None:
    """(c) One sample on a probability-0 outcome fails the member whatever its p-value."""
    law = [Fraction(1, 2), Fraction(0), Fraction(1, 2)]
    result = g_test("imp", [5000, 1, 5000], law)
    assert result.impossible_hits == 1
    assert result.failed_outright
    assert result.p_value > 0.5  # the possible cells fit perfectly
    verdict = holm([result], alpha=1e-5)
    assert not verdict.passed
    assert verdict.rejected == ("imp",)
    assert verdict.adjusted["imp"] == 0.0


def test_missing_cell_drives_p_below_alpha() -> None:
    """(d) A pooled cell that expects >= 20 but observes 0 is detected."""
    law = [Fraction(1, 50)] + [Fraction(49, 50 * 7)] * 7
    n = 1000  # outcome 0 expects exactly 20
    observed = [0] + [143] * 6 + [142]
    assert sum(observed) == n
    assert pool_cells(law, n).groups[0] == (0,)
    result = g_test("missing", observed, law)
    assert result.p_value < 1e-5
    assert not result.failed_outright


def test_single_cell_has_p_one_but_impossible_still_fails() -> None:
    law = [Fraction(1, 2), Fraction(1, 2), Fraction(0)]
    ok = g_test("one", [3, 4, 0], law)
    assert (ok.df, ok.p_value, ok.cells) == (0, 1.0, 1)
    bad = g_test("one-bad", [3, 4, 1], law)
    assert bad.df == 0 and bad.p_value == 1.0 and bad.failed_outright


def _member(name: str, p: float) -> MemberResult:
    return MemberResult(name, 100, 1.0, 3, p, 0, False, 4)


def test_holm_known_example() -> None:
    """(e) Holm on four p-values: adjusted = running max of (m - rank) p."""
    members = [_member("a", 0.01), _member("b", 0.04), _member("c", 0.03), _member("d", 0.005)]
    verdict = holm(members, alpha=0.05)
    # sorted: d .005*4=.02, a .01*3=.03, c .03*2=.06, b .04*1=.04 -> max .06
    assert verdict.adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert verdict.rejected == ("a", "d")
    assert not verdict.passed
    assert holm(members, alpha=0.01).rejected == ()
    assert holm(members, alpha=0.01).passed
    assert set(verdict.to_json()) == {"alpha", "passed", "rejected", "adjusted"}


def test_holm_outright_failure_is_rejected_regardless_of_p() -> None:
    failed = MemberResult("x", 100, 0.0, 3, 0.99, 2, True, 4)
    verdict = holm([failed, _member("y", 0.9)], alpha=1e-5)
    assert verdict.rejected == ("x",)
    assert verdict.adjusted["y"] == pytest.approx(0.9)


def test_holm_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="not unique"):
        holm([_member("a", 0.1), _member("a", 0.2)], alpha=0.01)


def test_sample_sizes_match_design_doc() -> None:
    """(f) DESIGN.md: ~180K samples for eps 1e-2 and ~18M for 1e-3 (df 15, alpha 1e-5)."""
    n2 = samples_for_tv(1e-2, 15, 1e-5, 0.99)
    n3 = samples_for_tv(1e-3, 15, 1e-5, 0.99)
    assert abs(n2 - 180_000) / 180_000 < 0.15, n2
    assert abs(n3 - 18_000_000) / 18_000_000 < 0.15, n3
    assert power_of(n2, 1e-2, 15, 1e-5) == pytest.approx(0.99, abs=1e-4)
    assert power_of(n2 // 4, 1e-2, 15, 1e-5) < 0.5


def test_noncentrality_is_monotone_and_validated() -> None:
    lam = [noncentrality_for_power(10, 1e-3, power) for power in (0.5, 0.9, 0.99)]
    assert lam[0] < lam[1] < lam[2]
    with pytest.raises(ValueError, match="power"):
        noncentrality_for_power(10, 0.1, 0.05)
    with pytest.raises(ValueError, match="df"):
        noncentrality_for_power(0, 0.1, 0.5)


def test_member_json_round_trip() -> None:
    result = g_test("j", [30, 20, 50], [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)])
    data = result.to_json()
    assert MemberResult(**data) == result


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-01)


def test_holm_rejects_at_adjusted_p_equal_to_alpha() -> None:
    """The rule is adj <= alpha (docstring): an adjusted p exactly at alpha is rejected.
    0.125 * 2 = 0.25 and the others are exact in binary, so there is no rounding."""
    members = [_member("a", 0.125), _member("b", 0.5)]
    verdict = holm(members, alpha=0.25)
    assert verdict.adjusted == {"a": 0.25, "b": 0.5}
    assert verdict.rejected == ("a",)
    assert not verdict.passed


def test_homogeneity_cells_close_at_exactly_the_needed_count() -> None:
    """n_a = n_b = 100, min_expected 20: a cell closes once its combined count reaches
    20 * 200 / 100 = 40 (>=), so five outcomes of 20 + 20 are five cells (df 4)."""
    result = g_test_homogeneity("h", [20] * 5, [20] * 5, 20.0)
    assert (result.cells, result.df) == (5, 4)
    assert result.statistic == 0.0 and result.p_value == pytest.approx(1.0)


def test_homogeneity_pools_for_the_smaller_arm() -> None:
    """n_a = 50, n_b = 150: every arm must expect >= 20, so a cell needs a combined count
    of 20 * 200 / 50 = 80; outcomes of 10 + 30 = 40 pair up into 2 cells (df 1)."""
    result = g_test_homogeneity("h", [10, 10, 10, 10], [30, 30, 30, 30], 20.0)
    assert (result.cells, result.df) == (2, 1)


@pytest.mark.parametrize("n", [1, 3, 10])
def test_invalidated_mixture_weights_are_the_odd_request_share(n: int) -> None:
    """Requests 1, 3, 5, ... are invalidated: floor(n/2) of n (0 of 1, 1 of 3, 5 of 10),
    so every member's law is the exact (ceil(n/2), floor(n/2)) mixture."""
    target = target_by_name("invalidated_proposals")
    valid = marginal_laws(target.steps(invalid=False))
    invalid = marginal_laws(target.steps(invalid=True))
    w = Fraction(n // 2, n)
    for law in member_laws(target, n):
        key = law.name.split("/")[1]
        want = tuple((1 - w) * a + w * b for a, b in zip(valid[key], invalid[key], strict=True))
        assert law.probs == (*want, Fraction(0)), key


def test_pairing_recompute_notices_a_tampered_n() -> None:
    """A pairing test's stored n (both arms' samples) is checked against its raw counts."""
    from pp3cli.evidence.family import _recompute_pairing

    first, second = [30, 20, 50, 40], [28, 25, 47, 44]
    result = g_test_homogeneity("pair/x", first, second)
    entry: dict[str, Any] = {
        "name": "pair/x",
        "first": first,
        "second": second,
        "result": result.to_json(),
    }
    assert _recompute_pairing({"tests": [entry]})[1] == []
    entry["result"]["n"] += 1
    _results, problems = _recompute_pairing({"tests": [entry]})
    assert any("stored n" in p for p in problems), problems


# ---- Tests that kill mutants the suite missed (a second campaign, 2026-12-05: one AST
# mutation at a time in pp3cli/evidence/stats.py against test_stats, test_exact and
# test_targets; the survivors that change behaviour are pinned here)


def test_g_test_counts_only_possible_samples_in_its_expected_counts() -> None:
    """Two samples on an impossible outcome: E_c = n' p_c with n' = n - 2 (docstring), and
    G is scipy's log-likelihood power divergence over the same cells."""
    law = [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2), Fraction(0)]
    observed = [30, 18, 50, 2]
    result = g_test("imp", observed, law, 20.0)
    want = power_divergence([30, 18, 50], [24.5, 24.5, 49.0], lambda_="log-likelihood")
    assert (result.n, result.impossible_hits, result.failed_outright) == (100, 2, True)
    assert (result.cells, result.df) == (3, 2)
    assert result.statistic == pytest.approx(float(want.statistic), rel=1e-12)
    assert result.p_value == pytest.approx(float(want.pvalue), rel=1e-9)


def test_a_single_observation_is_a_sample_of_one_cell() -> None:
    """n = 1 is a valid sample: one pooled cell (no outcome expects 20), df 0, G = 0, p = 1."""
    result = g_test("one", [0, 1], [Fraction(1, 2), Fraction(1, 2)])
    assert (result.n, result.cells, result.df) == (1, 1, 0)
    assert (result.statistic, result.p_value) == (0.0, 1.0)
    assert pool_cells([Fraction(1, 2), Fraction(1, 2)], 1).groups == ((0, 1),)


def test_one_possible_sample_is_still_tested() -> None:
    """Cells pooled for n = 100 (two, df 1) but 99 samples on the impossible outcome: the one
    possible sample is tested against E = 1 * p (G = 2 ln 2), and fails outright besides;
    with none possible, G = 0 and p = 1 (the impossible hits decide)."""
    law = [Fraction(1, 2), Fraction(1, 2), Fraction(0)]
    one = g_test("one", [1, 0, 99], law)
    assert (one.df, one.impossible_hits) == (1, 99)
    assert one.statistic == pytest.approx(2.0 * math.log(2.0), rel=1e-12)
    none = g_test("none", [0, 0, 100], law)
    assert (none.statistic, none.p_value, none.failed_outright) == (0.0, 1.0, True)


def test_a_threshold_below_one_expected_count_is_allowed() -> None:
    assert pool_cells([Fraction(1, 4)] * 4, 1, 0.5).groups == ((0, 1), (2, 3))  # E = 0.25 each


@pytest.mark.parametrize("min_expected", [0.0, -1.0, math.inf, math.nan])
def test_min_expected_must_be_finite_and_positive(min_expected: float) -> None:
    with pytest.raises(ValueError, match="expected a finite positive number"):
        pool_cells([Fraction(1, 2), Fraction(1, 2)], 10, min_expected)


def test_a_short_remainder_joins_the_last_closed_cell() -> None:
    """Seven outcomes of 1/7 at n = 70 (E = 10 each): cells close at 20, three of them, and
    the seventh outcome (10 < 20) joins the third, not another."""
    pooling = pool_cells([Fraction(1, 7)] * 7, 70, 20.0)
    assert pooling.groups == ((0, 1), (2, 3), (4, 5, 6))
    assert pooling.probs == (Fraction(2, 7), Fraction(2, 7), Fraction(3, 7))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_holm_needs_alpha_strictly_between_0_and_1(alpha: float) -> None:
    with pytest.raises(ValueError, match="expected 0 < alpha < 1"):
        holm([_member("a", 0.5)], alpha)


def test_holm_adjusted_p_values_are_capped_at_1() -> None:
    """Three members at p = 0.5: (m - rank) p = 1.5, 1.0, 0.5 -> adjusted 1 for all."""
    verdict = holm([_member("a", 0.5), _member("b", 0.5), _member("c", 0.5)], 0.05)
    assert verdict.adjusted == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert verdict.passed


@pytest.mark.parametrize(
    ("df", "alpha", "power", "fragment"),
    [
        (0, 0.05, 0.9, "at least 1 degree of freedom"),
        (1, 0.0, 0.9, "expected 0 < alpha < 1"),
        (1, 1.0, 0.9, "expected 0 < alpha < 1"),
        (1, 0.05, 0.05, "< power < 1"),
        (1, 0.05, 1.0, "< power < 1"),
        (1, 0.05, 1.5, "< power < 1"),
    ],
)
def test_power_design_bounds(df: int, alpha: float, power: float, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        noncentrality_for_power(df, alpha, power)


@pytest.mark.parametrize(
    ("df", "alpha", "power"), [(1, 0.05, 0.06), (1, 0.05, 0.9), (7, 1e-5, 0.99), (60, 1e-7, 0.5)]
)
def test_noncentrality_reaches_the_stated_power(df: int, alpha: float, power: float) -> None:
    """lambda solves P(ncx2(df, lambda) > chi2.isf(alpha, df)) = power, also where the root
    lies below 1 (a power just above alpha) and where it lies above the first bracket."""
    lam = noncentrality_for_power(df, alpha, power)
    critical = float(chi2.isf(alpha, df))
    assert float(ncx2.sf(critical, df, lam)) == pytest.approx(power, abs=1e-9)
    if power == 0.06:
        assert 0.0 < lam < 1.0


def test_sample_size_and_detectable_tv_defaults_and_inverse() -> None:
    """Power 0.99 by default; n = ceil(lambda / (4 tv^2)) and detectable_tv(n) =
    sqrt(lambda / (4 n)) are inverses (up to the ceiling); tv = 1 is allowed and a sample
    size is at least 1."""
    lam = noncentrality_for_power(3, 1e-5, 0.99)
    assert samples_for_tv(0.1, 3, 1e-5) == samples_for_tv(0.1, 3, 1e-5, 0.99)
    assert samples_for_tv(0.1, 3, 1e-5) == math.ceil(lam / 0.04)
    assert samples_for_tv(1.0, 3, 1e-5) == math.ceil(lam / 4.0)
    assert samples_for_tv(1.0, 1, 0.4, 0.45) == 1  # lambda / 4 < 1
    assert detectable_tv(1000, 3, 1e-5) == detectable_tv(1000, 3, 1e-5, 0.99)
    assert detectable_tv(1000, 3, 1e-5) == pytest.approx(math.sqrt(lam / 4000.0), rel=1e-12)
    assert detectable_tv(1, 3, 1e-5) == pytest.approx(math.sqrt(lam / 4.0), rel=1e-12)
    n = samples_for_tv(detectable_tv(5000, 3, 1e-5), 3, 1e-5)
    assert n in (5000, 5001)
    for tv in (0.0, 1.5):
        with pytest.raises(ValueError, match="expected 0 < tv <= 1"):
            samples_for_tv(tv, 3, 1e-5)
    with pytest.raises(ValueError, match="expected at least one sample"):
        detectable_tv(0, 3, 1e-5)


def test_power_of_at_the_edges_of_its_domain() -> None:
    """No samples or no deviation: the power is the test's size alpha; tv = 1 is allowed;
    a negative n or tv outside [0, 1] is refused."""
    assert power_of(0, 0.1, 3, 0.01) == pytest.approx(0.01, rel=1e-9)
    assert power_of(1000, 0.0, 3, 0.01) == pytest.approx(0.01, rel=1e-9)
    assert power_of(10, 1.0, 3, 0.01) == pytest.approx(
        float(ncx2.sf(chi2.isf(0.01, 3), 3, 40.0)), rel=1e-12
    )
    with pytest.raises(ValueError, match="non-negative sample size"):
        power_of(-1, 0.1, 3, 0.01)
    for tv in (-0.1, 1.5):
        with pytest.raises(ValueError, match="expected 0 <= tv <= 1"):
            power_of(10, tv, 3, 0.01)


def test_homogeneity_statistic_is_the_log_likelihood_contingency_test() -> None:
    """n_a = 98, n_b = 103: a cell needs 20 * 201 / 98 = 41.0 combined; outcomes of 65, 45
    and 85 close one each, the last two (3 + 3, then 0 + 0: a zero count is allowed) join
    the third. G, df and p are scipy's log-likelihood test on that 3 x 2 table (no
    continuity correction); there is no impossible outcome in a two-sample test."""
    result = g_test_homogeneity("h", [30, 25, 40, 3, 0], [35, 20, 45, 3, 0], 20.0)
    table = np.array([[30, 35], [25, 20], [43, 48]])
    statistic, p_value, dof, _ = chi2_contingency(table, correction=False, lambda_="log-likelihood")
    assert (result.n, result.cells, result.df) == (201, 3, dof)
    assert result.statistic == pytest.approx(float(statistic), rel=1e-12)
    assert result.p_value == pytest.approx(float(p_value), rel=1e-9)
    assert (result.impossible_hits, result.failed_outright) == (0, False)


def test_homogeneity_of_tiny_samples_is_one_cell() -> None:
    """Arms of 1 and 5 samples: nothing reaches the needed count, one cell, df 0, p = 1;
    an empty arm is refused, whichever it is."""
    for first, second in (([1, 0], [0, 5]), ([5, 0], [0, 1])):
        result = g_test_homogeneity("h", first, second)
        assert (result.n, result.cells, result.df) == (6, 1, 0)
        assert (result.statistic, result.p_value) == (0.0, 1.0)
    for first, second in (([0, 0], [3, 4]), ([3, 4], [0, 0])):
        with pytest.raises(ValueError, match="an empty sample"):
            g_test_homogeneity("h", first, second)
    with pytest.raises(ValueError, match="negative count"):
        g_test_homogeneity("h", [3, -1], [2, 2])


def test_results_are_frozen() -> None:
    """What a receipt stores cannot be changed after the test that made it."""
    result = g_test("f", [30, 20, 50], [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)])
    pooling = pool_cells([Fraction(1, 2), Fraction(1, 2)], 100)
    verdict = holm([result], 0.05)
    assert isinstance(verdict, FamilyVerdict)
    for frozen, field in ((result, "p_value"), (pooling, "n"), (verdict, "passed")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, 0)
