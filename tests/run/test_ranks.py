"""Ranks of a distributed run: place, CPU split, call ownership, launcher, and a rank's death."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from pp3cli.evidence.shares import RankShare
from pp3cli.run.errors import EXIT_RANK_FAILED, RankFailed, UsageProblem
from pp3cli.run.ranks import (
    EXCHANGE_TIMEOUT_S,
    RankGroup,
    RankPlace,
    _exchange,
    launch,
    process_group,
    split_cpus,
    strip_option,
    torchrun_arguments,
)
from pp3cli.run.scratch import MARKER_NAME, ROOT_TAG, ensure_scratch, repo_root
from pp3cli.run.settings import Settings

HERE = Path(__file__).resolve().parent
DYING = HERE / "dying_rank.py"
DEATH_TO_EXIT_S = 10.0  # a rank's death must end the whole run within this many seconds


@pytest.mark.parametrize(("cpus", "ranks"), [(16, 2), (16, 3), (5, 2), (2, 2), (1, 2), (3, 8)])
def test_split_cpus_gives_each_local_rank_its_own_block(cpus: int, ranks: int) -> None:
    available = list(range(100, 100 + cpus))
    blocks = [split_cpus(available, rank, ranks) for rank in range(ranks)]
    assert all(blocks), blocks
    if cpus >= ranks:  # disjoint, contiguous, covering, sizes within one
        assert sorted(cpu for block in blocks for cpu in block) == available
        assert all(block == list(range(block[0], block[-1] + 1)) for block in blocks)
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    else:  # fewer CPUs than ranks: one CPU each, shared round-robin
        assert [block[0] for block in blocks] == [available[r % cpus] for r in range(ranks)]


def test_place_comes_from_torchruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert RankPlace.from_environment() is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    place = RankPlace.from_environment()
    assert place == RankPlace(1, 2, 1, 2)
    assert place.device(cuda=True) == "cuda:1" and place.device(cuda=False) == "cpu"
    assert not place.takes_lock() and RankPlace(0, 2, 0, 2).takes_lock()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UsageProblem, match="rank < world size"):
        RankPlace.from_environment()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(UsageProblem, match="RANK='one'"):
        RankPlace.from_environment()


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_calls_are_split_disjointly_and_completely(world: int) -> None:
    targets, calls = 5, 16
    owners: dict[tuple[int, int], list[int]] = {}
    for rank in range(world):
        share = RankShare(RankGroup(RankPlace(rank, world, rank, world), "gloo", "cpu"))
        for target in range(targets):
            for call in range(calls):
                if share.owns_call(target, call, calls):
                    owners.setdefault((target, call), []).append(rank)
    assert len(owners) == targets * calls
    assert all(len(ranks) == 1 for ranks in owners.values())
    per_rank = [sum(ranks == [r] for ranks in owners.values()) for r in range(world)]
    assert max(per_rank) - min(per_rank) <= 1, per_rank
    # the documented numbering: call c of target t is item t * calls + c, owned by item % N
    assert all(owners[t, c] == [(t * calls + c) % world] for t, c in owners)


def test_launcher_command_line_is_torchruns() -> None:
    assert torchrun_arguments(2, ["qualify", "--seed", "3"], "pp3cli") == [
        "--nproc-per-node",
        "2",
        "-m",
        "pp3cli",
        "qualify",
        "--seed",
        "3",
    ]
    argv = ["--receipts", "r", "qualify", "--gpus", "2", "--seed", "3", "--gpus=4"]
    assert strip_option(argv, "--gpus") == ["--receipts", "r", "qualify", "--seed", "3"]
    with pytest.raises(UsageProblem, match="--gpus 0"):
        launch(0, ["qualify"])


def _smoke_arguments(tmp_path: Path) -> list[str]:
    return [
        "--scratch",
        str(tmp_path / "scratch"),
        "--receipts",
        str(tmp_path / "receipts"),
        "qualify",
        "--profile",
        "smoke",
        "--verifier",
        "reference",
        "--threads",
        "1",
    ]


def _no_receipt(tmp_path: Path) -> None:
    receipts = tmp_path / "receipts"
    left = sorted(p.name for p in receipts.iterdir()) if receipts.exists() else []
    assert left == [], left


def test_a_dying_rank_under_torchrun_stops_the_run_without_a_receipt(tmp_path: Path) -> None:
    (tmp_path / "receipts").mkdir()
    death = tmp_path / "death"
    env = os.environ | {"PP3_TEST_DYING_RANK": "1", "PP3_TEST_DEATH_FILE": str(death)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*command, str(DYING), *_smoke_arguments(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    ended = time.time()
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "exitcode  : 17" in proc.stderr or "exitcode: 17" in proc.stderr, proc.stderr[-3000:]
    assert ended - float(death.read_text()) < DEATH_TO_EXIT_S
    _no_receipt(tmp_path)


def test_pp3_gpus_launcher_reports_a_dead_rank_as_exit_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 dies: rank 1, waiting at the exchange, is stopped too; RankFailed, exit 5."""
    (tmp_path / "receipts").mkdir()
    death = tmp_path / "death"
    monkeypatch.setenv("PP3_TEST_DYING_RANK", "0")
    monkeypatch.setenv("PP3_TEST_DEATH_FILE", str(death))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    with pytest.raises(RankFailed, match="rank 0 exit 17") as caught:
        launch(2, _smoke_arguments(tmp_path), module="dying_rank")
    assert time.time() - float(death.read_text()) < DEATH_TO_EXIT_S
    assert caught.value.exit_code == EXIT_RANK_FAILED == 5
    assert "no receipt" in str(caught.value)
    _no_receipt(tmp_path)


