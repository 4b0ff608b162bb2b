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

import functools
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
    Pooling,
    detectable_tv,
    g_test_homogeneity,
    g_test_pooled,
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
    """A member's raw counts, exact law, the cells its G-test pooled and its result."""

    law: MemberLaw
    observed: tuple[int, ...]
    pooling: Pooling
    result: MemberResult

    def to_json(self) -> dict[str, Any]:
        """Receipt form: counts, exact probabilities as "num/den", pooled groups, stats."""
        pooling = self.pooling
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
        # Pooled once, for the test and the receipt (g_test_pooled refuses n < 1 itself).
        pooling = pool_cells(law.probs, max(1, sum(observed)), MIN_EXPECTED)
        result = g_test_pooled(law.name, observed, pooling)
        records.append(MemberRecord(law, observed, pooling, result))
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
    whatever the other members do. n starts from the unpooled df (possible cells - 1);
    pooling at that n can only merge cells, so its df and ``samples_for_tv`` at it are no
    larger and n already suffices (the loop, which would grow n, then stops at once). n is
    thus sufficient, not always the least n with n >= samples_for_tv(df pooled at n):
    the same at TV 1e-3 and 3e-4 (alpha 1e-5), 9% above it at TV 2e-2, where pooling
    merges many cells.
    """
    laws = [law for target in targets for law in member_laws(target, 2)]
    member_alpha = alpha / len(laws)
    rows = []
    for law in laws:
        possible = sum(1 for p in law.probs if p > 0)
        n = samples_for_tv(tv, max(1, possible - 1), member_alpha, power)
        for _ in range(20):
            df = max(1, len(pool_cells(law.probs, n, MIN_EXPECTED).groups) - 1)
            needed = samples_for_tv(tv, df, member_alpha, power)
            if needed <= n:
                break
            n = needed
        rows.append(PlanRow(law.name, len(law.probs), df, n))
    return rows


def requests_for(
    profile: Profile, alpha: float, tv: float | None = None, targets: Sequence[ToyTarget] = TARGETS
) -> int:
    """Requests per target: the profile's fixed count, or sized from a TV by ``plan_samples``.

    A TV sizes the family from its uncapped targets' members (each at alpha / m, m the
    whole family); a capped target (``ToyTarget.requests_cap``) runs fewer requests and
    states its own detectable TV (``target_power``).
    """
    wanted = tv if tv is not None else profile.tv
    if wanted is None:
        if profile.requests is None:
            raise ValueError(f"profile {profile.name!r} has neither requests nor tv")
        return profile.requests
    capped = {target.name for target in targets if target.capped}
    return max(
        row.n_needed
        for row in plan_samples(wanted, alpha, targets=targets)
        if row.member.split("/")[0] not in capped
    )


def target_power(
    records: Sequence[MemberRecord], alpha: float, extra_members: int = 0
) -> list[dict[str, Any]]:
    """Per target: its requests and the TV its members detect with power ``POWER``.

    Each member is sized at alpha / m (m = the family's size, Holm's strictest step, with
    ``extra_members`` pairing tests in it) on its pooled df; a target's detectable TV is its
    weakest member's. The receipt states these, and ``recompute_qualification`` recomputes
    them.
    """
    member_alpha = alpha / max(1, len(records) + extra_members)
    found: dict[str, dict[str, Any]] = {}
    for record in records:
        result = record.result
        tv = detectable_tv(max(1, result.n), max(1, result.df), member_alpha, POWER)
        entry = found.setdefault(
            record.law.target, {"name": record.law.target, "requests": result.n, "tv": 0.0}
        )
        entry["tv"] = max(float(entry["tv"]), tv)
    return list(found.values())


def control_requests_for(
    profile: Profile, alpha: float, tv: float | None = None, targets: Sequence[ToyTarget] = TARGETS
) -> int:
    """Requests per target of each control: the verifier's, or fewer with a ``control_tv``."""
    n = requests_for(profile, alpha, tv, targets)
    if profile.control_tv is None:
        return n
    return min(n, requests_for(profile, alpha, profile.control_tv, targets))


# ---------------------------------------------------------------------------- recompute


@functools.lru_cache(maxsize=256)
def _stored_law(exact: tuple[str, ...]) -> tuple[Fraction, ...]:
    """A receipt's ``"num/den"`` law as Fractions; a few dozen distinct laws recur in
    thousands of members across receipts, so each is parsed once per process."""
    return tuple(fraction_from_text(p) for p in exact)


@functools.lru_cache(maxsize=1024)
def _stored_pooling(exact: tuple[str, ...], n: int) -> Pooling:
    """``pool_cells`` of a stored law for n samples, once per (law, n) per process."""
    return pool_cells(_stored_law(exact), n, MIN_EXPECTED)


