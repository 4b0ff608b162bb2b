"""Ranks of one distributed run creating the same fresh scratch root at once.

On 2026-12-06 CI's two-rank qualify test failed once: rank 1 found the root empty, then saw
rank 0's marker and run folder and called the root foreign ("not empty and has no
.pp3-owned marker"). Four processes racing on a fresh root reproduced it in 18 of 1000
rounds on a 2-core machine before the fix, and in 0 of 2000 after it. On 2026-12-07 it failed
once more (round 131, the machine loaded beside it): a narrower window the first fix left,
mended in ``_marker_being_written`` and pinned deterministically in test_scratch_mutants.py.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from pp3cli.run.scratch import ROOT_TAG, RUN_TAG, has_marker, new_run_dir
from pp3cli.run.settings import Settings

RANKS = 4
# At the pre-fix rate of ~1.8% a round, 400 rounds miss the race with probability ~0.07%.
ROUNDS = 400


def _rank(root: str, start: Barrier, outcomes: multiprocessing.Queue[str]) -> None:
    settings = Settings(scratch=Path(root), receipts=Path(root).parent / "receipts")
    start.wait()
    try:
        run = new_run_dir(settings, "qualify")
    except Exception as err:  # the outcome is the assertion's message
        outcomes.put(f"{type(err).__name__}: {err}")
    else:
        outcomes.put("ok" if has_marker(run, RUN_TAG) else f"unmarked run folder {run}")


def test_ranks_creating_one_fresh_root_at_once_all_adopt_it(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        root = tmp_path / f"scratch{round_}"
        start, outcomes = context.Barrier(RANKS), context.Queue()
        ranks = [
            context.Process(target=_rank, args=(str(root), start, outcomes)) for _ in range(RANKS)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(timeout=30)
        results = [outcomes.get(timeout=5) for _ in ranks]
        assert results == ["ok"] * RANKS, f"round {round_}: {results}"
        assert has_marker(root, ROOT_TAG)
        assert len(list((root / "runs").iterdir())) == RANKS, "one run folder per rank"
