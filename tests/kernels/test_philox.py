"""Philox4x32-10 (torch and Triton) against Random123's known answers, and the contract's
counters and uniforms built on it."""

from __future__ import annotations

import pytest
import torch

from pp3kernels.contract import STREAM_ACCEPT, STREAM_DRAFT, STREAM_SAMPLE
from pp3kernels.philox import (
    KAT_VECTORS,
    MASK32,
    acceptance_uniform,
    acceptance_uniform_from_word,
    draft_integer,
    keys_from_seed,
    philox4x32,
    philox_words,
    row_counter,
    sample_uniform,
    sample_uniform_from_words,
    torch_philox_kat,
    triton_philox4x32,
    triton_philox_kat,
)
from pp3kernels.runtime import is_interpreter

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def _python_philox(counter: list[int], key: list[int]) -> list[int]:
    """Scalar Philox4x32-10 with Python integers: an independent check of the int64 trick."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * x0, M1 * x2
        x0, x1, x2, x3 = (
            (p1 >> 32) ^ x1 ^ k0,
            p1 & MASK32,
            (p0 >> 32) ^ x3 ^ k1,
            p0 & MASK32,
        )
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return [x0, x1, x2, x3]


def _interpreter_device() -> str:
    """CPU under TRITON_INTERPRET=1 (set by the Makefile/CI), else the GPU."""
    if is_interpreter():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.fail("set TRITON_INTERPRET=1 before Python starts to run Triton on CPU")


def test_torch_philox_matches_random123_kat() -> None:
    assert torch_philox_kat("cpu") == []
    for counter, key, expected in KAT_VECTORS:
        c0, c1, c2, c3, k0, k1 = (torch.tensor([v]) for v in (*counter, *key))
        words = philox4x32(c0, c1, c2, c3, k0, k1)
        assert [int(w) for w in words] == list(expected)


def test_torch_philox_matches_python_integers_on_random_words() -> None:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randint(0, 2**32, (200, 6), generator=generator, dtype=torch.int64)
    c0, c1, c2, c3, k0, k1 = inputs.unbind(1)
    got = torch.stack(philox4x32(c0, c1, c2, c3, k0, k1), dim=1).tolist()
    for row, out in zip(inputs.tolist(), got, strict=True):
        assert out == _python_philox(row[:4], row[4:])


def test_triton_philox_impl_matches_random123_kat() -> None:
    device = _interpreter_device()
    assert triton_philox_kat(device) == []


def test_triton_philox_matches_torch_on_random_words() -> None:
    device = _interpreter_device()
    generator = torch.Generator().manual_seed(99)
    inputs = torch.randint(0, 2**32, (64, 6), generator=generator, dtype=torch.int64)
    got = triton_philox4x32(inputs[:, :4].to(device), inputs[:, 4:].to(device)).cpu()
    c0, c1, c2, c3, k0, k1 = inputs.unbind(1)
    expected = torch.stack(philox4x32(c0, c1, c2, c3, k0, k1), dim=1)
    assert torch.equal(got, expected)


@pytest.mark.gpu
def test_philox_on_cuda_matches_kat() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert torch_philox_kat("cuda") == []
    assert triton_philox_kat("cuda") == []


def test_keys_from_seed_two_complement() -> None:
    seed = torch.tensor([0, 1, -1, 2**40 + 5, -(2**63)], dtype=torch.int64)
    k0, k1 = keys_from_seed(seed)
    assert k0.tolist() == [0, 1, MASK32, 5, 0]
    assert k1.tolist() == [0, 0, MASK32, 256, 0x80000000]


def test_row_counter_layout_and_wraparound() -> None:
    position = torch.tensor([0, 5, 2**32 - 1, 2**63 - 1], dtype=torch.int64)
    c0, c1, c2, c3 = row_counter(position, 1, STREAM_SAMPLE, index=7)
    assert c0.tolist() == [7, 7, 7, 7]
    assert c1.tolist() == [1, 6, 0, 0]
    assert c2.tolist() == [0, 0, 1, 0x80000000]  # 2^63 - 1 + 1 wraps to -2^63 = 2^63 unsigned
    assert c3.tolist() == [STREAM_SAMPLE] * 4


def test_acceptance_uniform_grid_extremes_exact() -> None:
    words = torch.tensor([0, 0xFF, 0x100, MASK32], dtype=torch.int64)
    u = acceptance_uniform_from_word(words)
    assert u.dtype == torch.float64
    assert u.tolist() == [2.0**-25, 2.0**-25, 3 * 2.0**-25, 1 - 2.0**-25]
    assert bool((u > 0).all()) and bool((u < 1).all())
    # fp32 cannot hold the top grid point (it would round to 1.0): the reason U is fp64.
    assert float(u[-1].to(torch.float32)) == 1.0


def test_sample_uniform_grid_extremes_exact() -> None:
    w0 = torch.tensor([0, MASK32, 0x3F, 0x40], dtype=torch.int64)
    w1 = torch.tensor([0, MASK32, 0x3F, 0x7F], dtype=torch.int64)
    u = sample_uniform_from_words(w0, w1)
    assert u.dtype == torch.float64
    assert u.tolist() == [2.0**-53, 1 - 2.0**-53, 2.0**-53, (2 * (2**26 + 1) + 1) * 2.0**-53]
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_uniforms_use_their_own_streams() -> None:
    seed = torch.tensor([7, -3, 2**40], dtype=torch.int64)
    rowpos = torch.tensor([0, 11, 2**35], dtype=torch.int64)
    w_accept = philox_words(seed, rowpos, STREAM_ACCEPT)
    w_sample = philox_words(seed, rowpos, STREAM_SAMPLE)
    w_draft = philox_words(seed, rowpos, STREAM_DRAFT)
    assert torch.equal(acceptance_uniform(seed, rowpos), acceptance_uniform_from_word(w_accept[0]))
    assert torch.equal(
        sample_uniform(seed, rowpos), sample_uniform_from_words(w_sample[0], w_sample[1])
    )
    assert torch.equal(draft_integer(seed, rowpos, 1024), w_draft[0] % 1024)
    # A direct Philox call on the documented counter gives the same words.
    k0, k1 = keys_from_seed(seed)
    manual = philox4x32(
        torch.zeros_like(rowpos), rowpos & MASK32, rowpos >> 32, torch.full_like(rowpos, 2), k0, k1
    )
    assert all(torch.equal(a, b) for a, b in zip(manual, w_sample, strict=True))


def test_streams_never_share_a_counter() -> None:
    positions = torch.arange(-40, 40, dtype=torch.int64) * 977
    rows = torch.arange(0, 9, dtype=torch.int64)
    rowpos = (positions[:, None] + rows[None, :]).flatten()
    counters = {}
    for stream in (STREAM_ACCEPT, STREAM_SAMPLE, STREAM_DRAFT):
        c = torch.stack(row_counter(rowpos, 0, stream), dim=1)
        counters[stream] = {tuple(v) for v in c.tolist()}
    assert counters[STREAM_ACCEPT].isdisjoint(counters[STREAM_SAMPLE])
    assert counters[STREAM_ACCEPT].isdisjoint(counters[STREAM_DRAFT])
    assert counters[STREAM_SAMPLE].isdisjoint(counters[STREAM_DRAFT])
    # and the words drawn for the same (seed, rowpos) differ between streams
    seed = torch.full_like(rowpos, 12345)
    w = {s: philox_words(seed, rowpos, s)[0] for s in (STREAM_ACCEPT, STREAM_SAMPLE)}
    assert int((w[STREAM_ACCEPT] == w[STREAM_SAMPLE]).sum()) == 0


def test_draft_integer_range_and_denominator_checks() -> None:
    seed = torch.arange(1000, dtype=torch.int64)
    r = draft_integer(seed, torch.zeros_like(seed), 8)
    assert int(r.min()) == 0 and int(r.max()) == 7
    assert torch.equal(draft_integer(seed, seed, 1), torch.zeros_like(seed))
    for bad in (0, 3, 2**25, True):
        with pytest.raises(ValueError, match="power of two"):
            draft_integer(seed, seed, bad)
