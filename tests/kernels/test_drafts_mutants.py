"""Integer draft laws, exactly: what a mutation campaign over ``kernels/pp3kernels/drafts.py``
found unpinned by tests/kernels/test_drafts.py (its law tests are G-tests, which let a
slot boundary moved by one count of C through, and its refusals match message fragments).
Expected values come from the rules in the module docstring (``quantise_q``: one count per
positive token, then largest remainder on R * p with ties to the lowest id;
``sample_drafts``: the first slot whose running count exceeds r = draft_integer(...)),
restated with Fractions and plain Python loops."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from pp3kernels.contract import SelectorInputError
from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts
from pp3kernels.philox import draft_integer


def _largest_remainder(weights: list[int], denominator: int) -> list[int]:
    """The documented rule with exact fractions: n_v = 1 + floor(t_v) (+1 for the
    R - sum floor(t) largest fractional parts, ties to the lowest id), t_v = R w_v / W."""
    positive = [v for v, w in enumerate(weights) if w > 0]
    remaining = denominator - len(positive)
    total = sum(weights)
    target = {v: Fraction(remaining * weights[v], total) for v in positive}
    floors = {v: int(target[v]) for v in positive}
    leftover = remaining - sum(floors.values())
    order = sorted(positive, key=lambda v: (-(target[v] - floors[v]), v))
    extra = set(order[:leftover])
    return [1 + floors[v] + (v in extra) if v in floors else 0 for v in range(len(weights))]


def test_quantise_matches_the_rule_on_random_rows() -> None:
    """Integer weights over a power-of-two total (so R * p is exact in fp64, as in
    Fractions), with zeros and many equal remainders: every count is the rule's, and the
    slots list the support in increasing id order, then (-1, 0) padding up to the widest
    row."""
    generator = torch.Generator().manual_seed(31)
    rows, vocab = 200, 9
    weights = torch.randint(0, 5, (rows, vocab), generator=generator)
    weights[:, 0] = 0
    weights[:, -1] += 64 - weights.sum(-1)  # total 64 per row, last weight > 0 anyway
    assert bool((weights[:, -1] > 0).all())
    for denominator in (16, 32, 1024):
        ids, counts = quantise_q(weights.to(torch.float32), denominator)
        width = int((weights > 0).sum(-1).max())
        assert ids.shape == (rows, width)
        for b in range(rows):
            expected = _largest_remainder(weights[b].tolist(), denominator)
            support = [v for v in range(vocab) if expected[v] > 0]
            pad = width - len(support)
            assert ids[b].tolist() == support + [-1] * pad, (denominator, b)
            assert counts[b].tolist() == [expected[v] for v in support] + [0] * pad


def test_quantise_support_equal_to_the_denominator_and_to_max_support() -> None:
    """As many positive tokens as C (each gets exactly one count) and as max_support
    (no padding) are allowed: the bounds are inclusive."""
    ids, counts = quantise_q(torch.tensor([0.7, 0.0, 0.1, 0.2]), 4, max_support=3)
    assert ids.tolist() == [0, 2, 3] and counts.tolist() == [2, 1, 1]
    ids, counts = quantise_q(torch.tensor([0.9, 0.1]), 2, max_support=2)
    assert ids.tolist() == [0, 1] and counts.tolist() == [1, 1]


def test_quantise_refusals_exact_messages() -> None:
    """The rows are named by their index in the leading dimensions ((1, 2) of a [2, 3, V]
    input), or as "the row" for a 1-D input; max_support below 1 is refused by value."""
    probs = torch.ones((2, 3, 2))
    probs[1, 2] = 0.0
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(probs, 4)
    assert str(raised.value) == ("row (1, 2) has total probability 0; expected a positive mass")
    probs = torch.ones((2, 3, 2))
    probs[0, 1, 1] = float("inf")
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(probs, 4)
    assert str(raised.value) == (
        "row (0, 1), token 1: probability inf; expected finite values >= 0"
    )
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.zeros(3), 4)
    assert str(raised.value) == "the row has total probability 0; expected a positive mass"
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.ones(3), 2)
    assert str(raised.value) == (
        "the row has 3 tokens with positive probability but denominator 2; expected a "
        "power-of-two denominator >= 3 so every such token gets a positive count"
    )
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.ones(3), 4, max_support=0)
    assert str(raised.value) == "max_support 0 must be >= 1"
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.ones((2, 3)), 4, max_support=2)
    assert str(raised.value) == (
        "row (0,) has 3 tokens with positive probability; expected at most max_support = 2"
    )


def test_quantise_refuses_non_float_and_empty_inputs() -> None:
    """An integer tensor, a non-tensor and a V = 0 row are refused by name."""
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.ones(3, dtype=torch.int64), 4)
    assert str(raised.value) == (
        "probs must be a floating-point tensor [..., V]; got Tensor of dtype torch.int64"
    )
    with pytest.raises(SelectorInputError) as raised:
        quantise_q([0.5, 0.5], 4)  # type: ignore[arg-type]
    assert str(raised.value) == "probs must be a floating-point tensor [..., V]; got list"
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.ones((2, 0)), 4)
    assert str(raised.value) == "probs has shape (2, 0); expected [..., V] with V >= 1"


def test_sample_drafts_is_the_exact_integer_inverse_cdf() -> None:
    """x_i = the id of the first slot whose running count exceeds r = draft_integer(seed,
    position + i, C), slot by slot (slots in any id order, a zero slot inside): with C = 8
    every boundary r = 2, 3, 7 is hit many times, so a slot moved by one count shows."""
    denominator, batch, drafts = 8, 3000, 2
    ids_row = [5, 2, -1, 0]
    counts_row = [3, 1, 0, 4]
    generator = torch.Generator().manual_seed(32)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    tokens = sample_drafts(
        torch.tensor(ids_row, dtype=torch.int32).expand(batch, drafts, -1),
        torch.tensor(counts_row, dtype=torch.int32).expand(batch, drafts, -1),
        denominator,
        seeds,
        positions,
    )
    for i in range(drafts):
        r = draft_integer(seeds, positions + i, denominator).tolist()
        assert set(r) == set(range(denominator))
        expected = []
        for value in r:
            running = 0
            for slot, count in enumerate(counts_row):
                running += count
                if running > value:
                    expected.append(ids_row[slot])
                    break
        assert tokens[:, i].tolist() == expected


def test_sample_drafts_last_slot_and_one_slot_rows() -> None:
    """A point mass in the last of several slots, and S = 1: every draw is that id."""
    seeds = torch.arange(50, dtype=torch.int64)
    positions = torch.zeros(50, dtype=torch.int64)
    tokens = sample_drafts(
        torch.tensor([[[-1, -1, 6]]], dtype=torch.int32).expand(50, 1, 3),
        torch.tensor([[[0, 0, 4]]], dtype=torch.int32).expand(50, 1, 3),
        4,
        seeds,
        positions,
    )
    assert tokens.tolist() == [[6]] * 50
    ids, counts = point_mass_q(torch.full((50, 1), 3, dtype=torch.int32), 4)
    assert sample_drafts(ids, counts, 4, seeds, positions).tolist() == [[3]] * 50


def test_sample_drafts_refuses_malformed_tensors_by_name() -> None:
    """Wrong dtype or rank of q, mismatched shapes, S = 0, seed / position not [B] int64,
    and a bad invalidate mask: each refused with its own message."""
    ids = torch.tensor([[[0, 1]]], dtype=torch.int32)
    counts = torch.tensor([[[4, 4]]], dtype=torch.int32)
    seed = torch.zeros(1, dtype=torch.int64)

    def refused(*args: object, **kwargs: object) -> str:
        with pytest.raises(SelectorInputError) as raised:
            sample_drafts(*args, **kwargs)  # type: ignore[arg-type]
        return str(raised.value)

    assert refused(ids.long(), counts, 8, seed, seed) == ("q_ids must be an int32 tensor [B, K, S]")
    assert refused(ids, counts[0], 8, seed, seed) == "q_counts must be an int32 tensor [B, K, S]"
    assert refused(ids, counts[..., :1], 8, seed, seed) == (
        "q_ids (1, 1, 2) and q_counts (1, 1, 1); expected the same shape [B, K, S] with S >= 1"
    )
    empty = torch.zeros((1, 1, 0), dtype=torch.int32)
    assert refused(empty, empty, 8, seed, seed).startswith("q_ids (1, 1, 0) and q_counts")
    assert refused(ids, counts, 8, seed.int(), seed) == "seed must be an int64 tensor [B] = [1]"
    assert refused(ids, counts, 8, seed, torch.zeros(2, dtype=torch.int64)) == (
        "position must be an int64 tensor [B] = [1]"
    )
    assert refused(ids, counts, 8, seed, seed, invalidate=torch.zeros((1, 1))) == (
        "invalidate must be a bool tensor [B, K] = [1, 1]"
    )
    assert refused(ids, counts, 8, seed, seed, invalidate=torch.zeros(1, dtype=torch.bool)) == (
        "invalidate must be a bool tensor [B, K] = [1, 1]"
    )
    assert refused(ids, counts, 8, seed, seed, invalidate=[[False]]) == (
        "invalidate must be a bool tensor [B, K] = [1, 1]"
    )


def test_sample_drafts_value_refusals_exact() -> None:
    """Negative counts, a positive count on a negative id and a wrong mass name the request,
    row and slot (here request 1, row 1, of a [2, 2, 2] q)."""
    ids = torch.tensor([[[0, 1]] * 2] * 2, dtype=torch.int32)
    good = torch.tensor([[[4, 4]] * 2] * 2, dtype=torch.int32)
    seed = torch.zeros(2, dtype=torch.int64)

    def refused(q_ids: torch.Tensor, q_counts: torch.Tensor) -> str:
        with pytest.raises(SelectorInputError) as raised:
            sample_drafts(q_ids, q_counts, 8, seed, seed)
        return str(raised.value)

    counts = good.clone()
    counts[1, 1] = torch.tensor([9, -1])
    assert refused(ids, counts) == ("request 1, row 1: q count -1 at slot 1; expected counts >= 0")
    bad_ids = ids.clone()
    bad_ids[1, 1, 0] = -3
    assert refused(bad_ids, good) == (
        "request 1, row 1: slot 0 has count 4 but id -3; expected a token id >= 0"
    )
    counts = good.clone()
    counts[1, 1, 1] = 5
    assert refused(ids, counts) == ("request 1, row 1: q mass 9; expected 8 (or 0 for no proposal)")


def test_point_mass_refusals() -> None:
    """A float tensor is refused, and the first id below -1 is named with its index."""
    with pytest.raises(SelectorInputError) as raised:
        point_mass_q(torch.zeros((1, 1)), 4)
    assert str(raised.value) == "draft_tokens must be an integer tensor [..., K]"
    with pytest.raises(SelectorInputError) as raised:
        point_mass_q(torch.tensor([[0, 2], [-1, -5]], dtype=torch.int32), 4)
    assert str(raised.value) == "draft token -5 at index (1, 1); expected -1 or an id >= 0"


def test_quantise_width_is_the_widest_support_at_least_one() -> None:
    """Point masses give S = 1 (no padding slot), and no rows at all still give S = 1."""
    ids, counts = quantise_q(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 4)
    assert ids.tolist() == [[1], [0]] and counts.tolist() == [[4], [4]]
    ids, counts = quantise_q(torch.zeros((0, 3)), 4)
    assert ids.shape == (0, 1) and counts.shape == (0, 1)


def test_sample_drafts_zero_mass_rows_propose_nothing() -> None:
    """A row of total count 0 gives -1 whatever ids its slots hold, and with C = 1 a row of
    mass 1 proposes its one id."""
    seeds = torch.arange(20, dtype=torch.int64)
    positions = torch.zeros(20, dtype=torch.int64)
    tokens = sample_drafts(
        torch.tensor([[[3, 4], [2, -1]]], dtype=torch.int32).expand(20, 2, 2),
        torch.tensor([[[0, 0], [1, 0]]], dtype=torch.int32).expand(20, 2, 2),
        1,
        seeds,
        positions,
    )
    assert tokens.tolist() == [[-1, 2]] * 20


def test_sample_drafts_refuses_a_count_of_one_on_padding() -> None:
    """Any positive count, 1 included, on an id below 0 is refused."""
    seed = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(SelectorInputError) as raised:
        sample_drafts(
            torch.tensor([[[0, -1]]], dtype=torch.int32),
            torch.tensor([[[7, 1]]], dtype=torch.int32),
            8,
            seed,
            seed,
        )
    assert str(raised.value) == (
        "request 0, row 0: slot 1 has count 1 but id -1; expected a token id >= 0"
    )


@pytest.mark.parametrize("name", ["q_counts", "seed", "position", "invalidate"])
def test_sample_drafts_refuses_a_second_device_by_name(name: str) -> None:
    """Every input on q_ids' device: one tensor on another device (``meta`` here, so the
    check runs without a GPU) is refused with a message naming it and both devices,
    before any arithmetic mixes devices (the optional invalidate mask included)."""
    tensors: dict[str, torch.Tensor] = {
        "q_counts": torch.tensor([[[4, 4]]], dtype=torch.int32),
        "seed": torch.zeros(1, dtype=torch.int64),
        "position": torch.zeros(1, dtype=torch.int64),
        "invalidate": torch.zeros((1, 1), dtype=torch.bool),
    }
    tensors[name] = tensors[name].to("meta")
    ids = torch.tensor([[[0, 1]]], dtype=torch.int32)
    with pytest.raises(SelectorInputError) as raised:
        sample_drafts(
            ids,
            tensors["q_counts"],
            8,
            tensors["seed"],
            tensors["position"],
            invalidate=tensors["invalidate"],
        )
    assert str(raised.value) == f"{name} is on meta but q_ids is on cpu; expected one device"


def test_quantise_refuses_a_scalar_by_its_shape() -> None:
    """A 0-d tensor has no vocabulary axis: refused as a shape [..., V] error (not an
    IndexError from reading shape[-1] of an empty shape)."""
    with pytest.raises(SelectorInputError) as raised:
        quantise_q(torch.tensor(0.5), 4)
    assert str(raised.value) == "probs has shape (); expected [..., V] with V >= 1"


def test_quantise_ties_go_to_the_lowest_ids_on_a_wide_row() -> None:
    """Ties of the fractional part go to the lowest id however wide the row (a sort that is
    not stable keeps this for a dozen tokens but not for hundreds): 200 equal weights,
    every other id of 400 zero, over C = 256 give R = 56, t = 0.28 each, floors 0, so the
    56 extra counts go to the 56 lowest support ids."""
    probs = torch.zeros(400, dtype=torch.float64)
    probs[::2] = 1.0
    ids, counts = quantise_q(probs, 256)
    assert ids.tolist() == list(range(0, 400, 2))
    assert counts.tolist() == [2] * 56 + [1] * 144


def test_quantise_rows_whose_sum_overflows_fp64() -> None:
    """Finite probabilities >= 0 with a positive mass are valid input even when their fp64
    sum overflows to inf: p_v = probs_v / sum is scale-free, so (1e308, 1e308, 1e308) is
    (1/3, 1/3, 1/3) and gets the rule's counts over C = 8 (R = 5, t = 5/3 each: floors 1,
    the two extra counts to the lowest ids), and weights scaled by 2^1020 give the counts of
    the unscaled weights, row by row (not the internal 'produced mass' RuntimeError)."""
    ids, counts = quantise_q(torch.tensor([1e308] * 3, dtype=torch.float64), 8)
    assert ids.tolist() == [0, 1, 2] and counts.tolist() == [3, 3, 2]
    generator = torch.Generator().manual_seed(33)
    weights = torch.randint(0, 10, (40, 12), generator=generator).to(torch.float64)
    weights[:, 0] += 1.0
    scaled = weights * 2.0**1020
    assert bool(torch.isinf(scaled.sum(dim=-1)).all()) and bool(torch.isfinite(scaled).all())
    expected = quantise_q(weights, 256)
    got = quantise_q(scaled, 256)
    assert got[0].tolist() == expected[0].tolist() and got[1].tolist() == expected[1].tolist()
