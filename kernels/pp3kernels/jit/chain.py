"""The selector's device code: the Triton kernels that verify B chains of K drafts, and their
helpers. The law is ``pp3kernels.contract``; plans and launches are ``pp3kernels.selector``.

Phase 1, ``chain_stats_kernel`` (grid: row blocks x vocabulary splits): each program
streams one chunk of the vocabulary for a block of rows at once (on the GPU's large-vocabulary
plans BLOCK_R consecutive rows of the flat B (K+1) rows, FLAT; otherwise the K+1 rows of
BLOCK_B requests, padded to R = K+1 rounded up to a power of two) and keeps *per-lane*
running statistics, reduced across lanes once per row and written as the chunk's partials.
Every program loads GROUPS tiles a step. Programs holding sampled rows fold them into each
lane with one rescale (max m, sum of exp2((l - m) log2(e)/tau), one exponential per
element; a NaN shows as a NaN lane sum), plus the first argmax where the block also holds
greedy rows; greedy-only programs keep per lane the max, its first index and a NaN flag
(``_greedy_group_update``: the first index from the step's group argmax,
``_group_first_argmax``, so that no tile is read twice). On sm_90+ the whole chunks of
rows that flatten to [B (K+1), V] come in as TMA boxes (``_step_tile``), the rest through
pointer loads.

Phase 2, ``chain_finish_kernel`` (one program per request block):

1. read what the inputs alone decide: the draft rows, their logits (``_draft_logit``), q at
   the drafts (``_sparse_q_counts`` / ``_dense_q_x``) and the acceptance coins; with
   OVERLAP this runs while phase 1 still does (programmatic dependent launch on sm_90+:
   phase 1 lets the next launch start at once, and ``gdc_wait`` holds every phase-2
   program before its first read of phase 1's output);
2. combine every row's partials into per-row m, s, argmax and status (``_combine_max_sum``,
   ``_first_argmax``, ``_logits_status``), evaluate every draft row's acceptance at once
   and take the first failure as the stop row (steps 1-2 are ``_chain_stop``);
3. for a T1 request, draw the stop row's token by inverse CDF with one 52-bit uniform:
   chunk masses from the partials (``_chunk_masses``), corrected where a rejected draft's
   support falls (``_support_corrections``) or rescanned exactly (``_rescan_chunks``), a
   chunk (``_pick_chunk``), then a tile and a token inside it (``_draw_in_chunk``:
   ``_chunk_walk``, ``_tile_pick``). Only one chunk of one row per request is read again.

Dense q changes every weight of a rejected row, so every chunk's mass must be walked
exactly: ``chain_rescan_kernel`` (grid as phase 1) runs between the two, each program
redoing steps 1-2 for its requests and walking its one chunk of each rejected stop row,
and the finish kernel reads those masses instead of walking all the chunks in turn.

The stop row of each request is described to the draw helpers by two tuples:

    row = (logits_ptr, row_off, stride_lv, row_max, row_sum, inv_tau)
    q   = (qid_ptr, qcnt_ptr, q_row_off, stride_qs, qdense_ptr, qd_row_off, stride_qdv,
           inv_denominator, scratch_ptr, scratch_off, slot_id, slot_count, slot_logit)

(row_off, q_row_off, qd_row_off, row_max, row_sum, inv_tau, scratch_off: [BLOCK_B] tensors;
the rest scalars; scratch_off is the request's row of BLOCK_F floats in the scratch buffer,
used by sparse q with more than MAX_LOOPED_SLOTS slots). slot_id, slot_count, slot_logit:
sparse q's stop row as the kernel read it before waiting for phase 1 (``_draft_row_slots``,
``_stop_row_slots``): its support ids, counts and the logits at those ids, [BLOCK_B, S_P2]
where the finish reads the whole support so (PREFETCH_SLOTS), else [BLOCK_B, 1]
placeholders, and the helpers read q's slots themselves. Triton inlines every helper, so
the split costs nothing at run time.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pp3kernels.contract import (
    NO_TOKEN,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
)
from pp3kernels.jit.launch import (
    MAX_LOOPED_SLOTS,
    MAX_MEMBERSHIP_TILE,
    MAX_PAIRWISE_SLOTS,
    MAX_PREFETCH_SLOTS,
    MAX_SLOT_TILE,
    Q_DENSE,
    Q_SPARSE,
)
from pp3kernels.jit.philox import acceptance_coin, sample_uniform

_STATUS_OK = tl.constexpr(STATUS_OK)
_STATUS_NAN = tl.constexpr(STATUS_NAN)
_STATUS_POSINF = tl.constexpr(STATUS_POSINF)
_STATUS_ALL_MASKED = tl.constexpr(STATUS_ALL_MASKED)
_STATUS_BAD_DRAFT = tl.constexpr(STATUS_BAD_DRAFT)
_NO_TOKEN = tl.constexpr(NO_TOKEN)
_Q_SPARSE = tl.constexpr(Q_SPARSE)
_Q_DENSE = tl.constexpr(Q_DENSE)

# A row's logits status is the minimum over the request's rows of a per-row code, so the
# codes must rank as the contract checks them (NaN, then +inf, then all -inf), and a clean
# row must rank after all of them. 99 is any value above the STATUS_* codes.
_CLEAN_ROW = tl.constexpr(99)
assert STATUS_OK < STATUS_NAN < STATUS_POSINF < STATUS_ALL_MASKED < _CLEAN_ROW.value

# "No index": above every token id (offsets are int32 and V < 2^30 in practice), so that a
# min-reduction over candidate ids ignores lanes that hold none.
_BIG_INDEX = tl.constexpr(2**30)

# Bits of a partial's flag word: a NaN was seen in the chunk; the chunk's maximum is +inf.
_FLAG_NAN = tl.constexpr(1)
_FLAG_POSINF = tl.constexpr(2)

# log2(e): phase 1's sampled-only update takes exp2 of (x - m) log2(e) / tau.
_LOG2E = tl.constexpr(1.4426950408889634)
# Phase 1's TMA boxes in flight per program (the chunk loop software-pipelined this deep;
# pointer loads are not: pipelining them lost 6-9% at B >= 64, bench/NOTES.md step 7). The
# stand-alone TMA sweep (eleventh session): 3 stages 354 µs at B1024 against 366 for 1.
_TMA_STAGES = tl.constexpr(3)

# Cancellation guard of the residual chunk masses: 2^-18 = 64 u, u = 2^-24 the fp32 unit
# roundoff. A chunk mass M from the partials is an fp32 value: each of its terms passes
# through the n online steps of its lane (an exponential of a few u and an add or a rescale
# each), the lane's rescale to the chunk max, a tree sum over BLOCK_V lanes and the rescale
# to the row max in phase 2; at the GPU plans (2048-token chunks of 256 lanes, n = 8; and
# 4096-token chunks of 128 lanes, n = 8 steps of 4 tokens a lane: a term passes one 4-term
# group sum more and one tree level less) a first-order worst case of its relative error is
# about 60 u, just under 2^-18. Measured on the H200 (tests/kernels/test_selector_gpu.py,
# test_chunk_masses_stay_inside_the_rescan_guard, rows built to stress the online sums): at
# most 21 u wherever a chunk holds >= 2^-20 of its row; chunks far below the row max exceed
# the first-order count (up to 2314 u, and 0.018 M for a subnormal mass), but there the
# excess stays under 2^-30 of the row's mass (docs/selector.md). The support
# exponentials e_s, by contrast, are the very fp32 values the draw uses. So where the
# non-support remainder M - sum e_s is at most 2^-18 M it may be rounding alone (even of the
# wrong sign, then clamped to 0), and the chunk is rescanned exactly. This guards two things:
# a chunk whose only positive-weight tokens are support tokens never keeps a phantom mass
# (drawn, it would find no token: the walk returns -1 and the request ends as BAD_DRAFT),
# and a chunk whose non-support mass is real is never zeroed by cancellation. Above the
# guard the remainder is certainly positive and its absolute error is that of M, the error
# every chunk mass from the partials carries anyway. (One-chunk rows always rescan.)
_RESCAN_BELOW = tl.constexpr(2.0**-18)

# Loop bounds are compile-time constants (CHUNK, NSPLIT_P2, S), never values computed from
# program ids or runtime arguments: Triton 3.6's interpreter turns a runtime bound into a
# Python int through a one-element numpy array, which numpy >= 2.4 refuses ("only
# 0-dimensional arrays can be converted to Python scalars"; triton-lang/triton#9171).
# Masks cover the tail of the last chunk.

# Sparse q's methods by support size (jit/launch.py says which and why).
_MAX_PAIRWISE_SLOTS = tl.constexpr(MAX_PAIRWISE_SLOTS)
_MAX_LOOPED_SLOTS = tl.constexpr(MAX_LOOPED_SLOTS)
_MAX_MEMBERSHIP_TILE = tl.constexpr(MAX_MEMBERSHIP_TILE)
_MAX_SLOT_TILE = tl.constexpr(MAX_SLOT_TILE)
_MAX_PREFETCH_SLOTS = tl.constexpr(MAX_PREFETCH_SLOTS)


# --------------------------------------------------------------------------------------
# Shared by both phases
# --------------------------------------------------------------------------------------


@triton.jit
def _temperature(tau):
    """(is_t1, inv_tau): tau > 0 selects T1; inv_tau = 1/tau (fp32) there and 1 for T0 rows,
    so that no division by zero is formed and T0 rows see finite, unused exponentials."""
    is_t1 = tau > 0.0
    inv_tau = tl.where(is_t1, 1.0 / tl.where(is_t1, tau, 1.0), 1.0)
    return is_t1, inv_tau


@triton.jit
def _combine_max_sum(part_max, part_sum, inv_tau, AXIS: tl.constexpr):
    """Combine (max, sum of exponentials) pairs along AXIS into one pair.

    Each part j holds m_j and s_j = sum_i exp((x_i - m_j)/tau); the combination is
    m = max_j m_j and s = sum_j s_j exp((m_j - m)/tau), over the parts with m_j > -inf only
    (an empty part adds 0 and no -inf - (-inf) is used). ``inv_tau`` broadcasts against
    ``part_max``. Lanes into a row (phase 1) and chunks into a row (phase 2) use it alike.
    """
    m = tl.max(part_max, axis=AXIS)
    return m, tl.sum(_rescaled_sums(part_max, part_sum, m, inv_tau, AXIS), axis=AXIS)


@triton.jit
def _rescaled_sums(part_max, part_sum, m, inv_tau, AXIS: tl.constexpr):
    """The terms s_j exp((m_j - m)/tau) of ``_combine_max_sum``'s s, 0 for an empty part
    (m_j = -inf), for a caller that sums them in a reduction of its own."""
    live = part_max != float("-inf")
    scale = tl.where(live, tl.exp((part_max - tl.expand_dims(m, AXIS)) * inv_tau), 0.0)
    return tl.where(live, part_sum * scale, 0.0)


@triton.jit
def _first_argmax(part_max, part_arg, m, AXIS: tl.constexpr):
    """The lowest first-argmax among the parts along AXIS whose max equals the combined max
    m (-0.0 == +0.0, so signed zeros tie and the lowest id wins)."""
    return tl.min(_argmax_candidates(part_max, part_arg, m, AXIS), axis=AXIS)


@triton.jit
def _argmax_candidates(part_max, part_arg, m, AXIS: tl.constexpr):
    """Each part's first argmax where its max is the combined max m, else _BIG_INDEX: the
    terms whose minimum is ``_first_argmax``."""
    return tl.where(part_max == tl.expand_dims(m, AXIS), part_arg, _BIG_INDEX)


# --------------------------------------------------------------------------------------
# Phase 1: per-chunk row statistics
# --------------------------------------------------------------------------------------


@triton.jit
def _load_groups(logits_ptr, row_off, offs_g, mask_r, chunk_end, stride_lv):
    """One [rows, GROUPS, BLOCK_V] tile of logits in their own dtype (``offs_g``:
    [1, GROUPS, BLOCK_V] token ids); -inf outside the chunk and in masked rows."""
    mask = mask_r[:, None, None] & (offs_g < chunk_end)
    ptrs = logits_ptr + row_off[:, None, None] + offs_g.to(tl.int64) * stride_lv
    return tl.load(ptrs, mask=mask, other=float("-inf"))


@triton.jit
def _step_tile(source, step_start, BLOCK_V: tl.constexpr, FROM_DESC: tl.constexpr):
    """The [rows, GROUPS, BLOCK_V] tile of one phase-1 step (tokens step_start + offs_g) in
    the logits' dtype, ``source`` = (logits_desc, flat0, logits_ptr, row_off, offs_g,
    mask_r, chunk_end, stride_lv): with FROM_DESC one box of the tensor memory accelerator
    (``logits_desc``: the logits as [V_whole / BLOCK_V, flat rows, BLOCK_V], the box at
    token block step_start / BLOCK_V and flat row ``flat0``; only whole chunks are read
    this way, so no token past the chunk is in the box, and rows past the batch read as 0
    and are never stored), else pointer loads (-inf outside the chunk and in masked
    rows)."""
    logits_desc, flat0, logits_ptr, row_off, offs_g, mask_r, chunk_end, stride_lv = source
    if FROM_DESC:
        # The box is [GROUPS, rows, BLOCK_V] (groups outermost), so that its default register
        # layout, permuted, is the pointer tile's: each thread holds its tokens of every
        # group, and the reductions over the groups stay within threads.
        x = tl.permute(logits_desc.load([step_start // BLOCK_V, flat0, 0]), (1, 0, 2))
    else:
        x = _load_groups(logits_ptr, row_off, step_start + offs_g, mask_r, chunk_end, stride_lv)
    return x


@triton.jit
def _group_first_argmax(x, lane_ids, run_max, run_arg):
    """The running first argmax of each lane before a [rows, GROUPS, BLOCK_V] tile is folded
    in: the tile's max over the groups and, where it beats the lane's max (strict >, so an
    earlier step keeps a tie), the lowest group holding it (``lane_ids``: [BLOCK_V], the
    token id of group 0 of each lane; group g holds lane_ids + g BLOCK_V). Returns
    (tile max, new run_arg)."""
    tile_max, group = tl.max(x, axis=1, return_indices=True, return_indices_tie_break_left=True)
    ids = lane_ids[None, :] + group * x.shape[2]
    return tile_max, tl.where(tile_max > run_max, ids, run_arg)


@triton.jit
def _greedy_group_update(x, lane_ids, run_max, run_arg, run_nan):
    """Per-lane max, first argmax and NaN flag of greedy rows after a [rows, GROUPS,
    BLOCK_V] tile: m' = max(m, max_g x_g), the first argmax from ``_group_first_argmax``
    (strict >, so a later tie keeps the earlier token), and nan' = nan | any_g (x_g != x_g),
    a NaN test of every token. Returns (run_max, run_arg, run_nan)."""
    # Built-in reductions only: Triton's interpreter runs a custom tl.reduce element by
    # element (a NaN-propagating max here took CI's greedy tests from 2 s to 30-140 s).
    run_nan = run_nan | (tl.max((x != x).to(tl.int32), axis=1) != 0)
    tile_max, run_arg = _group_first_argmax(x, lane_ids, run_max, run_arg)
    return tl.maximum(run_max, tile_max), run_arg, run_nan


@triton.jit
def _finite(x):
    return (x != float("-inf")) & (x != float("inf"))


@triton.jit
def _sampled_group_update(x, tile_max, run_max, run_sum, scale):
    """Per-lane online max / sum for a [rows, GROUPS, BLOCK_V] tile (``tile_max``: its max
    over the groups, [rows, BLOCK_V]).

    With c = log2(e) / tau (``scale``, [rows, 1]) and the GROUPS tokens x_g of a lane:
    m' = max(m, max_g x_g); s' = s 2^((m - m') c) + sum_g 2^((x_g - m') c). That is one
    rescale per lane per step and, per element, a subtraction, a multiplication, an exp2
    and an add (x - m' is exact for bf16 and fp16 logits). Exponentials are taken against a
    finite reference (0 where m' is +-inf), so -inf adds exactly 0 and no inf - inf forms.

    NaN needs no test per element: exp2(NaN) = NaN enters the lane's sum, and nothing turns
    a NaN sum back (every factor and term is otherwise >= 0, and s = 0 only while m = -inf,
    where the rescale is 0, not +inf), so the lane saw a NaN iff its sum is NaN at the end.
    A row whose max is +inf is reported POSINF and its sum is never used. Greedy rows that
    share the tile (tau = 0: c = log2(e)) get a finite sum too, used for this flag only.
    """
    new_max = tl.maximum(run_max, tile_max)
    m_ref = tl.where(_finite(new_max), new_max, 0.0)
    old_ref = tl.where(_finite(run_max), run_max, 0.0)
    rescale = tl.where(run_max == float("-inf"), 0.0, tl.math.exp2((old_ref - m_ref) * scale))
    e = tl.math.exp2((x - m_ref[:, None, :]) * scale[:, :, None])
    run_sum = run_sum * rescale + tl.sum(e, axis=1)
    return new_max, run_sum


@triton.jit
def _pointer_lane_statistics(
    logits_ptr,
    row_off,
    chunk_start,
    chunk_end,
    stride_lv,
    mask_r,
    inv_tau_r,
    any_t1,
    any_t0,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """Per-lane statistics of one chunk for BLOCK_R rows through pointer loads: (run_max,
    run_sum, run_arg, run_nan), each [BLOCK_R, BLOCK_V], run_arg the lane's first argmax
    (token id). Phase 1's program where TMA is off (steps 9-11's, unchanged: step 12's
    shared version compiled to 96 registers against 80 and ran sampled rows 10-15% slower
    at B16-B64 without TMA, bench/NOTES.md, twelfth session).

    Sampled rows: GROUPS tiles a step, in one load, folded into each lane with one rescale
    and no NaN test per element (a NaN shows in its lane's sum); the first argmax only where
    the block also holds greedy rows (never read for T1 rows). Greedy rows only: GROUPS
    tiles a step in one load, as the sampled rows: per lane the max, a NaN test of every
    token, and the first argmax from the step's lowest group holding its max, taken where
    it beats the lane's max (strict >, ``_group_first_argmax``; the TMA program's greedy
    loop since step 19)."""
    lane = tl.arange(0, BLOCK_V)
    run_max = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
    run_arg = tl.full([BLOCK_R, BLOCK_V], _BIG_INDEX, dtype=tl.int32)
    run_nan = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int1)
    offs_g = tl.arange(0, GROUPS)[None, :, None] * BLOCK_V + lane[None, None, :]
    if any_t1 > 0:
        scale = (inv_tau_r * _LOG2E)[:, None]
        if any_t0 == 0:
            for v0 in range(0, CHUNK, GROUPS * BLOCK_V):
                x = _load_groups(
                    logits_ptr, row_off, chunk_start + v0 + offs_g, mask_r, chunk_end, stride_lv
                ).to(tl.float32)
                run_max, run_sum = _sampled_group_update(
                    x, tl.max(x, axis=1), run_max, run_sum, scale
                )
        else:
            for v0 in range(0, CHUNK, GROUPS * BLOCK_V):
                x = _load_groups(
                    logits_ptr, row_off, chunk_start + v0 + offs_g, mask_r, chunk_end, stride_lv
                ).to(tl.float32)
                tile_max, run_arg = _group_first_argmax(
                    x, chunk_start + v0 + lane, run_max, run_arg
                )
                run_max, run_sum = _sampled_group_update(x, tile_max, run_max, run_sum, scale)
        run_nan = run_sum != run_sum
    else:
        for v0 in range(0, CHUNK, GROUPS * BLOCK_V):
            x = _load_groups(
                logits_ptr, row_off, chunk_start + v0 + offs_g, mask_r, chunk_end, stride_lv
            ).to(tl.float32)
            run_max, run_arg, run_nan = _greedy_group_update(
                x, chunk_start + v0 + lane, run_max, run_arg, run_nan
            )
    return run_max, run_sum, run_arg, run_nan


@triton.jit
def _chunk_statistics(
    logits_desc,
    flat0,
    logits_ptr,
    row_off,
    chunk_start,
    chunk_end,
    stride_lv,
    mask_r,
    inv_tau_r,
    any_t1,
    any_t0,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    GROUPS: tl.constexpr,
    FROM_DESC: tl.constexpr,
    STAGES: tl.constexpr,
    PURE_ONLY: tl.constexpr,
):
    """Per-lane statistics of one chunk for BLOCK_R rows: (run_max, run_sum, run_arg,
    run_nan), each [BLOCK_R, BLOCK_V]; GROUPS tiles a step (``_step_tile``).

    Sampled rows: folded into each lane with one rescale and no NaN test per element (a NaN
    shows in its lane's sum); the first argmax only where the block also holds greedy rows
    (never read for T1 rows). Greedy rows only: per lane the max, a NaN test of every
    token, and in run_arg the lane's first argmax: the step's max over its groups with the
    lowest group holding it (``_group_first_argmax``), taken where it beats the lane's max
    (strict >, so a later tie keeps the earlier token). (v5 step 12 kept the first step
    instead and read that step's tile again after the chunk, one dependent load a
    program: with chunks of 4096 that re-read cost 11% of a greedy B256 call, bench/NOTES.md,
    sixteenth session.) A step's max ignores NaN on the GPU and is NaN in Triton's
    interpreter, where numpy's maximum propagates it; either way the NaN test flags the
    row and its request ends as NAN, whatever its statistics.

    PURE_ONLY: every block that calls this holds rows of one kind (kind order's TMA boxes
    read pure groups only), so this instance carries no mixed loop. Dead code still costs:
    with the mixed loop in both instances the phase-1 program compiled to 79 registers,
    without it in the TMA one to 72 (sm_90a, bench/compile_sm90.py), and spread-mixed
    B1024 ran 3.7% faster (v5 step 22, bench/NOTES.md).
    """
    lane = tl.arange(0, BLOCK_V)
    offs_g = tl.arange(0, GROUPS)[None, :, None] * BLOCK_V + lane[None, None, :]
    run_max = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
    run_arg = tl.full([BLOCK_R, BLOCK_V], _BIG_INDEX, dtype=tl.int32)
    run_nan = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int1)
    source = (logits_desc, flat0, logits_ptr, row_off, offs_g, mask_r, chunk_end, stride_lv)
    if PURE_ONLY:
        mixed = 0  # a constant: the mixed loop below is not compiled
    else:
        mixed = any_t0
    if any_t1 > 0:
        scale = (inv_tau_r * _LOG2E)[:, None]
        if mixed == 0:
            for v0 in tl.range(0, CHUNK, GROUPS * BLOCK_V, num_stages=STAGES):
                x = _step_tile(source, chunk_start + v0, BLOCK_V, FROM_DESC).to(tl.float32)
                run_max, run_sum = _sampled_group_update(
                    x, tl.max(x, axis=1), run_max, run_sum, scale
                )
        else:
            # One box less in flight: at STAGES this loop set the program's registers (96
            # against 80 at TMA's 3), and the other loops ran 2-5% faster without it
            # (bench/NOTES.md, step 16); this loop's own speed did not change.
            for v0 in tl.range(0, CHUNK, GROUPS * BLOCK_V, num_stages=max(1, STAGES - 1)):
                x = _step_tile(source, chunk_start + v0, BLOCK_V, FROM_DESC).to(tl.float32)
                tile_max, run_arg = _group_first_argmax(
                    x, chunk_start + v0 + lane, run_max, run_arg
                )
                run_max, run_sum = _sampled_group_update(x, tile_max, run_max, run_sum, scale)
        run_nan = run_sum != run_sum
    else:
        for v0 in tl.range(0, CHUNK, GROUPS * BLOCK_V, num_stages=STAGES):
            x = _step_tile(source, chunk_start + v0, BLOCK_V, FROM_DESC).to(tl.float32)
            run_max, run_arg, run_nan = _greedy_group_update(
                x, chunk_start + v0 + lane, run_max, run_arg, run_nan
            )
    return run_max, run_sum, run_arg, run_nan


@triton.jit
def _kind_ordered_rows(temp_ptr, first_row, B, K: tl.constexpr, BLOCK_R: tl.constexpr):
    """(req, row, mask_r, pure, any_t1, any_t0) of the BLOCK_R flat rows from ``first_row``
    on, in kind order.

    The batch is cut into groups of BLOCK_R consecutive requests (BLOCK_R (K+1) rows: whole
    blocks, since BLOCK_R divides it). Within a group the requests are taken T1 first,
    then T0, each kind in request order (a stable partition by temperature), and their
    rows are laid out in that order, K+1 per request: so a group holds at most one block
    with both kinds, where the flat order gives nearly every block both when the kinds
    alternate. Virtual row f of the group is row f % (K+1) of the (f // (K+1))-th request
    in that order; rows past the batch are masked. ``pure``: the group holds one kind
    only, so the order is the flat one and the block's rows are consecutive (TMA boxes
    may read them). ``any_t1`` / ``any_t0`` (int32 0/1): the block holds a T1 / T0 row;
    its ranks lo..hi hold T1 requests below n_t1 (the group's T1 count) and T0 ones from
    n_t1 on, so both come from scalars, not from the rows' temperatures: the loop a block
    runs, and its first loads, wait for one round of scalar loads only. Every row's
    statistics are the same whichever block computes them, so the order changes no
    output, only which loop a block runs."""
    ROWS: tl.constexpr = K + 1
    group = first_row // (BLOCK_R * ROWS)
    local0 = first_row - group * (BLOCK_R * ROWS)
    local = local0 + tl.arange(0, BLOCK_R)  # the rows' virtual rows in the group
    rank = local // ROWS  # their requests' places in kind order
    first_req = group * BLOCK_R
    # Scalar work only (every thread computes it alike: no reduction, no barrier). One
    # load per request, kept as bits (t1_bits bit j: request first_req + j is T1).
    n_valid = tl.minimum(B - first_req, BLOCK_R)
    t1_bits = 0
    for j in tl.static_range(BLOCK_R):
        tau = tl.load(temp_ptr + first_req + j, mask=n_valid > j, other=0.0)
        t1_bits |= ((n_valid > j) & (tau > 0.0)).to(tl.int32) << j  # _temperature's test
    # The T1 requests take places 0, 1, ... in request order, the T0 ones the places after.
    pick = tl.full([BLOCK_R], -1, dtype=tl.int32)
    n_t1 = 0
    for j in tl.static_range(BLOCK_R):
        t1 = ((t1_bits >> j) & 1) != 0
        pick = tl.where(t1 & (rank == n_t1), j, pick)
        n_t1 += t1.to(tl.int32)
    n_t0 = 0
    for j in tl.static_range(BLOCK_R):
        t0 = (n_valid > j) & (((t1_bits >> j) & 1) == 0)
        pick = tl.where(t0 & (rank == n_t1 + n_t0), j, pick)
        n_t0 += t0.to(tl.int32)
    mask_r = pick >= 0
    req = first_req + tl.maximum(pick, 0)
    row = local % ROWS
    pure = (n_t1 == 0) | (n_t1 == n_valid)
    lo = local0 // ROWS
    hi = tl.minimum((local0 + BLOCK_R - 1) // ROWS, n_valid - 1)
    any_t1 = (lo < n_t1).to(tl.int32)
    any_t0 = (hi >= tl.maximum(lo, n_t1)).to(tl.int32)
    return req, row, mask_r, pure, any_t1, any_t0


# NSPLIT stays a runtime value even when it is 1: one code path for every split count.
@triton.jit(do_not_specialize=["NSPLIT"])
def chain_stats_kernel(
    logits_ptr,
    stride_lb,
    stride_lk,
    stride_lv,
    temp_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    ticket_ptr,
    B,
    V,
    CHUNK: tl.constexpr,
    NSPLIT,
    logits_desc,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FLAT: tl.constexpr,
    GROUPS: tl.constexpr,
    OVERLAP: tl.constexpr,
    TMA: tl.constexpr,
    KIND_ORDER: tl.constexpr,
    ARM_TICKET: tl.constexpr,
    CARVEOUT: tl.constexpr,  # not read: see pp3kernels.carveout
):
    """Phase 1: per-row partial statistics of one vocabulary chunk for a block of rows.

    Writes, for every row (request b, chain row i <= K) and this program's chunk c, at
    [b, i, c] of the [B, K+1, NSPLIT] partials: the chunk max m_c, s_c = sum over the chunk
    of exp((l - m_c)/tau) (T1 rows; T0 rows use tau = 1 and ignore it), the lowest id with
    l = m_c, and the flag bits _FLAG_NAN / _FLAG_POSINF.

    The block of BLOCK_R rows: without FLAT, the K+1 rows of each of BLOCK_B requests,
    padded to R rows per request (BLOCK_R = BLOCK_B R); with FLAT, BLOCK_R consecutive rows
    of the B (K+1) rows in request-major order (no padding rows; a block may straddle
    requests, and its last one may run past the batch, masked).

    KIND_ORDER (FLAT only): the flat rows are taken in kind order within groups of BLOCK_R
    requests (``_kind_ordered_rows``: T1 requests' rows first, then T0's), so that a
    block holds both kinds at most once a group, however the batch interleaves them.

    TMA (FLAT only; the host checks that the logits are [B (K+1), V] rows of 16-byte
    aligned stride and passes ``logits_desc``, else None): whole chunks are read as boxes
    of the tensor memory accelerator, the last, partial chunk with pointer loads, and so
    are the blocks of a kind-ordered group holding both kinds (their rows are not
    consecutive). The statistics are the same either way (same tiles, same arithmetic).

    OVERLAP (sm_90+, with the phase-2 launch made with programmatic dependent launch): every
    program lets that launch start at once, so that its programs read their inputs while
    this grid runs; they wait for this grid before reading the partials.

    ARM_TICKET (dense q with LaunchPlan.ticket): the programs of chunk 0 set the ticket of
    each phase-2 request block their rows belong to (int32 at ``ticket_ptr`` + b // BLOCK_B)
    to 0 for this call; ``chain_rescan_kernel``'s programs take it only after their wait
    for this grid.
    """
    if OVERLAP:
        # The phase-2 launch may start now: its programs read their inputs, then wait
        # (gdc_wait) until this grid is done and its partials are visible.
        gdc_launch_dependents()
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)

    # One [BLOCK_R, GROUPS, BLOCK_V] tile stream over this split's chunk; the block's rows
    # are loaded together so that their latencies overlap.
    offs_r = tl.arange(0, BLOCK_R)
    if FLAT and KIND_ORDER:
        req, row, mask_r, in_order, any_t1, any_t0 = _kind_ordered_rows(
            temp_ptr, pid_b * BLOCK_R, B, K, BLOCK_R
        )
    elif FLAT:
        flat = pid_b * BLOCK_R + offs_r
        req = flat // (K + 1)
        row = flat % (K + 1)
        mask_r = req < B
    else:
        req = pid_b * BLOCK_B + offs_r // R
        row = offs_r % R
        mask_r = (req < B) & (row <= K)
    req64 = req.to(tl.int64)
    if ARM_TICKET:
        if pid_s == 0:  # every request's rows meet chunk 0 in some program
            tl.store(ticket_ptr + req // BLOCK_B, 0, mask=mask_r)
    # (A kind-ordered block reads its rows' temperatures again, an L1 hit off the path to
    # its first loads. Taking them from _kind_ordered_rows instead cost the TMA program 16
    # registers, 80 -> 96, statically.)
    tau_r = tl.load(temp_ptr + req, mask=mask_r, other=0.0)
    t1_r, inv_tau_r = _temperature(tau_r)
    row_off = req64 * stride_lb + row.to(tl.int64) * stride_lk
    chunk_start = pid_s * CHUNK
    chunk_end = tl.minimum(chunk_start + CHUNK, V)
    if not (FLAT and KIND_ORDER):
        any_t1 = tl.max((t1_r & mask_r).to(tl.int32), axis=0)
        any_t0 = tl.max((~t1_r & mask_r).to(tl.int32), axis=0)
    if TMA:
        flat0 = pid_b * BLOCK_R
        # The runtime arguments of both instances below (source, chunk, rows, kinds).
        args = (
            logits_desc,
            flat0,
            logits_ptr,
            row_off,
            chunk_start,
            chunk_end,
            stride_lv,
            mask_r,
            inv_tau_r,
            any_t1,
            any_t0,
        )
        whole = chunk_start + CHUNK <= V
        if KIND_ORDER:
            whole = whole & in_order  # a box reads consecutive rows only
        # Boxes (FROM_DESC, pipelined), and under kind order only pure groups reach them
        # (PURE_ONLY); the last, partial chunk and mixed groups through pointer loads.
        if whole:
            run_max, run_sum, run_arg, run_nan = _chunk_statistics(
                *args, CHUNK, BLOCK_R, BLOCK_V, GROUPS, True, _TMA_STAGES, KIND_ORDER
            )
        else:
            run_max, run_sum, run_arg, run_nan = _chunk_statistics(
                *args, CHUNK, BLOCK_R, BLOCK_V, GROUPS, False, 1, False
            )
        row_max, row_sum = _combine_max_sum(run_max, run_sum, inv_tau_r[:, None], 1)
        row_arg = _first_argmax(run_max, run_arg, row_max, 1)
    else:
        run_max, run_sum, run_arg, run_nan = _pointer_lane_statistics(
            logits_ptr,
            row_off,
            chunk_start,
            chunk_end,
            stride_lv,
            mask_r,
            inv_tau_r,
            any_t1,
            any_t0,
            CHUNK,
            BLOCK_R,
            BLOCK_V,
            GROUPS,
        )
        row_max, row_sum = _combine_max_sum(run_max, run_sum, inv_tau_r[:, None], 1)
        row_arg = _first_argmax(run_max, run_arg, row_max, 1)
    # A NaN never wins a max, so it shows only in run_nan; +inf shows as the maximum.
    row_flag = tl.max(run_nan.to(tl.int32), axis=1) | tl.where(
        row_max == float("inf"), _FLAG_POSINF, 0
    )
    part = (req64 * (K + 1) + row) * NSPLIT + pid_s
    tl.store(part_max_ptr + part, row_max, mask=mask_r)
    tl.store(part_sum_ptr + part, row_sum, mask=mask_r)
    tl.store(part_arg_ptr + part, row_arg, mask=mask_r)
    tl.store(part_flag_ptr + part, row_flag, mask=mask_r)


# --------------------------------------------------------------------------------------
# Phase 2, steps 1-2: row statistics and the acceptance of every draft row
# --------------------------------------------------------------------------------------


@triton.jit
def _logits_status(p_flag, r_max, valid):
    """Per request: STATUS_NAN if any valid row saw a NaN, else STATUS_POSINF if any row's
    max is +inf, else STATUS_ALL_MASKED if any row's max is -inf, else STATUS_OK (the
    contract's order, over every row the request owns, whatever the chain does)."""
    saw_nan = tl.max(p_flag & _FLAG_NAN, axis=2) != 0
    saw_inf = tl.max(p_flag & _FLAG_POSINF, axis=2) != 0
    return _status_of_rows(saw_nan, saw_inf, r_max, valid)


@triton.jit
def _status_of_rows(saw_nan, saw_inf, r_max, valid):
    """``_logits_status`` from each row's flags (a NaN seen, a +inf max) and max."""
    code = tl.where(
        saw_nan,
        _STATUS_NAN,
        tl.where(
            saw_inf,
            _STATUS_POSINF,
            tl.where(r_max == float("-inf"), _STATUS_ALL_MASKED, _STATUS_OK),
        ),
    )
    code = tl.where(valid & (code != _STATUS_OK), code, _CLEAN_ROW)
    status = tl.min(code, axis=1)
    return tl.where(status == _CLEAN_ROW, _STATUS_OK, status)


@triton.jit
def _draft_logit(logits, offs_b64, rows, draft, t1_2d, in_range):
    """l_x as fp32 for every draft row of a T1 request (``t1_2d``) whose x is in [0, V)
    (``in_range``); -inf elsewhere, where nothing is read. Then p_x = exp((l_x - m)/tau) / s
    (``_chain_stop``), 0 where l_x is -inf."""
    logits_ptr, stride_lb, stride_lk, stride_lv = logits
    return tl.load(
        logits_ptr
        + offs_b64[:, None] * stride_lb
        + rows[None, :].to(tl.int64) * stride_lk
        + draft.to(tl.int64) * stride_lv,
        mask=t1_2d & in_range,
        other=float("-inf"),
    ).to(tl.float32)


@triton.jit
def _slot_tile(q_sparse, offs_b64, rows, drow, draft, slots, S, V):
    """Sparse q over the slots ``slots`` of every draft row: (count, mass, malformed, ids,
    positive): the count of the row's draft x among them, their total count (int64), whether
    one breaks a per-slot rule (negative count, a zero count on an id other than -1, a
    positive count on an id outside [0, V)), and the slots' ids and count > 0 masks."""
    qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs = q_sparse
    qidx = (
        offs_b64[:, None, None] * stride_qb
        + rows[None, :, None] * stride_qk
        + slots[None, None, :] * stride_qs
    )
    qmask = drow[:, :, None] & (slots < S)[None, None, :]
    q_sid = tl.load(qid_ptr + qidx, mask=qmask, other=_NO_TOKEN)
    q_cnt = tl.load(qcnt_ptr + qidx, mask=qmask, other=0)
    positive = q_cnt > 0
    count = tl.sum(tl.where((q_sid == draft[:, :, None]) & positive, q_cnt, 0), axis=2)
    q_mass = tl.sum(q_cnt.to(tl.int64), axis=2)
    slot_bad = (q_cnt < 0) | ((q_cnt == 0) & (q_sid != _NO_TOKEN))
    slot_bad = slot_bad | (positive & ((q_sid < 0) | (q_sid >= V)))
    malformed = tl.max(slot_bad.to(tl.int32), axis=2) != 0
    return count, q_mass, malformed, q_sid, positive


@triton.jit
def _sparse_q_counts(
    q_sparse,
    offs_b64,
    rows,
    drow,
    draft,
    is_t1,
    proposed,
    den64,
    bad,
    V,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    SLOT_TILE: tl.constexpr,
):
    """Integer q: (n, bad) for every draft row, n = the count of the draft x in q's row
    (over the denominator C); the draft is accepted iff U n < p_x C in fp64 (``_chain_stop``;
    exact: U has 24 significant bits, n at most 24, and p_x C is p_x scaled by a power of
    two). ``bad`` gains the host validation's rules, checked on every draft row (the status must
    not depend on where the chain stops): no negative count, padding slots carry id -1,
    support ids in [0, V) and distinct (pairwise, for S_P2 <= 16), mass C (or 0 where
    nothing is proposed or the request is greedy), and a sampled proposal inside the support.
    Past SLOT_TILE padded slots the rows are read in tiles of that many slots, so that the
    [BLOCK_B, R, slots] tiles stay in registers (the finish kernel: MAX_SLOT_TILE for its R
    rows; ``chain_counts_kernel``: R times as many for its one row).
    """
    if S_P2 <= SLOT_TILE:
        slots = tl.arange(0, S_P2)
        count, q_mass, malformed, q_sid, positive = _slot_tile(
            q_sparse, offs_b64, rows, drow, draft, slots, S, V
        )
        if S_P2 <= _MAX_PAIRWISE_SLOTS:
            same = (q_sid[:, :, :, None] == q_sid[:, :, None, :]) & (
                slots[:, None] < slots[None, :]
            )[None, None, :, :]
            dup = same & positive[:, :, :, None] & positive[:, :, None, :]
            malformed = malformed | (tl.max(tl.max(dup.to(tl.int32), axis=3), axis=2) != 0)
    else:
        count = tl.zeros_like(draft)
        q_mass = tl.zeros_like(draft).to(tl.int64)
        malformed = tl.zeros_like(draft) != 0
        for s0 in range(0, S_P2, SLOT_TILE):
            tile_count, tile_mass, tile_bad, _sid, _pos = _slot_tile(
                q_sparse, offs_b64, rows, drow, draft, s0 + tl.arange(0, SLOT_TILE), S, V
            )
            count += tile_count
            q_mass += tile_mass
            malformed = malformed | tile_bad
    zero_allowed = (draft < 0) | ~is_t1[:, None]
    mass_ok = (q_mass.to(tl.float64) == den64) | ((q_mass == 0) & zero_allowed)
    bad = bad | (drow & (malformed | ~mass_ok)) | (proposed & (count <= 0))
    return count, bad


@triton.jit
def _dense_q_x(q_dense, offs_b64, rows, draft, proposed, bad):
    """Dense float q: (q_x, bad) for every draft row; the draft is accepted iff U q_x < p_x
    in fp64 (``_chain_stop``). ``bad`` gains proposals whose q_x is not finite and positive
    (q_x is read only there)."""
    qdense_ptr, stride_qdb, stride_qdk, stride_qdv = q_dense
    q_x = tl.load(
        qdense_ptr
        + offs_b64[:, None] * stride_qdb
        + rows[None, :] * stride_qdk
        + draft.to(tl.int64) * stride_qdv,
        mask=proposed,
        other=0.0,
    ).to(tl.float32)
    bad = bad | (proposed & ~((q_x > 0.0) & (q_x < float("inf"))))
    return q_x, bad


# --------------------------------------------------------------------------------------
# Phase 2, step 3: the stop row's draw (chunk -> tile -> token)
# --------------------------------------------------------------------------------------


@triton.jit
def _row_weights(
    row,
    q,
    resid,
    tile_start,
    offs_v,
    mask_v,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """Residual weights r_v of one [BLOCK_B, BLOCK_F] tile (ids ``offs_v``, starting at
    ``tile_start``), in units of e_v = exp((l_v - m)/tau).

    r_v = max(e_v - q_v s, 0) where the request is in residual mode (``resid``: its stop row
    rejected a draft) and v is in q's support (sparse, q_v = count / C) or anywhere (dense);
    r_v = e_v otherwise. Masked lanes weigh 0. Sparse q costs S passes over the tile up to
    MAX_LOOPED_SLOTS slots, and O(BLOCK_F + S) above (``_scatter_residuals``).
    """
    logits_ptr, row_off, stride_lv, row_max, row_sum, inv_tau = row
    qid_ptr, qcnt_ptr, q_row_off, stride_qs, qdense_ptr, qd_row_off, stride_qdv, inv_den = q[0:8]
    if UNPIN and row_max.shape[0] == 1:
        row_off = _unpinned(row_off)  # one request a program: see _unpinned
        row_max = _unpinned(row_max)
        inv_tau = _unpinned(inv_tau)
    ptrs = logits_ptr + row_off[:, None] + offs_v.to(tl.int64) * stride_lv
    logit = tl.load(ptrs, mask=mask_v, other=float("-inf")).to(tl.float32)
    e = tl.exp((logit - row_max[:, None]) * inv_tau[:, None])
    e = tl.where(mask_v, e, 0.0)
    SCATTER: tl.constexpr = Q_MODE == _Q_SPARSE and S > _MAX_LOOPED_SLOTS
    # q's slot tensors [BLOCK_B, S_P2] hold the stop row's ids and counts, but no logits: the
    # ticketed finish read them first (``_preloaded_support``, v5 step 45)
    PRELOADED: tl.constexpr = q[10].shape[1] == S_P2 and q[12].shape[1] != S_P2
    if SCATTER and PRELOADED:
        # a request block with no rejected stop row skips the scatter, which would change no
        # weight (step 45c). The call is written twice on purpose: the skip in every plan
        # made B64 S = 1024's finish 4.6% slower (step 45b).
        if tl.max(resid.to(tl.int32), axis=0) > 0:
            e = _scatter_residuals(
                e,
                mask_v,
                q,
                resid,
                tile_start,
                row_max,
                row_sum,
                inv_tau,
                S,
                S_P2,
                BLOCK_F,
                PRELOADED,
                UNPIN,
            )
    elif SCATTER:
        e = _scatter_residuals(
            e,
            mask_v,
            q,
            resid,
            tile_start,
            row_max,
            row_sum,
            inv_tau,
            S,
            S_P2,
            BLOCK_F,
            PRELOADED,
            UNPIN,
        )
    elif Q_MODE == _Q_SPARSE:
        for s in range(S):
            sid = tl.load(qid_ptr + q_row_off + s * stride_qs, mask=resid, other=_NO_TOKEN)
            cnt = tl.load(qcnt_ptr + q_row_off + s * stride_qs, mask=resid, other=0)
            q_scaled = cnt.to(tl.float32) * inv_den * row_sum
            hit = (offs_v == sid[:, None]) & (resid & (cnt > 0))[:, None]
            e = tl.where(hit, tl.maximum(e - q_scaled[:, None], 0.0), e)
    if Q_MODE == _Q_DENSE:
        qd_ptrs = qdense_ptr + qd_row_off[:, None] + offs_v.to(tl.int64) * stride_qdv
        qd = tl.load(qd_ptrs, mask=mask_v & resid[:, None], other=0.0).to(tl.float32)
        e = tl.where(resid[:, None], tl.maximum(e - qd * row_sum[:, None], 0.0), e)
    return e


@triton.jit
def _unpinned(x):
    """x ([1]) rebuilt from its one value: the same value, in no register layout of its own
    (a -0.0 comes back as +0.0, which no comparison or difference tells apart).

    A [1] value that comes out of a reduction, or a load, keeps that tensor's layout;
    broadcast into a tile of another layout it costs a layout conversion (a shared-memory
    round trip with block barriers) at every use, or makes Triton lay the whole tile out
    like it, with most of the tile replicated in every thread (sparse q's split-support
    finish spilled 6 KB a thread that way; bench/NOTES.md, step 25). Rebuilt from a scalar,
    it takes each tile's layout for free. The GPU plans run one request a program (BLOCK_B
    = 1), so phase 2 unpins every per-request value where it is made (``_requests``,
    ``_chain_stop``, the chunk pick: step 29), and the draw helpers again under UNPIN
    (sparse q; dense q and the rescan walk only where the support is split: they compiled
    to more block barriers unpinned, bench/NOTES.md, twenty-sixth session).
    """
    return tl.full([1], 0, x.dtype) + tl.sum(x, axis=0)


@triton.jit
def _unpinned_flag(x):
    """``_unpinned`` for a boolean [1] value."""
    return _unpinned(x.to(tl.int32)) != 0


@triton.jit
def _unpinned_each(values):
    """Each [1] value of the tuple ``values`` unpinned, in order: ``_unpinned_flag`` for a
    boolean, ``_unpinned`` otherwise."""
    unpinned: tl.tuple = ()
    for i in tl.static_range(len(values)):
        if values[i].dtype == tl.int1:
            unpinned = unpinned + (_unpinned_flag(values[i]),)
        else:
            unpinned = unpinned + (_unpinned(values[i]),)
    return unpinned


@triton.jit
def _scatter_residuals(
    e,
    mask_v,
    q,
    resid,
    tile_start,
    row_max,
    row_sum,
    inv_tau,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PRELOADED: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """The tile e with r_s = max(e_s - q_s s, 0) in place of e_s at every support id s of q
    that falls in it (rows where ``resid``), q_s = count / C: the same values as the
    slot-by-slot loop of ``_row_weights``, in O(BLOCK_F + S) instead of O(BLOCK_F S).

    Through the request's scratch row: store the tile, then the support's r_s over it, load
    the tile back, with a barrier between the steps (the program's threads exchange values
    through global memory). Where the kernel read the stop row's support before the wait
    (q's slot tensors are [BLOCK_B, S_P2]), r_s comes from those logits, e_s =
    exp((l_s - m)/tau) as the tile computes it, on the lanes ``mask_v`` keeps (a prefix of
    the tile: its masked lanes weigh 0, as their stored e does); otherwise the ids and counts
    are taken from q (``PRELOADED``: the ticketed finish read them first,
    ``_preloaded_support``) or read here, and e_s is gathered from the stored tile. Support
    ids are distinct (validated; for unvalidated q with duplicate ids one of the writes wins,
    where the loop would apply both).
    """
    qid_ptr, qcnt_ptr, q_row_off, stride_qs, _qd, _qd_off, _qd_stride, inv_den = q[0:8]
    scr, scr_off, slot_id, slot_count, slot_logit = q[8:13]
    if UNPIN and resid.shape[0] == 1:  # see _unpinned
        resid = _unpinned_flag(resid)
        tile_start = _unpinned(tile_start)
        row_sum = _unpinned(row_sum)
        q_row_off = _unpinned(q_row_off)
        scr_off = _unpinned(scr_off)
    tile_ptrs = scr + scr_off[:, None] + tl.arange(0, BLOCK_F)[None, :]
    slots = tl.arange(0, S_P2)
    smask = resid[:, None] & (slots < S)[None, :]
    if slot_logit.shape[1] == S_P2:  # read before the wait: no load after it but the tile's
        lanes = tl.sum(mask_v.to(tl.int32), axis=1)
        s_pos = slot_id - tile_start[:, None]
        hit = smask & (slot_count > 0) & (s_pos >= 0) & (s_pos < lanes[:, None])
        e_s = tl.exp((slot_logit - row_max[:, None]) * inv_tau[:, None])
        r_s = tl.maximum(e_s - slot_count.to(tl.float32) * inv_den * row_sum[:, None], 0.0)
        s_ptrs = scr + scr_off[:, None] + s_pos
        tl.debug_barrier()  # every thread is done with the scratch row's previous tile
        tl.store(tile_ptrs, e)
        tl.debug_barrier()  # the tile is stored
        tl.store(s_ptrs, r_s, mask=hit)
    else:
        tl.debug_barrier()  # every thread is done with the scratch row's previous tile
        tl.store(tile_ptrs, e)
        if PRELOADED:  # ids and counts read at the ticketed finish's start
            s_id = slot_id
            s_cnt = slot_count
        else:
            sidx = q_row_off[:, None] + slots[None, :] * stride_qs
            s_id = tl.load(qid_ptr + sidx, mask=smask, other=_NO_TOKEN)
            s_cnt = tl.load(qcnt_ptr + sidx, mask=smask, other=0)
        s_pos = s_id - tile_start[:, None]
        hit = smask & (s_cnt > 0) & (s_pos >= 0) & (s_pos < BLOCK_F)
        s_ptrs = scr + scr_off[:, None] + s_pos
        tl.debug_barrier()  # the tile is stored
        e_s = tl.load(s_ptrs, mask=hit, other=0.0)
        q_scaled = s_cnt.to(tl.float32) * inv_den * row_sum[:, None]
        tl.store(s_ptrs, tl.maximum(e_s - q_scaled, 0.0), mask=hit)
    tl.debug_barrier()  # the residuals are stored
    return tl.load(tile_ptrs)


@triton.jit
def _preloaded_support(q, resid, S: tl.constexpr, S_P2: tl.constexpr):
    """``q`` with the stop row's support ids and counts, [BLOCK_B, S_P2], read now in place of
    the placeholders (id -1 and count 0 past S and on rows not in ``resid``): the ticketed
    finish of a split support reads them before it adds the tiles' sums, so that the draw's
    scatter (``_scatter_residuals``) waits on no load of q after the pick (v5 step 45)."""
    qid_ptr, qcnt_ptr, q_stop, stride_qs = q[0:4]
    slots = tl.arange(0, S_P2)
    sidx = q_stop[:, None] + slots[None, :] * stride_qs
    smask = resid[:, None] & (slots < S)[None, :]
    s_id = tl.load(qid_ptr + sidx, mask=smask, other=_NO_TOKEN)
    s_cnt = tl.load(qcnt_ptr + sidx, mask=smask, other=0)
    return q[0:10] + (s_id, s_cnt, q[12])


@triton.jit
def _chunk_walk(
    row,
    q,
    resid,
    live,
    chunk_start,
    CHUNK: tl.constexpr,
    V,
    target,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """Walk one chunk tile by tile (rows where ``live``), summing r_v in fp64 per tile.

    Returns (total, tile, before): the chunk's total weight T = sum of the tile sums, the
    start of the first tile whose running total exceeds ``target`` (else the last tile with
    positive weight, else -1), and the running total before that tile. One cumulative sum
    inside one tile then finishes the draw (``_tile_pick``). An exact rescan of the chunk's
    mass is the same walk with target = +inf, so the mass and the draw share their sums.
    """
    chunk_end = tl.minimum(chunk_start + CHUNK, V)
    carry = tl.zeros([BLOCK_B], dtype=tl.float64)
    hit_tile = tl.full([BLOCK_B], -1, dtype=tl.int32)
    hit_before = tl.zeros([BLOCK_B], dtype=tl.float64)
    last_tile = tl.full([BLOCK_B], -1, dtype=tl.int32)
    last_before = tl.zeros([BLOCK_B], dtype=tl.float64)
    lane = tl.arange(0, BLOCK_F)
    for v0 in range(0, CHUNK, BLOCK_F):
        offs_v = chunk_start[:, None] + v0 + lane[None, :]
        mask_v = (offs_v < chunk_end[:, None]) & live[:, None]
        w = _row_weights(
            row, q, resid, chunk_start + v0, offs_v, mask_v, Q_MODE, S, S_P2, BLOCK_F, UNPIN
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
    row,
    q,
    resid,
    live,
    tile_start,
    tile_end,
    target,
    before,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """The first id v in [tile_start, tile_end) whose running sum before + sum_{w <= v} r_w
    (fp64) exceeds ``target``: it has r_v > 0, since the sum grows only there. Where rounding
    left the target past the tile's end, the tile's last positive-weight id; -1 where the
    tile is -1 (no positive weight in the chunk) or the row is not ``live``."""
    offs_v = tile_start[:, None] + tl.arange(0, BLOCK_F)[None, :]
    mask_v = (offs_v < tile_end[:, None]) & ((tile_start >= 0) & live)[:, None]
    w = _row_weights(row, q, resid, tile_start, offs_v, mask_v, Q_MODE, S, S_P2, BLOCK_F, UNPIN)
    running = before[:, None] + tl.cumsum(w.to(tl.float64), axis=1)
    first = tl.min(tl.where((running > target[:, None]) & mask_v, offs_v, _BIG_INDEX), axis=1)
    last_positive = tl.max(tl.where((w > 0.0) & mask_v, offs_v, -1), axis=1)
    return tl.where(first < _BIG_INDEX, first, last_positive)


@triton.jit
def _chunk_masses(p_max, p_sum, at_stop, stop_max, inv_tau):
    """M_c = s_c exp((m_c - m)/tau) for every chunk c of the stop row (fp32, returned as
    fp64): the chunk's sum of e_v from its partials (m_c, s_c), rescaled to the row max m;
    0 for a chunk of only -inf."""
    sel = at_stop[:, :, None]
    c_max = tl.max(tl.where(sel, p_max, float("-inf")), axis=1)
    c_sum = tl.sum(tl.where(sel, p_sum, 0.0), axis=1)
    c_live = c_max != float("-inf")
    return tl.where(c_live, c_sum * tl.exp((c_max - stop_max[:, None]) * inv_tau[:, None]), 0.0).to(
        tl.float64
    )


@triton.jit
def _add_eight(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """tl.reduce's combine for eight sums in one reduction: elementwise a + b."""
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7


# Combines for several reductions along one axis taken as one tl.reduce (step 31; one
# request a program only: Triton's interpreter runs a custom combine element by element,
# and its plans put many requests in a program). On the GPU a reduction across the
# program's warps goes through shared memory between block barriers; one tl.reduce of
# several operands shares them. Each operand is combined as tl.sum / tl.max / tl.min
# combine it, so the values are theirs. Not merged, though measured: the chunk masses'
# max and sum, and the membership's two sums (each doubled the point finish's shared
# memory, 1 -> 2 KB, and that finish then ran B4 calls 2.8 µs slower, B1 and B16 not;
# bench/NOTES.md, step 31).
@triton.jit
def _add_four(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _min_max(a0, a1, b0, b1):
    return tl.minimum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def _add_add_max(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, tl.maximum(a2, b2)


@triton.jit
def _max_max_max(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), tl.maximum(a2, b2)


@triton.jit
def _add_min(a0, a1, b0, b1):
    return a0 + b0, tl.minimum(a1, b1)


@triton.jit
def _add_min_max(a0, a1, a2, b0, b1, b2):
    return a0 + b0, tl.minimum(a1, b1), tl.maximum(a2, b2)


@triton.jit
def _place_four(per_chunk, splits, c0, v0, v1, v2, v3):
    """``per_chunk`` ([BLOCK_B, NSPLIT_P2]) with columns c0 .. c0 + 3 set to v0 .. v3."""
    per_chunk = tl.where(splits[None, :] == c0, v0[:, None], per_chunk)
    per_chunk = tl.where(splits[None, :] == c0 + 1, v1[:, None], per_chunk)
    per_chunk = tl.where(splits[None, :] == c0 + 2, v2[:, None], per_chunk)
    return tl.where(splits[None, :] == c0 + 3, v3[:, None], per_chunk)


@triton.jit
def _support_terms(row, q, resid, slots, chunk, V, S):
    """The support slots ``slots`` of each stop row (rows where ``resid``), as the
    corrections take them: (e_s, r_s, chunk id) per slot (``_slot_terms``), read here: q's
    ids and counts, then the logits at those ids."""
    logits_ptr, stop_off, stride_lv, stop_max, stop_sum, inv_tau = row
    qid_ptr, qcnt_ptr, q_stop, stride_qs, _qdense_ptr, _qd_stop, _stride_qdv, inv_den = q[0:8]
    sidx = q_stop[:, None] + slots[None, :] * stride_qs
    smask = resid[:, None] & (slots < S)[None, :]
    s_id = tl.load(qid_ptr + sidx, mask=smask, other=_NO_TOKEN)
    s_cnt = tl.load(qcnt_ptr + sidx, mask=smask, other=0)
    s_ok = smask & (s_cnt > 0) & (s_id >= 0) & (s_id < V)
    s_logit = tl.load(
        logits_ptr + stop_off[:, None] + s_id.to(tl.int64) * stride_lv,
        mask=s_ok,
        other=float("-inf"),
    ).to(tl.float32)
    return _slot_terms(row, inv_den, smask, s_id, s_cnt, s_logit, chunk, V)


@triton.jit
def _slot_terms(row, inv_den, smask, s_id, s_cnt, s_logit, chunk, V):
    """(e_s, r_s, chunk id) of the support slots (ids ``s_id``, counts ``s_cnt``, logits at
    the ids ``s_logit``) that ``smask`` keeps: e_s = exp((l_s - m)/tau) and
    r_s = max(e_s - q_s s, 0) in fp32, both 0 and the chunk id -1 on a slot that carries no
    mass (padding, count <= 0, an id outside [0, V), past S) or a row not in ``resid``."""
    _logits_ptr, _stop_off, _stride_lv, stop_max, stop_sum, inv_tau = row
    s_ok = smask & (s_cnt > 0) & (s_id >= 0) & (s_id < V)
    s_e = tl.where(s_ok, tl.exp((s_logit - stop_max[:, None]) * inv_tau[:, None]), 0.0)
    s_r = tl.maximum(s_e - s_cnt.to(tl.float32) * inv_den * stop_sum[:, None], 0.0)
    s_r = tl.where(s_ok, s_r, 0.0)
    s_chunk = tl.where(s_ok, s_id // chunk, -1)
    return s_e, s_r, s_chunk


@triton.jit
def _stop_slot_terms(row, q, resid, slots, chunk, V, S):
    """``_support_terms`` of the slots ``slots`` from q's slot tensors, which the kernel read
    before the wait (``_stop_row_slots``), where it did, and read now otherwise."""
    _qid, _qcnt, _q_stop, _stride_qs, _qd, _qd_stop, _stride_qdv, inv_den = q[0:8]
    _scr, _scr_off, slot_id, slot_count, slot_logit = q[8:13]
    if slot_id.shape[1] == slots.shape[0]:
        smask = resid[:, None] & (slots < S)[None, :]
        return _slot_terms(row, inv_den, smask, slot_id, slot_count, slot_logit, chunk, V)
    else:
        return _support_terms(row, q, resid, slots, chunk, V, S)


@triton.jit
def _corrected_masses(full_mass, sup_e, sup_r, NSPLIT):
    """(mass, rescan) per chunk from the support's sums per chunk (``sup_e`` = sum_s e_s,
    ``sup_r`` = sum_s r_s over the chunk's support tokens, fp64): a chunk c holding some gets
    W_c = max(M_c - sum_s e_s, 0) + sum_s r_s, the others keep M_c; ``rescan`` marks the
    corrected chunks whose remainder M_c - sum_s e_s is at most 2^-18 M_c (see
    _RESCAN_BELOW), and every corrected chunk of a one-chunk row, where a rescan is as cheap
    as the correction is inexact."""
    dirty = sup_e > 0.0
    remainder = full_mass - sup_e
    mass = tl.where(dirty, tl.maximum(remainder, 0.0) + sup_r, full_mass)
    rescan = dirty & ((remainder <= full_mass * _RESCAN_BELOW) | (NSPLIT == 1))
    return mass, rescan


@triton.jit
def _support_corrections(
    row,
    q,
    resid,
    full_mass,
    splits,
    chunk,
    V,
    NSPLIT,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Sparse q: (mass, rescan) per chunk of the stop row (``_corrected_masses``), the
    support's sums per chunk taken here over all S slots at once.

    The residual differs from e only on the S support tokens of a rejected draft, so only
    the chunks holding some of them change (``_support_terms``, ``_corrected_masses``).
    """
    if S_P2 * NSPLIT_P2 <= _MAX_MEMBERSHIP_TILE:  # one [S_P2, NSPLIT_P2] membership tile
        s_e, s_r, s_chunk = _stop_slot_terms(row, q, resid, tl.arange(0, S_P2), chunk, V, S)
        sup_e, sup_r = _membership_sums(s_e, s_r, s_chunk, splits)
    else:  # four chunks at a time: their eight [S_P2] sums in one reduction
        s_e, s_r, s_chunk = _stop_slot_terms(row, q, resid, tl.arange(0, S_P2), chunk, V, S)
        sup_e = tl.zeros([BLOCK_B, NSPLIT_P2], dtype=tl.float64)
        sup_r = tl.zeros([BLOCK_B, NSPLIT_P2], dtype=tl.float64)
        # r_s <= e_s for every term (q_s s >= 0; a request whose logits hold a NaN or +inf
        # is not in ``resid``), so this select changes nothing but the chunk ids' register
        # layout, once, to the terms': without it every mask of the loop is converted, a
        # shared-memory round trip with two block barriers each (bench/compile_sm90.py).
        s_chunk = tl.where(s_r <= s_e, s_chunk, -1)
        for c0 in range(0, NSPLIT_P2, 4):  # NSPLIT_P2 is a power of two >= 8
            e0, e1, e2, e3, r0, r1, r2, r3 = tl.reduce(
                (
                    tl.where(s_chunk == c0, s_e, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 1, s_e, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 2, s_e, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 3, s_e, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0, s_r, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 1, s_r, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 2, s_r, 0.0).to(tl.float64),
                    tl.where(s_chunk == c0 + 3, s_r, 0.0).to(tl.float64),
                ),
                1,
                _add_eight,
            )
            sup_e = _place_four(sup_e, splits, c0, e0, e1, e2, e3)
            sup_r = _place_four(sup_r, splits, c0, r0, r1, r2, r3)
    return _corrected_masses(full_mass, sup_e, sup_r, NSPLIT)


@triton.jit
def _membership_sums(s_e, s_r, s_chunk, splits):
    """Support slots' terms summed per chunk: (sum_s e_s, sum_s r_s) over the slots in each
    chunk, [BLOCK_B, NSPLIT_P2] in fp64, from one [slots, NSPLIT_P2] membership tile
    (``chain_support_kernel`` for its tile of slots, and ``_support_corrections`` for a
    narrow support: all its slots as one tile)."""
    in_c = s_chunk[:, :, None] == splits[None, None, :]
    sup_e = tl.sum(tl.where(in_c, s_e[:, :, None], 0.0).to(tl.float64), axis=1)
    sup_r = tl.sum(tl.where(in_c, s_r[:, :, None], 0.0).to(tl.float64), axis=1)
    return sup_e, sup_r


@triton.jit
def _summed_support_tiles(
    sup_ptrs,
    offs_b64,
    resid,
    splits,
    split_ok,
    NSPLIT,
    NSPLIT_P2: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """The support's sums per chunk of each stop row (rows where ``resid``), from the
    per-tile sums ``chain_support_kernel`` wrote at [b, t, c] of its two [B, TILES, NSPLIT]
    fp64 buffers: the tiles added in a fixed order (blocks of MAX_MEMBERSHIP_TILE /
    NSPLIT_P2 tiles, each block summed by one reduction, the blocks in turn), so that the
    bits depend on the plan and the inputs only."""
    sup_e_ptr, sup_r_ptr = sup_ptrs
    T_BLOCK: tl.constexpr = _MAX_MEMBERSHIP_TILE // NSPLIT_P2
    sup_e = tl.zeros([BLOCK_B, NSPLIT_P2], dtype=tl.float64)
    sup_r = tl.zeros([BLOCK_B, NSPLIT_P2], dtype=tl.float64)
    for t0 in range(0, TILES, T_BLOCK):
        tiles = t0 + tl.arange(0, T_BLOCK)
        idx = (offs_b64[:, None, None] * TILES + tiles[None, :, None]) * NSPLIT + splits[
            None, None, :
        ]
        ok = resid[:, None, None] & (tiles < TILES)[None, :, None] & split_ok[None, None, :]
        sup_e += tl.sum(tl.load(sup_e_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg"), axis=1)
        sup_r += tl.sum(tl.load(sup_r_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg"), axis=1)
    return sup_e, sup_r


@triton.jit
def _rescan_chunks(
    row,
    q,
    resid,
    rescan,
    mass,
    splits,
    chunk: tl.constexpr,
    V,
    NSPLIT_P2: tl.constexpr,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """``mass`` with every chunk marked in ``rescan`` replaced by its exact residual total:
    one ``_chunk_walk`` per chunk that some request needs, the very sums the draw will use."""
    if tl.max(tl.max(rescan.to(tl.int32), axis=1), axis=0) > 0:
        for c in range(NSPLIT_P2):  # padded chunks (c >= NSPLIT) never rescan
            rescan_c = tl.max(tl.where(splits[None, :] == c, rescan, 0), axis=1) != 0
            if tl.max(rescan_c.to(tl.int32), axis=0) > 0:
                total, _t, _b = _chunk_walk(
                    row,
                    q,
                    resid,
                    rescan_c,
                    tl.zeros([BLOCK_B], tl.int32) + c * chunk,
                    chunk,
                    V,
                    tl.full([BLOCK_B], float("inf"), tl.float64),
                    Q_MODE,
                    S,
                    S_P2,
                    BLOCK_B,
                    BLOCK_F,
                    UNPIN,
                )
                hit = rescan_c[:, None] & (splits[None, :] == c)
                mass = tl.where(hit, total[:, None], mass)
    return mass


@triton.jit
def _pick_chunk(
    mass,
    full_mass,
    split_ok,
    splits,
    resid,
    need_sample,
    seed,
    position,
    stop_row,
    NSPLIT_P2: tl.constexpr,
):
    """(pick, inner, resid): the chunk c that the inverse CDF over chunk masses names for the
    uniform u (first c with sum_{c' <= c} W_c' > u sum W and W_c > 0; else the last chunk
    of positive mass), and the target inside it, u sum W - sum_{c' < c} W_c'.

    A request whose residual is empty in floats (only reachable through rounding: p and q
    agree to within it) samples p instead: its masses become M_c and ``resid`` is cleared.
    """
    mass = tl.where(split_ok[None, :], mass, 0.0)
    total_mass = tl.sum(mass, axis=1)
    empty = need_sample & ~(total_mass > 0.0)
    resid = resid & ~empty
    mass = tl.where(empty[:, None], tl.where(split_ok[None, :], full_mass, 0.0), mass)
    cumulative = tl.cumsum(mass, axis=1)
    total_mass = tl.sum(mass, axis=1)
    u = sample_uniform(seed, position + stop_row)
    target = u * total_mass
    past = (cumulative > target[:, None]) & (mass > 0.0)
    crossed = tl.where(past, splits[None, :], NSPLIT_P2)
    nonzero = tl.where(mass > 0.0, splits[None, :], -1)
    if mass.shape[0] == 1:  # one request a program: one reduction (see _add_four)
        pick, last_nonzero = tl.reduce((crossed, nonzero), 1, _min_max)
    else:
        pick = tl.min(crossed, axis=1)
        last_nonzero = tl.max(nonzero, axis=1)
    pick = tl.maximum(tl.where(pick >= NSPLIT_P2, last_nonzero, pick), 0)
    before_chunk = tl.sum(tl.where(splits[None, :] < pick[:, None], mass, 0.0), axis=1)
    return pick, target - before_chunk, resid


@triton.jit
def _one_tile_draw(
    row,
    q,
    resid,
    live,
    chunk_start,
    target,
    V,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """``_chunk_walk`` then ``_tile_pick`` for a chunk that is one tile, from one read of it:
    the tile's weights w_v, their total T (fp64) and running sums 0 + sum_{w <= v} w_v
    (fp64, as _tile_pick's with the walk's before = 0); where T > 0 the first id whose
    running sum exceeds ``target`` (else the last positive-weight id), where T = 0 or the
    row is not ``live``, -1. Same bits as the walk and pick, one tile load and one pass of
    exponentials instead of two."""
    offs_v = chunk_start[:, None] + tl.arange(0, BLOCK_F)[None, :]
    mask_v = (offs_v < V) & live[:, None]
    w = _row_weights(row, q, resid, chunk_start, offs_v, mask_v, Q_MODE, S, S_P2, BLOCK_F, UNPIN)
    w64 = w.to(tl.float64)
    running = tl.cumsum(w64, axis=1)
    crossed = tl.where((running > target[:, None]) & mask_v, offs_v, _BIG_INDEX)
    positive = tl.where((w > 0.0) & mask_v, offs_v, -1)
    if w.shape[0] == 1:  # one request a program: one reduction (see _add_four)
        total, first, last_positive = tl.reduce((w64, crossed, positive), 1, _add_min_max)
    else:
        total = tl.sum(w64, axis=1)
        first = tl.min(crossed, axis=1)
        last_positive = tl.max(positive, axis=1)
    token = tl.where(first < _BIG_INDEX, first, last_positive)
    return tl.where(total > 0.0, token, -1)


@triton.jit
def _draw_in_chunk(
    row,
    q,
    resid,
    need_sample,
    pick,
    inner,
    chunk: tl.constexpr,
    V,
    Q_MODE: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_F: tl.constexpr,
    UNPIN: tl.constexpr,
):
    """The token of chunk ``pick`` at which the running sum of r_v exceeds ``inner``: the
    tile by its tile sums (``_chunk_walk``), then the token inside it (``_tile_pick``); a
    chunk of one tile (chunk = BLOCK_F) in one read (``_one_tile_draw``)."""
    if chunk == BLOCK_F:
        return _one_tile_draw(
            row, q, resid, need_sample, pick * chunk, inner, V, Q_MODE, S, S_P2, BLOCK_F, UNPIN
        )
    _total, tile, before = _chunk_walk(
        row,
        q,
        resid,
        need_sample,
        pick * chunk,
        chunk,
        V,
        inner,
        Q_MODE,
        S,
        S_P2,
        BLOCK_B,
        BLOCK_F,
        UNPIN,
    )
    tile_end = tl.minimum(tl.minimum(tile + BLOCK_F, pick * chunk + chunk), V)
    return _tile_pick(
        row, q, resid, need_sample, tile, tile_end, inner, before, Q_MODE, S, S_P2, BLOCK_F, UNPIN
    )


@triton.jit
def _row_statistics(
    partials, offs_b64, rows, valid, splits, split_ok, inv_tau, NSPLIT, K, MERGED: tl.constexpr
):
    """Every row's partials at once, [BLOCK_B, R, NSPLIT_P2], into row statistics: (p_max,
    p_sum, m, s, the first argmax, the request's logits status). MERGED: in two reductions
    of several operands (``_add_four``; one request a program only)."""
    part_max_ptr, part_sum_ptr, part_arg_ptr, part_flag_ptr = partials
    prow = offs_b64[:, None] * (K + 1) + rows[None, :]
    pidx = prow[:, :, None] * NSPLIT + splits[None, None, :]
    pmask = valid[:, :, None] & split_ok[None, None, :]
    p_max = tl.load(part_max_ptr + pidx, mask=pmask, other=float("-inf"))
    p_sum = tl.load(part_sum_ptr + pidx, mask=pmask, other=0.0)
    p_arg = tl.load(part_arg_ptr + pidx, mask=pmask, other=_BIG_INDEX)
    p_flag = tl.load(part_flag_ptr + pidx, mask=pmask, other=0)
    if MERGED:
        r_max, nan_flags, inf_flags = tl.reduce(
            (p_max, p_flag & _FLAG_NAN, p_flag & _FLAG_POSINF), 2, _max_max_max
        )
        r_sum, greedy = tl.reduce(
            (
                _rescaled_sums(p_max, p_sum, r_max, inv_tau[:, None, None], 2),
                _argmax_candidates(p_max, p_arg, r_max, 2),
            ),
            2,
            _add_min,
        )
        status = _status_of_rows(nan_flags != 0, inf_flags != 0, r_max, valid)
        return p_max, p_sum, r_max, r_sum, greedy, status
    r_max, r_sum = _combine_max_sum(p_max, p_sum, inv_tau[:, None, None], 2)
    greedy = _first_argmax(p_max, p_arg, r_max, 2)
    status = _logits_status(p_flag, r_max, valid)
    return p_max, p_sum, r_max, r_sum, greedy, status


@triton.jit
def _draft_row_slots(logits, q_sparse, offs_b64, rows, t1_rows, slots, S, V):
    """Sparse q's slots ``slots`` of every draft row of a T1 request (``t1_rows``), read
    before the wait, when the stop row is not known yet: (ids, counts, logits at the ids),
    [BLOCK_B, R, SLOTS]; id -1, count 0 and logit -inf where nothing is read (a masked row
    or slot; the logit also at a count <= 0 or an id outside [0, V))."""
    logits_ptr, stride_lb, stride_lk, stride_lv = logits
    qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs = q_sparse
    rows64 = rows.to(tl.int64)[None, :, None]
    qidx = (
        offs_b64[:, None, None] * stride_qb + rows64 * stride_qk + slots[None, None, :] * stride_qs
    )
    qmask = t1_rows[:, :, None] & (slots < S)[None, None, :]
    s_id = tl.load(qid_ptr + qidx, mask=qmask, other=_NO_TOKEN)
    s_cnt = tl.load(qcnt_ptr + qidx, mask=qmask, other=0)
    s_ok = qmask & (s_cnt > 0) & (s_id >= 0) & (s_id < V)
    s_logit = tl.load(
        logits_ptr
        + offs_b64[:, None, None] * stride_lb
        + rows64 * stride_lk
        + s_id.to(tl.int64) * stride_lv,
        mask=s_ok,
        other=float("-inf"),
    ).to(tl.float32)
    return s_id, s_cnt, s_logit


@triton.jit
def _stop_row_slots(draft_row_slots, at_stop):
    """The stop row's slots out of ``_draft_row_slots``' [BLOCK_B, R, SLOTS] tensors:
    [BLOCK_B, SLOTS] (id 0, count 0, logit -inf where the stop row is the bonus row, which
    has no q)."""
    s_id, s_cnt, s_logit = draft_row_slots
    sel = at_stop[:, :, None]
    if sel.shape[0] == 1:  # one request a program: one reduction (see _add_four)
        return tl.reduce(
            (
                tl.where(sel, s_id, 0),
                tl.where(sel, s_cnt, 0),
                tl.where(sel, s_logit, float("-inf")),
            ),
            1,
            _add_add_max,
        )
    return (
        tl.sum(tl.where(sel, s_id, 0), axis=1),
        tl.sum(tl.where(sel, s_cnt, 0), axis=1),
        tl.max(tl.where(sel, s_logit, float("-inf")), axis=1),
    )


@triton.jit
def _chain_stop(
    logits,
    drafts,
    q_sparse,
    q_dense,
    q_counted,
    partials,
    offs_b,
    mask_b,
    is_t1,
    inv_tau,
    seed,
    position,
    V,
    NSPLIT,
    denominator_f,
    K: tl.constexpr,
    R: tl.constexpr,
    S: tl.constexpr,
    S_P2: tl.constexpr,
    Q_MODE: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    OVERLAP: tl.constexpr,
    SUPPORT_TILE: tl.constexpr,
    prefetch,
    PREFETCH: tl.constexpr,
):
    """Phase 2, steps 1-2 for the requests ``offs_b``: their rows' statistics from the
    partials and the chain's stop row. Every phase-2 kernel after the counts runs it, so
    that they agree. Sparse q with SUPPORT_TILE > 0 takes each draft row's count and q
    verdict from ``q_counted`` (``chain_counts_kernel`` wrote them; read after the wait),
    otherwise reads q's slots here (``_sparse_q_counts``). With PREFETCH (sparse q), it
    also reads the slots ``prefetch`` of every draft row and the logits at their ids before
    the wait (``_draft_row_slots``), so that the stop row's support terms need no load after
    it.

    Returns (status, stop_row, draft, need_sample, resid, stop_max, stop_sum, final,
    at_stop, p_max, p_sum, stop_slots): the request's status; its stop row (= its accepted
    count); the draft rows; whether its stop row is drawn (an OK T1 request); whether,
    drawn, the stop row rejected a draft (the draw samples (p - q)+ there); the stop row's
    max m and sum s; the greedy token of the stop row (-1 for T1); the stop row's mask over
    the [BLOCK_B, R] rows; the partials' max and sum, [BLOCK_B, R, NSPLIT_P2]; and with
    PREFETCH the stop row's slots ``prefetch`` (ids, counts, logits; ``_stop_row_slots``),
    else [BLOCK_B, 1] placeholders.
    """
    draft_ptr, stride_db, stride_dk = drafts
    offs_b64 = offs_b.to(tl.int64)
    rows = tl.arange(0, R)
    valid = mask_b[:, None] & (rows <= K)[None, :]
    splits = tl.arange(0, NSPLIT_P2)
    split_ok = splits < NSPLIT
    den64 = tl.zeros([BLOCK_B, R], dtype=tl.float64) + denominator_f
    # Reductions along one axis taken together (``_add_four``): one request a program, and
    # not for dense q, whose B4 call they made 1.3-1.5% slower in two A/Bs (bench/NOTES.md,
    # step 31).
    MERGED: tl.constexpr = BLOCK_B == 1 and Q_MODE != _Q_DENSE

    # ---- 1. Without OVERLAP, every row's statistics from the partials first, as the
    # kernel read them before step 8 (bench/NOTES.md: in the other order sparse q's finish
    # compiles to a slower program, +9 µs at S = 1024). With OVERLAP, after step 2.
    if not OVERLAP:
        p_max, p_sum, r_max, r_sum, greedy, status = _row_statistics(
            partials, offs_b64, rows, valid, splits, split_ok, inv_tau, NSPLIT, K, MERGED
        )

    # ---- 2. What the inputs alone decide (with OVERLAP read while phase 1 still runs, then
    # wait for it): the draft rows, their logits l_x, q at x and the coins.
    drow = valid & (rows < K)[None, :]
    draft = tl.load(
        draft_ptr + offs_b64[:, None] * stride_db + rows[None, :] * stride_dk,
        mask=drow,
        other=_NO_TOKEN,
    )
    in_range = (draft >= 0) & (draft < V)
    t1_2d = is_t1[:, None] & drow
    x_logit = _draft_logit(logits, offs_b64, rows, draft, t1_2d, in_range)
    coin = acceptance_coin(seed[:, None], position[:, None] + rows[None, :])
    bad = drow & ((draft < _NO_TOKEN) | (draft >= V))
    proposed = t1_2d & in_range  # a T1 proposal inside [0, V): its p_x and q are read
    if Q_MODE == _Q_SPARSE:
        if SUPPORT_TILE == 0:
            count, bad = _sparse_q_counts(
                q_sparse,
                offs_b64,
                rows,
                drow,
                draft,
                is_t1,
                proposed,
                den64,
                bad,
                V,
                S,
                S_P2,
                _MAX_SLOT_TILE,
            )
    elif Q_MODE == _Q_DENSE:
        q_x, bad = _dense_q_x(q_dense, offs_b64, rows, draft, proposed, bad)
    else:
        bad = bad | proposed  # a sampled proposal without any q
    if PREFETCH:
        draft_row_slots = _draft_row_slots(logits, q_sparse, offs_b64, rows, t1_2d, prefetch, S, V)
    if OVERLAP:
        gdc_wait()  # the launches before (phase 1, and the rescan or counts) done, visible
        p_max, p_sum, r_max, r_sum, greedy, status = _row_statistics(
            partials, offs_b64, rows, valid, splits, split_ok, inv_tau, NSPLIT, K, MERGED
        )
    if Q_MODE == _Q_SPARSE:
        if SUPPORT_TILE > 0:
            count_ptr, q_bad_ptr = q_counted
            counted = offs_b64[:, None] * K + rows[None, :]
            count = tl.load(count_ptr + counted, mask=drow, other=0)
            bad = bad | (tl.load(q_bad_ptr + counted, mask=drow, other=0) != 0)

    # ---- 3. The chain, all rows at once: accept[i] for every draft row, then the first
    # failure is the stop row (K when every draft is accepted: the bonus row).
    p_x = tl.exp((x_logit - r_max) * inv_tau[:, None]) / r_sum
    if Q_MODE == _Q_SPARSE:
        accept_t1 = coin * count.to(tl.float64) < p_x.to(tl.float64) * den64
    elif Q_MODE == _Q_DENSE:
        accept_t1 = coin * q_x.to(tl.float64) < p_x.to(tl.float64)
    else:
        accept_t1 = draft < _NO_TOKEN  # all False where it matters (in_range gates it)
    accept = in_range & tl.where(is_t1[:, None], accept_t1, draft == greedy)
    fail = drow & ~accept
    if MERGED:
        stop_row, bad_any = tl.reduce(
            (tl.where(fail, rows[None, :], K), bad.to(tl.int32)), 1, _min_max
        )
        at_stop = rows[None, :] == stop_row[:, None]
        stop_draft, final, stop_max, stop_sum = tl.reduce(
            (
                tl.where(at_stop & drow, draft, 0),
                tl.where(at_stop, greedy, 0),
                tl.where(at_stop, r_max, 0.0),
                tl.where(at_stop, r_sum, 0.0),
            ),
            1,
            _add_four,
        )
    else:
        stop_row = tl.min(tl.where(fail, rows[None, :], K), axis=1)
        at_stop = rows[None, :] == stop_row[:, None]
        bad_any = tl.max(bad.to(tl.int32), axis=1)
        stop_draft = tl.sum(tl.where(at_stop & drow, draft, 0), axis=1)
        stop_max = tl.sum(tl.where(at_stop, r_max, 0.0), axis=1)
        stop_sum = tl.sum(tl.where(at_stop, r_sum, 0.0), axis=1)
        final = tl.sum(tl.where(at_stop, greedy, 0), axis=1)
    status = tl.where((status == _STATUS_OK) & (bad_any != 0), _STATUS_BAD_DRAFT, status)
    # The requests whose stop row is drawn (T1 and OK), and among them those whose stop row
    # rejected a draft, drawn from (p - q)+: both phase-2 kernels take these from here.
    need_sample = mask_b & is_t1 & (status == _STATUS_OK)
    resid = need_sample & (stop_row < K) & (stop_draft >= 0)
    final = tl.where(is_t1, _NO_TOKEN, final)
    if BLOCK_B == 1:  # one request a program: see _unpinned
        status, stop_row, need_sample, resid, stop_max, stop_sum, final = _unpinned_each(
            (status, stop_row, need_sample, resid, stop_max, stop_sum, final)
        )
    if PREFETCH:
        stop_slots = _stop_row_slots(draft_row_slots, at_stop)
    else:
        stop_slots = (
            tl.zeros([BLOCK_B, 1], tl.int32),
            tl.zeros([BLOCK_B, 1], tl.int32),
            tl.zeros([BLOCK_B, 1], tl.float32),
        )
    return (
        status,
        stop_row,
        draft,
        need_sample,
        resid,
        stop_max,
        stop_sum,
        final,
        at_stop,
        p_max,
        p_sum,
        stop_slots,
    )


@triton.jit
def _requests(pid_b, B, temp_ptr, seed_ptr, pos_ptr, BLOCK_B: tl.constexpr):
    """(offs_b, mask_b, is_t1, inv_tau, seed, position) of request block ``pid_b``."""
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_b = offs_b < B
    tau = tl.load(temp_ptr + offs_b, mask=mask_b, other=0.0)
    is_t1, inv_tau = _temperature(tau)
    seed = tl.load(seed_ptr + offs_b, mask=mask_b, other=0)
    position = tl.load(pos_ptr + offs_b, mask=mask_b, other=0)
    if BLOCK_B == 1:  # one request a program: see _unpinned
        offs_b, mask_b, is_t1, inv_tau, seed, position = _unpinned_each(
            (offs_b, mask_b, is_t1, inv_tau, seed, position)
        )
    return offs_b, mask_b, is_t1, inv_tau, seed, position


@triton.jit
def _stop_views(
    logits,
    q_sparse,
    q_dense,
    offs_b,
    stop_row,
    stop_max,
    stop_sum,
    inv_tau,
    denominator_f,
    scratch_ptr,
    stop_slots,
    BLOCK_F: tl.constexpr,
):
    """The (row, q) tuples that describe each request's stop row to the draw helpers (see
    the module docstring); request b's scratch row is row b of the scratch buffer;
    ``stop_slots``: ``_chain_stop``'s."""
    logits_ptr, stride_lb, stride_lk, stride_lv = logits
    qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs = q_sparse
    qdense_ptr, stride_qdb, stride_qdk, stride_qdv = q_dense
    offs_b64 = offs_b.to(tl.int64)
    stop64 = stop_row.to(tl.int64)
    stop_off = offs_b64 * stride_lb + stop64 * stride_lk
    row = (logits_ptr, stop_off, stride_lv, stop_max, stop_sum, inv_tau)
    q = (
        qid_ptr,
        qcnt_ptr,
        offs_b64 * stride_qb + stop64 * stride_qk,
        stride_qs,
        qdense_ptr,
        offs_b64 * stride_qdb + stop64 * stride_qdk,
        stride_qdv,
        1.0 / denominator_f,
        scratch_ptr,
        offs_b64 * BLOCK_F,
        stop_slots[0],
        stop_slots[1],
        stop_slots[2],
    )
    return row, q


@triton.jit
def _last_to_arrive(ticket_ptr, block):
    """Whether this program is the last of request block ``block`` to get here: a block
    barrier (every thread's stores issued), then one gpu-scope release-acquire increment of
    the block's ticket (an int32 counter armed to 0 for this call), the pattern of CUTLASS's
    semaphore. The last arriver (count = programs along grid axis 1, less one) sees every
    other program's stores, read past L1."""
    tl.debug_barrier()
    arrived = tl.atomic_add(ticket_ptr + block, 1, sem="acq_rel", scope="gpu")
    return arrived == tl.num_programs(1) - 1


# --------------------------------------------------------------------------------------
# The kernels of phase 2
# --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["NSPLIT"])
def chain_rescan_kernel(
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
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    scratch_ptr,
    mass_ptr,
    count_ptr,
    q_bad_ptr,
    ticket_ptr,
    sup_e_ptr,
    sup_r_ptr,
    tokens_ptr,
    accepted_ptr,
    status_ptr,
    B,
    V,
    CHUNK: tl.constexpr,
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
    OVERLAP: tl.constexpr,
    SUPPORT_TILE: tl.constexpr,
    TICKET: tl.constexpr,
    CARVEOUT: tl.constexpr,  # not read: see pp3kernels.carveout
):
    """Phase 2a, dense q (grid: request blocks x vocabulary splits): the exact residual
    mass W_c = sum over chunk c of max(e_v - q_v s, 0) of every T1 request whose stop row
    rejected a draft, written to mass[b, c] (fp64) for ``chain_finish_kernel``.

    Each program redoes steps 1-2 for its requests (``_chain_stop``: the partials and the
    draft rows are small) and walks its one chunk with ``_chunk_walk``, the same per-tile
    sums that the draw in that chunk uses; the NSPLIT chunks of a row are walked in
    parallel instead of one after another in the finish program.

    With TICKET there is no finish launch: after storing its mass each program takes a
    ticket of its request block (an atomic counter that ``chain_stats_kernel`` sets to 0
    each call, ARM_TICKET), and the one that draws NSPLIT - 1, the last to arrive, runs the
    finish's step 3 and outputs (``_finish_requests``) for the block, as
    ``chain_support_kernel`` does for a split support; the acquire-release atomic makes
    every other program's stored masses visible to it.
    """
    if OVERLAP:
        gdc_launch_dependents()  # the finish launch may start; it waits before reading
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)
    q_sparse = (qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs)
    q_dense = (qdense_ptr, stride_qdb, stride_qdk, stride_qdv)
    offs_b, mask_b, is_t1, inv_tau, seed, position = _requests(
        pid_b, B, temp_ptr, seed_ptr, pos_ptr, BLOCK_B
    )
    chain = _chain_stop(
        logits,
        (draft_ptr, stride_db, stride_dk),
        q_sparse,
        q_dense,
        (count_ptr, q_bad_ptr),
        (part_max_ptr, part_sum_ptr, part_arg_ptr, part_flag_ptr),
        offs_b,
        mask_b,
        is_t1,
        inv_tau,
        seed,
        position,
        V,
        NSPLIT,
        denominator_f,
        K,
        R,
        S,
        S_P2,
        Q_MODE,
        NSPLIT_P2,
        BLOCK_B,
        OVERLAP,
        SUPPORT_TILE,
        tl.arange(0, 2),
        False,
    )
    _s, stop_row, _d, _n, walk, stop_max, stop_sum, _f, _a, _pm, _ps, slots = chain
    if tl.max(walk.to(tl.int32), axis=0) > 0:
        row, q = _stop_views(
            logits,
            q_sparse,
            q_dense,
            offs_b,
            stop_row,
            stop_max,
            stop_sum,
            inv_tau,
            denominator_f,
            scratch_ptr,
            slots,
            BLOCK_F,
        )
        total, _tile, _before = _chunk_walk(
            row,
            q,
            walk,
            walk,
            tl.zeros([BLOCK_B], tl.int32) + pid_s * CHUNK,
            CHUNK,
            V,
            tl.full([BLOCK_B], float("inf"), tl.float64),
            Q_MODE,
            S,
            S_P2,
            BLOCK_B,
            BLOCK_F,
            False,
        )
        tl.store(mass_ptr + offs_b.to(tl.int64) * NSPLIT + pid_s, total, mask=walk)
    if TICKET:
        # The last program of this request block finishes it (no finish launch); the
        # finish reads the masses past L1.
        if _last_to_arrive(ticket_ptr, pid_b):
            _finish_requests(
                logits,
                q_sparse,
                q_dense,
                offs_b,
                mask_b,
                is_t1,
                inv_tau,
                seed,
                position,
                chain,
                scratch_ptr,
                mass_ptr,
                (sup_e_ptr, sup_r_ptr),
                (tokens_ptr, accepted_ptr, status_ptr),
                V,
                CHUNK,
                NSPLIT,
                denominator_f,
                K,
                R,
                S,
                S_P2,
                Q_MODE,
                NSPLIT_P2,
                BLOCK_B,
                BLOCK_F,
                SUPPORT_TILE,
                False,
            )


@triton.jit(do_not_specialize=["NSPLIT"])
def chain_counts_kernel(
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
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    scratch_ptr,
    mass_ptr,
    count_ptr,
    q_bad_ptr,
    ticket_ptr,
    sup_e_ptr,
    sup_r_ptr,
    B,
    V,
    CHUNK: tl.constexpr,
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
    OVERLAP: tl.constexpr,
    SUPPORT_TILE: tl.constexpr,
    TICKET: tl.constexpr,
    CARVEOUT: tl.constexpr,  # not read: see pp3kernels.carveout
):
    """Phase 2a, sparse q with SUPPORT_TILE > 0 (grid: request blocks x the K draft rows):
    for draft row k of every request, the count n of its draft x in q's row and whether q
    breaks a rule there (``_sparse_q_counts``: the finish kernel's own checks), written to
    count[b, k] (int32) and q_bad[b, k] (int8) of two [B, K] buffers.

    q's slots are all this reads (no logits, no partials): a row's S slots in tiles of R x
    MAX_SLOT_TILE, one row a program, so that the K S slots of a request are read by K
    programs at once instead of in turn by one. With OVERLAP it runs while phase 1 does, and
    waits for phase 1 before it exits, so that the launches after it, which wait for this
    one, see phase 1's partials too.
    """
    if OVERLAP:
        gdc_launch_dependents()
    pid_b = tl.program_id(0)
    k = tl.program_id(1)
    offs_b, mask_b, is_t1, _inv_tau, _seed, _position = _requests(
        pid_b, B, temp_ptr, seed_ptr, pos_ptr, BLOCK_B
    )
    offs_b64 = offs_b.to(tl.int64)
    rows = k + tl.arange(0, 1)
    drow = mask_b[:, None] & (rows < K)[None, :]
    draft = tl.load(
        draft_ptr + offs_b64[:, None] * stride_db + rows[None, :] * stride_dk,
        mask=drow,
        other=_NO_TOKEN,
    )
    proposed = is_t1[:, None] & drow & (draft >= 0) & (draft < V)
    den64 = tl.zeros([BLOCK_B, 1], dtype=tl.float64) + denominator_f
    count, q_bad = _sparse_q_counts(
        (qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs),
        offs_b64,
        rows,
        drow,
        draft,
        is_t1,
        proposed,
        den64,
        tl.zeros_like(draft) != 0,
        V,
        S,
        S_P2,
        R * _MAX_SLOT_TILE,
    )
    counted = offs_b64[:, None] * K + rows[None, :]
    tl.store(count_ptr + counted, count, mask=drow)
    tl.store(q_bad_ptr + counted, q_bad.to(tl.int8), mask=drow)
    if TICKET:
        if k == 0:  # the support launch's ticket of this request block, armed for this call
            tl.store(ticket_ptr + pid_b, 0)
    if OVERLAP:
        gdc_wait()  # exit only after phase 1: the next launch waits for this one alone


@triton.jit(do_not_specialize=["NSPLIT"])
def chain_support_kernel(
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
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    scratch_ptr,
    mass_ptr,
    count_ptr,
    q_bad_ptr,
    ticket_ptr,
    sup_e_ptr,
    sup_r_ptr,
    tokens_ptr,
    accepted_ptr,
    status_ptr,
    B,
    V,
    CHUNK: tl.constexpr,
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
    OVERLAP: tl.constexpr,
    SUPPORT_TILE: tl.constexpr,
    TICKET: tl.constexpr,
    CARVEOUT: tl.constexpr,  # not read: see pp3kernels.carveout
):
    """Phase 2b, sparse q with SUPPORT_TILE > 0 (grid: request blocks x tiles of
    SUPPORT_TILE support slots): for every request whose stop row rejected a draft, the
    sums sum_s e_s and sum_s r_s over the stop row's support slots of this tile that fall
    in each chunk c (``_support_terms``, ``_membership_sums``), written at [b, t, c] of
    two [B, TILES, NSPLIT] fp64 buffers; the finish kernel adds the tiles
    (``_summed_support_tiles``).

    Each program finds the stop row as the finish does (``_chain_stop``, from the counts
    and the partials: both small), then reads SUPPORT_TILE slots, their logits and one
    [SUPPORT_TILE, NSPLIT_P2] membership tile: the S x NSPLIT membership of the stop row is
    spread over S / SUPPORT_TILE programs instead of one.

    With TICKET (step 28) there is no finish launch: after storing its sums each program
    takes a ticket of its request block (an atomic counter that chain_counts_kernel sets to
    0 each call), and the one that draws TILES - 1, the last to arrive, runs the finish's
    step 3 and outputs (``_finish_requests``) for the block; the acquire-release atomic
    makes every other program's stored sums visible to it.
    """
    if OVERLAP:
        gdc_launch_dependents()  # the finish launch may start; it waits before reading
    pid_b = tl.program_id(0)
    pid_t = tl.program_id(1)
    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)
    q_sparse = (qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs)
    q_dense = (qdense_ptr, stride_qdb, stride_qdk, stride_qdv)
    offs_b, mask_b, is_t1, inv_tau, seed, position = _requests(
        pid_b, B, temp_ptr, seed_ptr, pos_ptr, BLOCK_B
    )
    (
        status,
        stop_row,
        draft,
        need_sample,
        resid,
        stop_max,
        stop_sum,
        final,
        at_stop,
        p_max,
        p_sum,
        slots,
    ) = _chain_stop(
        logits,
        (draft_ptr, stride_db, stride_dk),
        q_sparse,
        q_dense,
        (count_ptr, q_bad_ptr),
        (part_max_ptr, part_sum_ptr, part_arg_ptr, part_flag_ptr),
        offs_b,
        mask_b,
        is_t1,
        inv_tau,
        seed,
        position,
        V,
        NSPLIT,
        denominator_f,
        K,
        R,
        S,
        S_P2,
        Q_MODE,
        NSPLIT_P2,
        BLOCK_B,
        OVERLAP,
        SUPPORT_TILE,
        tl.arange(0, 2),
        False,
    )
    if tl.max(resid.to(tl.int32), axis=0) > 0:
        row, q = _stop_views(
            logits,
            q_sparse,
            q_dense,
            offs_b,
            stop_row,
            stop_max,
            stop_sum,
            inv_tau,
            denominator_f,
            scratch_ptr,
            slots,
            BLOCK_F,
        )
        splits = tl.arange(0, NSPLIT_P2)
        tile_slots = pid_t * SUPPORT_TILE + tl.arange(0, SUPPORT_TILE)
        s_e, s_r, s_chunk = _support_terms(row, q, resid, tile_slots, CHUNK, V, S)
        sup_e, sup_r = _membership_sums(s_e, s_r, s_chunk, splits)
        tiles: tl.constexpr = (S + SUPPORT_TILE - 1) // SUPPORT_TILE
        idx = (offs_b.to(tl.int64)[:, None] * tiles + pid_t) * NSPLIT + splits[None, :]
        ok = resid[:, None] & (splits < NSPLIT)[None, :]
        tl.store(sup_e_ptr + idx, sup_e, mask=ok)
        tl.store(sup_r_ptr + idx, sup_r, mask=ok)
    if TICKET:
        # The last program of this request block to get here finishes it (no finish
        # launch); the finish reads the tiles past L1 (_summed_support_tiles).
        if _last_to_arrive(ticket_ptr, pid_b):
            _finish_requests(
                logits,
                q_sparse,
                q_dense,
                offs_b,
                mask_b,
                is_t1,
                inv_tau,
                seed,
                position,
                (
                    status,
                    stop_row,
                    draft,
                    need_sample,
                    resid,
                    stop_max,
                    stop_sum,
                    final,
                    at_stop,
                    p_max,
                    p_sum,
                    slots,
                ),
                scratch_ptr,
                mass_ptr,
                (sup_e_ptr, sup_r_ptr),
                (tokens_ptr, accepted_ptr, status_ptr),
                V,
                CHUNK,
                NSPLIT,
                denominator_f,
                K,
                R,
                S,
                S_P2,
                Q_MODE,
                NSPLIT_P2,
                BLOCK_B,
                BLOCK_F,
                SUPPORT_TILE,
                True,  # PRELOAD (v5 step 45)
            )


@triton.jit(do_not_specialize=["NSPLIT"])
def chain_finish_kernel(
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
    part_max_ptr,
    part_sum_ptr,
    part_arg_ptr,
    part_flag_ptr,
    scratch_ptr,
    mass_ptr,
    count_ptr,
    q_bad_ptr,
    ticket_ptr,
    sup_e_ptr,
    sup_r_ptr,
    tokens_ptr,
    accepted_ptr,
    status_ptr,
    B,
    V,
    CHUNK: tl.constexpr,
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
    OVERLAP: tl.constexpr,
    SUPPORT_TILE: tl.constexpr,
    CARVEOUT: tl.constexpr,  # not read: see pp3kernels.carveout
):
    """Phase 2: combine the partials, walk the chain, draw the stop row's token.

    Writes tokens [B, K+1] (accepted drafts, the emitted token, then -1), accepted [B] and
    status [B] (int8); a request with a non-OK status emits nothing (all -1, accepted 0).
    Dense q reads its rejected rows' chunk masses from ``mass_ptr`` (``chain_rescan_kernel``
    ran first); the other forms never read it.
    """
    pid_b = tl.program_id(0)
    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)
    q_sparse = (qid_ptr, qcnt_ptr, stride_qb, stride_qk, stride_qs)
    q_dense = (qdense_ptr, stride_qdb, stride_qdk, stride_qdv)
    offs_b, mask_b, is_t1, inv_tau, seed, position = _requests(
        pid_b, B, temp_ptr, seed_ptr, pos_ptr, BLOCK_B
    )
    # Sparse q's support read before the wait where it is narrow (see _chain_stop).
    PREFETCH_SLOTS: tl.constexpr = (
        S > _MAX_LOOPED_SLOTS and S_P2 <= _MAX_SLOT_TILE and R * S_P2 <= _MAX_PREFETCH_SLOTS
    )
    (
        status,
        stop_row,
        draft,
        need_sample,
        resid,
        stop_max,
        stop_sum,
        final,
        at_stop,
        p_max,
        p_sum,
        stop_slots,
    ) = _chain_stop(
        logits,
        (draft_ptr, stride_db, stride_dk),
        q_sparse,
        q_dense,
        (count_ptr, q_bad_ptr),
        (part_max_ptr, part_sum_ptr, part_arg_ptr, part_flag_ptr),
        offs_b,
        mask_b,
        is_t1,
        inv_tau,
        seed,
        position,
        V,
        NSPLIT,
        denominator_f,
        K,
        R,
        S,
        S_P2,
        Q_MODE,
        NSPLIT_P2,
        BLOCK_B,
        OVERLAP,
        SUPPORT_TILE,
        tl.arange(0, S_P2),
        Q_MODE == _Q_SPARSE and SUPPORT_TILE == 0 and PREFETCH_SLOTS,
    )
    _finish_requests(
        logits,
        q_sparse,
        q_dense,
        offs_b,
        mask_b,
        is_t1,
        inv_tau,
        seed,
        position,
        (
            status,
            stop_row,
            draft,
            need_sample,
            resid,
            stop_max,
            stop_sum,
            final,
            at_stop,
            p_max,
            p_sum,
            stop_slots,
        ),
        scratch_ptr,
        mass_ptr,
        (sup_e_ptr, sup_r_ptr),
        (tokens_ptr, accepted_ptr, status_ptr),
        V,
        CHUNK,
        NSPLIT,
        denominator_f,
        K,
        R,
        S,
        S_P2,
        Q_MODE,
        NSPLIT_P2,
        BLOCK_B,
        BLOCK_F,
        SUPPORT_TILE,
        False,
    )


@triton.jit
def _finish_requests(
    logits,
    q_sparse,
    q_dense,
    offs_b,
    mask_b,
    is_t1,
    inv_tau,
    seed,
    position,
    chain,
    scratch_ptr,
    mass_ptr,
    sup_ptrs,
    outputs,
    V,
    CHUNK: tl.constexpr,
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
    SUPPORT_TILE: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """Phase 2, step 3 and the outputs for the requests ``offs_b``, from ``chain`` (what
    ``_chain_stop`` returned for them): the stop row's draw, then tokens, accepted and
    status (``outputs``: their pointers). The finish kernel runs it, and with TICKET the
    last program of each request block of the support launch (``chain_support_kernel``) or
    of dense q's rescan launch (``chain_rescan_kernel``). PRELOAD (the support launch's):
    the stop row's support ids and counts are read first (``_preloaded_support``)."""
    (
        status,
        stop_row,
        draft,
        need_sample,
        resid,
        stop_max,
        stop_sum,
        final,
        at_stop,
        p_max,
        p_sum,
        stop_slots,
    ) = chain
    sup_e_ptr, sup_r_ptr = sup_ptrs
    tokens_ptr, accepted_ptr, status_ptr = outputs
    offs_b64 = offs_b.to(tl.int64)
    accepted = stop_row
    rows = tl.arange(0, R)
    valid = mask_b[:, None] & (rows <= K)[None, :]
    splits = tl.arange(0, NSPLIT_P2)
    split_ok = splits < NSPLIT

    # ---- 3. T1: draw the stop row's token: a CHUNK by inverse CDF, a tile, then a token.
    if tl.max(need_sample.to(tl.int32), axis=0) > 0:
        row, q = _stop_views(
            logits,
            q_sparse,
            q_dense,
            offs_b,
            stop_row,
            stop_max,
            stop_sum,
            inv_tau,
            denominator_f,
            scratch_ptr,
            stop_slots,
            BLOCK_F,
        )
        if PRELOAD and Q_MODE == _Q_SPARSE and SUPPORT_TILE > 0 and S > _MAX_LOOPED_SLOTS:
            q = _preloaded_support(q, resid, S, S_P2)
        full_mass = _chunk_masses(p_max, p_sum, at_stop, stop_max, inv_tau)
        mass = full_mass
        if Q_MODE == _Q_SPARSE and SUPPORT_TILE > 0:
            # The support's sums per chunk, per tile of slots from chain_support_kernel.
            sup_e, sup_r = _summed_support_tiles(
                (sup_e_ptr, sup_r_ptr),
                offs_b64,
                resid,
                splits,
                split_ok,
                NSPLIT,
                NSPLIT_P2,
                (S + SUPPORT_TILE - 1) // SUPPORT_TILE,
                BLOCK_B,
            )
            mass, rescan = _corrected_masses(full_mass, sup_e, sup_r, NSPLIT)
        elif Q_MODE == _Q_SPARSE:
            mass, rescan = _support_corrections(
                row, q, resid, full_mass, splits, CHUNK, V, NSPLIT, S, S_P2, NSPLIT_P2, BLOCK_B
            )
        if Q_MODE == _Q_SPARSE:
            mass = _rescan_chunks(
                row,
                q,
                resid,
                rescan,
                mass,
                splits,
                CHUNK,
                V,
                NSPLIT_P2,
                Q_MODE,
                S,
                S_P2,
                BLOCK_B,
                BLOCK_F,
                SUPPORT_TILE > 0,
            )
        elif Q_MODE == _Q_DENSE:
            # Dense q changes every weight of a rejected row: every chunk's exact residual
            # mass was walked by chain_rescan_kernel.
            walked = resid[:, None] & split_ok[None, :]
            walked_mass = tl.load(
                mass_ptr + offs_b64[:, None] * NSPLIT + splits[None, :],
                mask=walked,
                other=0.0,
                cache_modifier=".cg",  # stored by other programs of a ticketed rescan
            )
            mass = tl.where(walked, walked_mass, full_mass)
        pick, inner, resid = _pick_chunk(
            mass,
            full_mass,
            split_ok,
            splits,
            resid,
            need_sample,
            seed,
            position,
            stop_row,
            NSPLIT_P2,
        )
        if BLOCK_B == 1:  # see _unpinned
            pick = _unpinned(pick)
            inner = _unpinned(inner)
            resid = _unpinned_flag(resid)
        chosen = _draw_in_chunk(
            row,
            q,
            resid,
            need_sample,
            pick,
            inner,
            CHUNK,
            V,
            Q_MODE,
            S,
            S_P2,
            BLOCK_B,
            BLOCK_F,
            Q_MODE == _Q_SPARSE,
        )
        final = tl.where(need_sample, chosen, final)

    # ---- Outputs: accepted drafts, the final token, -1 padding; nothing on a bad status.
    # A T1 draw that found no token (only possible on malformed, unvalidated q) is BAD_DRAFT.
    status = tl.where(mask_b & (status == _STATUS_OK) & (final < 0), _STATUS_BAD_DRAFT, status)
    ok = mask_b & (status == _STATUS_OK)
    token = tl.where(
        rows[None, :] < accepted[:, None],
        draft,
        tl.where(rows[None, :] == accepted[:, None], final[:, None], _NO_TOKEN),
    )
    token = tl.where(ok[:, None], token, _NO_TOKEN)
    tl.store(tokens_ptr + offs_b64[:, None] * (K + 1) + rows[None, :], token, mask=valid)
    tl.store(accepted_ptr + offs_b, tl.where(ok, accepted, 0), mask=mask_b)
    tl.store(status_ptr + offs_b, status.to(tl.int8), mask=mask_b)
