"""In-kernel randomness: Philox4x32-10 words of a chain row, the contract's two uniforms, and
a known-answer-test kernel for Triton's generator.

Counter and key layout (``pp3kernels.contract``): key = (seed mod 2^32, seed >> 32) with the
seed read as uint64; counter = (index, rowpos mod 2^32, rowpos >> 32, stream) with
rowpos = position + row as uint64 and index 0 for a per-row draw. The generator is Triton's
own ``philox_impl`` (Random123 constants, 10 rounds); ``pp3kernels.philox`` holds the same
generator in plain torch and checks both against Random123's vectors.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.random import philox_impl

from pp3kernels.contract import STREAM_ACCEPT, STREAM_SAMPLE

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_SAMPLE = tl.constexpr(STREAM_SAMPLE)
_PHILOX_ROUNDS = tl.constexpr(10)
# 2^-25: the coin U = (2j + 1) 2^-25 is the midpoint of cell j of a 2^24-point grid.
_COIN_SCALE = tl.constexpr(1.0 / 33554432.0)
# 2^-53: the sample uniform u = (2k + 1) 2^-53 is the midpoint of cell k of a 2^52-point grid.
_SAMPLE_SCALE = tl.constexpr(1.0 / 9007199254740992.0)


@triton.jit
def philox_row(seed, rowpos, stream: tl.constexpr):
    """Philox4x32-10 words (w0, w1, w2, w3) of counter (0, rowpos lo, rowpos hi, stream).

    Key (k0, k1) = (seed mod 2^32, seed >> 32) and (c1, c2) = (rowpos mod 2^32, rowpos >> 32),
    both int64 operands read as uint64 (two's complement); c0 = 0 is built as c1 * 0 so that
    it has c1's shape and type.
    """
    s = seed.to(tl.uint64, bitcast=True)
    k0 = (s & 0xFFFFFFFF).to(tl.uint32)
    k1 = (s >> 32).to(tl.uint32)
    rp = rowpos.to(tl.uint64, bitcast=True)
    c1 = (rp & 0xFFFFFFFF).to(tl.uint32)
    c2 = (rp >> 32).to(tl.uint32)
    c0 = c1 * 0
    c3 = c0 + stream
    return philox_impl(c0, c1, c2, c3, k0, k1, _PHILOX_ROUNDS)


@triton.jit
def acceptance_coin(seed, rowpos):
    """The acceptance coin U = (2 floor(w0 / 2^8) + 1) 2^-25 in fp64 (stream STREAM_ACCEPT).

    j = floor(w0 / 2^8) < 2^24, so U is the midpoint of cell j of a 2^24-point grid: never 0
    or 1, and exact in fp64 (it needs 25 significant bits, one more than fp32 has).
    """
    w0, _w1, _w2, _w3 = philox_row(seed, rowpos, _STREAM_ACCEPT)
    k = (w0 >> 8).to(tl.float64)
    return (2.0 * k + 1.0) * _COIN_SCALE


@triton.jit
def sample_uniform(seed, rowpos):
    """The sample uniform u = (2k + 1) 2^-53 in fp64 (stream STREAM_SAMPLE).

    k = floor(w0 / 2^6) 2^26 + floor(w1 / 2^6) < 2^52, so 2k + 1 < 2^53 is an exact fp64
    integer and u is the midpoint of cell k of a 2^52-point grid in (0, 1).
    """
    w0, w1, _w2, _w3 = philox_row(seed, rowpos, _STREAM_SAMPLE)
    k = ((w0 >> 6).to(tl.uint64) << 26) | (w1 >> 6).to(tl.uint64)
    return (2.0 * k.to(tl.float64) + 1.0) * _SAMPLE_SCALE


@triton.jit
def philox_kat_kernel(counter_ptr, key_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = Philox4x32-10(counter[i], key[i]) for i < n: the words are uint32 values held
    in int64 ([n, 4] counters, [n, 2] keys, [n, 4] outputs, contiguous); one program per
    BLOCK entries."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    c0 = tl.load(counter_ptr + offsets * 4 + 0, mask=mask, other=0).to(tl.uint32)
    c1 = tl.load(counter_ptr + offsets * 4 + 1, mask=mask, other=0).to(tl.uint32)
    c2 = tl.load(counter_ptr + offsets * 4 + 2, mask=mask, other=0).to(tl.uint32)
    c3 = tl.load(counter_ptr + offsets * 4 + 3, mask=mask, other=0).to(tl.uint32)
    k0 = tl.load(key_ptr + offsets * 2 + 0, mask=mask, other=0).to(tl.uint32)
    k1 = tl.load(key_ptr + offsets * 2 + 1, mask=mask, other=0).to(tl.uint32)
    o0, o1, o2, o3 = philox_impl(c0, c1, c2, c3, k0, k1, _PHILOX_ROUNDS)
    tl.store(out_ptr + offsets * 4 + 0, o0.to(tl.int64), mask=mask)
    tl.store(out_ptr + offsets * 4 + 1, o1.to(tl.int64), mask=mask)
    tl.store(out_ptr + offsets * 4 + 2, o2.to(tl.int64), mask=mask)
    tl.store(out_ptr + offsets * 4 + 3, o3.to(tl.int64), mask=mask)
