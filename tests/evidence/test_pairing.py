"""The paired run's bookkeeping (pp3cli.evidence.pairing): T0 mismatches between two
verifiers, and the histograms a homogeneity test compares, malformed rows included."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pp3cli.evidence.pairing import _same_t0, pair_sampled, pair_t0, sampled_histograms
from pp3cli.evidence.profiles import PROFILES
from pp3cli.evidence.targets import TARGETS
from pp3kernels import ChainResult, reference_verify_chain

SMOKE = PROFILES["smoke"]


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

    many, capped = pair_t0(
        reference_verify_chain, disagrees, 16, device=torch.device("cpu"), seed=3, batch=4
    )  # the cap holds across batches too
    assert many == 16 and [e["request"] for e in capped] == list(range(10))
    assert [e["batch"] for e in capped] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    single, numbered = pair_t0(
        reference_verify_chain, disagrees, 3, device=torch.device("cpu"), seed=3, batch=1
    )
    assert single == 3 and [e["batch"] for e in numbered] == [0, 1, 2]


def test_pair_t0_compares_its_t0_rows_alone_in_calls_of_alternating_depth() -> None:
    """Each call holds T0 (even) and T1 (odd) rows, K = 4 then 5 then 4...; a second
    verifier that differs on T1 rows only is no mismatch, one that differs on T0 rows is;
    no two requests share a Philox position."""
    calls: list[dict[str, Any]] = []

    def changes(rows: slice) -> Any:
        def verifier(*args: Any, **kwargs: Any) -> ChainResult:
            out = reference_verify_chain(*args, **kwargs)
            drafts, tau, position = args[1], args[2], args[4]
            calls.append({"k": drafts.shape[1], "tau": tau.tolist(), "position": position})
            tokens = out.tokens.clone()
            tokens[rows, 0] = (tokens[rows, 0] + 1) % args[0].shape[-1]
            return ChainResult(tokens, out.accepted, out.status)

        return verifier

    cpu = torch.device("cpu")
    t1_only = pair_t0(reference_verify_chain, changes(slice(1, None, 2)), 5, device=cpu, seed=4,
                      batch=2)  # fmt: skip
    assert t1_only == (0, ())
    assert [call["k"] for call in calls] == [4, 5, 4]
    assert all(tau[0::2] == [0.0] * len(tau[0::2]) for tau in (c["tau"] for c in calls))
    assert all(t > 0 for c in calls for t in c["tau"][1::2])
    positions = torch.cat([c["position"] for c in calls])
    assert len(set(positions.tolist())) == positions.numel() == 2 * 5
    calls.clear()
    t0_changed = pair_t0(reference_verify_chain, changes(slice(0, None, 2)), 5, device=cpu,
                         seed=4, batch=2)  # fmt: skip
    assert t0_changed[0] == 5


def test_pair_sampled_compares_the_two_verifiers_laws() -> None:
    """The same law on both sides gives the same counts (one seed); a second verifier at
    twice the temperature has another law, and the tests compare the two sides."""

    def hotter(*args: Any, **kwargs: Any) -> ChainResult:
        logits, drafts, tau, *rest = args
        return reference_verify_chain(logits, drafts, 2 * tau, *rest, **kwargs)

    target = next(t for t in TARGETS if t.name == "sparse_tails")
    kwargs: dict[str, Any] = {"device": torch.device("cpu"), "seed": 6, "profile": SMOKE}
    same = pair_sampled(reference_verify_chain, reference_verify_chain, [target], 2000, **kwargs)
    assert [r.name for r in same] == ["pair/sparse_tails/accepted", "pair/sparse_tails/final"]
    assert all(r.first == r.second for r in same)
    differ = pair_sampled(reference_verify_chain, hotter, [target], 2000, **kwargs)
    assert all(r.first == s.first for r, s in zip(differ, same, strict=True))
    assert min(r.result.p_value for r in differ) < 1e-9, [r.result for r in differ]
