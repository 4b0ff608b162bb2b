"""The selector: two Triton kernels that verify a chain of K drafts for B requests.

Law: exactly the one in ``pp3kernels.contract`` (read it first). Structure:

Phase 1, ``_chain_stats_kernel`` (grid: request blocks x vocabulary splits): each program
streams one chunk of the vocabulary for the K+1 rows of its BLOCK_B requests at once (one
[BLOCK_B * R, BLOCK_V] tile per step, R = K+1 rounded up to a power of two) and keeps *per-lane*
running statistics — max m, sum of exp((l - m)/tau) with one exponential per element (the side
that lost is rescaled), first argmax for greedy rows, NaN flag — reduced across lanes once per
row and written as the chunk's partials. Greedy-only programs skip the exponentials.

Phase 2, ``_chain_finish_kernel`` (one program per request block): loads every row's partials
at once, combines them into per-row m, s, argmax and status, evaluates every draft row's
acceptance together (T0: x == argmax; T1: U * n < p_x * C in fp64) and takes the first
failure as the stop row; for a T1 request it draws the stop row's token by inverse CDF with
one 52-bit uniform — over chunk masses (from the partials; a chunk holding support tokens of
a rejected draft gets W = mass - sum e_s + sum r_s, or an exact rescan when that difference
is within rounding of the chunk mass), then over tile sums inside the chosen chunk, then by one
cumulative sum inside one tile. Only one chunk of one row per request is read again.

Exactness: the acceptance test is exact given U and the fp32 p_x. The residual law is exact
up to fp32 rounding of e_v and of the chunk sums: a token's probability is off by at most a
few ulps of its chunk's mass. A zero-weight token (p = 0, or p <= q on the support of a
rejected draft) is never emitted: the in-tile search picks the first token whose running sum
exceeds the target, which has positive weight, and falls back to the tile's last
positive-weight token when rounding leaves the target past the end.

Launch shapes, one source: row-tiled (many requests per program, one split) for the CPU
interpreter, where every program instance costs a second or more, and for small vocabularies
on a GPU; split-vocabulary (one request per program, many splits) for V ~ 129K on a GPU, so
that B * splits programs fill the multiprocessors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.random import philox_impl

from pp3kernels.contract import (
    MAX_DENOMINATOR,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    STREAM_ACCEPT,
    STREAM_SAMPLE,
)
from pp3kernels.interface import ChainInputs, ChainResult
from pp3kernels.runtime import is_interpreter
from pp3kernels.validate import validate_chain_inputs

Q_NONE = 0
Q_SPARSE = 1
Q_DENSE = 2

MODE_RESIDUAL = 0  # rejected draft: sample (p - q)+
MODE_FULL = 1  # invalidated proposal or bonus row: sample p

_BIG_INDEX = tl.constexpr(2**30)
_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_SAMPLE = tl.constexpr(STREAM_SAMPLE)


@triton.jit
def _philox_row(seed, rowpos, stream: tl.constexpr):
    """Philox4x32-10 words for counter (0, rowpos lo, rowpos hi, stream), key = seed."""
    s = seed.to(tl.uint64, bitcast=True)
    k0 = (s & 0xFFFFFFFF).to(tl.uint32)
    k1 = (s >> 32).to(tl.uint32)
    rp = rowpos.to(tl.uint64, bitcast=True)
    c1 = (rp & 0xFFFFFFFF).to(tl.uint32)
    c2 = (rp >> 32).to(tl.uint32)
    c0 = c1 * 0
    c3 = c0 + stream
    return philox_impl(c0, c1, c2, c3, k0, k1, 10)


@triton.jit
def _acceptance_coin(seed, rowpos, STREAM: tl.constexpr):
    """U = (2 floor(w0 / 2^8) + 1) 2^-25 in fp64: 24-bit grid, never 0 or 1."""
    w0, _w1, _w2, _w3 = _philox_row(seed, rowpos, STREAM)
    k = (w0 >> 8).to(tl.float64)
    return (2.0 * k + 1.0) * (1.0 / 33554432.0)


@triton.jit
def _sample_uniform(seed, rowpos, STREAM: tl.constexpr):
    """u = (2k + 1) 2^-53 with k = floor(w0/2^6) 2^26 + floor(w1/2^6): 52-bit grid in (0, 1)."""
    w0, w1, _w2, _w3 = _philox_row(seed, rowpos, STREAM)
    k = ((w0 >> 6).to(tl.uint64) << 26) | (w1 >> 6).to(tl.uint64)
    return (2.0 * k.to(tl.float64) + 1.0) * (1.0 / 9007199254740992.0)


@triton.jit
def _row_weights(
    logits_ptr,
    row_off,
    offs_v,
    mask_v,
    stride_lv,
    row_max,
    row_sum,
    inv_tau,
    resid,
    qid_ptr,
    qcnt_ptr,
    q_row_off,
    stride_qs,
    qdense_ptr,
    qd_row_off,
    stride_qdv,
    inv_denominator,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
):
    """Residual weights r_v of one [BLOCK_B, BLOCK_F] tile, in units of e_v = exp((l_v - m)/tau).

    r_v = max(e_v - q_v * s, 0) where the request is in residual mode and v is in q's support
    (sparse) or everywhere (dense); r_v = e_v otherwise. Masked lanes weigh 0.
    """
    ptrs = logits_ptr + row_off[:, None] + offs_v.to(tl.int64) * stride_lv
    logit = tl.load(ptrs, mask=mask_v, other=float("-inf")).to(tl.float32)
    e = tl.exp((logit - row_max[:, None]) * inv_tau[:, None])
    e = tl.where(mask_v, e, 0.0)
    if Q_MODE == 1:
        for s in range(S):
            sid = tl.load(qid_ptr + q_row_off + s * stride_qs, mask=resid, other=-1)
            cnt = tl.load(qcnt_ptr + q_row_off + s * stride_qs, mask=resid, other=0)
            q_scaled = cnt.to(tl.float32) * inv_denominator * row_sum
            hit = (offs_v == sid[:, None]) & (resid & (cnt > 0))[:, None]
            e = tl.where(hit, tl.maximum(e - q_scaled[:, None], 0.0), e)
    if Q_MODE == 2:
        qd_ptrs = qdense_ptr + qd_row_off[:, None] + offs_v.to(tl.int64) * stride_qdv
        qd = tl.load(qd_ptrs, mask=mask_v & resid[:, None], other=0.0).to(tl.float32)
        e = tl.where(resid[:, None], tl.maximum(e - qd * row_sum[:, None], 0.0), e)
    return e


@triton.jit
def _chunk_walk(
    logits_ptr,
    row_off,
    chunk_start,
    V,
    chunk,
    target,
    stride_lv,
    row_max,
    row_sum,
    inv_tau,
    resid,
    live,
    qid_ptr,
    qcnt_ptr,
    q_row_off,
    stride_qs,
    qdense_ptr,
    qd_row_off,
    stride_qdv,
    inv_denominator,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Walk one chunk tile by tile, summing residual weights in fp64 (tile sums only).

    Returns (total, tile, before): the chunk's total weight, the start of the first tile whose
    running total exceeds ``target`` (else the last tile with positive weight, else -1), and
    the running total before that tile. One cumulative sum inside one tile then finishes the
    draw (``_tile_pick``). The rescan of a chunk's mass (target = +inf) uses the same sums.
    """
    chunk_end = tl.minimum(chunk_start + chunk, V)
    carry = tl.zeros([BLOCK_B], dtype=tl.float64)
    hit_tile = tl.full([BLOCK_B], -1, dtype=tl.int32)
    hit_before = tl.zeros([BLOCK_B], dtype=tl.float64)
    last_tile = tl.full([BLOCK_B], -1, dtype=tl.int32)
    last_before = tl.zeros([BLOCK_B], dtype=tl.float64)
    lane = tl.arange(0, BLOCK_F)
    for v0 in range(0, chunk, BLOCK_F):
        offs_v = chunk_start[:, None] + v0 + lane[None, :]
        mask_v = (offs_v < chunk_end[:, None]) & live[:, None]
        w = _row_weights(
            logits_ptr,
            row_off,
            offs_v,
            mask_v,
            stride_lv,
            row_max,
            row_sum,
            inv_tau,
            resid,
            qid_ptr,
            qcnt_ptr,
            q_row_off,
            stride_qs,
            qdense_ptr,
            qd_row_off,
            stride_qdv,
            inv_denominator,
            Q_MODE,
            S,
        )
        tile_total = tl.sum(w.to(tl.float64), axis=1)
        after = carry + tile_total
        crossing = (hit_tile < 0) & (after > target) & (tile_total > 0.0)
        hit_before = tl.where(crossing, carry, hit_before)
        hit_tile = tl.where(crossing, chunk_start + v0, hit_tile)
        last_before = tl.where(tile_total > 0.0, carry, last_before)
        last_tile = tl.where(tile_total > 0.0, chunk_start + v0, last_tile)
        carry = after
    tile = tl.where(hit_tile >= 0, hit_tile, last_tile)
    before = tl.where(hit_tile >= 0, hit_before, last_before)
    return carry, tile, before


