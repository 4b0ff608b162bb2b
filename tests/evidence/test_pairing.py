"""The paired run's bookkeeping (pp3cli.evidence.pairing): T0 mismatches between two
verifiers, and the histograms a homogeneity test compares, malformed rows included."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pp3cli.evidence.pairing import _same_t0, pair_t0, sampled_histograms
from pp3cli.evidence.targets import TARGETS
from pp3kernels import ChainResult, reference_verify_chain


def _result(tokens: list[list[int]], accepted: list[int], status: list[int]) -> ChainResult:
    return ChainResult(
        torch.tensor(tokens, dtype=torch.int32),
        torch.tensor(accepted, dtype=torch.int32),
        torch.tensor(status, dtype=torch.int8),
    )


def test_histograms_put_every_kind_of_malformed_row_last() -> None:
    """A non-OK status or an accepted length outside [0, K] is malformed in both histograms;
    a final token outside [0, V) only in the final-token one."""
    target = TARGETS[0]
    k, vocab = target.k, target.vocab
    pad = [-1] * (k - 1)
    rows = [
        ([2, 3, *pad], 1, 0),  # accepted 1, final token 3
        ([2, 3, *pad], 1, 1),  # status NAN
        ([2, 3, *pad], k + 1, 0),  # accepted past K
        ([2, 3, *pad], -1, 0),  # accepted below 0
        ([2, vocab, *pad], 1, 0),  # final token V
        ([2, -1, *pad], 1, 0),  # final token -1
        ([5, -1, *pad], 0, 0),  # accepted 0, final token 5
        ([1] * k + [4], k, 0),  # every draft accepted, bonus token 4
        ([0, -1, *pad], 0, 0),  # accepted 0, final token 0 (the lowest id)
    ]
    result = _result([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    got = sampled_histograms(target, result)
    accepted = np.zeros(k + 2, dtype=np.int64)
    accepted[[1, k + 1, 0, k]] = [3, 3, 2, 1]  # rows 0, 4, 5 | 1, 2, 3 | 6, 8 | 7
    final = np.zeros(vocab + 1, dtype=np.int64)
    final[[3, 5, 4, 0, vocab]] = [1, 1, 1, 1, 5]
    assert np.array_equal(got["accepted"], accepted), got["accepted"]
    assert np.array_equal(got["final"], final), got["final"]


def test_a_t0_mismatch_is_any_differing_output() -> None:
    """Rows 0, 2 and 4 of the slice compared; each differs in one output only."""
    first = _result([[1, 2]] * 6, [1] * 6, [0] * 6)
    second = _result([[1, 2], [9, 9], [1, 3], [1, 2], [1, 2], [1, 2]], [1, 1, 1, 1, 0, 1], [0] * 6)
    bad, details = _same_t0(first, second, slice(0, 6, 2))
    assert bad.tolist() == [False, True, True]
    assert [d["row"] for d in details] == [1, 2]
    status_only = _result([[1, 2]] * 6, [1] * 6, [0, 0, 0, 0, 1, 0])
    assert _same_t0(first, status_only, slice(0, 6, 2))[0].tolist() == [False, False, True]


def test_pair_t0_numbers_its_batches_and_requests() -> None:
    """Seven pairs in batches of three against a verifier that disagrees everywhere: seven
    mismatches, examples numbered by request (0..6) and batch (0, 0, 0, 1, 1, 1, 2)."""

    def disagrees(*args: Any, **kwargs: Any) -> ChainResult:
        out = reference_verify_chain(*args, **kwargs)
        return ChainResult(out.tokens, out.accepted, torch.ones_like(out.status))

    mismatches, examples = pair_t0(
        reference_verify_chain, disagrees, 7, device=torch.device("cpu"), seed=3, batch=3
    )
    assert mismatches == 7
    assert [e["request"] for e in examples] == list(range(7))
    assert [e["batch"] for e in examples] == [0, 0, 0, 1, 1, 1, 2]
    same, none = pair_t0(
        reference_verify_chain, reference_verify_chain, 7, device=torch.device("cpu"), seed=3,
        batch=3,
    )  # fmt: skip
    assert (same, none) == (0, ())
    many, capped = pair_t0(
        reference_verify_chain, disagrees, 12, device=torch.device("cpu"), seed=3, batch=12
    )
    assert many == 12 and [e["request"] for e in capped] == list(range(10))  # 10 by default
