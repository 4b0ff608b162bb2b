"""Philox4x32-10 in plain torch, and the contract's counters and uniforms built on it.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
Random123 constants). One round maps counter (x0, x1, x2, x3) under key (k0, k1) to

    hi0:lo0 = M0 * x0,  hi1:lo1 = M1 * x2              (32 x 32 -> 64-bit products)
    (x0, x1, x2, x3) <- (hi1 ^ x1 ^ k0,  lo1,  hi0 ^ x3 ^ k1,  lo0)

and the key is bumped (k0 += W0, k1 += W1, mod 2^32) between rounds; ten rounds.
M0 = 0xD2511F53, M1 = 0xCD9E8D57, W0 = 0x9E3779B9, W1 = 0xBB67AE85.

Here every word is an int64 tensor holding a uint32 value (0 <= w < 2^32), so that the
same code runs on CPU and CUDA tensors. A 32 x 32-bit product does not fit in int64, so
``M * x`` is formed from the 16-bit halves of x: with a = M * (x & 0xFFFF) < 2^48 and
b = M * (x >> 16) < 2^48, M * x = b * 2^16 + a, t = a + ((b & 0xFFFF) << 16) < 2^49,
lo = t mod 2^32 and hi = (b >> 16) + (t >> 32); every intermediate is below 2^63.

Counters, keys and uniforms follow ``pp3kernels.contract`` exactly (see its docstring):
key = (seed mod 2^32, (seed >> 32) mod 2^32), counter = (index, rowpos mod 2^32,
rowpos >> 32, stream), rowpos = position + i (uint64, two's complement).

``triton_philox_kat`` runs Triton's own ``philox_impl`` on the same words (through
``pp3kernels.jit.philox_kat_kernel``), so that the known-answer check covers the generator
the kernels use (interpreter or GPU). The in-kernel counters and uniforms are
``pp3kernels.jit.philox``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from pp3kernels.contract import STREAM_ACCEPT, STREAM_DRAFT, STREAM_SAMPLE, check_denominator
from pp3kernels.jit import philox_kat_kernel

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF

# Random123 ``kat_vectors`` lines "philox4x32 10 ...": (counter[4], key[2], output[4]).
KAT_VECTORS: tuple[
    tuple[tuple[int, int, int, int], tuple[int, int], tuple[int, int, int, int]], ...
] = (
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (MASK32, MASK32, MASK32, MASK32),
        (MASK32, MASK32),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
)

_ACCEPT_SCALE = 2.0**-24
_SAMPLE_SCALE = 2.0**-53

Words = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# torch.broadcast_tensors carries no annotations; this is its signature.
_broadcast_tensors: Callable[..., tuple[torch.Tensor, ...]] = torch.broadcast_tensors


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of ``multiplier * x`` for uint32 values held in int64."""
    low_product = x.bitwise_and(_MASK16) * multiplier  # < 2^48
    high_product = x.bitwise_right_shift(16) * multiplier  # < 2^48
    t = low_product + high_product.bitwise_and(_MASK16).bitwise_left_shift(16)  # < 2^49
    lo = t.bitwise_and(MASK32)
    hi = high_product.bitwise_right_shift(16) + t.bitwise_right_shift(32)
    return hi, lo


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    rounds: int = PHILOX_ROUNDS,
) -> Words:
    """Philox4x32-``rounds`` of counter (c0..c3) under key (k0, k1), elementwise.

    Inputs are integer tensors (or anything broadcastable with them) whose values are
    uint32 (0 <= v < 2^32; larger values are reduced mod 2^32). Returns four int64
    tensors holding the uint32 output words, broadcast to a common shape.
    """
    x0, x1, x2, x3, key0, key1 = (
        torch.as_tensor(v).to(torch.int64).bitwise_and(MASK32) for v in (c0, c1, c2, c3, k0, k1)
    )
    x0, x1, x2, x3, key0, key1 = _broadcast_tensors(x0, x1, x2, x3, key0, key1)
    for round_index in range(rounds):
        if round_index > 0:
            key0 = (key0 + PHILOX_W0).bitwise_and(MASK32)
            key1 = (key1 + PHILOX_W1).bitwise_and(MASK32)
        hi0, lo0 = _mulhilo(PHILOX_M0, x0)
        hi1, lo1 = _mulhilo(PHILOX_M1, x2)
        x0, x1, x2, x3 = (
            hi1.bitwise_xor(x1).bitwise_xor(key0),
            lo1,
            hi0.bitwise_xor(x3).bitwise_xor(key1),
            lo0,
        )
    return x0, x1, x2, x3