@triton.jit
def _tile_pick(
    logits_ptr,
    row_off,
    tile_start,
    tile_end,
    target,
    before,
    stride_lv,
    row_max,
    row_sum,
    inv_tau,
    resid,
    live,
    qid_ptr,
    qcnt_ptr,
    q_row_off,
    stride_qs,
    qdense_ptr,
    qd_row_off,
    stride_qdv,
    inv_denominator,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """The first id whose running sum (from ``before``) exceeds ``target`` within one tile;
    the tile's last positive-weight id when rounding left the target past its end."""
    offs_v = tile_start[:, None] + tl.arange(0, BLOCK_F)[None, :]
    mask_v = (offs_v < tile_end[:, None]) & ((tile_start >= 0) & live)[:, None]
    w = _row_weights(
        logits_ptr,
        row_off,
        offs_v,
        mask_v,
        stride_lv,
        row_max,
        row_sum,
        inv_tau,
        resid,
        qid_ptr,
        qcnt_ptr,
        q_row_off,
        stride_qs,
        qdense_ptr,
        qd_row_off,
        stride_qdv,
        inv_denominator,
        Q_MODE,
        S,
    )
    running = before[:, None] + tl.cumsum(w.to(tl.float64), axis=1)
    first = tl.min(tl.where((running > target[:, None]) & mask_v, offs_v, _BIG_INDEX), axis=1)
    last_positive = tl.max(tl.where((w > 0.0) & mask_v, offs_v, -1), axis=1)
    return tl.where(first < _BIG_INDEX, first, last_positive)


@triton.jit
def _load_tile(logits_ptr, row_off, offs_v, mask_r, chunk_end, stride_lv):
    """One [rows, BLOCK_V] tile of logits as fp32; -inf outside the chunk."""
    mask = mask_r[:, None] & (offs_v < chunk_end)[None, :]
    ptrs = logits_ptr + row_off[:, None] + offs_v[None, :].to(tl.int64) * stride_lv
    return tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)


