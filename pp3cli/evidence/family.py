"""The qualification family: its members' exact laws, their tests, the plan and the verdict.

Pure (no torch): ``pp3 qualify`` builds its report with these functions, and
``pp3 verify-receipts`` recomputes a receipt's verdict with the same ones.

Members per target (``pp3cli.evidence.targets``), all exact (``Fraction``): the emitted
token at every output slot j (V tokens + "absent"), the accepted length (0..K), and the
joint (accepted length, final token); laws from ``pp3cli.evidence.exact.marginal_laws``.
With an ``invalid_row`` the requests are a fixed mixture: ceil(n/2) valid, floor(n/2)
invalidated (odd request indices), and each member's law is the weighted mixture. Every
member has one more outcome, "malformed" (status not OK, token out of range, bad
padding), of exact probability 0, so a single malformed row fails it outright.

The verdict rule itself is ``pp3cli.evidence.verdict.qualification_verdict``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pp3cli.evidence.exact import fraction_from_text, fraction_text, marginal_laws
from pp3cli.evidence.profiles import MIN_EXPECTED, POWER, Profile
from pp3cli.evidence.shares import check_rank_counts
from pp3cli.evidence.stats import (
    FamilyVerdict,
    MemberResult,
    g_test,
    holm,
    pool_cells,
    samples_for_tv,
)
from pp3cli.evidence.targets import TARGETS, ToyTarget
from pp3cli.evidence.verdict import FAIL, battery_caught, qualification_verdict


@dataclass(frozen=True)
class MemberLaw:
    """One family member: its name, target, kind and exact outcome probabilities."""

    name: str
    target: str
    kind: str  # "slot", "accepted" or "joint"
    probs: tuple[Fraction, ...]  # last outcome: "malformed", probability 0


def member_laws(target: ToyTarget, n: int) -> list[MemberLaw]:
    """Exact laws of the target's members for n requests (odd indices invalidated)."""
    if n < 1:
        raise ValueError(f"n = {n}: expected at least one request")
    valid = marginal_laws(target.steps(invalid=False))
    if target.invalid_row is None:
        mixed = valid
    else:
        odd = Fraction(n // 2, n)
        invalid = marginal_laws(target.steps(invalid=True))
        mixed = {
            key: [(1 - odd) * a + odd * b for a, b in zip(valid[key], invalid[key], strict=True)]
            for key in valid
        }
    return [
        MemberLaw(
            f"{target.name}/{key}",
            target.name,
            "slot" if key.startswith("slot") else key,
            (*probs, Fraction(0)),
        )
        for key, probs in mixed.items()
    ]


@dataclass(frozen=True)
class MemberRecord:
    """A member's raw counts, exact law, pooled cells and G-test result."""

    law: MemberLaw
    observed: tuple[int, ...]
    result: MemberResult

    def to_json(self) -> dict[str, Any]:
        """Receipt form: counts, exact probabilities as "num/den", pooled groups, stats."""
        pooling = pool_cells(self.law.probs, max(1, self.result.n), MIN_EXPECTED)
        return {
            "name": self.law.name,
            "target": self.law.target,
            "kind": self.law.kind,
            "observed": list(self.observed),
            "exact": [fraction_text(p) for p in self.law.probs],
            "pooled": {
                "groups": [list(g) for g in pooling.groups],
                "impossible": list(pooling.impossible),
            },
            "result": self.result.to_json(),
        }


def judge_members(
    laws: Sequence[MemberLaw], counts: Mapping[str, Iterable[int]], alpha: float
) -> tuple[list[MemberRecord], FamilyVerdict]:
    """G-test every member's counts against its exact law; Holm over the family at alpha."""
    records = []
    for law in laws:
        observed = tuple(int(c) for c in counts[law.name])
        result = g_test(law.name, observed, law.probs, MIN_EXPECTED)
        records.append(MemberRecord(law, observed, result))
    return records, holm([record.result for record in records], alpha)


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanRow:
    """Samples one member needs to detect a TV deviation with the stated power."""

    member: str
    outcomes: int
    df: int
    n_needed: int


def plan_samples(
    tv: float, alpha: float, power: float = POWER, targets: Sequence[ToyTarget] = TARGETS
) -> list[PlanRow]:
    """Per member: n with P(reject | TV = tv on the pooled cells) >= power.

    Sized at alpha / m (m = family size, Holm's strictest step), so the guarantee holds
    whatever the other members do. df depends on pooling, which depends on n: iterate
    n -> pool at n -> df -> samples_for_tv until n stops growing.
    """
    laws = [law for target in targets for law in member_laws(target, 2)]
    member_alpha = alpha / len(laws)
    rows = []
    for law in laws:
        possible = sum(1 for p in law.probs if p > 0)
        n = samples_for_tv(tv, max(1, possible - 1), member_alpha, power)
        df = possible - 1
        for _ in range(20):
            df = max(1, len(pool_cells(law.probs, n, MIN_EXPECTED).groups) - 1)
            needed = samples_for_tv(tv, df, member_alpha, power)
            if needed <= n:
                break
            n = needed
        rows.append(PlanRow(law.name, len(law.probs), df, n))
    return rows


def requests_for(profile: Profile, alpha: float, tv: float | None = None) -> int:
    """Requests per target: the profile's fixed count, or sized from a TV by ``plan_samples``."""
    wanted = tv if tv is not None else profile.tv
    if wanted is None:
        if profile.requests is None:
            raise ValueError(f"profile {profile.name!r} has neither requests nor tv")
        return profile.requests
    return max(row.n_needed for row in plan_samples(wanted, alpha))


def control_requests_for(profile: Profile, alpha: float, tv: float | None = None) -> int:
    """Requests per target of each control: the verifier's, or fewer with a ``control_tv``."""
    n = requests_for(profile, alpha, tv)
    if profile.control_tv is None:
        return n
    return min(n, max(row.n_needed for row in plan_samples(profile.control_tv, alpha)))


# ---------------------------------------------------------------------------- recompute


def _recompute_members(
    stored: Sequence[Mapping[str, Any]], alpha: float
) -> tuple[FamilyVerdict, list[str]]:
    """Recompute each member's G-test from raw counts and exact probabilities; list problems."""
    problems: list[str] = []
    results: list[MemberResult] = []
    for entry in stored:
        name = str(entry["name"])
        observed = [int(c) for c in entry["observed"]]
        probs = [fraction_from_text(p) for p in entry["exact"]]
        if len(observed) != len(probs):
            problems.append(f"{name}: {len(observed)} counts for {len(probs)} outcomes")
            continue
        try:
            result = g_test(name, observed, probs, MIN_EXPECTED)
        except ValueError as err:
            problems.append(f"{name}: {err}")
            continue
        results.append(result)
        claimed = entry["result"]
        if int(claimed["n"]) != result.n:
            problems.append(f"{name}: counts sum to {result.n}, receipt says n={claimed['n']}")
        for key in ("statistic", "p_value"):
            if not math.isclose(
                float(claimed[key]), getattr(result, key), rel_tol=1e-9, abs_tol=1e-300
            ):
                problems.append(
                    f"{name}: stored {key} {claimed[key]} != recomputed {getattr(result, key)}"
                )
        for key in ("df", "impossible_hits", "failed_outright", "cells"):
            if claimed[key] != getattr(result, key):
                problems.append(
                    f"{name}: stored {key} {claimed[key]} != recomputed {getattr(result, key)}"
                )
        pooling = pool_cells(probs, max(1, result.n), MIN_EXPECTED)
        if entry.get("pooled", {}).get("groups") != [list(g) for g in pooling.groups]:
            problems.append(f"{name}: stored pooled groups differ from the pre-registered rule")
    return holm(results, alpha), problems


def recompute_qualification(predicate: Mapping[str, Any]) -> tuple[str, list[str]]:
    """Recompute every statistic and the verdict of a qualification receipt's predicate.

    Returns (recomputed verdict, problems). The verdict is FAIL when the rule above says so,
    or when any stored statistic, pooled cell, flag or verdict differs from what the raw
    counts give.
    """
    data = predicate["data"]
    alpha = float(predicate["parameters"]["alpha"])
    family, problems = _recompute_members(data["members"], alpha)
    if family.passed != bool(data["family"]["passed"]):
        problems.append(
            f"family: stored passed={data['family']['passed']}, recomputed {family.passed}"
        )
    caught = []
    for control in data["controls"]:
        c_family, c_problems = _recompute_members(control["members"], alpha)
        problems.extend(f"control {control['defect']}: {p}" for p in c_problems)
        was_caught = battery_caught(
            c_family.passed,
            int(control["greedy"]["mismatches"]),
            (bool(e["passed"]) for e in control["edge"]),
        )
        if was_caught != bool(control["failed_as_required"]):
            problems.append(f"control {control['defect']}: stored failed flag is wrong")
        caught.append(was_caught)
    problems.extend(check_rank_counts(data))  # distributed runs: per-rank counts add up
    verdict = qualification_verdict(
        family.passed,
        int(data["greedy"]["mismatches"]),
        (bool(e["passed"]) for e in data["edge"]),
        caught,
    )
    if problems:
        return FAIL, problems
    if str(predicate.get("verdict")) != verdict:
        problems.append(f"stored verdict {predicate.get('verdict')} != recomputed {verdict}")
    return verdict, problems