def keys_from_seed(seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Philox key of a request: (seed mod 2^32, (seed >> 32) mod 2^32), seed as uint64.

    ``seed`` is int64; a negative seed is read in two's complement (seed = -1 gives the
    key (0xFFFFFFFF, 0xFFFFFFFF)).
    """
    seed = torch.as_tensor(seed).to(torch.int64)
    return seed.bitwise_and(MASK32), seed.bitwise_right_shift(32).bitwise_and(MASK32)


def row_counter(
    position: torch.Tensor,
    row_offset: int | torch.Tensor,
    stream: int,
    index: int | torch.Tensor = 0,
) -> Words:
    """Counter words (index, rowpos mod 2^32, rowpos >> 32, stream), rowpos = position + row.

    The sum wraps modulo 2^64 (int64 two's complement), as the contract's uint64 rowpos.
    Returns four int64 tensors (uint32 values) broadcast to a common shape.
    """
    rowpos = torch.as_tensor(position).to(torch.int64) + row_offset
    rowpos = torch.as_tensor(rowpos)
    c0 = torch.as_tensor(index, device=rowpos.device).to(torch.int64).bitwise_and(MASK32)
    c1 = rowpos.bitwise_and(MASK32)
    c2 = rowpos.bitwise_right_shift(32).bitwise_and(MASK32)
    c3 = torch.full_like(rowpos, int(stream) & MASK32)
    c0, c1, c2, c3 = _broadcast_tensors(c0, c1, c2, c3)
    return c0, c1, c2, c3


def philox_words(
    seed: torch.Tensor, rowpos: torch.Tensor, stream: int, index: int | torch.Tensor = 0
) -> Words:
    """The four Philox output words for (seed, rowpos, stream, index)."""
    k0, k1 = keys_from_seed(seed)
    c0, c1, c2, c3 = row_counter(rowpos, 0, stream, index)
    return philox4x32(c0, c1, c2, c3, k0, k1)


def acceptance_uniform_from_word(w0: torch.Tensor) -> torch.Tensor:
    """U = (floor(w0 / 2^8) + 1/2) * 2^-24, returned exactly as float64.

    U lies on the 24-bit midpoint grid {(j + 1/2) 2^-24 : 0 <= j < 2^24}, so
    2^-25 <= U <= 1 - 2^-25: never 0, never 1. The value needs 25 significant bits, so
    it is NOT exact in fp32 for U >= 1/2 (fp32 would round w0 = 0xFFFFFFFF to 1.0);
    float64 holds every grid value exactly and U * n (n <= 2^24) stays exact in fp64.
    """
    j = torch.as_tensor(w0).to(torch.int64).bitwise_right_shift(8)
    return (j.to(torch.float64) + 0.5) * _ACCEPT_SCALE


def sample_uniform_from_words(w0: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """u = (2k + 1) * 2^-53, k = floor(w0 / 2^6) * 2^26 + floor(w1 / 2^6), as float64.

    k has 52 bits, 2k + 1 < 2^53 is an exact fp64 integer, so u is exact and
    2^-53 <= u <= 1 - 2^-53.
    """
    high = torch.as_tensor(w0).to(torch.int64).bitwise_right_shift(6)
    low = torch.as_tensor(w1).to(torch.int64).bitwise_right_shift(6)
    k = high.bitwise_left_shift(26) + low
    return (2 * k + 1).to(torch.float64) * _SAMPLE_SCALE


def acceptance_uniform(seed: torch.Tensor, rowpos: torch.Tensor) -> torch.Tensor:
    """The acceptance coin U of the row at ``rowpos`` (stream STREAM_ACCEPT, index 0), fp64."""
    w0, _, _, _ = philox_words(seed, rowpos, STREAM_ACCEPT)
    return acceptance_uniform_from_word(w0)


def sample_uniform(seed: torch.Tensor, rowpos: torch.Tensor) -> torch.Tensor:
    """The residual/bonus sample uniform u of the row at ``rowpos`` (STREAM_SAMPLE), fp64."""
    w0, w1, _, _ = philox_words(seed, rowpos, STREAM_SAMPLE)
    return sample_uniform_from_words(w0, w1)


def draft_integer(seed: torch.Tensor, rowpos: torch.Tensor, denominator: int) -> torch.Tensor:
    """r = w0 mod C (stream STREAM_DRAFT, index 0), int64, exactly uniform on [0, C).

    C must be a power of two in [1, MAX_DENOMINATOR]: 2^32 is a multiple of C, so every
    residue has exactly 2^32 / C preimages.
    """
    check_denominator(denominator)
    w0, _, _, _ = philox_words(seed, rowpos, STREAM_DRAFT)
    return w0.bitwise_and(denominator - 1)


# --------------------------------------------------------------------------------------
# Triton known-answer check: the generator the kernels use, on the same words.
# --------------------------------------------------------------------------------------

_KAT_BLOCK = 64  # entries per program of the known-answer kernel


def triton_philox4x32(counters: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Triton's ``philox_impl`` (10 rounds, uint32) on counters [N, 4] and keys [N, 2].

    Inputs are int64 tensors of uint32 values on one device (CPU needs TRITON_INTERPRET=1
    set before Python starts); returns [N, 4] int64 output words on that device.
    """
    if counters.ndim != 2 or counters.shape[1] != 4 or keys.shape != (counters.shape[0], 2):
        raise ValueError(
            f"expected counters [N, 4] and keys [N, 2], got {tuple(counters.shape)} and "
            f"{tuple(keys.shape)}"
        )
    if counters.device != keys.device:
        raise ValueError(f"counters on {counters.device} but keys on {keys.device}")
    counters = counters.to(torch.int64).bitwise_and(MASK32).contiguous()
    keys = keys.to(torch.int64).bitwise_and(MASK32).contiguous()
    n = counters.shape[0]
    out = torch.zeros((n, 4), dtype=torch.int64, device=counters.device)
    if n == 0:
        return out
    philox_kat_kernel[(triton.cdiv(n, _KAT_BLOCK),)](counters, keys, out, n, BLOCK=_KAT_BLOCK)
    return out.bitwise_and(MASK32)


def _kat_tensors(device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    counters = torch.tensor([v[0] for v in KAT_VECTORS], dtype=torch.int64, device=device)
    keys = torch.tensor([v[1] for v in KAT_VECTORS], dtype=torch.int64, device=device)
    expected = torch.tensor([v[2] for v in KAT_VECTORS], dtype=torch.int64, device=device)
    return counters, keys, expected


def torch_philox_kat(device: torch.device | str = "cpu") -> list[str]:
    """Run the Random123 vectors through ``philox4x32``; returns mismatch lines (empty = OK)."""
    counters, keys, expected = _kat_tensors(device)
    c0, c1, c2, c3 = counters.unbind(1)
    k0, k1 = keys.unbind(1)
    words = philox4x32(c0, c1, c2, c3, k0, k1)
    return _mismatches(torch.stack(words, dim=1), expected)


def triton_philox_kat(device: torch.device | str = "cpu") -> list[str]:
    """Run the Random123 vectors through Triton's ``philox_impl``; mismatch lines (empty = OK).

    On CPU this needs TRITON_INTERPRET=1 in the environment before Python starts.
    """
    counters, keys, expected = _kat_tensors(device)
    return _mismatches(triton_philox4x32(counters, keys), expected)


def _mismatches(got: torch.Tensor, expected: torch.Tensor) -> list[str]:
    lines = []
    for (counter, key, _), got_row, want_row in zip(
        KAT_VECTORS, got.cpu().tolist(), expected.cpu().tolist(), strict=True
    ):
        if got_row != want_row:
            lines.append(
                "philox4x32-10 counter "
                + " ".join(f"{w:08x}" for w in counter)
                + " key "
                + " ".join(f"{w:08x}" for w in key)
                + ": got "
                + " ".join(f"{w:08x}" for w in got_row)
                + ", expected "
                + " ".join(f"{w:08x}" for w in want_row)
            )
    return lines