@triton.jit
def _sampled_update(x, offs_v, run_max, run_sum, run_arg, run_nan, inv_tau, track_arg):
    """Per-lane online max / sum of exp((x - m)/tau) with one exponential per element.

    If x > m: s <- s * exp((m - x)/tau) + 1 and m <- x; else s <- s + exp((x - m)/tau).
    -inf adds nothing; a NaN never wins ``x > m`` and turns s into NaN (flagged separately).
    """
    run_nan = run_nan | (x != x)
    gt = x > run_max
    diff = tl.where(gt, run_max - x, x - run_max)
    e = tl.exp(diff * inv_tau[:, None])
    run_sum = tl.where(gt, run_sum * e + 1.0, tl.where(x == float("-inf"), run_sum, run_sum + e))
    if track_arg > 0:
        run_arg = tl.where(gt, offs_v[None, :], run_arg)
    run_max = tl.where(gt, x, run_max)
    return run_max, run_sum, run_arg, run_nan


@triton.jit
def _greedy_update(x, offs_v, run_max, run_arg, run_nan):
    """Per-lane running max and its first index (strict >: the lowest id wins ties)."""
    run_nan = run_nan | (x != x)
    gt = x > run_max
    run_arg = tl.where(gt, offs_v[None, :], run_arg)
    run_max = tl.where(gt, x, run_max)
    return run_max, run_arg, run_nan