def test_a_scratch_root_another_rank_is_marking_is_waited_for(tmp_path: Path) -> None:
    """Ranks of one run create the same new scratch root at once (a race seen in CI): one
    has created the marker (O_EXCL) and not yet written it; the other waits, not refuses."""
    root = tmp_path / "scratch"
    root.mkdir()
    marker = root / MARKER_NAME
    marker.write_bytes(b"")
    payload = orjson.dumps({"tag": ROOT_TAG, "pid": 1})
    writer = threading.Timer(0.3, marker.write_bytes, args=(payload,))
    writer.start()
    try:
        assert ensure_scratch(Settings(scratch=root, receipts=tmp_path)) == root.resolve()
    finally:
        writer.join()


def test_place_refuses_local_ranks_outside_the_local_world_and_takes_the_smallest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    place = RankPlace.from_environment()
    assert place == RankPlace(0, 1, 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        place.rank = 1  # type: ignore[misc]
    monkeypatch.setenv("LOCAL_RANK", "1")  # local rank == local world size
    with pytest.raises(UsageProblem, match="local alike"):
        RankPlace.from_environment()


@pytest.mark.parametrize(
    ("error", "shown"), [("", "no message"), ("first line\nsecond line", "first line)")]
)
def test_a_failed_exchange_names_the_errors_first_line_and_the_documented_timeout(
    error: str, shown: str
) -> None:
    group = RankGroup(RankPlace(1, 2, 1, 2), "gloo", "cpu")
    with pytest.raises(RankFailed) as caught, _exchange(group, "gather counts"):
        raise RuntimeError(error)
    message = str(caught.value)
    assert message.startswith("rank 1/2: gather counts failed (RuntimeError: " + shown)
    assert "second line" not in message
    within = f"within {EXCHANGE_TIMEOUT_S:g} s"
    assert within in message
    docs = repo_root() / "docs"
    assert within in (docs / "exit-codes.md").read_text()  # what users are told
    assert f"timeout ({EXCHANGE_TIMEOUT_S:g} s" in (docs / "qualify.md").read_text()


def test_a_gpu_rank_past_torchs_gpus_is_refused_before_any_device_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    chosen: list[int] = []

    def set_device(index: int) -> None:
        chosen.append(index)
        raise RuntimeError("stop here: the check passed")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    with pytest.raises(UsageProblem, match="local rank 1 has no GPU: torch sees 1"):
        with process_group(RankPlace(1, 2, 1, 2), cuda=True):
            pass
    assert chosen == []
    with pytest.raises(RuntimeError, match="stop here"):
        with process_group(RankPlace(0, 2, 0, 2), cuda=True):
            pass
    assert chosen == [0]


def test_a_one_rank_gloo_group_gathers_objects_and_counts_and_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np
    import torch.distributed as dist

    with socket.socket() as probe:  # a free local port for the group's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with process_group(RankPlace(0, 1, 0, 1), cuda=False) as group:
        assert (group.backend, group.device, group.rank, group.world_size) == ("gloo", "cpu", 0, 1)
        assert group.gather_objects({"calls": 3}) == [{"calls": 3}]
        counts = group.gather_counts(np.array([4, 0, 7], dtype=np.int32))
        assert counts.dtype == np.int64 and counts.tolist() == [[4, 0, 7]]
        assert group.owns(0) and group.owns(5)
    assert not dist.is_initialized()


def test_one_rank_is_launched_as_torchrun_with_one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.run as torchrun

    seen: list[tuple[int, str, list[str]]] = []

    def run(parsed: argparse.Namespace) -> None:
        seen.append(
            (int(parsed.nproc_per_node), parsed.training_script, parsed.training_script_args)
        )

    monkeypatch.setattr(torchrun, "run", run)
    launch(1, ["qualify", "--seed", "3"])
    assert seen == [(1, "pp3cli", ["qualify", "--seed", "3"])]
