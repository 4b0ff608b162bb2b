"""A hand mutant of receipts/recompute.py (the oracle's recomputer swapped for the probe's)
passed tests/receipts/test_verify_receipts.py: each kind's entry is pinned here on a
committed receipt of that kind."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pp3cli.receipts.recompute import RECOMPUTERS
from pp3cli.run.scratch import repo_root


def _smallest(kind: str) -> dict[str, Any]:
    """The predicate of the smallest committed receipt of ``kind`` (fast to recompute)."""
    folder = repo_root() / "receipts"
    path = min(folder.glob(f"{kind}-*.json"), key=lambda p: p.stat().st_size)
    predicate: dict[str, Any] = orjson.loads(path.read_bytes())["predicate"]
    return predicate


@pytest.mark.parametrize("kind", ["qualification", "oracle", "probe"])
def test_each_kind_is_recomputed_by_its_own_rule(kind: str) -> None:
    """A committed receipt's own recomputer gives back its stored verdict; another kind's
    recomputer cannot read it (it raises, which verify-receipts reports as FAIL) or does
    not agree."""
    predicate = _smallest(kind)
    assert RECOMPUTERS[kind](predicate) == predicate["verdict"]
    for other, recompute in RECOMPUTERS.items():
        if other == kind:
            continue
        try:
            verdict = recompute(predicate)
        except Exception:  # noqa: BLE001 - any failure to read it is the point
            continue
        assert verdict != predicate["verdict"], (kind, other)