def _recompute_members(
    stored: Sequence[Mapping[str, Any]], alpha: float, extra: Sequence[MemberResult] = ()
) -> tuple[FamilyVerdict, list[str]]:
    """Recompute each member's G-test from raw counts and exact probabilities; list problems.

    ``extra`` members (the pairing's homogeneity tests) join the Holm family."""
    problems: list[str] = []
    results: list[MemberResult] = []
    for entry in stored:
        name = str(entry["name"])
        observed = [int(c) for c in entry["observed"]]
        exact = tuple(entry["exact"])
        if len(observed) != len(exact):
            problems.append(f"{name}: {len(observed)} counts for {len(exact)} outcomes")
            continue
        try:
            pooling = _stored_pooling(exact, max(1, sum(observed)))
            result = g_test_pooled(name, observed, pooling)
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
        if entry.get("pooled", {}).get("groups") != [list(g) for g in pooling.groups]:
            problems.append(f"{name}: stored pooled groups differ from the pre-registered rule")
    return holm([*results, *extra], alpha), problems


def _recompute_pairing(stored: Mapping[str, Any] | None) -> tuple[list[MemberResult], list[str]]:
    """``--pair-with``'s homogeneity tests recomputed from their raw counts (no torch)."""
    results: list[MemberResult] = []
    problems: list[str] = []
    for entry in (stored or {}).get("tests", []):
        name = str(entry["name"])
        try:
            result = g_test_homogeneity(name, entry["first"], entry["second"], MIN_EXPECTED)
        except ValueError as err:
            problems.append(f"{name}: {err}")
            continue
        results.append(result)
        claimed = entry["result"]
        for key in ("statistic", "p_value"):
            if not math.isclose(
                float(claimed[key]), getattr(result, key), rel_tol=1e-9, abs_tol=1e-300
            ):
                problems.append(f"{name}: stored {key} {claimed[key]} != {getattr(result, key)}")
        for key in ("n", "df", "cells"):
            if claimed[key] != getattr(result, key):
                problems.append(f"{name}: stored {key} {claimed[key]} != {getattr(result, key)}")
    return results, problems


def _recompute_target_power(
    stored: Sequence[Mapping[str, Any]],
    claimed: Sequence[Mapping[str, Any]],
    alpha: float,
    extra_members: int = 0,
) -> list[str]:
    """Problems where the receipt's per-target requests or detectable TV differ from the
    members' counts (``target_power``); the Holm family also holds ``extra_members`` (the
    pairing tests)."""
    member_alpha = alpha / max(1, len(stored) + extra_members)
    found: dict[str, tuple[int, float]] = {}
    for entry in stored:
        result = entry["result"]
        n, df = int(result["n"]), int(result["df"])
        tv = detectable_tv(max(1, n), max(1, df), member_alpha, POWER)
        _, worst = found.get(str(entry["target"]), (n, 0.0))
        found[str(entry["target"])] = (n, max(worst, tv))
    problems = []
    if sorted(str(c["name"]) for c in claimed) != sorted(found):
        problems.append(f"targets {sorted(found)} but the power statement names others")
    for entry in claimed:
        name = str(entry["name"])
        if name not in found:
            continue
        n, tv = found[name]
        if int(entry["requests"]) != n or not math.isclose(float(entry["tv"]), tv, rel_tol=1e-9):
            problems.append(
                f"target {name}: stated {entry['requests']} requests detecting TV "
                f"{entry['tv']}, recomputed {n} and {tv}"
            )
    return problems


def recompute_qualification(
    predicate: Mapping[str, Any], *, require_controls: bool = False
) -> tuple[str, list[str]]:
    """Recompute every statistic and the verdict of a qualification receipt's predicate.

    Returns (recomputed verdict, problems). The verdict is FAIL when the rule above says so,
    or when any stored statistic, pooled cell, flag or verdict differs from what the raw
    counts give. Where the parameters list the negative controls (``controls``), the data's
    controls must be exactly those, in order, and at least one; with ``require_controls`` (a
    receipt, whose verdict needs caught defects) parameters that list none are a problem too.
    A library caller's report may list none.
    """
    data = predicate["data"]
    alpha = float(predicate["parameters"]["alpha"])
    pairing = data.get("pairing")
    paired, problems = _recompute_pairing(pairing)
    family, member_problems = _recompute_members(data["members"], alpha, paired)
    problems += member_problems
    if "targets" in data:  # the per-target power statement (absent from older receipts)
        problems.extend(
            _recompute_target_power(data["members"], data["targets"], alpha, len(paired))
        )
    if family.passed != bool(data["family"]["passed"]):
        problems.append(
            f"family: stored passed={data['family']['passed']}, recomputed {family.passed}"
        )
    named = [str(control["defect"]) for control in data["controls"]]
    listed = predicate["parameters"].get("controls")
    if listed is None and require_controls:
        problems.append("the parameters name no negative controls")
    if listed is not None:  # a receipt names the controls it ran; a library caller may not
        if not listed:
            problems.append("no negative control: a receipt's verdict needs caught defects")
        if named != [str(defect) for defect in listed]:
            problems.append(f"controls {named} but the parameters list {list(listed)}")
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
    edge_decides = bool(data.get("edge_decides", True))
    verdict = qualification_verdict(
        family.passed,
        int(data["greedy"]["mismatches"]) + (int(pairing["t0_mismatches"]) if pairing else 0),
        (bool(e["passed"]) or not edge_decides for e in data["edge"]),
        caught,
    )
    if problems:
        return FAIL, problems
    if str(predicate.get("verdict")) != verdict:
        problems.append(f"stored verdict {predicate.get('verdict')} != recomputed {verdict}")
    return verdict, problems
