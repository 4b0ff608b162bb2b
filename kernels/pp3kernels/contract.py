"""The selector contract: status codes, Philox streams and the exact sampling law.

Everything that the Triton kernel (``selector.py``), the torch reference
(``reference.py``), the draft sampler (``drafts.py``) and the evidence commands must
agree on lives here, so that there is one definition of each number.

Randomness (Philox4x32-10, Random123 constants)
------------------------------------------------
key     = (seed mod 2^32, (seed >> 32) mod 2^32)            (seed as uint64, two's complement)
counter = (c0, c1, c2, c3) = (index, rowpos mod 2^32, rowpos >> 32, stream)
rowpos  = position + i for chain row i (i = 0..K)            (uint64, two's complement)
index   = 0 for a per-row draw; the draft sampler and any per-token draw use the token id.

The batch index never enters a counter: a request's draws depend only on
(seed, position, stream, index), so permuting requests permutes outputs bit for bit.

Uniforms
--------
acceptance coin  U = (2 floor(w0 / 2^8) + 1) * 2^-25      (24-bit grid, in (0, 1); exact in fp64,
                 NOT in fp32, which lacks the 25th bit: compute U in fp64)
sample uniform   u = (2k + 1) * 2^-53, k = floor(w0 / 2^6) * 2^26 + floor(w1 / 2^6)
                 (52-bit grid, in (0, 1), exact in fp64)
draft integer    r = w0 mod C  (C a power of two <= 2^24: exactly uniform on [0, C))

Law per request (T1, temperature tau > 0)
-----------------------------------------
m = max_v l_v, e_v = exp((l_v - m) / tau) (fp32), s = sum_v e_v, p_v = e_v / s.
Row i < K with draft x >= 0 and integer q (count n of x over denominator C):
accept iff U * n < p_x * C, evaluated in fp64 (exact given U and p_x; strict, so p_x = 0
is never accepted). With dense float q: accept iff U * q_x < p_x.
At the first rejection the row's residual weights are r_v = max(e_v - q_v * s, 0) for v in
the support of q, e_v elsewhere; at an invalidated proposal (x = -1) or after K accepts
(bonus row K), r_v = e_v. The emitted token is the smallest v whose running sum
sum_{w <= v} r_w exceeds u * sum_w r_w (inverse CDF; a zero-weight token is never chosen).

T0 (tau = 0): y_i = argmax_v l_{i,v}, lowest id on ties, -0.0 == +0.0; accept x_i iff x_i ==
y_i; emit y_i at the first mismatch or -1; after K accepts emit y_K. No draw at all.

A request any of whose K+1 rows holds a NaN, a +inf, or only -inf emits nothing:
tokens all -1, accepted 0, status NAN / POSINF / ALL_MASKED (checked in that order).
"""

from __future__ import annotations

from typing import TypeGuard

# Status codes written to ``status`` [B] int8.
STATUS_OK = 0
STATUS_NAN = 1
STATUS_POSINF = 2
STATUS_ALL_MASKED = 3
# Only reachable with validate=False (inside a captured graph): a draft id outside
# [0, V), a proposal whose q count is 0, or a malformed q row found by the kernel.
STATUS_BAD_DRAFT = 4

STATUS_NAMES = {
    STATUS_OK: "ok",
    STATUS_NAN: "nan",
    STATUS_POSINF: "posinf",
    STATUS_ALL_MASKED: "all_masked",
    STATUS_BAD_DRAFT: "bad_draft",
}

# Philox stream tags (counter word c3).
STREAM_ACCEPT = 1
STREAM_SAMPLE = 2
STREAM_DRAFT = 3

# Largest integer-q denominator: U (24 bits) * count (<= 24 bits) is exact in fp64.
MAX_DENOMINATOR = 1 << 24

# Invalidated proposal and output padding.
NO_TOKEN = -1


class SelectorInputError(ValueError):
    """An input that breaks the selector contract; the message names the offender."""


def is_power_of_two_denominator(denominator: object) -> TypeGuard[int]:
    """True when ``denominator`` is an int (not a bool) and a power of two in [1, 2^24]."""
    return (
        isinstance(denominator, int)
        and not isinstance(denominator, bool)
        and 1 <= denominator <= MAX_DENOMINATOR
        and denominator & (denominator - 1) == 0
    )


def check_denominator(denominator: object) -> int:
    """Return ``denominator`` as an int, or raise SelectorInputError naming it.

    The one check of the integer-q denominator C: a power of two in [1, MAX_DENOMINATOR],
    so that 2^32 is a multiple of C (draws are exactly uniform) and U * count is exact in fp64.
    """
    if is_power_of_two_denominator(denominator):
        return denominator
    raise SelectorInputError(
        f"denominator {denominator!r} is not a power of two in [1, {MAX_DENOMINATOR}]"
    )
