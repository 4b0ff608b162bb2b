"""Integer draft laws: quantisation exactness and the exact draft sampler."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import power_divergence

from pp3kernels.contract import SelectorInputError
from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts

ALPHA = 1e-6


def _dense(ids: torch.Tensor, counts: torch.Tensor, vocab: int) -> torch.Tensor:
    flat_ids = ids.reshape(-1, ids.shape[-1]).long()
    flat_counts = counts.reshape(-1, counts.shape[-1]).long()
    out = torch.zeros((flat_ids.shape[0], vocab + 1), dtype=torch.int64)
    out.scatter_add_(1, torch.where(flat_ids >= 0, flat_ids, vocab), flat_counts)
    return out[:, :vocab].reshape(*ids.shape[:-1], vocab)


@pytest.mark.parametrize(
    ("vocab", "denominator"),
    [(1, 1), (1, 4), (2, 2), (2, 8), (5, 8), (17, 32), (64, 1024), (300, 2**24)],
)
def test_quantise_mass_exact_and_support_positive(vocab: int, denominator: int) -> None:
    generator = torch.Generator().manual_seed(vocab * 1000 + denominator)
    probs = torch.rand((6, 3, vocab), generator=generator, dtype=torch.float64)
    # sparsify: zero about half the tokens, keep at most `denominator` positive per row
    keep = torch.rand(probs.shape, generator=generator) < 0.5
    keep[..., 0] = True
    probs = torch.where(keep, probs, 0.0)
    rank = keep.long().cumsum(-1)
    probs = torch.where(rank <= denominator, probs, 0.0)
    ids, counts = quantise_q(probs.to(torch.float32), denominator)
    assert ids.dtype == torch.int32 and counts.dtype == torch.int32
    assert ids.shape[:-1] == probs.shape[:-1]
    assert torch.equal(counts.long().sum(-1), torch.full(probs.shape[:-1], denominator))
    dense = _dense(ids, counts, vocab)
    assert torch.equal(dense > 0, probs > 0)  # positive exactly on the positive tokens
    # ids sorted increasingly, padding (-1, 0) only at the end
    support = counts > 0
    assert torch.equal(ids < 0, ~support)
    real = torch.where(support, ids.long(), vocab + torch.arange(ids.shape[-1]))
    assert bool((real[..., 1:] > real[..., :-1]).all())
    # close to C p: within 1 + #support (reserve-one then largest remainder)
    target = denominator * probs / probs.sum(-1, keepdim=True)
    bound = 1 + (probs > 0).sum(-1, keepdim=True)
    assert bool(((dense - target).abs() <= bound).all())


def test_quantise_largest_remainder_rule() -> None:
    # R = C - 2 = 2, t = (1.5, 0.5): floors (1, 0), the tie of remainders goes to id 0.
    ids, counts = quantise_q(torch.tensor([0.75, 0.25]), 4)
    assert ids.tolist() == [0, 1] and counts.tolist() == [3, 1]
    # R = 14, t = (12.6, 1.4): floors (12, 1), the larger remainder 0.6 gets the extra unit.
    ids, counts = quantise_q(torch.tensor([0.0, 0.9, 0.0, 0.1]), 16)
    assert ids.tolist() == [1, 3] and counts.tolist() == [14, 2]
    # unnormalised input is normalised by its sum
    _, counts = quantise_q(torch.tensor([3.0, 1.0]), 4)
    assert counts.tolist() == [3, 1]


def test_quantise_max_support_pads_and_refuses() -> None:
    ids, counts = quantise_q(torch.tensor([[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]), 8, max_support=4)
    assert ids.tolist() == [[0, 2, -1, -1], [1, -1, -1, -1]]
    assert counts.tolist() == [[4, 4, 0, 0], [8, 0, 0, 0]]
    with pytest.raises(SelectorInputError, match="at most max_support = 1"):
        quantise_q(torch.tensor([[0.5, 0.5]]), 8, max_support=1)


def test_quantise_refusals_name_the_row() -> None:
    with pytest.raises(SelectorInputError, match=r"row \(1,\) has 3 tokens .* denominator 2"):
        quantise_q(torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]), 2)
    with pytest.raises(SelectorInputError, match=r"row \(0,\), token 1: probability nan"):
        quantise_q(torch.tensor([[0.5, float("nan")]]), 4)
    with pytest.raises(SelectorInputError, match=r"token 0: probability -0.5"):
        quantise_q(torch.tensor([-0.5, 1.5]), 4)
    with pytest.raises(SelectorInputError, match="total probability 0"):
        quantise_q(torch.zeros(3), 4)
    with pytest.raises(SelectorInputError, match="power of two"):
        quantise_q(torch.ones(3), 6)


def test_point_mass_q() -> None:
    ids, counts = point_mass_q(torch.tensor([[3, -1], [0, 7]], dtype=torch.int32), 16)
    assert ids.shape == (2, 2, 1)
    assert ids[..., 0].tolist() == [[3, -1], [0, 7]]
    assert counts[..., 0].tolist() == [[16, 0], [16, 16]]
    with pytest.raises(SelectorInputError, match="draft token -2"):
        point_mass_q(torch.tensor([[-2]]), 16)


def _requests(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    return seeds, positions


def test_sample_drafts_frequencies_match_q_exactly() -> None:
    denominator = 256
    counts_row = torch.tensor([1, 3, 0, 40, 100, 2, 60, 50], dtype=torch.int32)
    ids_row = torch.tensor([9, 2, -1, 5, 0, 7, 3, 1], dtype=torch.int32)  # any slot order
    assert int(counts_row.sum()) == denominator
    batch, drafts = 10_000, 2
    q_ids = ids_row.expand(batch, drafts, -1)
    q_counts = counts_row.expand(batch, drafts, -1)
    seeds, positions = _requests(batch, seed=5)
    tokens = sample_drafts(q_ids, q_counts, denominator, seeds, positions)
    assert tokens.dtype == torch.int32 and tokens.shape == (batch, drafts)
    support = ids_row[counts_row > 0].tolist()
    assert set(torch.unique(tokens).tolist()) <= set(support)  # every draft has q > 0
    for row in range(drafts):
        observed = torch.bincount(tokens[:, row].long(), minlength=10)[support].double()
        expected = counts_row[counts_row > 0].double() * batch / denominator
        _, p_value = power_divergence(observed.numpy(), expected.numpy(), lambda_="log-likelihood")
        assert p_value > ALPHA, (row, observed.tolist(), expected.tolist(), p_value)


def test_sample_drafts_detects_a_wrong_law() -> None:
    """The same G-test rejects drafts from a law off by 0.04 in total variation."""
    denominator = 64
    true_counts = torch.tensor([32, 32], dtype=torch.int32)
    claimed = torch.tensor([35, 29], dtype=torch.float64)  # TV 3/64 away
    batch = 10_000
    seeds, positions = _requests(batch, seed=6)
    tokens = sample_drafts(
        torch.tensor([0, 1], dtype=torch.int32).expand(batch, 1, -1),
        true_counts.expand(batch, 1, -1),
        denominator,
        seeds,
        positions,
    )
    observed = torch.bincount(tokens[:, 0].long(), minlength=2).double()
    _, p_value = power_divergence(
        observed.numpy(), (claimed * batch / denominator).numpy(), lambda_="log-likelihood"
    )
    assert p_value < ALPHA


def test_sample_drafts_is_a_function_of_seed_and_position() -> None:
    denominator = 1024
    generator = torch.Generator().manual_seed(11)
    probs = torch.rand((64, 3, 20), generator=generator)
    q_ids, q_counts = quantise_q(probs, denominator)
    seeds, positions = _requests(64, seed=12)
    tokens = sample_drafts(q_ids, q_counts, denominator, seeds, positions)
    permutation = torch.randperm(64, generator=generator)
    permuted = sample_drafts(
        q_ids[permutation],
        q_counts[permutation],
        denominator,
        seeds[permutation],
        positions[permutation],
    )
    assert torch.equal(permuted, tokens[permutation])
    alone = sample_drafts(q_ids[5:6], q_counts[5:6], denominator, seeds[5:6], positions[5:6])
    assert torch.equal(alone[0], tokens[5])
    # draft i of a request at position P equals draft 0 of the same request at P + i
    shifted = sample_drafts(q_ids[:, 2:3], q_counts[:, 2:3], denominator, seeds, positions + 2)
    assert torch.equal(shifted[:, 0], tokens[:, 2])
    dense = _dense(q_ids, q_counts, 20)
    assert bool((dense.gather(2, tokens.long()[..., None]) > 0).all())


def test_sample_drafts_invalidated_and_empty_rows() -> None:
    q_ids = torch.tensor([[[4, -1], [-1, -1], [1, 2]]], dtype=torch.int32)
    q_counts = torch.tensor([[[8, 0], [0, 0], [4, 4]]], dtype=torch.int32)
    seeds, positions = _requests(1, seed=13)
    tokens = sample_drafts(q_ids, q_counts, 8, seeds, positions)
    assert tokens[0, 0] == 4 and tokens[0, 1] == -1 and int(tokens[0, 2]) in (1, 2)
    invalidate = torch.tensor([[True, False, False]])
    tokens = sample_drafts(q_ids, q_counts, 8, seeds, positions, invalidate=invalidate)
    assert tokens[0, 0] == -1


def test_sample_drafts_refusals() -> None:
    seeds, positions = _requests(1, seed=14)
    ids = torch.tensor([[[0, 1]]], dtype=torch.int32)
    with pytest.raises(SelectorInputError, match=r"request 0, row 0: q mass 7; expected 8"):
        sample_drafts(ids, torch.tensor([[[4, 3]]], dtype=torch.int32), 8, seeds, positions)
    with pytest.raises(SelectorInputError, match=r"q count -1 at slot 1"):
        sample_drafts(ids, torch.tensor([[[9, -1]]], dtype=torch.int32), 8, seeds, positions)
    with pytest.raises(SelectorInputError, match=r"slot 1 has count 4 but id -1"):
        sample_drafts(
            torch.tensor([[[0, -1]]], dtype=torch.int32),
            torch.tensor([[[4, 4]]], dtype=torch.int32),
            8,
            seeds,
            positions,
        )
    with pytest.raises(SelectorInputError, match="power of two"):
        sample_drafts(ids, torch.tensor([[[4, 4]]], dtype=torch.int32), 12, seeds, positions)