# NSPLIT stays a runtime value even when it is 1: one code path for every split count.
@triton.jit(do_not_specialize=["NSPLIT"])
def _chain_stats_kernel(
    logits_ptr,
    stride_lb,
    stride_lk,
    stride_lv,
    temp_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    B,
    V,
    chunk,
    NSPLIT,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Phase 1: per-row partial statistics of one vocabulary chunk for BLOCK_B requests."""
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)

    # ---- One: one [BLOCK_B * R, BLOCK_V] tile stream over this split's chunk; the R rows
    # of a request (K+1 of them valid) are loaded together so their latencies overlap.
    BLOCK_R: tl.constexpr = BLOCK_B * R
    offs_r = tl.arange(0, BLOCK_R)
    req = pid_b * BLOCK_B + offs_r // R
    row = offs_r % R
    mask_r = (req < B) & (row <= K)
    req64 = req.to(tl.int64)
    tau_r = tl.load(temp_ptr + req, mask=mask_r, other=0.0)
    t1_r = tau_r > 0.0
    inv_tau_r = tl.where(t1_r, 1.0 / tl.where(t1_r, tau_r, 1.0), 1.0)
    row_off = req64 * stride_lb + row.to(tl.int64) * stride_lk
    lane = tl.arange(0, BLOCK_V)
    chunk_start = pid_s * chunk
    chunk_end = tl.minimum(chunk_start + chunk, V)
    chunk_len = chunk_end - chunk_start
    any_t1 = tl.max((t1_r & mask_r).to(tl.int32), axis=0)
    any_t0 = tl.max((~t1_r & mask_r).to(tl.int32), axis=0)
    run_max = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
    run_arg = tl.full([BLOCK_R, BLOCK_V], _BIG_INDEX, dtype=tl.int32)
    run_nan = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int1)
    if any_t1 > 0:
        # Sampled rows: running max and sum of exp((x - m)/tau) with ONE exponential per
        # element (the side that lost is scaled by exp(-|x - m|/tau)); argmax only if the
        # tile also holds greedy rows.
        for v0 in range(0, chunk_len, 2 * BLOCK_V):
            # Two tiles in flight per step: both loads are issued before either is used.
            offs_a = chunk_start + v0 + lane
            offs_b = offs_a + BLOCK_V
            x_a = _load_tile(logits_ptr, row_off, offs_a, mask_r, chunk_end, stride_lv)
            x_b = _load_tile(logits_ptr, row_off, offs_b, mask_r, chunk_end, stride_lv)
            run_max, run_sum, run_arg, run_nan = _sampled_update(
                x_a, offs_a, run_max, run_sum, run_arg, run_nan, inv_tau_r, any_t0
            )
            run_max, run_sum, run_arg, run_nan = _sampled_update(
                x_b, offs_b, run_max, run_sum, run_arg, run_nan, inv_tau_r, any_t0
            )
    else:
        # Greedy rows only: max and first argmax per lane, nothing else.
        for v0 in range(0, chunk_len, 2 * BLOCK_V):
            offs_a = chunk_start + v0 + lane
            offs_b = offs_a + BLOCK_V
            x_a = _load_tile(logits_ptr, row_off, offs_a, mask_r, chunk_end, stride_lv)
            x_b = _load_tile(logits_ptr, row_off, offs_b, mask_r, chunk_end, stride_lv)
            run_max, run_arg, run_nan = _greedy_update(x_a, offs_a, run_max, run_arg, run_nan)
            run_max, run_arg, run_nan = _greedy_update(x_b, offs_b, run_max, run_arg, run_nan)
    row_max = tl.max(run_max, axis=1)
    lane_live = run_max != float("-inf")
    lane_scale = tl.where(lane_live, tl.exp((run_max - row_max[:, None]) * inv_tau_r[:, None]), 0.0)
    row_sum = tl.sum(tl.where(lane_live, run_sum * lane_scale, 0.0), axis=1)
    row_arg = tl.min(tl.where(run_max == row_max[:, None], run_arg, _BIG_INDEX), axis=1)
    # Bit 0: a NaN was seen; bit 1: the maximum is +inf (a NaN never wins `x > m`).
    row_flag = tl.max(run_nan.to(tl.int32), axis=1) | tl.where(row_max == float("inf"), 2, 0)
    part = (req64 * (K + 1) + row) * NSPLIT + pid_s
    tl.store(part_max_ptr + part, row_max, mask=mask_r)
    tl.store(part_sum_ptr + part, row_sum, mask=mask_r)
    tl.store(part_arg_ptr + part, row_arg, mask=mask_r)
    tl.store(part_flag_ptr + part, row_flag, mask=mask_r)


@triton.jit(do_not_specialize=["NSPLIT"])
def _chain_finish_kernel(
    logits_ptr,
    stride_lb,
    stride_lk,
    stride_lv,
    draft_ptr,
    stride_db,
    stride_dk,
    qid_ptr,
    qcnt_ptr,
    stride_qb,
    stride_qk,
    stride_qs,
    qdense_ptr,
    stride_qdb,
    stride_qdk,
    stride_qdv,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    tokens_ptr,
    accepted_ptr,
    status_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    B,
    V,
    chunk,
    NSPLIT,
    denominator_f,
    K: tl.constexpr,
    R: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    Q_MODE: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Phase 2: combine the partials, walk the chain, draw the stop row's token."""
    pid_b = tl.program_id(0)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_b = offs_b < B
    offs_b64 = offs_b.to(tl.int64)
    tau = tl.load(temp_ptr + offs_b, mask=mask_b, other=0.0)
    is_t1 = tau > 0.0
    inv_tau = tl.where(is_t1, 1.0 / tl.where(is_t1, tau, 1.0), 1.0)
    seed = tl.load(seed_ptr + offs_b, mask=mask_b, other=0)
    position = tl.load(pos_ptr + offs_b, mask=mask_b, other=0)
    rows = tl.arange(0, R)
    valid = mask_b[:, None] & (rows <= K)[None, :]
    splits = tl.arange(0, NSPLIT_P2)
    split_ok = splits < NSPLIT
    inv_denominator = 1.0 / denominator_f
    den64 = tl.zeros([BLOCK_B, R], dtype=tl.float64) + denominator_f

    # Every row's partials at once: [BLOCK_B, R, NSPLIT_P2].
    prow = offs_b64[:, None] * (K + 1) + rows[None, :]
    pidx = prow[:, :, None] * NSPLIT + splits[None, None, :]
    pmask = valid[:, :, None] & split_ok[None, None, :]
    p_max = tl.load(part_max_ptr + pidx, mask=pmask, other=float("-inf"))
    p_sum = tl.load(part_sum_ptr + pidx, mask=pmask, other=0.0)
    p_arg = tl.load(part_arg_ptr + pidx, mask=pmask, other=_BIG_INDEX)
    p_flag = tl.load(part_flag_ptr + pidx, mask=pmask, other=0)
    r_max = tl.max(p_max, axis=2)
    p_live = p_max != float("-inf")
    p_scale = tl.where(p_live, tl.exp((p_max - r_max[:, :, None]) * inv_tau[:, None, None]), 0.0)
    r_sum = tl.sum(tl.where(p_live, p_sum * p_scale, 0.0), axis=2)
    greedy = tl.min(tl.where(p_max == r_max[:, :, None], p_arg, _BIG_INDEX), axis=2)
    saw_nan = tl.max(p_flag & 1, axis=2) != 0
    saw_inf = tl.max(p_flag & 2, axis=2) != 0
    code = tl.where(saw_nan, 1, tl.where(saw_inf, 2, tl.where(r_max == float("-inf"), 3, 0)))
    code = tl.where(valid & (code != 0), code, 99)
    status = tl.min(code, axis=1)
    status = tl.where(status == 99, 0, status)

    # The chain, all rows at once: accept[i] for every draft row, then the first failure.
    drow = valid & (rows < K)[None, :]
    draft = tl.load(
        draft_ptr + offs_b64[:, None] * stride_db + rows[None, :] * stride_dk,
        mask=drow,
        other=-1,
    )
    in_range = (draft >= 0) & (draft < V)
    t1_2d = is_t1[:, None] & drow
    x_logit = tl.load(
        logits_ptr
        + offs_b64[:, None] * stride_lb
        + rows[None, :].to(tl.int64) * stride_lk
        + draft.to(tl.int64) * stride_lv,
        mask=t1_2d & in_range,
        other=float("-inf"),
    ).to(tl.float32)
    p_x = tl.exp((x_logit - r_max) * inv_tau[:, None]) / r_sum
    coin = _acceptance_coin(seed[:, None], position[:, None] + rows[None, :], _STREAM_ACCEPT)
    bad = drow & ((draft < -1) | (draft >= V))
    if Q_MODE == 1:
        slots = tl.arange(0, S_P2)
        qidx = (
            offs_b64[:, None, None] * stride_qb
            + rows[None, :, None] * stride_qk
            + slots[None, None, :] * stride_qs
        )
        qmask = drow[:, :, None] & (slots < S)[None, None, :]
        q_sid = tl.load(qid_ptr + qidx, mask=qmask, other=-1)
        q_cnt = tl.load(qcnt_ptr + qidx, mask=qmask, other=0)
        positive = q_cnt > 0
        count = tl.sum(tl.where((q_sid == draft[:, :, None]) & positive, q_cnt, 0), axis=2)
        q_mass = tl.sum(q_cnt.to(tl.int64), axis=2)
        # The host validation's rules, on every draft row (the status must not depend on
        # where the chain stopped): no negative count, padding slots carry id -1, support ids
        # in [0, V) and distinct (pairwise check for S <= 16), mass C (or 0 where nothing is
        # proposed or the request is greedy), and a sampled proposal inside the support.
        slot_bad = (q_cnt < 0) | ((q_cnt == 0) & (q_sid != -1))
        slot_bad = slot_bad | (positive & ((q_sid < 0) | (q_sid >= V)))
        malformed = tl.max(slot_bad.to(tl.int32), axis=2) != 0
        if S_P2 <= 16:
            same = (q_sid[:, :, :, None] == q_sid[:, :, None, :]) & (
                slots[:, None] < slots[None, :]
            )[None, None, :, :]
            dup = same & positive[:, :, :, None] & positive[:, :, None, :]
            malformed = malformed | (tl.max(tl.max(dup.to(tl.int32), axis=3), axis=2) != 0)
        zero_allowed = (draft < 0) | ~is_t1[:, None]
        mass_ok = (q_mass.to(tl.float64) == den64) | ((q_mass == 0) & zero_allowed)
        bad = bad | (drow & (malformed | ~mass_ok)) | (t1_2d & in_range & (count <= 0))
        accept_t1 = coin * count.to(tl.float64) < p_x.to(tl.float64) * den64
    elif Q_MODE == 2:
        q_x = tl.load(
            qdense_ptr
            + offs_b64[:, None] * stride_qdb
            + rows[None, :] * stride_qdk
            + draft.to(tl.int64) * stride_qdv,
            mask=t1_2d & in_range,
            other=0.0,
        ).to(tl.float32)
        bad = bad | (t1_2d & in_range & ~((q_x > 0.0) & (q_x < float("inf"))))
        accept_t1 = coin * q_x.to(tl.float64) < p_x.to(tl.float64)
    else:
        bad = bad | (t1_2d & in_range)  # a sampled proposal without any q
        accept_t1 = draft < -1
    accept = in_range & tl.where(is_t1[:, None], accept_t1, draft == greedy)
    fail = drow & ~accept
    stop_row = tl.min(tl.where(fail, rows[None, :], K), axis=1)
    accepted = stop_row
    at_stop = rows[None, :] == stop_row[:, None]
    bad_any = tl.max(bad.to(tl.int32), axis=1)
    status = tl.where((status == 0) & (bad_any != 0), 4, status)
    stop_draft = tl.sum(tl.where(at_stop & drow, draft, 0), axis=1)
    resid = (stop_row < K) & (stop_draft >= 0)
    stop_max = tl.sum(tl.where(at_stop, r_max, 0.0), axis=1)
    stop_sum = tl.sum(tl.where(at_stop, r_sum, 0.0), axis=1)
    final = tl.sum(tl.where(at_stop, greedy, 0), axis=1)
    final = tl.where(is_t1, -1, final)

    # ---- T1: draw the stop row's token: chunk by inverse CDF, then a tile, then a token.
    need_sample = mask_b & is_t1 & (status == 0)
    if tl.max(need_sample.to(tl.int32), axis=0) > 0:
        resid = resid & need_sample
        stop_off = offs_b64 * stride_lb + stop_row.to(tl.int64) * stride_lk
        q_stop = offs_b64 * stride_qb + stop_row.to(tl.int64) * stride_qk
        qd_stop = offs_b64 * stride_qdb + stop_row.to(tl.int64) * stride_qdk
        sel = at_stop[:, :, None]
        c_max = tl.max(tl.where(sel, p_max, float("-inf")), axis=1)
        c_sum = tl.sum(tl.where(sel, p_sum, 0.0), axis=1)
        c_live = c_max != float("-inf")
        full_mass = tl.where(
            c_live, c_sum * tl.exp((c_max - stop_max[:, None]) * inv_tau[:, None]), 0.0
        ).to(tl.float64)
        mass = full_mass
        if Q_MODE == 1:
            # Correct the chunks holding support tokens: W_c = (mass_c - sum e_s) + sum r_s.
            slots = tl.arange(0, S_P2)
            sidx = q_stop[:, None] + slots[None, :] * stride_qs
            smask = resid[:, None] & (slots < S)[None, :]
            s_id = tl.load(qid_ptr + sidx, mask=smask, other=-1)
            s_cnt = tl.load(qcnt_ptr + sidx, mask=smask, other=0)
            s_ok = smask & (s_cnt > 0) & (s_id >= 0) & (s_id < V)
            s_logit = tl.load(
                logits_ptr + stop_off[:, None] + s_id.to(tl.int64) * stride_lv,
                mask=s_ok,
                other=float("-inf"),
            ).to(tl.float32)
            s_e = tl.where(s_ok, tl.exp((s_logit - stop_max[:, None]) * inv_tau[:, None]), 0.0)
            s_r = tl.maximum(s_e - s_cnt.to(tl.float32) * inv_denominator * stop_sum[:, None], 0.0)
            s_r = tl.where(s_ok, s_r, 0.0)
            in_c = s_ok[:, :, None] & ((s_id // chunk)[:, :, None] == splits[None, None, :])
            sup_e = tl.sum(tl.where(in_c, s_e[:, :, None], 0.0).to(tl.float64), axis=1)
            sup_r = tl.sum(tl.where(in_c, s_r[:, :, None], 0.0).to(tl.float64), axis=1)
            dirty = sup_e > 0.0
            remainder = mass - sup_e
            mass = tl.where(dirty, tl.maximum(remainder, 0.0) + sup_r, mass)
            # Where the non-support remainder is within rounding of the chunk mass (or the
            # row is one chunk), rescan the chunk exactly instead of subtracting.
            rescan = dirty & ((remainder <= full_mass * 3.814697265625e-06) | (NSPLIT == 1))
        elif Q_MODE == 2:
            # Dense q changes every weight of a rejected row: every chunk is rescanned.
            rescan = resid[:, None] & split_ok[None, :]
        else:
            rescan = tl.zeros([BLOCK_B, NSPLIT_P2], dtype=tl.int1)
        # Exact rescans: one walk per chunk that needs it, the same sums the draw will use.
        if tl.max(tl.max(rescan.to(tl.int32), axis=1), axis=0) > 0:
            for c in range(NSPLIT):
                rescan_c = tl.max(tl.where(splits[None, :] == c, rescan, 0), axis=1) != 0
                if tl.max(rescan_c.to(tl.int32), axis=0) > 0:
                    total, _t, _b = _chunk_walk(
                        logits_ptr,
                        stop_off,
                        tl.zeros([BLOCK_B], tl.int32) + c * chunk,
                        V,
                        chunk,
                        tl.full([BLOCK_B], float("inf"), tl.float64),
                        stride_lv,
                        stop_max,
                        stop_sum,
                        inv_tau,
                        resid,
                        rescan_c,
                        qid_ptr,
                        qcnt_ptr,
                        q_stop,
                        stride_qs,
                        qdense_ptr,
                        qd_stop,
                        stride_qdv,
                        inv_denominator,
                        Q_MODE,
                        S,
                        BLOCK_B,
                        BLOCK_F,
                    )
                    hit = rescan_c[:, None] & (splits[None, :] == c)
                    mass = tl.where(hit, total[:, None], mass)
        mass = tl.where(split_ok[None, :], mass, 0.0)
        cumulative = tl.cumsum(mass, axis=1)
        total_mass = tl.sum(mass, axis=1)
        # An empty residual in floats (only reachable through rounding): sample p instead.
        empty = need_sample & ~(total_mass > 0.0)
        resid = resid & ~empty
        mass = tl.where(empty[:, None], tl.where(split_ok[None, :], full_mass, 0.0), mass)
        cumulative = tl.cumsum(mass, axis=1)
        total_mass = tl.sum(mass, axis=1)
        u = _sample_uniform(seed, position + stop_row, _STREAM_SAMPLE)
        target = u * total_mass
        past = (cumulative > target[:, None]) & (mass > 0.0)
        pick = tl.min(tl.where(past, splits[None, :], NSPLIT_P2), axis=1)
        last_nonzero = tl.max(tl.where(mass > 0.0, splits[None, :], -1), axis=1)
        pick = tl.maximum(tl.where(pick >= NSPLIT_P2, last_nonzero, pick), 0)
        before_chunk = tl.sum(tl.where(splits[None, :] < pick[:, None], mass, 0.0), axis=1)
        inner = target - before_chunk
        _total, tile, before = _chunk_walk(
            logits_ptr,
            stop_off,
            pick * chunk,
            V,
            chunk,
            inner,
            stride_lv,
            stop_max,
            stop_sum,
            inv_tau,
            resid,
            need_sample,
            qid_ptr,
            qcnt_ptr,
            q_stop,
            stride_qs,
            qdense_ptr,
            qd_stop,
            stride_qdv,
            inv_denominator,
            Q_MODE,
            S,
            BLOCK_B,
            BLOCK_F,
        )
        tile_end = tl.minimum(tl.minimum(tile + BLOCK_F, pick * chunk + chunk), V)
        chosen = _tile_pick(
            logits_ptr,
            stop_off,
            tile,
            tile_end,
            inner,
            before,
            stride_lv,
            stop_max,
            stop_sum,
            inv_tau,
            resid,
            need_sample,
            qid_ptr,
            qcnt_ptr,
            q_stop,
            stride_qs,
            qdense_ptr,
            qd_stop,
            stride_qdv,
            inv_denominator,
            Q_MODE,
            S,
            BLOCK_F,
        )
        final = tl.where(need_sample, chosen, final)

    # ---- Outputs: accepted drafts, the final token, -1 padding; nothing on a bad status.
    status = tl.where(mask_b & (status == 0) & (final < 0), 4, status)
    ok = mask_b & (status == 0)
    token = tl.where(
        rows[None, :] < accepted[:, None],
        draft,
        tl.where(rows[None, :] == accepted[:, None], final[:, None], -1),
    )
    token = tl.where(ok[:, None], token, -1)
    tl.store(tokens_ptr + offs_b64[:, None] * (K + 1) + rows[None, :], token, mask=valid)
    tl.store(accepted_ptr + offs_b, tl.where(ok, accepted, 0), mask=mask_b)
    tl.store(status_ptr + offs_b, status.to(tl.int8), mask=mask_b)


@dataclass(frozen=True)
class LaunchPlan:
    """How one call is split.

    block_b requests per program (their K+1 rows padded to a power of two form one tile of
    block_b * R rows by block_v tokens), nsplit vocabulary chunks of ``chunk`` tokens each
    (a multiple of block_v and block_f), and block_f tokens per tile of the final draw.
    """

    block_b: int
    block_v: int
    nsplit: int
    chunk: int
    num_warps: int
    block_f: int = 0  # 0: same as block_v


def plan_launch(batch: int, rows: int, vocab: int, *, interpreter: bool) -> LaunchPlan:
    """Pick the launch shape.

    Interpreter: one split and up to 8192 requests per program, tiles of up to 2^20 elements
    (each program instance costs a second or more; numpy on a big tile is cheap). Small
    vocabularies on a GPU: one request per program, one split (row tiles of many requests hit
    a scan-lowering assertion in Triton 3.6 on sm_90). Large vocabularies on a GPU: one request
    per program (all its rows in one tile) and about four programs per multiprocessor in all,
    so that enough loads are in flight to cover memory latency.
    """
    r = triton.next_power_of_2(rows)
    if interpreter:
        block_v = triton.next_power_of_2(min(vocab, 1024))
        block_b = max(1, min(triton.next_power_of_2(batch), (1 << 20) // (block_v * r), 8192))
        chunk = triton.cdiv(vocab, block_v) * block_v
        return LaunchPlan(block_b, block_v, 1, chunk, 4, block_v)
    if vocab <= 1024:  # small vocabularies (qualification targets): one request per program
        block_v = max(16, triton.next_power_of_2(vocab))
        return LaunchPlan(1, block_v, 1, 1024, 4, 1024)
    # Measured on the H200 at V = 129280 (bench/NOTES.md): chunks of 2048 tokens (64 splits)
    # with [R, 256] tiles and 4 warps beat 8, 32 and 127 splits for B = 1, 4 and 64.
    block_f = 1024
    block_v = max(64, 2048 // r)
    chunk = max(2048, triton.cdiv(triton.cdiv(vocab, 256), block_f) * block_f)
    nsplit = triton.cdiv(vocab, chunk)
    return LaunchPlan(1, block_v, nsplit, chunk, 4, block_f)


def verify_chain(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    q_ids: torch.Tensor | None = None,
    q_counts: torch.Tensor | None = None,
    denominator: int | None = None,
    q_dense: torch.Tensor | None = None,
    validate: bool = True,
    plan: LaunchPlan | None = None,
) -> ChainResult:
    """Verify B chains of K drafts against target logits; the law is ``pp3kernels.contract``.

    logits [B, K+1, V] bf16/fp16/fp32 (strided views honoured: batch stride 0 is fine);
    draft_tokens [B, K] int32 (-1 = invalidated); temperature [B] fp32 (0 = greedy);
    seed, position [B] int64; q as sparse integer counts (q_ids, q_counts [B, K, S] int32
    over ``denominator``, a power of two <= 2^24) or dense float q_dense [B, K, V].
    With ``validate`` (default) the inputs are checked on the host first and a contract
    violation raises ``SelectorInputError``; pass ``validate=False`` inside a CUDA graph,
    where a violating row reports STATUS_BAD_DRAFT instead and nothing is read out of bounds.
    Returns ChainResult(tokens [B, K+1] int32, accepted [B] int32, status [B] int8).
    """
    if validate:
        validate_chain_inputs(
            ChainInputs(
                logits,
                draft_tokens,
                temperature,
                seed,
                position,
                q_ids=q_ids,
                q_counts=q_counts,
                denominator=denominator,
                q_dense=q_dense,
            )
        )
    batch, rows, vocab = logits.shape
    k = rows - 1
    device = logits.device
    tokens = torch.empty((batch, rows), dtype=torch.int32, device=device)
    accepted = torch.empty((batch,), dtype=torch.int32, device=device)
    status = torch.empty((batch,), dtype=torch.int8, device=device)
    if batch == 0:
        return ChainResult(tokens, accepted, status)
    if plan is None:
        plan = plan_launch(batch, rows, vocab, interpreter=is_interpreter() or not logits.is_cuda)
    # Triton 3.6 fails to lower fp64 scans over very short axes on sm_90: pad to >= 8.
    nsplit_p2 = max(8, triton.next_power_of_2(plan.nsplit))
    block_f = plan.block_f or plan.block_v
    if plan.chunk % plan.block_v or plan.chunk % block_f:
        raise ValueError(f"{plan}: chunk must be a multiple of block_v and block_f")
    blocks = triton.cdiv(batch, plan.block_b)
    part_shape = (batch, rows, plan.nsplit)
    part_max = torch.empty(part_shape, dtype=torch.float32, device=device)
    part_sum = torch.empty(part_shape, dtype=torch.float32, device=device)
    part_arg = torch.empty(part_shape, dtype=torch.int32, device=device)
    part_flag = torch.empty(part_shape, dtype=torch.int32, device=device)

    drafts = draft_tokens if k > 0 else torch.full((batch, 1), -1, dtype=torch.int32, device=device)
    if q_dense is not None:
        q_mode, support = Q_DENSE, 1
        qd, qd_strides = q_dense, q_dense.stride()
        qid = qcnt = drafts
        q_strides = (0, 0, 0)
        den = 1
    elif q_ids is not None and q_counts is not None:
        q_mode, support = Q_SPARSE, q_ids.shape[2]
        if q_ids.stride() != q_counts.stride():
            q_counts = q_counts.contiguous()
            q_ids = q_ids.contiguous()
        qid, qcnt, q_strides = q_ids, q_counts, q_ids.stride()
        qd, qd_strides = logits, (0, 0, 0)
        den = int(denominator) if denominator is not None else 1
    else:
        q_mode, support = Q_NONE, 1
        qid = qcnt = drafts
        q_strides = (0, 0, 0)
        qd, qd_strides = logits, (0, 0, 0)
        den = 1
    if not 1 <= den <= MAX_DENOMINATOR:
        raise ValueError(f"denominator={den}: expected a power of two in [1, {MAX_DENOMINATOR}]")

    _chain_stats_kernel[(blocks, plan.nsplit)](
        logits,
        *logits.stride(),
        temperature,
        part_max,
        part_sum,
        part_arg,
        part_flag,
        batch,
        vocab,
        plan.chunk,
        plan.nsplit,
        K=k,
        R=triton.next_power_of_2(rows),
        BLOCK_B=plan.block_b,
        BLOCK_V=plan.block_v,
        num_warps=plan.num_warps,
    )
    _chain_finish_kernel[(blocks,)](
        logits,
        *logits.stride(),
        drafts,
        drafts.stride(0),
        drafts.stride(1) if k > 0 else 0,
        qid,
        qcnt,
        *q_strides,
        qd,
        *qd_strides,
        temperature,
        seed,
        position,
        tokens,
        accepted,
        status,
        part_max,
        part_sum,
        part_arg,
        part_flag,
        batch,
        vocab,
        plan.chunk,
        plan.nsplit,
        float(den),
        K=k,
        R=triton.next_power_of_2(rows),
        S=support,
        S_P2=triton.next_power_of_2(max(support, 2)),
        Q_MODE=q_mode,
        NSPLIT_P2=nsplit_p2,
        BLOCK_B=plan.block_b,
        BLOCK_F=block_f,
        num_warps=4,
    )
    return ChainResult(tokens, accepted, status)


__all__ = [
    "STATUS_ALL_MASKED",
    "STATUS_BAD_DRAFT",
    "STATUS_NAN",
    "STATUS_OK",
    "STATUS_POSINF",
    "LaunchPlan",
    "plan_launch",
    "verify_chain",
]
