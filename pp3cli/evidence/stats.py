"""Goodness-of-fit statistics against an exact law: pooling, G-test, Holm, power.

Everything here follows docs/method.md ("Statistics", "Power"):

- cells are pooled from the *exact* probabilities and the planned sample size only
  (never from observed counts) so that every cell expects at least ``min_expected``;
  outcomes of exact probability 0 are never pooled and any sample on one fails the
  member outright;
- the statistic is the likelihood ratio G = 2 sum_c O_c ln(O_c / E_c), df = cells - 1,
  p = P(chi2_df > G);
- a family of members is judged with Holm's step-down procedure at family-wise alpha;
- power: a deviation of total variation eps (on the pooled cells) gives a G
  non-centrality of at least 4 n eps^2 per the Pinsker / Cauchy-Schwarz bound, so
  n = ceil(lambda(df, alpha, power) / (4 eps^2)) samples detect it with that power.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import xlogy
from scipy.stats import chi2, ncx2

__all__ = [
    "FamilyVerdict",
    "MemberResult",
    "Pooling",
    "g_test",
    "g_test_pooled",
    "holm",
    "noncentrality_for_power",
    "pool_cells",
    "power_of",
    "samples_for_tv",
]


@dataclass(frozen=True)
class Pooling:
    """Pre-registered cells, built from exact probabilities and the sample size only."""

    groups: tuple[tuple[int, ...], ...]  # outcome indices per pooled cell
    probs: tuple[Fraction, ...]  # exact probability of each pooled cell
    impossible: tuple[int, ...]  # outcomes with exact probability 0
    outcomes: int  # outcomes of the law pooled (possible and impossible)
    n: int  # the sample size the cells were pooled for


def _validate_law(exact_probs: Sequence[Fraction]) -> list[Fraction]:
    probs = [Fraction(p) for p in exact_probs]
    if not probs:
        raise ValueError("exact law is empty: expected at least one outcome")
    for index, prob in enumerate(probs):
        if prob < 0:
            raise ValueError(f"exact probability of outcome {index} is {prob}: expected >= 0")
    total = sum(probs, Fraction(0))
    if total != 1:
        raise ValueError(f"exact probabilities sum to {total}: expected exactly 1")
    return probs


def pool_cells(exact_probs: Sequence[Fraction], n: int, min_expected: float = 20.0) -> Pooling:
    """Pool outcomes so that every cell's exact expected count n * p is >= ``min_expected``.

    Rule: outcomes with p = 0 are listed as impossible and never pooled. The others are
    sorted by (p, index); walking from the smallest, outcomes join the current cell until
    n * p_cell >= min_expected (exact comparison), which closes it. A remainder below
    the threshold at the end joins the previously closed cell (if there is none, all
    possible outcomes form one cell). Indices inside a cell are listed ascending.
    """
    if n < 1:
        raise ValueError(f"sample size n = {n}: expected a positive integer")
    if not min_expected > 0 or not math.isfinite(min_expected):
        raise ValueError(f"min_expected = {min_expected}: expected a finite positive number")
    probs = _validate_law(exact_probs)
    threshold = Fraction(min_expected)
    impossible = tuple(index for index, prob in enumerate(probs) if prob == 0)
    order = sorted(
        (index for index, prob in enumerate(probs) if prob > 0), key=lambda i: (probs[i], i)
    )
    groups: list[list[int]] = []
    masses: list[Fraction] = []
    current: list[int] = []
    mass = Fraction(0)
    for index in order:
        current.append(index)
        mass += probs[index]
        if n * mass >= threshold:
            groups.append(current)
            masses.append(mass)
            current, mass = [], Fraction(0)
    if current:
        if groups:
            groups[-1].extend(current)
            masses[-1] += mass
        else:
            groups.append(current)
            masses.append(mass)
    return Pooling(
        groups=tuple(tuple(sorted(group)) for group in groups),
        probs=tuple(masses),
        impossible=impossible,
        outcomes=len(probs),
        n=n,
    )


@dataclass(frozen=True)
class MemberResult:
    """One member's G-test against its exact law."""

    name: str
    n: int
    statistic: float
    df: int
    p_value: float
    impossible_hits: int  # samples that fell on probability-0 outcomes
    failed_outright: bool  # impossible_hits > 0
    cells: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready dict (finite floats only)."""
        return dataclasses.asdict(self)


def g_test(
    name: str,
    observed: Sequence[int],
    exact_probs: Sequence[Fraction],
    min_expected: float = 20.0,
) -> MemberResult:
    """G-test of ``observed`` counts against the exact law ``exact_probs`` (same indexing).

    Cells come from ``pool_cells(exact_probs, n)`` with n = sum(observed). With n' the
    samples on possible outcomes (n' = n unless the member failed outright), the expected
    count of cell c is E_c = n' p_c and G = 2 sum_c O_c ln(O_c / E_c), so sum O = sum E and
    G >= 0. df = cells - 1; p = chi2.sf(G, df), and p = 1 when df = 0.
    """
    counts = _checked_counts(name, observed, len(exact_probs))
    return _g_test_cells(name, counts, pool_cells(exact_probs, sum(counts), min_expected))


def g_test_pooled(name: str, observed: Sequence[int], pooling: Pooling) -> MemberResult:
    """``g_test`` on cells pooled beforehand: the same result as ``g_test(name, observed,
    law, min_expected)`` when ``pooling = pool_cells(law, sum(observed), min_expected)``.

    For re-judging many members that share a law (``verify-receipts``): pooling an exact law
    costs O(outcomes) rational operations, the test itself only integer sums. ValueError when
    the counts do not fit the pooling (other outcome count, or a sample size it was not
    pooled for).
    """
    counts = _checked_counts(name, observed, pooling.outcomes)
    if sum(counts) != pooling.n:
        raise ValueError(
            f"member {name!r}: {sum(counts)} observations but the cells were pooled for "
            f"n = {pooling.n}: expected equal sample sizes"
        )
    return _g_test_cells(name, counts, pooling)


def _checked_counts(name: str, observed: Sequence[int], outcomes: int) -> list[int]:
    """``observed`` as ints; ValueError unless there is one count >= 0 per outcome, n >= 1."""
    if len(observed) != outcomes:
        raise ValueError(
            f"member {name!r}: {len(observed)} observed counts for {outcomes} outcomes:"
            " expected equal lengths"
        )
    counts = [int(c) for c in observed]
    for index, count in enumerate(counts):
        if count < 0:
            raise ValueError(f"member {name!r}: observed count {count} at outcome {index}")
    if sum(counts) < 1:
        raise ValueError(f"member {name!r}: no observations (n = 0): expected n >= 1")
    return counts


def _g_test_cells(name: str, counts: Sequence[int], pooling: Pooling) -> MemberResult:
    """The G-test of ``g_test``'s docstring on validated counts and their pooled cells."""
    n = sum(counts)
    impossible_hits = sum(counts[index] for index in pooling.impossible)
    possible = n - impossible_hits
    cells = len(pooling.groups)
    df = cells - 1
    if df == 0 or possible == 0:
        statistic, p_value = 0.0, 1.0
    else:
        cell_observed = np.array(
            [sum(counts[i] for i in group) for group in pooling.groups], dtype=np.float64
        )
        cell_expected = possible * np.array([float(p) for p in pooling.probs], dtype=np.float64)
        statistic = float(
            max(0.0, 2.0 * np.sum(xlogy(cell_observed, cell_observed / cell_expected)))
        )
        p_value = float(chi2.sf(statistic, df))
    return MemberResult(
        name=name,
        n=n,
        statistic=statistic,
        df=df,
        p_value=p_value,
        impossible_hits=impossible_hits,
        failed_outright=impossible_hits > 0,
        cells=cells,
    )


@dataclass(frozen=True)
class FamilyVerdict:
    """Holm's step-down verdict over a family of members."""

    alpha: float
    passed: bool
    rejected: tuple[str, ...]
    adjusted: dict[str, float]  # Holm-adjusted p-values

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready dict (keys sorted by the receipt writer)."""
        return {
            "alpha": self.alpha,
            "passed": self.passed,
            "rejected": list(self.rejected),
            "adjusted": dict(self.adjusted),
        }


def holm(members: Sequence[MemberResult], alpha: float) -> FamilyVerdict:
    """Holm step-down at family-wise ``alpha``.

    With p-values sorted ascending (ties by position), adj_(i) = max_{j<=i} min(1,
    (m - j + 1) p_(j)); a member is rejected iff adj <= alpha. A member that failed
    outright enters with p = 0 (an impossible outcome is proof, not chance), so it is
    always rejected.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"family alpha = {alpha}: expected 0 < alpha < 1")
    names = [member.name for member in members]
    if len(set(names)) != len(names):
        raise ValueError(f"member names {names} are not unique: expected distinct names")
    effective = [0.0 if member.failed_outright else member.p_value for member in members]
    order = sorted(range(len(members)), key=lambda i: (effective[i], i))
    m = len(members)
    adjusted: dict[str, float] = {}
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * effective[index]))
        adjusted[names[index]] = running
    rejected = tuple(
        names[i] for i in range(m) if adjusted[names[i]] <= alpha or members[i].failed_outright
    )
    ordered = {name: adjusted[name] for name in names}
    return FamilyVerdict(alpha=alpha, passed=not rejected, rejected=rejected, adjusted=ordered)


