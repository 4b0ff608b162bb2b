"""The pre-registered constants and profiles (pp3cli.evidence.profiles) are the ones the
documentation states: a receipt's evidence is read against docs/qualify.md's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pp3cli.evidence.profiles import (
    ALPHA,
    CAPPED_REPEATS,
    MIN_EXPECTED,
    MIN_REPEATS,
    ORACLE_REQUESTS_CPU,
    ORACLE_REQUESTS_GPU,
    POWER,
    PROFILES,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _table() -> dict[str, list[str]]:
    """docs/qualify.md's profile table: profile name -> its other cells."""
    rows = {}
    for line in (DOCS / "qualify.md").read_text().splitlines():
        match = re.fullmatch(r"\| `(\w+)` \|(.*)\|", line)
        if match:
            rows[match[1]] = [cell.strip() for cell in match[2].split("|")]
    return rows


def test_the_pre_registered_constants() -> None:
    """DESIGN.md's statistics contract: family-wise alpha 1e-5 (Holm), power 0.99, cells
    pooled to expect at least 20, at least 16 verifier calls per target."""
    assert (ALPHA, POWER, MIN_EXPECTED, MIN_REPEATS) == (1e-5, 0.99, 20.0, 16)
    assert 1 <= CAPPED_REPEATS <= MIN_REPEATS


def test_the_documented_table_lists_every_profile() -> None:
    assert set(_table()) == set(PROFILES)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_profile_is_as_documented(name: str) -> None:
    profile = PROFILES[name]
    requests, calls, pairs, _default_on = _table()[name]
    if profile.requests is not None:
        assert profile.tv is None and requests == f"{profile.requests:,}"
    else:
        sized = re.match(r"sized for TV ([0-9.e-]+) ", requests)
        assert sized is not None and profile.tv == float(sized[1]), requests
    if profile.control_tv is not None:
        controls = re.search(r"controls at strict's size \(TV ([0-9.e-]+)\)", requests)
        assert controls is not None and profile.control_tv == float(controls[1]), requests
        assert profile.control_tv == PROFILES["strict"].tv
    else:
        assert "controls" not in requests
    assert calls.startswith(f">= {profile.repeats}")
    if "<= 4M requests each" in calls:
        assert profile.batch == 1 << 22
    assert pairs == f"{profile.n_greedy:,}"


def test_the_oracles_default_sizes_are_as_documented() -> None:
    method = " ".join((DOCS / "method.md").read_text().split())
    gpu, cpu = ORACLE_REQUESTS_GPU // 1000, ORACLE_REQUESTS_CPU // 1000
    assert (gpu * 1000, cpu * 1000) == (ORACLE_REQUESTS_GPU, ORACLE_REQUESTS_CPU)
    assert f"(default {gpu}K on a GPU, {cpu}K on CPU)" in method
