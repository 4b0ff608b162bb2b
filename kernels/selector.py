"""The selector: one Triton kernel that verifies a chain of K drafts for B requests.

Law: exactly the one in ``pp3kernels.contract`` (read it first). Structure:

Phase 1, every program (request block ``pid_b`` x vocabulary split ``pid_s``): for each of
the K+1 rows of its BLOCK_B requests, stream the split's chunk of the vocabulary once and
keep *per-lane* running statistics — max m, sum of exp((l - m)/tau) with one exponential per
element (online rescaling on the side that lost), first argmax, NaN / +inf flags — reduced
across lanes once per row and written as the chunk's partials.

Phase 2, the last program of a request block to finish its split (an atomic counter per
block; with one split every program is the last): combines the partials into per-row m, s,
argmax and status, walks the chain (T0: x == argmax; T1: U * n < p_x * C in fp64) and, for a
T1 request, samples its stop row by inverse CDF with one 52-bit uniform: first over chunk
masses (from the partials; chunks holding a support token of a rejected draft are rescanned
exactly with the residual weights), then inside the chosen chunk, token by token in id order.
Only that one row per request is read again, and only one chunk of it (two with support
rescans), so the cost is one pass over the logits plus a few thousand elements.

Exactness: the acceptance test is exact given U and the fp32 p_x. The residual law is exact
up to fp32 rounding of e_v and of the chunk sums: a token's probability is off by at most a
few ulps of its chunk's mass (relative 2^-22 of the chunk mass). A zero-weight token (p = 0,
or p <= q on the support of a rejected draft) is never emitted: the in-chunk search picks the
first token whose running sum exceeds the target, which has positive weight, and falls back
to the chunk's last positive-weight token when rounding leaves the target past the end.

Launch shapes, one source: row-tiled (BLOCK_B requests per program, one split) for the CPU
interpreter, where every program instance costs ~20 ms; split-vocabulary (BLOCK_B = 1, many
splits per request) on a GPU, so that B * splits programs fill the multiprocessors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from pp3kernels.contract import (
    MAX_DENOMINATOR,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    ChainResult,
)
from triton.language.random import philox_impl

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
    tau,
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
    """Residual weights r_v (unnormalised, in units of e_v = exp((l_v - m)/tau)) of one tile.

    r_v = max(e_v - q_v * s, 0) where the request is in residual mode and v is in q's support
    (sparse) or everywhere (dense); r_v = e_v otherwise. Masked lanes weigh 0.
    """
    ptrs = logits_ptr + row_off[:, None] + offs_v.to(tl.int64) * stride_lv
    logit = tl.load(ptrs, mask=mask_v, other=float("-inf")).to(tl.float32)
    e = tl.exp((logit - row_max[:, None]) / tau[:, None])
    e = tl.where(mask_v, e, 0.0)
    if Q_MODE == 1:
        for s in range(S):
            sid = tl.load(qid_ptr + q_row_off + s * stride_qs)
            cnt = tl.load(qcnt_ptr + q_row_off + s * stride_qs)
            q_scaled = cnt.to(tl.float32) * inv_denominator * row_sum
            hit = (offs_v == sid[:, None]) & (resid & (cnt > 0))[:, None]
            e = tl.where(hit, tl.maximum(e - q_scaled[:, None], 0.0), e)
    if Q_MODE == 2:
        qd_ptrs = qdense_ptr + qd_row_off[:, None] + offs_v.to(tl.int64) * stride_qdv
        qd = tl.load(qd_ptrs, mask=mask_v & resid[:, None], other=0.0).to(tl.float32)
        e = tl.where(resid[:, None], tl.maximum(e - qd * row_sum[:, None], 0.0), e)
    return e


@triton.jit
def _scan_chunk(
    logits_ptr,
    row_off,
    chunk_start,
    V,
    chunk,
    target,
    stride_lv,
    row_max,
    row_sum,
    tau,
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
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Walk one chunk in id order with a running fp64 sum of the residual weights.

    Returns (total, chosen, last_positive): the chunk's total weight, the first id whose
    running sum exceeds ``target`` (or -1), and the last id with positive weight (or -1).
    The same arithmetic serves the mass of a rescanned chunk (target = +inf) and the draw,
    so the two agree to the bit.
    """
    chunk_end = tl.minimum(chunk_start + chunk, V)
    carry = tl.zeros([BLOCK_B], dtype=tl.float64)
    chosen = tl.full([BLOCK_B], -1, dtype=tl.int32)
    last_positive = tl.full([BLOCK_B], -1, dtype=tl.int32)
    lane = tl.arange(0, BLOCK_V)
    for v0 in range(0, chunk, BLOCK_V):
        offs_v = chunk_start[:, None] + v0 + lane[None, :]
        mask_v = offs_v < chunk_end[:, None]
        w = _row_weights(
            logits_ptr,
            row_off,
            offs_v,
            mask_v,
            stride_lv,
            row_max,
            row_sum,
            tau,
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
        running = carry[:, None] + tl.cumsum(w.to(tl.float64), axis=1)
        hit = (running > target[:, None]) & mask_v
        first = tl.min(tl.where(hit, offs_v, _BIG_INDEX), axis=1)
        chosen = tl.where((chosen < 0) & (first < _BIG_INDEX), first, chosen)
        last_positive = tl.maximum(
            last_positive, tl.max(tl.where((w > 0.0) & mask_v, offs_v, -1), axis=1)
        )
        carry = tl.max(tl.where(mask_v, running, 0.0), axis=1)
        carry = tl.maximum(carry, 0.0)
    return carry, chosen, last_positive


@triton.jit
def _chain_verify_kernel(
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
    counter_ptr,
    B,
    V,
    chunk,
    denominator_f,
    K: tl.constexpr,
    S: tl.constexpr,
    Q_MODE: tl.constexpr,
    NSPLIT: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_b = offs_b < B
    offs_b64 = offs_b.to(tl.int64)
    tau_raw = tl.load(temp_ptr + offs_b, mask=mask_b, other=0.0)
    is_t1 = tau_raw > 0.0
    tau = tl.where(is_t1, tau_raw, 1.0)  # T0 rows never use their sums
    lane = tl.arange(0, BLOCK_V)
    chunk_start = pid_s * chunk
    chunk_end = tl.minimum(chunk_start + chunk, V)
    part_row = offs_b64 * (K + 1)

    # ---- Phase 1: per-lane running statistics over this split's chunk, for every row.
    for i in tl.static_range(K + 1):
        row_off = offs_b64 * stride_lb + i * stride_lk
        run_max = tl.full([BLOCK_B, BLOCK_V], float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros([BLOCK_B, BLOCK_V], dtype=tl.float32)
        run_arg = tl.full([BLOCK_B, BLOCK_V], _BIG_INDEX, dtype=tl.int32)
        run_flag = tl.zeros([BLOCK_B, BLOCK_V], dtype=tl.int32)
        for v0 in range(0, chunk, BLOCK_V):
            offs_v = chunk_start + v0 + lane
            mask = mask_b[:, None] & (offs_v < chunk_end)[None, :]
            ptrs = logits_ptr + row_off[:, None] + offs_v[None, :].to(tl.int64) * stride_lv
            x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
            run_flag = run_flag | tl.where(x != x, 1, 0) | tl.where(x == float("inf"), 2, 0)
            gt = x > run_max
            # One exponential per element: the side that lost is scaled by exp(-|x - m|/tau).
            diff = tl.where(gt, run_max - x, x - run_max)
            e = tl.exp(diff / tau[:, None])
            run_sum = tl.where(
                gt, run_sum * e + 1.0, tl.where(x == float("-inf"), run_sum, run_sum + e)
            )
            run_arg = tl.where(gt, offs_v[None, :], run_arg)
            run_max = tl.where(gt, x, run_max)
        row_max = tl.max(run_max, axis=1)
        lane_scale = tl.where(
            run_max == float("-inf"), 0.0, tl.exp((run_max - row_max[:, None]) / tau[:, None])
        )
        row_sum = tl.sum(tl.where(run_max == float("-inf"), 0.0, run_sum * lane_scale), axis=1)
        row_arg = tl.min(tl.where(run_max == row_max[:, None], run_arg, _BIG_INDEX), axis=1)
        row_flag = tl.max(run_flag, axis=1)
        part = (part_row + i) * NSPLIT + pid_s
        tl.store(part_max_ptr + part, row_max, mask=mask_b)
        tl.store(part_sum_ptr + part, row_sum, mask=mask_b)
        tl.store(part_arg_ptr + part, row_arg, mask=mask_b)
        tl.store(part_flag_ptr + part, row_flag, mask=mask_b)

    # ---- Phase 2 runs in the last program of this request block to finish.
    if NSPLIT > 1:
        tl.debug_barrier()
        done_before = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel")
        is_last = done_before == NSPLIT - 1
    else:
        is_last = pid_s == 0
    if is_last:
        if NSPLIT > 1:
            tl.atomic_xchg(counter_ptr + pid_b, 0)  # re-arm for the next call / graph replay
        seed = tl.load(seed_ptr + offs_b, mask=mask_b, other=0)
        position = tl.load(pos_ptr + offs_b, mask=mask_b, other=0)
        splits = tl.arange(0, NSPLIT_P2)
        split_mask = mask_b[:, None] & (splits < NSPLIT)[None, :]
        inv_denominator = 1.0 / denominator_f
        den64 = tl.zeros([BLOCK_B], dtype=tl.float64) + denominator_f

        status = tl.zeros([BLOCK_B], dtype=tl.int32)
        alive = mask_b
        accepted = tl.zeros([BLOCK_B], dtype=tl.int32)
        final = tl.full([BLOCK_B], -1, dtype=tl.int32)
        stop_row = tl.full([BLOCK_B], K, dtype=tl.int32)
        mode = tl.full([BLOCK_B], 1, dtype=tl.int32)  # MODE_FULL
        stop_max = tl.zeros([BLOCK_B], dtype=tl.float32)
        stop_sum = tl.full([BLOCK_B], 1.0, dtype=tl.float32)
        for i in tl.static_range(K + 1):
            cmb_part = ((part_row + i) * NSPLIT)[:, None] + splits[None, :]
            p_max = tl.load(
                part_max_ptr + cmb_part, mask=split_mask, other=float("-inf"), cache_modifier=".cg"
            )
            p_sum = tl.load(
                part_sum_ptr + cmb_part, mask=split_mask, other=0.0, cache_modifier=".cg"
            )
            p_arg = tl.load(
                part_arg_ptr + cmb_part, mask=split_mask, other=_BIG_INDEX, cache_modifier=".cg"
            )
            p_flag = tl.load(
                part_flag_ptr + cmb_part, mask=split_mask, other=0, cache_modifier=".cg"
            )
            r_max = tl.max(p_max, axis=1)
            scale = tl.where(
                p_max == float("-inf"), 0.0, tl.exp((p_max - r_max[:, None]) / tau[:, None])
            )
            r_sum = tl.sum(tl.where(p_max == float("-inf"), 0.0, p_sum * scale), axis=1)
            greedy = tl.min(tl.where(p_max == r_max[:, None], p_arg, _BIG_INDEX), axis=1)
            flag = tl.max(p_flag, axis=1)
            code = tl.where(
                (flag & 1) != 0,
                1,
                tl.where((flag & 2) != 0, 2, tl.where(r_max == float("-inf"), 3, 0)),
            )
            status = tl.where((code != 0) & ((status == 0) | (code < status)), code, status)

            if i < K:
                draft = tl.load(
                    draft_ptr + offs_b64 * stride_db + i * stride_dk, mask=mask_b, other=-1
                )
                in_range = (draft >= 0) & (draft < V)
                bad = alive & ((draft < -1) | (draft >= V))
                # T0: accept iff the draft is the greedy token.
                accept_t0 = draft == greedy
                # T1: accept iff U * n < p_x * C (or U * q_x < p_x for dense q), in fp64.
                x_row_off = offs_b64 * stride_lb + i * stride_lk
                x_logit = tl.load(
                    logits_ptr + x_row_off + draft.to(tl.int64) * stride_lv,
                    mask=alive & is_t1 & in_range,
                    other=float("-inf"),
                )
                p_x = tl.exp((x_logit.to(tl.float32) - r_max) / tau) / r_sum
                coin = _acceptance_coin(seed, position + i, _STREAM_ACCEPT)
                if Q_MODE == 1:
                    q_row = offs_b64 * stride_qb + i * stride_qk
                    count = tl.zeros([BLOCK_B], dtype=tl.int32)
                    q_mass = tl.zeros([BLOCK_B], dtype=tl.int64)
                    for s in range(S):
                        q_sid = tl.load(qid_ptr + q_row + s * stride_qs, mask=mask_b, other=-1)
                        q_cnt = tl.load(qcnt_ptr + q_row + s * stride_qs, mask=mask_b, other=0)
                        count = count + tl.where((q_sid == draft) & (q_cnt > 0), q_cnt, 0)
                        q_mass = q_mass + q_cnt.to(tl.int64)
                        bad = bad | (
                            alive & is_t1 & in_range & (q_cnt > 0) & ((q_sid < 0) | (q_sid >= V))
                        )
                    bad = bad | (
                        alive & is_t1 & in_range & ((count <= 0) | (q_mass.to(tl.float64) != den64))
                    )
                    accept_t1 = coin * count.to(tl.float64) < p_x.to(tl.float64) * den64
                elif Q_MODE == 2:
                    qd_off = offs_b64 * stride_qdb + i * stride_qdk
                    q_x = tl.load(
                        qdense_ptr + qd_off + draft.to(tl.int64) * stride_qdv,
                        mask=alive & is_t1 & in_range,
                        other=0.0,
                    ).to(tl.float32)
                    bad = bad | (alive & is_t1 & in_range & ~(q_x > 0.0))
                    accept_t1 = coin * q_x.to(tl.float64) < p_x.to(tl.float64)
                else:
                    bad = bad | (alive & is_t1 & in_range)  # a T1 proposal without any q
                    accept_t1 = in_range & (draft < 0)
                accept = in_range & tl.where(is_t1, accept_t1, accept_t0)
                status = tl.where(bad & (status == 0), 4, status)
                stopping = alive & ~accept
                final = tl.where(stopping & ~is_t1, greedy, final)
                stop_row = tl.where(stopping, i, stop_row)
                mode = tl.where(stopping, tl.where(draft < 0, 1, 0), mode)
                stop_max = tl.where(stopping, r_max, stop_max)
                stop_sum = tl.where(stopping, r_sum, stop_sum)
                accepted = tl.where(alive & accept, accepted + 1, accepted)
                alive = alive & accept
            else:
                final = tl.where(alive & ~is_t1, greedy, final)
                stop_max = tl.where(alive, r_max, stop_max)
                stop_sum = tl.where(alive, r_sum, stop_sum)

        # ---- T1: draw the stop row's token by inverse CDF over chunks, then inside one.
        need_sample = mask_b & is_t1 & (status == 0)
        if tl.max(need_sample.to(tl.int32), axis=0) > 0:
            resid = need_sample & (mode == 0)
            stop_off = offs_b64 * stride_lb + stop_row.to(tl.int64) * stride_lk
            q_stop = offs_b64 * stride_qb + stop_row.to(tl.int64) * stride_qk
            qd_stop = offs_b64 * stride_qdb + stop_row.to(tl.int64) * stride_qdk
            stop_part = ((part_row + stop_row) * NSPLIT)[:, None] + splits[None, :]
            c_max = tl.load(
                part_max_ptr + stop_part, mask=split_mask, other=float("-inf"), cache_modifier=".cg"
            )
            c_sum = tl.load(
                part_sum_ptr + stop_part, mask=split_mask, other=0.0, cache_modifier=".cg"
            )
            mass = tl.where(
                c_max == float("-inf"),
                0.0,
                c_sum * tl.exp((c_max - stop_max[:, None]) / tau[:, None]),
            ).to(tl.float64)
            # Chunks whose weights differ from e_v are rescanned exactly.
            if Q_MODE == 1:
                for s in range(S):
                    d_sid = tl.load(qid_ptr + q_stop + s * stride_qs, mask=resid, other=-1)
                    d_cnt = tl.load(qcnt_ptr + q_stop + s * stride_qs, mask=resid, other=0)
                    dirty = resid & (d_cnt > 0) & (d_sid >= 0) & (d_sid < V)
                    sid_chunk = tl.where(dirty, d_sid // chunk, 0)
                    # process each chunk once: skip if an earlier slot lies in the same chunk
                    for s2 in range(s):
                        sid2 = tl.load(qid_ptr + q_stop + s2 * stride_qs, mask=dirty, other=-1)
                        cnt2 = tl.load(qcnt_ptr + q_stop + s2 * stride_qs, mask=dirty, other=0)
                        seen = (cnt2 > 0) & (sid2 >= 0) & (sid2 < V) & (sid2 // chunk == sid_chunk)
                        dirty = dirty & ~seen
                    if tl.max(dirty.to(tl.int32), axis=0) > 0:
                        total, _c, _l = _scan_chunk(
                            logits_ptr,
                            stop_off,
                            sid_chunk * chunk,
                            V,
                            chunk,
                            tl.full([BLOCK_B], float("inf"), tl.float64),
                            stride_lv,
                            stop_max,
                            stop_sum,
                            tau,
                            resid,
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
                            BLOCK_V,
                        )
                        hit = dirty[:, None] & (splits[None, :] == sid_chunk[:, None])
                        mass = tl.where(hit, total[:, None], mass)
            if Q_MODE == 2:
                if tl.max(resid.to(tl.int32), axis=0) > 0:
                    for c in range(NSPLIT):
                        total, _c, _l = _scan_chunk(
                            logits_ptr,
                            stop_off,
                            tl.zeros([BLOCK_B], tl.int32) + c * chunk,
                            V,
                            chunk,
                            tl.full([BLOCK_B], float("inf"), tl.float64),
                            stride_lv,
                            stop_max,
                            stop_sum,
                            tau,
                            resid,
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
                            BLOCK_V,
                        )
                        hit = resid[:, None] & (splits[None, :] == c)
                        mass = tl.where(hit, total[:, None], mass)
            cumulative = tl.cumsum(mass, axis=1)
            total_mass = tl.max(tl.where(split_mask, cumulative, 0.0), axis=1)
            # An empty residual in floats (only reachable through rounding): sample p instead.
            empty = need_sample & (total_mass <= 0.0)
            resid = resid & ~empty
            full_mass = tl.where(
                c_max == float("-inf"),
                0.0,
                c_sum * tl.exp((c_max - stop_max[:, None]) / tau[:, None]),
            ).to(tl.float64)
            mass = tl.where(empty[:, None], full_mass, mass)
            cumulative = tl.cumsum(mass, axis=1)
            total_mass = tl.max(tl.where(split_mask, cumulative, 0.0), axis=1)
            u = _sample_uniform(seed, position + stop_row, _STREAM_SAMPLE)
            target = u * total_mass
            past = (cumulative > target[:, None]) & split_mask & (mass > 0.0)
            pick = tl.min(tl.where(past, splits[None, :], NSPLIT_P2), axis=1)
            last_nonzero = tl.max(tl.where((mass > 0.0) & split_mask, splits[None, :], -1), axis=1)
            pick = tl.where(pick >= NSPLIT_P2, last_nonzero, pick)
            pick = tl.maximum(pick, 0)
            before = tl.sum(tl.where(splits[None, :] < pick[:, None], mass, 0.0), axis=1)
            _t, chosen, last_positive = _scan_chunk(
                logits_ptr,
                stop_off,
                pick * chunk,
                V,
                chunk,
                target - before,
                stride_lv,
                stop_max,
                stop_sum,
                tau,
                resid,
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
                BLOCK_V,
            )
            chosen = tl.where(chosen < 0, last_positive, chosen)
            final = tl.where(need_sample, chosen, final)

        # ---- Outputs: accepted drafts, the final token, -1 padding; nothing on a bad status.
        ok = mask_b & (status == 0) & (final >= 0)
        status = tl.where(mask_b & (status == 0) & (final < 0), 4, status)
        for i in tl.static_range(K + 1):
            if i < K:
                draft = tl.load(
                    draft_ptr + offs_b64 * stride_db + i * stride_dk, mask=mask_b, other=-1
                )
                token = tl.where(i < accepted, draft, tl.where(i == accepted, final, -1))
            else:
                token = tl.where(i == accepted, final, -1)
            token = tl.where(ok, token, -1)
            tl.store(tokens_ptr + offs_b64 * (K + 1) + i, token, mask=mask_b)
        tl.store(accepted_ptr + offs_b, tl.where(ok, accepted, 0), mask=mask_b)
        tl.store(status_ptr + offs_b, status.to(tl.int8), mask=mask_b)


@dataclass(frozen=True)
class LaunchPlan:
    """How one call is split: BLOCK_B requests per program, NSPLIT vocabulary chunks."""

    block_b: int
    block_v: int
    nsplit: int
    chunk: int
    num_warps: int


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed per-block arrival counters, cached per device; the kernel re-arms them."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def plan_launch(batch: int, rows: int, vocab: int, *, interpreter: bool) -> LaunchPlan:
    """Pick the launch shape.

    Interpreter: one split, BLOCK_B requests per program so that a tile holds up to 128K
    elements (each program instance costs seconds of interpretation; numpy on a big tile is
    cheap). GPU: one request per program and enough vocabulary splits that B * splits
    programs cover the multiprocessors about twice.
    """
    if interpreter:
        block_v = triton.next_power_of_2(min(vocab, 1024))
        block_b = max(1, min(triton.next_power_of_2(batch), 131072 // block_v, 8192))
        chunk = triton.cdiv(vocab, block_v) * block_v
        return LaunchPlan(block_b, block_v, 1, chunk, 4)
    block_v = 1024 if vocab >= 1024 else triton.next_power_of_2(vocab)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    want = max(1, math.ceil(2 * sms / max(batch, 1)))
    max_split = triton.cdiv(vocab, block_v)
    nsplit = min(want, max_split, 256)
    chunk = triton.cdiv(triton.cdiv(vocab, nsplit), block_v) * block_v
    nsplit = triton.cdiv(vocab, chunk)
    return LaunchPlan(1, block_v, nsplit, chunk, 4)


def _is_interpreter() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
        from pp3kernels.validate import validate_chain_inputs

        validate_chain_inputs(
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
    batch, rows, vocab = logits.shape
    k = rows - 1
    device = logits.device
    tokens = torch.empty((batch, rows), dtype=torch.int32, device=device)
    accepted = torch.empty((batch,), dtype=torch.int32, device=device)
    status = torch.empty((batch,), dtype=torch.int8, device=device)
    if batch == 0:
        return ChainResult(tokens, accepted, status)
    if plan is None:
        plan = plan_launch(batch, rows, vocab, interpreter=_is_interpreter() or not logits.is_cuda)
    nsplit_p2 = triton.next_power_of_2(plan.nsplit)
    blocks = triton.cdiv(batch, plan.block_b)
    part_shape = (batch, rows, plan.nsplit)
    part_max = torch.empty(part_shape, dtype=torch.float32, device=device)
    part_sum = torch.empty(part_shape, dtype=torch.float32, device=device)
    part_arg = torch.empty(part_shape, dtype=torch.int32, device=device)
    part_flag = torch.empty(part_shape, dtype=torch.int32, device=device)
    counters = _counters(device, blocks)

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

    grid = (blocks, plan.nsplit)
    _chain_verify_kernel[grid](
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
        counters,
        batch,
        vocab,
        plan.chunk,
        float(den),
        K=k,
        S=support,
        Q_MODE=q_mode,
        NSPLIT=plan.nsplit,
        NSPLIT_P2=nsplit_p2,
        BLOCK_B=plan.block_b,
        BLOCK_V=plan.block_v,
        num_warps=plan.num_warps,
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