def _check_design(df: int, alpha: float, power: float | None = None) -> None:
    if df < 1:
        raise ValueError(f"df = {df}: expected at least 1 degree of freedom")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha = {alpha}: expected 0 < alpha < 1")
    if power is not None and not alpha < power < 1:
        raise ValueError(f"power = {power}: expected alpha ({alpha}) < power < 1")


def noncentrality_for_power(df: int, alpha: float, power: float) -> float:
    """lambda with P(ncx2(df, lambda) > chi2.isf(alpha, df)) = power (brentq root)."""
    _check_design(df, alpha, power)
    critical = float(chi2.isf(alpha, df))

    def excess(lam: float) -> float:
        return float(ncx2.sf(critical, df, lam)) - power

    upper = max(1.0, critical)
    while excess(upper) < 0:
        upper *= 2.0
        if upper > 1e12:
            raise ValueError(f"no non-centrality reaches power {power} at df={df}, alpha={alpha}")
    return float(brentq(excess, 0.0, upper, xtol=1e-10, rtol=1e-12))


def samples_for_tv(tv: float, df: int, alpha: float, power: float = 0.99) -> int:
    """Samples that detect a total-variation deviation ``tv`` with ``power``.

    n = ceil(lambda(df, alpha, power) / (4 tv^2)). The 4 tv^2 is a lower bound on the
    G non-centrality per sample for any deviation of TV ``tv`` on the pooled cells:
    Pinsker gives 2 KL(q||p) >= 4 tv^2, and Cauchy-Schwarz gives the Pearson form
    sum (q - p)^2 / p >= (sum |q - p|)^2 = 4 tv^2, tight when |q - p| is proportional to p.
    """
    if not 0 < tv <= 1:
        raise ValueError(f"tv = {tv}: expected 0 < tv <= 1")
    lam = noncentrality_for_power(df, alpha, power)
    return max(1, math.ceil(lam / (4.0 * tv * tv)))


