"""Verdicts: the two words a receipt may carry, and the qualification rule that picks one.

Light (no torch, no scipy) and pure: the commands decide with these functions and
``pp3 verify-receipts`` recomputes with the same ones.

Qualification rule: PASS iff the verifier's battery caught nothing (its family, under Holm
at alpha, rejects no member; its greedy pairing has no mismatch; every edge check passes)
and every negative control was caught (the same battery, run on a verifier with one
planted defect, found something). A receipt whose controls passed is not evidence.
"""

from __future__ import annotations

from collections.abc import Iterable

PASS = "PASS"
FAIL = "FAIL"
VERDICTS = (PASS, FAIL)


def verdict_text(ok: bool) -> str:
    """PASS or FAIL."""
    return PASS if ok else FAIL


def battery_caught(family_passed: bool, greedy_mismatches: int, edges: Iterable[bool]) -> bool:
    """True when a battery found a defect: a rejected member, a greedy mismatch, a failed edge."""
    return not family_passed or greedy_mismatches > 0 or not all(edges)


def qualification_verdict(
    family_passed: bool, greedy_mismatches: int, edges: Iterable[bool], controls: Iterable[bool]
) -> str:
    """PASS iff the verifier's battery caught nothing and every control was caught."""
    clean = not battery_caught(family_passed, greedy_mismatches, edges)
    return verdict_text(clean and all(controls))
