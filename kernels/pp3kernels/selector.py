"""The selector's host side: launch plans and ``verify_chain``, which runs the chain kernels.

Law: exactly the one in ``pp3kernels.contract`` (read it first). The device code, and how
the two phases work, is ``pp3kernels.jit.chain``: phase 1 (``chain_stats_kernel``, grid
request blocks x vocabulary splits) writes per-chunk row statistics; phase 2
(``chain_finish_kernel``, one program per request block) combines them, walks the chain and
draws the stop row's token. Dense q runs ``chain_rescan_kernel`` between them (grid as
phase 1): the exact residual mass of every chunk of each rejected stop row, in parallel.

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

from dataclasses import dataclass, replace

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from pp3kernels.carveout import prefer_carveout
from pp3kernels.contract import NO_TOKEN, check_denominator
from pp3kernels.interface import ChainInputs, ChainResult
from pp3kernels.jit import (
    Q_DENSE,
    Q_NONE,
    Q_SPARSE,
    Launchable,
    chain_counts_kernel,
    chain_finish_kernel,
    chain_rescan_kernel,
    chain_stats_kernel,
    chain_support_kernel,
)
from pp3kernels.jit.launch import (
    MAX_LOOPED_SLOTS,
    MAX_MEMBERSHIP_TILE,
    MAX_PAIRWISE_SLOTS,
    MAX_SLOT_TILE,
    SPLIT_SUPPORT_SLOTS,
)
from pp3kernels.runtime import is_interpreter
from pp3kernels.validate import validate_chain_inputs

# The launches go through these module globals, so that a benchmark can swap one out
# (bench/phase_timings.py times phase 1 alone by replacing the finish launch).
_chain_stats_kernel: Launchable = chain_stats_kernel
_chain_rescan_kernel: Launchable = chain_rescan_kernel
_chain_counts_kernel: Launchable = chain_counts_kernel
_chain_support_kernel: Launchable = chain_support_kernel
_chain_finish_kernel: Launchable = chain_finish_kernel

# ---- Plan constants. Interpreter: every program instance costs a second or more and numpy
# on a big tile is cheap, so few programs with big tiles.
_INTERP_MAX_BLOCK_V = 1024  # tokens per tile (the whole row when V <= 1024)
# Triton's per-tensor element limit (TRITON_MAX_TENSOR_NUMEL): every tile of either kernel,
# for all block_b requests of a program, stays within it (see _tile_elements_per_request).
_INTERP_TILE_ELEMENTS = 1 << 20
_INTERP_MAX_BLOCK_B = 8192  # requests per program
# Past this vocabulary the interpreter splits it into chunks of this many tokens, as the GPU
# does (in chunks of 2048) from V = 1025 on: CPU runs then exercise the split path (chunk
# masses, support corrections, exact rescans, cross-split ties) at a cost close to one split.
_INTERP_CHUNK = 8192
# GPU, small vocabularies (qualification targets, V <= 1024): one request per program and
# one split, the row padded to a power of two of at least 16 lanes, which is also the draw's
# one tile (a V = 8 row draws from 16 lanes, not 1024).
_SMALL_VOCAB = 1024
_SMALL_MIN_BLOCK_V = 16
# GPU, large vocabularies; measured on the H200 at V = 129280 (bench/NOTES.md): chunks of
# 2048 tokens (64 splits) with [R, 256] tiles and 4 warps beat 8, 32 and 127 splits for
# B = 1, 4 and 64. Phase-1 tiles hold R * block_v = 2048 elements (block_v >= 64); past
# 256 * 2048 tokens the chunks grow in whole draw tiles instead of the split count.
# The phase-1 tile and warps by batch (bench/NOTES.md, "plans measured beside the default"):
# from B = 16 on, [R, 1024 / R] tiles with 4 warps (B64: 133 -> 97 us sampled, 63 -> 49 us
# greedy); below, [R, 2048 / R] tiles with 8 warps (B4 sampled: 17.4 -> 15.6 us, L2-warm).
_CHUNK = 2048
_MAX_SPLITS = 256
_LARGE_BATCH = 16
# Phase 1 through TMA boxes from this many requests on (bench/NOTES.md, twelfth session's
# A/B against pointer loads: B256 greedy 131.0 -> 115.9 us, sampled 124.8 -> 124.0; at B64
# greedy 39.1 -> 36.8 but sampled 39.5 -> 42.2, at B16 sampled 17.2 -> 19.3: below this,
# the TMA program's 96 registers and twice the instructions cost more than its loads save).
# Checked again at 80 registers (step 16, fourteenth session): at B64 T0 38.7 -> 36.0 but
# T1 39.6 -> 41.3 and spread-mixed 41.4 -> 46.1, so the line stays.
_TMA_BATCH = 256
# From this many requests on, chunks of _LONG_CHUNK tokens: 8 phase-1 steps a program
# instead of 4, so that what a program does outside its loop is paid half as often
# (sixteenth session's A/B at B256 / B1024: T1 -5.2% / -7.6%, T0 -3.5% / -1.2%, spread-mixed
# -3.9% / -7.9%; from 64 requests, with pointer loads, B64 T0 gained 6%, T1 and mixed 0).
# Step 21: from 64 requests, with the draw reading a 4096-token chunk as one tile below 256
# (its A/B at B64 against step 20, nineteenth session: T0 -6.4%, T1 -2.1%, spread-mixed
# -0.7%, dense q -24%, sparse S = 4096 -15%; outputs identical).
_LONG_CHUNK_BATCH = 64
_LONG_CHUNK = 4096
_TILE_ELEMENTS_LARGE_BATCH = 1024
_NUM_WARPS_LARGE_BATCH = 4
_TILE_ELEMENTS = 2048
_NUM_WARPS_SMALL_BATCH = 8
_MIN_BLOCK_V = 64
_DRAW_TILE = 1024  # block_f: tokens per tile of the final draw (phase 2)
# Tiles per phase-1 step of a sampled-only program, loaded as one [rows, groups, block_v]
# tile and folded into each lane with one rescale (bench/NOTES.md, "what bounds phase 1":
# in the stand-alone sweep's exp2 pass at B = 64, 4 groups of [8, 128] read at 2.9 TB/s
# against 2.6 for 2 groups of the same tiles; the small-batch [8, 256] tiles with 8 warps
# keep 2 groups, the faster there).
_GROUPS = 2
_GROUPS_LARGE_BATCH = 4
# Below this many requests phase 1 tiles one flat row a program, [1, _GROUPS,
# _ROW_TILE_LANES] at _NUM_WARPS warps (one 2048-token chunk a step): a call's few rows
# then spread over (K+1) x NSPLIT programs instead of NSPLIT, which a latency-bound pass
# wants (v5 step 40, bench/NOTES.md, forty-first session: B1 T1 -15.5%, T0 -11%; at B4
# T0 lost 8%, from B16 on every variant lost). Tile rows of 1024 tokens keep each
# thread's groups in its registers; with 256, Triton laid the warps along the groups and
# every step's max over them crossed warps through shared memory (3.6-37x slower).
_ROW_TILE_BATCH = 2
_ROW_TILE_LANES = 1024
# From _ROW_TILE_BATCH requests up to _PAIR_TILE_BATCH, two flat rows a program, [2,
# _GROUPS_LARGE_BATCH, _PAIR_TILE_LANES] at _NUM_WARPS warps: a quarter of the eight-row
# tile's rows, so four times its programs (v5 step 41, bench/NOTES.md, forty-second
# session: B2 T1 0.91, mixed 0.87; B4 T1 0.92, mixed 0.89, T0 within +-1%; from B16 on
# every case lost or tied). Step 42 (forty-third session): B5 T1 0.96, mixed 0.92, T0
# 1.006; from B6 greedy calls lost 2-3% (B6 T0 1.020, B7 1.029, B8 1.027).
_PAIR_TILE_BATCH = 6
_PAIR_TILE_LANES = 512
# From _TMA_BATCH requests on: one pair of flat rows a program, [2, _GROUPS_LARGE_BATCH,
# _ROW_PAIR_LANES] at one warp, through TMA boxes, with no kind order. Where K+1 is even
# (v5 step 47, bench/NOTES.md, fifty-first session, H100: B256 T1 0.981, T0 0.986,
# spread-mixed 0.970; B1024 0.996, 0.997, 0.994; outputs identical) every pair is one
# request's rows, so of one kind. Where it is odd (step 48, fifty-second session) two of
# every K+1 pairs straddle two requests and, in a mixed batch, some run the mixed loop; the
# pairs still beat the eight kind-ordered rows (LaunchPlan.kind_order, step 17's choice
# from 256 requests until then). The lanes and groups are the eight-row tile's, and at one
# warp the groups stay in each thread's registers (at two, half the warps lay along them:
# 56 barriers against 26).
_ROW_PAIR_LANES = 128
_ROW_PAIR_WARPS = 1
_NUM_WARPS = 4  # interpreter and small-vocabulary plans (both phases)
# Phase 2 (the rescan and finish launches) on the large-vocabulary plans (bench/NOTES.md,
# "phase 2 by launch shape"): 8 warps (dense q at B4: 51 -> 32 us, B64: 122 -> 93; point
# and S = 64 drafts 0-3% faster), 16 where sparse q's slot axis S_P2 is this wide or wider
# (S = 4096 at B4: 204 -> 107 us; at 4 warps its [S_P2] tiles spill registers).
_FINISH_WARPS = 8
_FINISH_WARPS_WIDE_SUPPORT = 16
_WIDE_SUPPORT_SLOTS = 2048
# Dense q below _LARGE_BATCH: 2 warps (B4: 32.2 -> 25.5 us in the small-batch plan sweep,
# 1 warp 27.9, 4 warps 50.6; bench/NOTES.md, ninth session); its finish then compiles to 56
# block barriers instead of 85, and its rescan no longer spills.
_FINISH_WARPS_DENSE_SMALL_BATCH = 2
# Sparse q of a slot axis of SPLIT_SUPPORT_SLOTS (128) or more: the support-split launches
# (step 25: chain_counts_kernel, then chain_support_kernel over tiles of slots, then the
# finish; B4 S = 1024 / 4096 40.7 / 82.3 -> 21.6 / 25.8 µs, B64 S = 1024 61.0 -> 54.0),
# the support launch in tiles of _SUPPORT_TILE slots at _SUPPORT_WARPS warps (step 26,
# bench/plan_variants.py: B64 S = 4096 96.4 µs unsplit, 148.4 split at 16 warps, 61.0
# at 4; B4 S = 4096 25.4 -> 24.2; bench/NOTES.md).
_SUPPORT_TILE = 128
_SUPPORT_WARPS = 4
# A slot axis of _WIDE_SUPPORT_SLOTS or more: tiles of _WIDE_SUPPORT_TILE slots at
# _WIDE_SUPPORT_WARPS warps (B64 S = 4096 -3.5% in step 26's sweep, -1.9% in step 27's; B4
# unchanged, 23.99 against 24.01 µs; bench/NOTES.md, twenty-fourth session).
_WIDE_SUPPORT_TILE = 256
_WIDE_SUPPORT_WARPS = 8
# Step 28: below _TICKET_BATCH requests, no finish launch; the split support's last program
# of each request block finishes it (plan.ticket), the support launch in tiles of
# _WIDE_SUPPORT_TILE at _WIDE_SUPPORT_WARPS warps, which carry the finish's code without
# spilling (4 warps spill at S = 4096). B4 S = 1024 / 4096 -2.6% / -2.8%; at B64 the last
# program per request finishes after its own tile, 64 such at the end of the launch: +31% /
# +102% (twenty-fourth session).
_TICKET_BATCH = 16
# Every q form overlaps its launches (programmatic dependent launch, the finish reading the
# partials last): sparse q of 65-1024 slots, whose finish summed the support itself, ran
# 27% slower so at B4 (twenty-first session) and was planned with plain launches until
# step 25 took that sum out of the finish.
# Phase 2 pads its chunk axis to a power of two of at least 8: Triton 3.6 fails to lower the
# fp64 cumulative sum over that axis on sm_90 when it is too short (a ScanOpToLLVM assertion
# seen on the H200 below 8; a one-wide axis does not even compile). The q-slot axis is
# padded to at least 2. Padded entries are masked: they load nothing and weigh 0.
_MIN_SPLIT_AXIS = 8
_MIN_SLOT_AXIS = 2
# The shared-memory carveout (% of the multiprocessor's largest: 100 = 228 KB shared, 28 KB
# L1) that every launch of a call asks for where phase 2 reads much before its wait, so that
# its programs, which start during phase 1, fit beside phase 1's (pp3kernels.carveout;
# Nsight Compute, 2026-12-04: the driver's own choice was 8 KB for phase 1 and 16 KB for the
# finish at B4). Measured (v5 step 33, B4 against the driver's splits): dense q 0.84x,
# sparse q of 1024 slots 0.95x; point drafts 1.00x, greedy-only 1.02x, 4096 slots 1.01x, and
# from 64 requests on within 1%: only the first two ask (plan_launch).
_CARVEOUT = 100
# Where no launch asks for a split, the finish asks for the 16 KB split (7% of 228 KB) and
# is compiled to at most 128 registers a thread (ptx .maxnreg; 174-192 uncapped, no spill
# at S = 64 or point drafts). A finish holding 8 KB of shared memory (sparse q's support
# read before the wait) fits that split once with the 1 KB reserved, two do not, so each
# runs alone on a multiprocessor once phase 1 drains; the 1 KB point-draft finish is not
# held apart by it (two fit) and measured within +-0.6% either way.
# Held to 128 registers without the split, two finish programs shared a multiprocessor
# and ran ~3 µs slower at B4 and B16 (S = 64: +25% / +17%); with it, B4 / B16 S = 64
# 0.968x / 0.981x, B64 S = 1024 0.949x, point drafts and dense q within +-0.6% (v5 step
# 38, H100; bench/NOTES.md, thirty-eighth and thirty-ninth sessions).
# Up to _FINISH_ALONE_BATCH requests (one finish program each): no more programs than the
# H100's and H200's 132 multiprocessors.
_FINISH_ALONE = 7
_FINISH_ALONE_MAXNREG = 128
_FINISH_ALONE_BATCH = 128


def _prev_power_of_2(n: int) -> int:
    """The largest power of two <= n (n >= 1); 1 for n < 1."""
    return 1 << (max(n, 1).bit_length() - 1)


@dataclass(frozen=True)
class LaunchPlan:
    """How one call is split.

    block_b requests per program (their K+1 rows padded to a power of two form one tile of
    block_b * R rows by block_v tokens), nsplit vocabulary chunks of ``chunk`` tokens each
    (a multiple of block_v and block_f), and block_f tokens per tile of the final draw.
    With flat_rows = n > 0 (a power of two), phase 1 instead tiles n consecutive rows of
    the B * (K+1) rows, with no padding rows, and block_b applies to phase 2 only. Phase 1's
    sampled-only programs load ``groups`` (a power of two >= 2) such tiles per step, as one
    [rows, groups, block_v] tile, and fold them into each lane with one rescale. The
    phase-2 launches run with finish_warps warps (num_warps is phase 1's). With overlap
    (honoured on CUDA devices of compute capability 9.0 and up, ignored elsewhere), the
    phase-2 launches are programmatic dependent launches: their programs start while phase
    1 runs, read the inputs that do not depend on it, then wait for it (griddepcontrol).
    With tma (flat_rows plans; honoured where ``reads_by_tma`` says the device and the
    logits' layout allow it), phase 1 reads its whole chunks as [flat_rows, groups,
    block_v] boxes of the tensor memory accelerator instead of pointer loads. With
    kind_order (flat_rows plans), phase 1 takes the rows of each flat_rows requests in kind
    order, T1 requests first, so that mixed batches run blocks of one kind; blocks of a
    group holding both kinds then read with pointer loads (their rows are not consecutive).
    With support_tile = n > 0 (a power of two; sparse q only, ignored otherwise), phase 2
    is three launches: the draft rows' counts (one program per request block and draft
    row), the stop row's support sums per chunk (one program per request block and tile of
    n slots, at support_warps warps, or finish_warps where 0), then the finish, which adds
    the tiles instead of reading all S slots itself. With ticket (and support_tile > 0), the
    support launch's last program of each request block to store its sums (an atomic
    ticket) finishes that block itself, and there is no finish launch; with ticket and
    dense q, so does the rescan launch's last program of each request block to store its
    chunk's mass (the ticket armed by phase 1). Every launch asks
    CUDA for carveout % of the multiprocessor's largest shared memory (-1: the driver's
    choice), the finish launch for finish_carveout where that is not -1. With
    finish_maxnreg = n > 0, the finish launch compiles to at most n registers a thread (ptx
    .maxnreg; ignored by the interpreter). Both move time, never the bits.
    """

    block_b: int
    block_v: int
    nsplit: int
    chunk: int
    num_warps: int
    block_f: int = 0  # 0: same as block_v
    flat_rows: int = 0  # 0: phase 1 tiles whole requests, padded to R rows
    groups: int = 2  # tiles per phase-1 step of a sampled-only program
    finish_warps: int = 4  # warps of the phase-2 launches (rescan and finish)
    overlap: bool = False  # phase 2 starts during phase 1 (programmatic dependent launch)
    tma: bool = False  # phase 1 reads whole chunks through the tensor memory accelerator
    kind_order: bool = False  # phase 1 takes flat rows T1 first, T0 after, per flat_rows requests
    support_tile: int = 0  # sparse q: slots per chain_support_kernel program (0: none)
    support_warps: int = 0  # warps of chain_support_kernel (0: finish_warps)
    ticket: bool = False  # split support or dense q's rescan: its last program finishes
    carveout: int = -1  # shared memory every launch asks for, % of the most (-1: driver's)
    finish_carveout: int = -1  # the finish launch's instead, where not -1
    finish_maxnreg: int = 0  # registers a thread of the finish launch may hold (0: ptxas's)


def slot_axis(support: int) -> int:
    """The finish kernel's padded q-slot axis S_P2 for S support slots (at least 2)."""
    return int(triton.next_power_of_2(max(support, _MIN_SLOT_AXIS)))