def detectable_tv(n: int, df: int, alpha: float, power: float = 0.99) -> float:
    """The smallest TV that ``n`` samples detect with ``power``: the inverse of
    ``samples_for_tv``, sqrt(lambda(df, alpha, power) / (4 n))."""
    if n < 1:
        raise ValueError(f"n = {n}: expected at least one sample")
    return math.sqrt(noncentrality_for_power(df, alpha, power) / (4.0 * n))


def power_of(n: int, tv: float, df: int, alpha: float) -> float:
    """Lower bound on the power against any TV-``tv`` deviation: P(ncx2(df, 4 n tv^2) > crit)."""
    _check_design(df, alpha)
    if n < 0:
        raise ValueError(f"n = {n}: expected a non-negative sample size")
    if not 0 <= tv <= 1:
        raise ValueError(f"tv = {tv}: expected 0 <= tv <= 1")
    critical = float(chi2.isf(alpha, df))
    return float(ncx2.sf(critical, df, 4.0 * n * tv * tv))


def g_test_homogeneity(
    name: str, first: Sequence[int], second: Sequence[int], min_expected: float = 20.0
) -> MemberResult:
    """Two-sample G-test: were ``first`` and ``second`` drawn from one (unknown) law?

    Outcomes are pooled in index order from the *combined* counts (ancillary under the null,
    so the rule is fixed before either sample is compared): a cell closes once every arm
    expects at least ``min_expected`` in it (E_ac = n_a * combined_c / N); a short last cell
    joins the one before it. Then G = 2 sum_{a,c} O_ac ln(O_ac / E_ac), df = cells - 1,
    p = chi2.sf(G, df) (p = 1 when df = 0). Outcomes neither sample hit add nothing.
    ``impossible_hits`` is 0: there is no exact law to be impossible under.
    """
    a = [int(c) for c in first]
    b = [int(c) for c in second]
    if len(a) != len(b):
        raise ValueError(f"{name!r}: {len(a)} and {len(b)} outcomes: expected equal lengths")
    if min(a + b, default=0) < 0:
        raise ValueError(f"{name!r}: negative count in {a} / {b}")
    n_a, n_b = sum(a), sum(b)
    if n_a < 1 or n_b < 1:
        raise ValueError(f"{name!r}: an empty sample (n = {n_a}, {n_b}): expected both >= 1")
    total = n_a + n_b
    need = min_expected * total / min(n_a, n_b)  # combined count that gives E >= min_expected
    cells: list[tuple[int, int]] = []
    open_a = open_b = 0
    for x, y in zip(a, b, strict=True):
        open_a, open_b = open_a + x, open_b + y
        if open_a + open_b >= need:
            cells.append((open_a, open_b))
            open_a = open_b = 0
    if open_a + open_b:
        if cells:
            last_a, last_b = cells.pop()
            cells.append((last_a + open_a, last_b + open_b))
        else:
            cells.append((open_a, open_b))
    df = len(cells) - 1
    if df == 0:
        statistic, p_value = 0.0, 1.0
    else:
        observed = np.array(cells, dtype=np.float64)  # [cells, 2]
        combined = observed.sum(axis=1, keepdims=True)
        expected = combined * np.array([[n_a, n_b]], dtype=np.float64) / total
        statistic = float(max(0.0, 2.0 * np.sum(xlogy(observed, observed / expected))))
        p_value = float(chi2.sf(statistic, df))
    return MemberResult(
        name=name,
        n=total,
        statistic=statistic,
        df=df,
        p_value=p_value,
        impossible_hits=0,
        failed_outright=False,
        cells=len(cells),
    )
