"""Per-kind verdict recomputation: from a receipt's raw data to the verdict it implies.

``verify-receipts`` trusts no stored statistic: each recomputer rebuilds the verdict from
the raw counts, samples and exact inputs a receipt stores, with the same functions the
command used to decide it (so the rule has one implementation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pp3cli.evidence.family import recompute_qualification
from pp3cli.evidence.oracle import recompute_oracle
from pp3cli.timing.summary import recompute_probe

Recomputer = Callable[[Mapping[str, Any]], str]
"""Takes a receipt's predicate, returns the verdict its raw data imply (PASS or FAIL)."""


def _qualification(predicate: Mapping[str, Any]) -> str:
    verdict, _problems = recompute_qualification(predicate)
    return verdict


RECOMPUTERS: dict[str, Recomputer] = {
    "qualification": _qualification,
    "oracle": recompute_oracle,
    "probe": recompute_probe,
}
