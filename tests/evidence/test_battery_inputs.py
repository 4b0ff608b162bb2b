"""What a qualification battery feeds a verifier and how it counts what comes back
(pp3cli.evidence.qualify): the malformed-row rule, the calls of a target, the T0 batches."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pp3cli.evidence.profiles import CAPPED_REPEATS, PROFILES
from pp3cli.evidence.qualify import (
    GREEDY_VOCAB,
    _greedy_batch,
    as_target_form,
    count_members,
    target_calls,
    target_inputs,
)
from pp3cli.evidence.shares import RankShare
from pp3cli.evidence.targets import TARGETS, target_by_name
from pp3cli.run.ranks import RankGroup, RankPlace
from pp3kernels import ChainResult

SMOKE = PROFILES["smoke"]


@pytest.mark.parametrize(
    ("tokens", "accepted", "why"),
    [
        ([0, 1, 5, -1, -1], 2, "an emitted token equal to V"),
        ([0, -2, -1, -1, -1], 1, "an emitted token below -1"),
        ([0, -1, -1, -1, -1], 1, "an emitted slot left at -1"),
        ([0, 1, 4, 3, -1], 2, "a token after the emitted ones"),
        ([0, 1, 2, 3, 4, 2], 5, "an accepted length past K"),
    ],
)
def test_a_malformed_row_counts_only_on_the_malformed_outcomes(
    tokens: list[int], accepted: int, why: str
) -> None:
    """One well-formed row (accepted 1, tokens 0 then 3) beside the malformed one: the
    malformed row adds to the last outcome of every member and nowhere else."""
    target = target_by_name("point_mass_positions")
    k, vocab = target.k, target.vocab
    assert (k, vocab) == (4, 5)
    rows = [[0, 3, -1, -1, -1], tokens[: k + 1]]
    result = ChainResult(
        torch.tensor(rows), torch.tensor([1, accepted]), torch.zeros(2, dtype=torch.int8)
    )
    counts = count_members(target, result)
    for name, vector in counts.items():
        assert vector[-1] == 1, (why, name, vector)
        assert vector.sum() == 2, (why, name, vector)
    assert counts["point_mass_positions/slot0"][0] == 1
    assert counts["point_mass_positions/slot1"][3] == 1
    assert counts["point_mass_positions/slot2"][vocab] == 1  # not emitted by the good row
    assert counts["point_mass_positions/accepted"][1] == 1
    assert counts["point_mass_positions/joint"][1 * vocab + 3] == 1


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_a_target_runs_in_at_least_its_repeats_calls_in_request_order(name: str) -> None:
    """Uncapped targets at least the profile's repeats (so a verifier keyed by the batch
    index reuses its randomness that often), capped ones CAPPED_REPEATS; every request once,
    in order; progress after each call, up to the total."""
    target = target_by_name(name)
    seen: list[tuple[str, int, int]] = []
    calls = list(
        target_calls(
            target,
            3,
            2000,
            device=torch.device("cpu"),
            seed=1,
            profile=SMOKE,
            task="t",
            progress=lambda task, done, total: seen.append((task, done, total)),
        )
    )
    requests = target.requests(SMOKE.name, 2000)
    repeats = CAPPED_REPEATS if target.capped else SMOKE.repeats
    assert len(calls) == repeats, (name, len(calls))
    sizes = [len(inputs.logits) for inputs in calls]
    assert sum(sizes) == requests and max(sizes) - min(sizes) <= max(sizes) // 2
    done = np.cumsum(sizes).tolist()
    assert seen == [("t", d, requests) for d in done]
    positions = torch.cat([inputs.position for inputs in calls])
    assert torch.equal(positions, positions.sort().values)
    assert len(set(positions.tolist())) == requests


def test_greedy_batches_hold_ties_signed_zeros_masks_and_both_kinds_of_row() -> None:
    rng = np.random.default_rng(8)
    logits, drafts, tau = _greedy_batch(rng, 400, 5)
    assert logits.shape == (400, 6, GREEDY_VOCAB) and drafts.shape == (400, 5)
    zeros = logits == 0
    assert np.signbit(logits[zeros]).any() and (~np.signbit(logits[zeros])).any()
    assert np.isneginf(logits).any() and np.isfinite(logits).any(axis=-1).all()
    top = logits.max(axis=-1, keepdims=True)
    assert ((logits == top).sum(axis=-1) > 1).mean() > 0.2  # many rows tie at the max
    assert (tau[0::2] == 0).all() and set(tau[1::2].tolist()) == {0.5, 1.0, 2.0}
    greedy = logits.argmax(axis=-1)[:, :5]
    assert 0.6 < (drafts == greedy).mean() < 0.9
    assert (drafts == -1).any() and ((drafts >= -1) & (drafts < GREEDY_VOCAB)).all()


def test_target_inputs_place_requests_and_invalidate_odd_ones() -> None:
    """Request r of target t sits at position (t << 40) + 8 r; the target's invalid row is
    -1 on odd requests only."""
    target = target_by_name("invalidated_proposals")
    assert target.invalid_row is not None
    index = torch.arange(10, 30)
    inputs = target_inputs(target, index, seed=2, target_index=5)
    assert torch.equal(inputs.position, (5 << 40) + 8 * index)
    row = inputs.draft_tokens[:, target.invalid_row]
    assert (row[1::2] == -1).all() and (row[0::2] >= 0).all()
    assert (inputs.temperature == target.tau).all() and (inputs.seed == 2).all()


def test_dense_form_is_counts_over_c_with_padding_adding_nothing() -> None:
    target = next(t for t in TARGETS if t.q_form == "dense")
    sparse = target_inputs(target, torch.arange(4), seed=1, target_index=0)
    assert sparse.q_ids is not None and sparse.q_counts is not None
    padded = replace(
        sparse,
        q_ids=torch.cat([sparse.q_ids, torch.full_like(sparse.q_ids[..., :1], -1)], dim=-1),
        q_counts=torch.cat([sparse.q_counts, torch.zeros_like(sparse.q_counts[..., :1])], dim=-1),
    )
    dense = as_target_form(target, padded)
    assert dense.q_ids is None and dense.q_counts is None and dense.denominator is None
    assert dense.q_dense is not None
    want = torch.zeros(4, target.k, target.vocab)
    want.scatter_(-1, sparse.q_ids.long(), sparse.q_counts.float() / target.denominator)
    assert torch.equal(dense.q_dense, want)
    sparse_target = target_by_name("sparse_tails")
    same = target_inputs(sparse_target, torch.arange(4), seed=1, target_index=0)
    assert as_target_form(sparse_target, same) is same


def test_a_rank_runs_the_calls_the_documented_numbering_gives_it() -> None:
    """Call c of target t is work item t * calls + c, run by rank item % N (shares.py)."""
    target = target_by_name("sparse_tails")
    size = 2000 // SMOKE.repeats
    owned: dict[int, list[int]] = {}
    for rank in range(4):
        share = RankShare(RankGroup(RankPlace(rank, 4, rank, 4), "gloo", "cpu"))
        for inputs in target_calls(
            target, 2, 2000, device=torch.device("cpu"), seed=1, profile=SMOKE, share=share,
            task="t",
        ):  # fmt: skip
            first = int(inputs.position[0]) - (2 << 40)
            assert first % (8 * size) == 0 and len(inputs.position) == size
            owned.setdefault(rank, []).append(first // (8 * size))
    calls = SMOKE.repeats
    assert owned == {r: [c for c in range(calls) if (2 * calls + c) % 4 == r] for r in range(4)}
