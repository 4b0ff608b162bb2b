"""Distributed qualify on CPUs (gloo, 2 processes, the selector in Triton's interpreter).

- The seed profile on 2 ranks through ``pp3 qualify --gpus 2`` (torchrun's launcher): PASS,
  one receipt with per-rank devices, CPUs and counts, OK in verify-receipts.
- N-invariance (smoke profile, to keep CI short): the non-distributed run and 2 ranks give
  identical counts, statistics, p-values, greedy and edge results, controls and verdict.
- Per-rank counts that do not add up to the judged counts make the receipt FAIL.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

from pp3cli.evidence.family import recompute_qualification
from pp3cli.evidence.profiles import ALPHA, PROFILES
from pp3cli.evidence.qualify import run_qualification
from pp3cli.evidence.shares import VERIFIER, check_rank_counts
from pp3cli.receipts.verify import OK, verify_receipts
from pp3cli.run.scratch import repo_root
from pp3cli.verifiers.registry import planted_defect_controls, resolve_verifier
from pp3kernels.runtime import is_interpreter

COMPARED = ("members", "family", "greedy", "edge", "controls", "verdict", "requests_per_target")


def _qualify_on_ranks(
    tmp_path: Path, ranks: int, *options: str, gpu: bool = False
) -> tuple[Path, dict[str, Any]]:
    receipts = tmp_path / "receipts"
    receipts.mkdir()
    cpu = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    env = os.environ if gpu else os.environ | cpu
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pp3cli", "--scratch", str(tmp_path / "scratch")),
            *("--receipts", str(receipts), "qualify", "--gpus", str(ranks), "--threads", "1"),
            *options,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (receipt,) = receipts.glob("qualification-*.json")
    return receipts, orjson.loads(receipt.read_bytes())["predicate"]


@pytest.fixture(scope="module")
def seed_on_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _qualify_on_ranks(tmp_path_factory.mktemp("seed2"), 2, "--profile", "seed")


def test_seed_profile_on_two_gloo_ranks_passes_with_one_receipt(
    seed_on_two_ranks: tuple[Path, dict[str, Any]],
) -> None:
    receipts, predicate = seed_on_two_ranks
    data = predicate["data"]
    assert predicate["verdict"] == "PASS" and predicate["parameters"]["world_size"] == 2
    block = data["distributed"]
    assert block["world_size"] == 2 and block["backend"] == "gloo"
    assert [r["rank"] for r in block["ranks"]] == [0, 1]
    assert [r["device"] for r in block["ranks"]] == ["cpu", "cpu"]
    assert [r["holds_lock"] for r in block["ranks"]] == [True, False]
    # rank 0 wrote the receipt (its guard's environment), the other ranks none
    assert predicate["environment"]["pid"] == block["ranks"][0]["pid"] != block["ranks"][1]["pid"]
    assert predicate["environment"]["affinity"] == block["ranks"][0]["affinity"]
    assert all(0 < r["wall_s"] < 600 for r in block["ranks"])  # seconds since the rank began
    affinities = [set(r["affinity"]) for r in block["ranks"]]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not affinities[0] & affinities[1], affinities
    # both ranks did half the calls of every battery: 16 calls per target, 8 each
    n = data["requests_per_target"]
    assert set(block["counts"]) == {VERIFIER, *planted_defect_controls()}
    for battery, per_member in block["counts"].items():
        accepted = per_member["sparse_tails/accepted"]
        assert [sum(counts) for counts in accepted] == [n // 2, n // 2], battery
    assert check_rank_counts(data) == []
    results = {r.file: r for r in verify_receipts(receipts, root=repo_root())}
    assert all(r.status == OK for r in results.values()), [r.line() for r in results.values()]


def test_one_process_and_two_ranks_give_identical_results(tmp_path: Path) -> None:
    smoke = PROFILES["smoke"]
    alone = run_qualification(
        smoke,
        verifier=resolve_verifier("selector"),
        device="cpu",
        alpha=ALPHA,
        seed=5,
        controls=planted_defect_controls(),
    ).to_json()
    _, predicate = _qualify_on_ranks(tmp_path, 2, "--profile", "smoke", "--seed", "5")
    for key in COMPARED:
        assert predicate["data"][key] == alone[key], key
    assert predicate["verdict"] == alone["verdict"] == "PASS"


def test_rank_counts_that_do_not_add_up_fail(
    seed_on_two_ranks: tuple[Path, dict[str, Any]],
) -> None:
    _, predicate = seed_on_two_ranks
    assert recompute_qualification(predicate) == ("PASS", [])
    counts = predicate["data"]["distributed"]["counts"]
    name = [m["name"] for m in predicate["data"]["members"] if m["name"] in counts["accept_ge"]][-1]
    moved = copy.deepcopy(predicate)
    moved["data"]["distributed"]["counts"]["accept_ge"][name][1][0] += 1
    verdict, problems = recompute_qualification(moved)
    assert verdict == "FAIL"
    assert any(f"accept_ge {name}" in p and "add up" in p for p in problems), problems
    lost = copy.deepcopy(predicate)
    lost["data"]["distributed"]["ranks"].pop()
    assert any("rank records [0]" in p for p in check_rank_counts(lost["data"]))
    missing = copy.deepcopy(predicate)
    del missing["data"]["distributed"]["counts"]["reused_coin"]
    assert recompute_qualification(missing)[0] == "FAIL"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2 or is_interpreter(),
    reason="needs 2 CUDA GPUs and compiled Triton",
)
def test_one_and_two_gpus_give_identical_results(tmp_path: Path) -> None:
    """On the 2-GPU machine: NCCL ranks, the seed profile, 1 vs 2 GPUs identical."""
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    one = _qualify_on_ranks(one_dir, 1, "--profile", "seed", gpu=True)[1]
    two = _qualify_on_ranks(two_dir, 2, "--profile", "seed", gpu=True)[1]
    assert two["data"]["distributed"]["backend"] == "nccl"
    assert [r["device"] for r in two["data"]["distributed"]["ranks"]] == ["cuda:0", "cuda:1"]
    for key in COMPARED:
        assert one["data"][key] == two["data"][key], key
    assert one["verdict"] == two["verdict"] == "PASS"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--gpus", "0"], "--gpus 0: expected at least 1"),
        (["--gpus", "2", "--via-proxy"], "--via-proxy with several ranks"),
    ],
)
def test_bad_distributed_options_are_usage_errors(options: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pp3cli", "qualify", *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_controls_sized_by_control_tv_alone_and_on_a_rank(tmp_path: Path) -> None:
    """A profile with a control_tv (exhaustive) runs its controls at that smaller size, the
    same in the single-process and the distributed code path (one gloo rank, in-process)."""
    import torch.distributed as dist

    from pp3cli.evidence.family import control_requests_for, requests_for
    from pp3cli.evidence.profiles import Profile
    from pp3cli.evidence.shares import RankShare
    from pp3cli.run.ranks import RankGroup, RankPlace
    from pp3kernels.reference import reference_verify_chain

    exhaustive, strict = PROFILES["exhaustive"], PROFILES["strict"]
    assert control_requests_for(exhaustive, ALPHA) == requests_for(strict, ALPHA)
    assert requests_for(exhaustive, ALPHA) > 10 * requests_for(strict, ALPHA)
    small = Profile(
        "small", requests=2000, tv=None, batch=1024, n_greedy=200, repeats=4, control_tv=0.2
    )
    n_controls = control_requests_for(small, ALPHA)
    assert 0 < n_controls < 2000

    def qualify(share: RankShare | None) -> dict[str, Any]:
        return run_qualification(
            small,
            verifier=reference_verify_chain,
            device="cpu",
            alpha=ALPHA,
            seed=2,
            controls=planted_defect_controls(),
            share=share,
        ).to_json()

    alone = qualify(None)
    assert alone["control_requests_per_target"] == n_controls
    assert all(m["result"]["n"] == 2000 for m in alone["members"])
    for control in alone["controls"]:
        assert all(m["result"]["n"] == n_controls for m in control["members"])
        assert control["failed_as_required"], control["defect"]
    assert alone["verdict"] == "PASS"
    predicate = {"data": alone, "parameters": {"alpha": ALPHA}, "verdict": alone["verdict"]}
    assert recompute_qualification(predicate) == ("PASS", [])
    # torch's stubs leave HashStore out of torch.distributed's exported names; it is there.
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        share = RankShare(RankGroup(RankPlace(0, 1, 0, 1), "gloo", "cpu"))
        on_rank = qualify(share)
    finally:
        dist.destroy_process_group()
    assert on_rank == alone