def split_axis(nsplit: int) -> int:
    """The finish kernel's padded chunk axis NSPLIT_P2 for ``nsplit`` splits (at least 8)."""
    return max(_MIN_SPLIT_AXIS, int(triton.next_power_of_2(nsplit)))


def _tile_elements_per_request(r: int, block_v: int, support: int, nsplit: int) -> int:
    """The largest tile either kernel holds, per request of a program (R = r rows).

    Phase 1: [R, _GROUPS, block_v]. Phase 2: the partials [R, NSPLIT_P2]; sparse q's slots
    [R, S_P2] (in tiles of MAX_SLOT_TILE slots above that) and, for S_P2 <= 16, the
    pairwise duplicate check [R, S_P2, S_P2]; the
    support's chunk membership [S_P2, NSPLIT_P2] (or [S_P2] tiles, four chunks at a time, above
    MAX_MEMBERSHIP_TILE); the draw tiles [block_f = block_v].
    """
    s_p2 = slot_axis(support)
    pairwise = s_p2 if s_p2 <= MAX_PAIRWISE_SLOTS else 1
    n_p2 = split_axis(nsplit)
    membership = s_p2 * n_p2 if s_p2 * n_p2 <= MAX_MEMBERSHIP_TILE else s_p2
    slot_tile = min(s_p2, MAX_SLOT_TILE)
    return max(r * _GROUPS * block_v, r * n_p2, r * slot_tile * pairwise, membership)


