"""Per-kind verdict recomputation: from a receipt's raw data to the verdict it implies.

``verify-receipts`` trusts no stored statistic: each recomputer rebuilds the verdict from
the raw counts, samples and exact inputs a receipt stores, with the same functions the
command used to decide it (so each rule has one implementation). The rules' modules are
imported when a receipt of their kind is checked, not before: scipy loads only for
statistics, and torch never.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Recomputer = Callable[[Mapping[str, Any]], str]
"""Takes a receipt's predicate, returns the verdict its raw data imply (PASS or FAIL)."""


def recompute_qualification(predicate: Mapping[str, Any]) -> str:
    """``pp3cli.evidence.family.recompute_qualification``'s verdict for a receipt: its
    parameters must name the negative controls it ran."""
    from pp3cli.evidence.family import recompute_qualification as recompute

    verdict, _problems = recompute(predicate, require_controls=True)
    return verdict


def recompute_oracle(predicate: Mapping[str, Any]) -> str:
    """``pp3cli.evidence.oracle.recompute_oracle``."""
    from pp3cli.evidence.oracle import recompute_oracle as recompute

    return recompute(predicate)


def recompute_probe(predicate: Mapping[str, Any]) -> str:
    """``pp3cli.timing.summary.recompute_probe``."""
    from pp3cli.timing.summary import recompute_probe as recompute

    return recompute(predicate)


RECOMPUTERS: dict[str, Recomputer] = {
    "qualification": recompute_qualification,
    "oracle": recompute_oracle,
    "probe": recompute_probe,
}
