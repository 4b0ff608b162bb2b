"""`qualify --plan --gpus N`: the per-GPU rate from the newest verified H200 strict receipt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pp3cli.receipts.rates import MeasuredRate, expected_wall_s, family_requests, newest_rate
from pp3cli.run.scratch import repo_root

RECEIPTS = repo_root() / "receipts"


def _predicate(name: str) -> Any:
    return orjson.loads((RECEIPTS / name).read_bytes())["predicate"]


@pytest.fixture(scope="module")
def rate() -> MeasuredRate:
    measured = newest_rate(RECEIPTS, repo_root())
    assert measured is not None
    return measured


def test_rate_comes_from_the_newest_single_gpu_h200_strict_pass(rate: MeasuredRate) -> None:
    chosen = _predicate(rate.receipt)
    assert "H200" in rate.gpu_name and rate.status in ("OK", "STALE")
    assert chosen["parameters"]["profile"] == "strict" and chosen["verdict"] == "PASS"
    data = chosen["data"]
    assert rate.requests == family_requests(chosen)
    # Strict: the verifier runs each target's stated requests (n, or a capped target's
    # cap); every control runs n on each target that is not capped.
    n = data["requests_per_target"]
    stated = {t["name"]: t["requests"] for t in data["targets"]}
    uncapped = [name for name, requests in stated.items() if requests == n]
    assert len(uncapped) < len(stated)
    assert rate.requests == sum(stated.values()) + len(data["controls"]) * len(uncapped) * n
    assert rate.requests_per_s == pytest.approx(rate.requests / data["elapsed_s"])
    for path in RECEIPTS.glob("qualification-*.json"):
        other = orjson.loads(path.read_bytes())["predicate"]
        if (
            "H200" in str(other["environment"].get("gpu_name"))
            and other["parameters"].get("profile") == "strict"
            and other["verdict"] == "PASS"
            and "distributed" not in other["data"]
        ):
            assert other["created_utc"] <= chosen["created_utc"], path.name


def test_no_receipt_no_rate(tmp_path: Path) -> None:
    assert newest_rate(tmp_path, repo_root()) is None


def test_plan_on_n_gpus_divides_the_one_gpu_time(rate: MeasuredRate) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pp3cli", "qualify", "--plan", "--profile", "exhaustive"]
        + ["--gpus", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["tv"] == 3e-4 and plan["gpus"] == 2
    assert plan["rate"]["receipt"] == rate.receipt
    n, n_controls = plan["requests_per_target"], plan["control_requests_per_target"]
    assert n > 10 * n_controls  # exhaustive's controls stay at strict's size (TV 1e-3)
    from pp3cli.evidence.targets import TARGETS
    from pp3cli.verifiers.registry import planted_defect_controls

    uncapped = [t for t in TARGETS if not t.capped]
    assert len(uncapped) < len(TARGETS)  # the capped targets count their caps only
    requests = sum(t.requests("exhaustive", n) for t in TARGETS)
    requests += len(planted_defect_controls()) * len(uncapped) * n_controls
    assert plan["family_requests"] == requests
    assert plan["expected_wall_s"] == pytest.approx(requests / (2 * rate.requests_per_s))
    assert expected_wall_s(rate, requests, 1) == pytest.approx(2 * plan["expected_wall_s"])