def plan_launch(
    batch: int, rows: int, vocab: int, *, interpreter: bool, support: int = 1, dense: bool = False
) -> LaunchPlan:
    """Pick the launch shape (``support``: q's slots S for sparse q, else 1; ``dense``: q is
    dense).

    Interpreter: up to 8192 requests per program, one split up to V = 8192 and splits of
    8192 tokens beyond, every tile within Triton's 2^20-element limit for the given rows,
    support and splits (each program instance costs a second
    or more; numpy on a big tile is cheap). Small
    vocabularies on a GPU: one request per program, one split (row tiles of many requests hit
    a scan-lowering assertion in Triton 3.6 on sm_90). Large vocabularies on a GPU: phase 1
    tiles consecutive flat rows a program (one row where a single request is verified, two
    for two to five requests, R = next_power_of_2(K+1) from six, and a pair of rows at one
    warp from 256 requests), phase 2 one request a
    program, and many vocabulary splits per request, so that the programs keep enough
    loads in flight to cover memory latency.
    """
    r = triton.next_power_of_2(rows)
    if interpreter:
        block_v = triton.next_power_of_2(min(vocab, _INTERP_MAX_BLOCK_V))
        nsplit = triton.cdiv(vocab, _INTERP_CHUNK) if vocab > _INTERP_CHUNK else 1
        per_request = _tile_elements_per_request(r, block_v, support, nsplit)
        block_b = max(
            1,
            min(
                triton.next_power_of_2(batch),
                _prev_power_of_2(_INTERP_TILE_ELEMENTS // per_request),
                _INTERP_MAX_BLOCK_B,
            ),
        )
        chunk = _INTERP_CHUNK if nsplit > 1 else triton.cdiv(vocab, block_v) * block_v
        return LaunchPlan(block_b, block_v, nsplit, chunk, _NUM_WARPS, block_v)
    if vocab <= _SMALL_VOCAB:
        block_v = max(_SMALL_MIN_BLOCK_V, triton.next_power_of_2(vocab))
        return LaunchPlan(1, block_v, 1, block_v, _NUM_WARPS, block_v)
    # Phase 1's tile [flat_rows, groups, block_v] at `warps` warps, by the batch.
    if batch < _ROW_TILE_BATCH:
        flat_rows, groups, block_v, warps = 1, _GROUPS, _ROW_TILE_LANES, _NUM_WARPS
    elif batch < _PAIR_TILE_BATCH:
        flat_rows, groups, block_v, warps = 2, _GROUPS_LARGE_BATCH, _PAIR_TILE_LANES, _NUM_WARPS
    elif batch < _LARGE_BATCH:
        block_v = max(_MIN_BLOCK_V, _TILE_ELEMENTS // r)
        flat_rows, groups, warps = r, _GROUPS, _NUM_WARPS_SMALL_BATCH
    else:
        block_v = max(_MIN_BLOCK_V, _TILE_ELEMENTS_LARGE_BATCH // r)
        flat_rows, groups, warps = r, _GROUPS_LARGE_BATCH, _NUM_WARPS_LARGE_BATCH
    if batch >= _TMA_BATCH:
        flat_rows, block_v, warps = 2, _ROW_PAIR_LANES, _ROW_PAIR_WARPS
    shortest = _LONG_CHUNK if batch >= _LONG_CHUNK_BATCH else _CHUNK
    chunk = max(shortest, triton.cdiv(triton.cdiv(vocab, _MAX_SPLITS), _DRAW_TILE) * _DRAW_TILE)
    nsplit = triton.cdiv(vocab, chunk)
    # Phase 1 tiles R consecutive rows of the flat B * (K+1) rows: the same [R, block_v]
    # tile as one request's rows padded to R, without the padding rows (K = 5: 6 of 8).
    slots = slot_axis(support)
    wide = slots >= _WIDE_SUPPORT_SLOTS
    finish_warps = _FINISH_WARPS_WIDE_SUPPORT if wide else _FINISH_WARPS
    if dense and batch < _LARGE_BATCH:
        finish_warps = _FINISH_WARPS_DENSE_SMALL_BATCH
    # The draw reads a 2048-token chunk as one tile, once (jit/chain.py, _one_tile_draw), and
    # a 4096-token one below 256 requests (step 21: measured at B64 only); dense q keeps
    # 1024-token tiles (its rescan and draw ran 3x slower with 2048: NOTES, "phase 2 by
    # launch shape"), and so do the chunks of 4096 from 256 requests on (not measured).
    one_tile = chunk == _CHUNK or (chunk == _LONG_CHUNK and batch < _TMA_BATCH)
    block_f = chunk if one_tile and not dense else _DRAW_TILE
    # A wide support splits its membership over programs (steps 25-26); below _TICKET_BATCH
    # requests its last program per request block finishes it (step 28).
    split_support = slots >= SPLIT_SUPPORT_SLOTS
    ticket = (split_support or dense) and batch < _TICKET_BATCH
    if not split_support:
        support_tile, support_warps = 0, 0
    elif ticket or wide:
        support_tile, support_warps = _WIDE_SUPPORT_TILE, _WIDE_SUPPORT_WARPS
    else:
        support_tile, support_warps = _SUPPORT_TILE, _SUPPORT_WARPS
    # One split for every launch where phase 2's launches start with the most to read
    # before they wait: dense q's rescan and finish, and the support launch of a split
    # support that is not wide, below 16 requests (8-warp phase-1 programs: _CARVEOUT).
    one_split = batch < _LARGE_BATCH and (dense or (split_support and not wide))
    # Elsewhere, up to one finish program a multiprocessor: each alone, in fewer registers.
    finish_alone = not one_split and not ticket and batch <= _FINISH_ALONE_BATCH
    return LaunchPlan(
        1,
        block_v,
        nsplit,
        chunk,
        warps,
        block_f,
        flat_rows=flat_rows,
        groups=groups,
        finish_warps=finish_warps,
        overlap=True,
        # TMA boxes: the max-only pass read at 0.93x the copy floor at B1024 against
        # 1.1-1.2x with pointer loads (bench/NOTES.md, eleventh session); from
        # _TMA_BATCH requests on, where the whole selector gained (twelfth session).
        tma=batch >= _TMA_BATCH,
        support_tile=support_tile,
        support_warps=support_warps,
        ticket=ticket,
        carveout=_CARVEOUT if one_split else -1,
        finish_carveout=_FINISH_ALONE if finish_alone else -1,
        finish_maxnreg=_FINISH_ALONE_MAXNREG if finish_alone else 0,
    )


def overlaps(plan: LaunchPlan, device: torch.device) -> bool:
    """Whether a call on ``device`` with ``plan`` overlaps its launches: plan.overlap on a
    CUDA device of compute capability 9.0 or more (programmatic dependent launch and the
    griddepcontrol instructions start with sm_90), never in Triton's interpreter."""
    if not plan.overlap or device.type != "cuda" or is_interpreter():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


# The tensor memory accelerator: global strides and the base address in multiples of 16
# bytes, box dimensions of at most 256 elements (CUDA's cuTensorMapEncodeTiled).
_TMA_ALIGN = 16
_TMA_MAX_BOX = 256


def reads_by_tma(plan: LaunchPlan, logits: torch.Tensor) -> bool:
    """Whether phase 1 reads ``logits`` [B, K+1, V] through TMA boxes under ``plan``: the
    plan asks for it with flat rows; Triton's interpreter, or a CUDA device of compute
    capability 9.0 or more; the rows flatten to [B (K+1), V] (unit token stride, batch
    stride (K+1) times the row stride, or one request), the row stride and the base address
    are multiples of 16 bytes, a box row of block_v tokens is too, and there is at least
    one whole chunk. Anything else (broadcast views, odd strides, V below one chunk) is read
    with pointer loads, with the same results."""
    if not plan.tma or not plan.flat_rows:
        return False
    on_gpu = logits.device.type == "cuda" and not is_interpreter()
    if on_gpu and torch.cuda.get_device_capability(logits.device)[0] < 9:
        return False
    if not on_gpu and not is_interpreter():
        return False
    batch, rows, vocab = logits.shape
    size = logits.element_size()
    stride_b, stride_k, stride_v = logits.stride()
    return (
        stride_v == 1
        and (batch == 1 or stride_b == rows * stride_k)
        and (stride_k * size) % _TMA_ALIGN == 0
        and logits.data_ptr() % _TMA_ALIGN == 0
        and (plan.block_v * size) % _TMA_ALIGN == 0
        and max(plan.flat_rows, plan.groups, plan.block_v) <= _TMA_MAX_BOX
        and vocab >= plan.chunk
    )


def tma_descriptor(plan: LaunchPlan, logits: torch.Tensor) -> TensorDescriptor:
    """The logits as a [V_whole / block_v, B (K+1), block_v] tensor (token blocks outermost:
    strides block_v, the row stride, 1) for TMA boxes of [groups, flat_rows, block_v]
    (V_whole: the tokens of the whole chunks, a multiple of the chunk and so of groups *
    block_v); ``reads_by_tma`` must hold."""
    batch, rows, vocab = logits.shape
    whole = vocab // plan.chunk * plan.chunk
    return TensorDescriptor(
        logits,
        [whole // plan.block_v, batch * rows, plan.block_v],
        [plan.block_v, logits.stride(1), 1],
        [plan.groups, plan.flat_rows, plan.block_v],
    )


def launch_constants(
    plan: LaunchPlan, rows: int, q_mode: int, support: int, *, overlap: bool, tma: bool = False
) -> tuple[dict[str, int | bool], dict[str, int | bool]]:
    """The compile-time arguments of phase 1's launch and of the phase-2 launches (rescan
    and finish), in that order, for ``rows`` = K+1 rows per request; ``support`` is S for
    sparse q, else 1; ``tma``: phase 1 reads through a descriptor (``reads_by_tma``).
    Both carry the plan's carveout, which no kernel reads: as a compile-time argument it gives
    each carveout its own compiled kernel, so that the per-function attribute one plan asks
    for is never the one another plan's launches (and CUDA graphs) run with.
    verify_chain launches with them; bench/compile_sm90.py compiles with them."""
    r = int(triton.next_power_of_2(rows))
    shape: dict[str, int | bool] = {"K": rows - 1, "R": r, "BLOCK_B": plan.block_b}
    stats: dict[str, int | bool] = {
        **shape,
        "BLOCK_V": plan.block_v,
        "BLOCK_R": plan.flat_rows or plan.block_b * r,
        "FLAT": bool(plan.flat_rows),
        "GROUPS": plan.groups,
        "OVERLAP": overlap,
        "TMA": tma,
        "KIND_ORDER": bool(plan.flat_rows) and plan.kind_order,
        "ARM_TICKET": q_mode == Q_DENSE and plan.ticket,
        "CARVEOUT": plan.carveout,
    }
    phase2: dict[str, int | bool] = {
        **shape,
        "S": support,
        "S_P2": slot_axis(support),
        "Q_MODE": q_mode,
        "NSPLIT_P2": split_axis(plan.nsplit),
        "BLOCK_F": plan.block_f or plan.block_v,
        "OVERLAP": overlap,
        "SUPPORT_TILE": plan.support_tile if q_mode == Q_SPARSE else 0,
        "CARVEOUT": plan.carveout,
    }
    return stats, phase2


def finish_launch_plan(plan: LaunchPlan) -> LaunchPlan:
    """The plan the separate finish launch runs under: ``plan`` with its carveout replaced by
    ``plan.finish_carveout`` where that is not -1 (so the finish is its own compiled kernel,
    asking for its own carveout). verify_chain launches with it; bench/compile_sm90.py
    compiles with it."""
    if plan.finish_carveout == -1:
        return plan
    return replace(plan, carveout=plan.finish_carveout)


def _launch(
    kernel: Launchable, grid: tuple[int, ...], plan: LaunchPlan, *args: object, **meta: object
) -> None:
    """Launch ``kernel`` over ``grid`` (asynchronously, on the current stream) and ask CUDA
    for ``plan.carveout`` for it from its next launch on (``pp3kernels.carveout``)."""
    prefer_carveout(kernel[grid](*args, **meta), plan.carveout)


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

    Extra device memory besides the outputs: the partials (16 bytes per row and vocabulary
    chunk); for sparse q of more than 4 slots, one scratch row of block_f fp32 per request
    (up to 16 KiB on the GPU plans) that the draw writes its residual tiles through; for
    dense q, the chunk masses of the rejected rows (8 bytes per request and chunk); for a
    split support (plan.support_tile > 0), each draft row's count and verdict (5 bytes) and
    two fp64 sums per request, tile of support_tile slots and chunk (S = 4096 at B = 64:
    32 tiles x 32 chunks, 1 MiB).
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
    # K = 0 still needs a valid draft pointer: a [B, 1] column of NO_TOKEN, never read as a
    # draft (no row is a draft row) and standing in for the unused q pointers.
    if k > 0:
        drafts = draft_tokens
    else:
        drafts = torch.full((batch, 1), NO_TOKEN, dtype=torch.int32, device=device)
    q_strides: tuple[int, ...]
    qd_strides: tuple[int, ...]
    if q_dense is not None:
        q_mode, support = Q_DENSE, 1
        qd, qd_strides = q_dense, q_dense.stride()
        qid = qcnt = drafts
        q_strides = (0, 0, 0)
        den = 1
    elif q_ids is not None and q_counts is not None:
        q_mode, support = Q_SPARSE, q_ids.shape[2]
        if q_ids.stride() != q_counts.stride():  # one set of strides serves both
            q_counts = q_counts.contiguous()
            q_ids = q_ids.contiguous()
        qid, qcnt, q_strides = q_ids, q_counts, q_ids.stride()
        qd, qd_strides = logits, (0, 0, 0)
        den = check_denominator(denominator)  # a host integer: checked even when not validating
    else:
        q_mode, support = Q_NONE, 1
        qid = qcnt = drafts
        q_strides = (0, 0, 0)
        qd, qd_strides = logits, (0, 0, 0)
        den = 1

    if plan is None:
        plan = plan_launch(
            batch,
            rows,
            vocab,
            interpreter=is_interpreter() or not logits.is_cuda,
            support=support,
            dense=q_mode == Q_DENSE,
        )
    block_f = plan.block_f or plan.block_v
    if plan.chunk % plan.block_v or plan.chunk % block_f:
        raise ValueError(f"{plan}: chunk must be a multiple of block_v and block_f")
    if plan.flat_rows < 0 or plan.flat_rows & (plan.flat_rows - 1):
        raise ValueError(f"{plan}: flat_rows must be 0 or a power of two")
    if plan.groups < 2 or plan.groups & (plan.groups - 1):
        raise ValueError(f"{plan}: groups must be a power of two >= 2")
    if plan.finish_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{plan}: finish_warps must be a power of two from 1 to 32")
    if plan.support_tile < 0 or plan.support_tile & (plan.support_tile - 1):
        raise ValueError(f"{plan}: support_tile must be 0 or a power of two")
    if not -1 <= plan.carveout <= 100:
        raise ValueError(f"{plan}: carveout must be -1 or a percentage from 0 to 100")
    if not -1 <= plan.finish_carveout <= 100:
        raise ValueError(f"{plan}: finish_carveout must be -1 or a percentage from 0 to 100")
    if plan.finish_maxnreg and not 24 <= plan.finish_maxnreg <= 255:
        raise ValueError(f"{plan}: finish_maxnreg must be 0 or a register count from 24 to 255")
    if plan.support_warps not in (0, 1, 2, 4, 8, 16, 32):
        raise ValueError(f"{plan}: support_warps must be 0 or a power of two from 1 to 32")
    blocks = triton.cdiv(batch, plan.block_b)
    # Phase 1 writes, phase 2 reads: per (request, row, chunk) max, sum, argmax and flags;
    # both kernels take them, then (B, V, chunk, NSPLIT), in this order.
    part_shape = (batch, rows, plan.nsplit)
    partials = (
        torch.empty(part_shape, dtype=torch.float32, device=device),
        torch.empty(part_shape, dtype=torch.float32, device=device),
        torch.empty(part_shape, dtype=torch.int32, device=device),
        torch.empty(part_shape, dtype=torch.int32, device=device),
    )
    split = (batch, vocab, plan.chunk, plan.nsplit)
    overlap = overlaps(plan, device)
    tma = reads_by_tma(plan, logits)
    stats_meta, phase2_meta = launch_constants(
        plan, rows, q_mode, support, overlap=overlap, tma=tma
    )

    # Sparse q past MAX_LOOPED_SLOTS slots draws through one row of block_f floats per
    # request (jit/chain.py, _scatter_residuals); otherwise a placeholder pointer, never read.
    if q_mode == Q_SPARSE and support > MAX_LOOPED_SLOTS:
        scratch = torch.empty((blocks * plan.block_b, block_f), dtype=torch.float32, device=device)
    else:
        scratch = partials[1]
    # Dense q: chain_rescan_kernel writes each rejected row's exact chunk masses, the finish
    # kernel reads them; the other forms never touch this pointer (a placeholder).
    if q_mode == Q_DENSE:
        masses = torch.empty((batch, plan.nsplit), dtype=torch.float64, device=device)
    else:
        masses = partials[1]
    # Sparse q split over support tiles: chain_counts_kernel writes every draft row's count
    # and q verdict, chain_support_kernel every stop row's support sums per tile and chunk
    # (two fp64 buffers), the finish kernel reads both; otherwise placeholders, never read.
    support_tile = int(phase2_meta["SUPPORT_TILE"])
    tiles = triton.cdiv(support, support_tile) if support_tile else 0
    if tiles:
        counted = (
            torch.empty((batch, max(k, 1)), dtype=torch.int32, device=device),
            torch.empty((batch, max(k, 1)), dtype=torch.int8, device=device),
            # one ticket per request block, armed by the counts launch (plan.ticket)
            torch.empty((blocks,), dtype=torch.int32, device=device),
        )
        sums = torch.empty((2, batch, tiles, plan.nsplit), dtype=torch.float64, device=device)
        support_sums = (sums[0], sums[1])
    else:
        # Dense q with plan.ticket: the rescan's ticket per request block, which phase 1
        # arms (ARM_TICKET); otherwise a placeholder, never read.
        rescan_ticket = (
            torch.empty((blocks,), dtype=torch.int32, device=device)
            if stats_meta["ARM_TICKET"]
            else partials[2]
        )
        counted = (partials[2], partials[3], rescan_ticket)
        support_sums = (partials[1], partials[1])

    if plan.flat_rows:
        stats_grid = (triton.cdiv(batch * rows, plan.flat_rows), plan.nsplit)
    else:
        stats_grid = (blocks, plan.nsplit)
    _launch(
        _chain_stats_kernel,
        stats_grid,
        plan,
        logits,
        *logits.stride(),
        temperature,
        *partials,
        counted[2],
        *split,
        tma_descriptor(plan, logits) if tma else None,
        **stats_meta,
        num_warps=plan.num_warps,
    )
    # The finish kernel's arguments up to its outputs, which the rescan kernel takes too.
    phase2 = (
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
        *partials,
        scratch,
        masses,
        *counted,
        *support_sums,
    )
    # With overlap, both phase-2 launches are programmatic dependent launches (each waits
    # for the launch before it inside the kernel, before its first read of its output).
    launch2: dict[str, int | bool] = {"num_warps": plan.finish_warps}
    if overlap:
        launch2["launch_pdl"] = True
    if q_mode == Q_DENSE:
        _launch(
            _chain_rescan_kernel,
            (blocks, plan.nsplit),
            plan,
            *phase2,
            tokens,
            accepted,
            status,
            *split,
            float(den),
            **phase2_meta,
            TICKET=bool(stats_meta["ARM_TICKET"]),
            **launch2,
        )
    ticket = (bool(tiles) and k > 0 and plan.ticket) or bool(stats_meta["ARM_TICKET"])
    if tiles and k > 0:  # (no draft row: nothing to count, no stop row rejects a draft)
        _launch(
            _chain_counts_kernel,
            (blocks, k),
            plan,
            *phase2,
            *split,
            float(den),
            **phase2_meta,
            TICKET=ticket,
            **launch2,
        )
        _launch(
            _chain_support_kernel,
            (blocks, tiles),
            plan,
            *phase2,
            tokens,
            accepted,
            status,
            *split,
            float(den),
            **phase2_meta,
            TICKET=ticket,
            **{**launch2, "num_warps": plan.support_warps or plan.finish_warps},
        )
    if not ticket:
        # its own compiled kernel for its own carveout (launch_constants) and register cap
        finish = finish_launch_plan(plan)
        if plan.finish_maxnreg:
            launch2 = {**launch2, "maxnreg": plan.finish_maxnreg}
        _launch(
            _chain_finish_kernel,
            (blocks,),
            finish,
            *phase2,
            tokens,
            accepted,
            status,
            *split,
            float(den),
            **{**phase2_meta, "CARVEOUT": finish.carveout},
            **launch2,
        )
    return ChainResult(tokens, accepted, status)


__all__ = [
    "LaunchPlan",
    "finish_launch_plan",
    "launch_constants",
    "overlaps",
    "plan_launch",
    "reads_by_tma",
    "verify_chain",
]
