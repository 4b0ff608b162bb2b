"""The selector's host side, pinned without a kernel launch: what a mutation campaign over
``pp3kernels/selector.py`` (its plan functions and ``verify_chain``'s checks and buffers)
found unpinned.

Every expected value is worked out from the documented rules (the plan constants'
comments in selector.py, docs/selector.md "Launch shapes", bench/NOTES.md), not copied
from the code's output. ``verify_chain`` runs with every launch global replaced by a
recorder, so its plan checks, buffers, grids and warps are read in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
import torch
from launches import LaunchRecorder

import pp3kernels.selector as selector_module
from pp3kernels.contract import SelectorInputError
from pp3kernels.jit import chain as chain_kernels
from pp3kernels.jit.launch import Q_DENSE, Q_NONE, Q_SPARSE
from pp3kernels.selector import (
    LaunchPlan,
    _prev_power_of_2,
    _tile_elements_per_request,
    launch_constants,
    overlaps,
    plan_launch,
    reads_by_tma,
    slot_axis,
    split_axis,
    verify_chain,
)

# ---- pure helpers


def _floor_power_of_2(n: int) -> int:
    """The largest power of two <= n, by doubling (1 for n < 1): an independent count."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _ceil_power_of_2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@pytest.mark.parametrize("n", [-5, 0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 8191, 8192, 1 << 20])
def test_prev_power_of_2_is_the_largest_power_at_or_below(n: int) -> None:
    """Below 1 it is 1 (a tile always holds one request); otherwise the floor power."""
    assert _prev_power_of_2(n) == _floor_power_of_2(n)


def test_padded_axes_have_their_documented_minimums() -> None:
    """docs/selector.md: phase 2 pads its chunk axis to a power of two of at least 8 and its
    q-slot axis to a power of two of at least 2."""
    for n in (1, 2, 3, 7, 8, 9, 33, 64, 65, 245):
        assert split_axis(n) == max(8, _ceil_power_of_2(n)), n
    for s in (1, 2, 3, 4, 5, 16, 17, 1024, 1025, 4096):
        assert slot_axis(s) == max(2, _ceil_power_of_2(s)), s


# (r, block_v, support, nsplit) -> the largest tile per request, by hand from the docstring:
# max(r * 2 * block_v, r * NSPLIT_P2, r * min(S_P2, 256) * (S_P2 if S_P2 <= 16 else 1),
#     S_P2 * NSPLIT_P2 if that is <= 4096 else S_P2).
_TILES = [
    (8, 1024, 1, 1, 8 * 2 * 1024),  # phase 1's [R, 2, block_v]
    (64, 1, 1, 100, 64 * 128),  # the partials [R, NSPLIT_P2]: 128 chunks
    (8, 8, 16, 1, 8 * 16 * 16),  # S_P2 = 16 still has the pairwise [R, 16, 16] check
    (8, 8, 17, 1, 8 * 32),  # S_P2 = 32: no pairwise check, [R, 32] (membership 32 * 8 too)
    (4, 8, 17, 1, 32 * 8),  # ... where membership [32, 8] is the largest
    (1, 8, 512, 8, 512 * 8),  # membership [512, 8]: exactly 4096 elements, one tile
    (1, 8, 512, 9, 512),  # [512, 16] is past 4096: [S_P2] tiles, four chunks at a time
    (8, 8, 4096, 1, 4096),  # [4096, 8] past 4096: [S_P2]; slots in tiles of 256: 8 * 256
    (32, 8, 4096, 1, 32 * 256),  # slots [R, 256] tiles, above the [S_P2] membership tile
]


@pytest.mark.parametrize("case", _TILES, ids=str)
def test_tile_elements_per_request_is_the_largest_documented_tile(
    case: tuple[int, int, int, int, int],
) -> None:
    r, block_v, support, nsplit, want = case
    assert _tile_elements_per_request(r, block_v, support, nsplit) == want


def test_interpreter_plan_fits_the_largest_tile_into_two_to_the_20() -> None:
    """The interpreter's requests per program: the largest power of two whose tiles stay
    within 2^20 elements, and never below one request (a huge support at K = 15)."""
    # R = 8, V = 1000: block_v 1024, phase 1's [8, 2, 1024] = 16384 per request: 64 a program
    assert plan_launch(10_000, 6, 1000, interpreter=True).block_b == 64
    # R = 16, S = 2^20: membership [2^20] alone fills the limit: 1 request
    assert plan_launch(10, 16, 64, interpreter=True, support=1 << 20).block_b == 1
    # S = 2^21: past the limit, still one request per program
    assert plan_launch(10, 16, 64, interpreter=True, support=1 << 21).block_b == 1
    # B = 3: the batch rounded up to a power of two bounds it
    assert plan_launch(3, 2, 64, interpreter=True).block_b == 4


@pytest.mark.parametrize(
    ("vocab", "nsplit", "chunk"),
    [(1000, 1, 1024), (8192, 1, 8192), (8193, 2, 8192), (10_000, 2, 8192), (16_385, 3, 8192)],
)
def test_interpreter_splits_past_8192_tokens_into_chunks_of_8192(
    vocab: int, nsplit: int, chunk: int
) -> None:
    """docs/selector.md: one split up to V = 8192 (the row in whole 1024-token tiles), and
    splits of 8192 tokens beyond, two of them included."""
    plan = plan_launch(4, 6, vocab, interpreter=True)
    assert (plan.nsplit, plan.chunk, plan.block_v) == (nsplit, chunk, 1024)


# ---- plan_launch's documented table (large and small vocabularies on a GPU)


def test_small_vocabularies_end_at_1024_tokens() -> None:
    """V <= 1024 on a GPU: one request, one split, the row padded to a power of two of at
    least 16 lanes; V = 1025 takes the split-vocabulary plan (flat rows, overlap)."""
    small = plan_launch(4, 6, 1024, interpreter=False)
    assert (small.block_b, small.block_v, small.nsplit, small.chunk, small.block_f) == (
        1,
        1024,
        1,
        1024,
        1024,
    )
    assert small.flat_rows == 0 and not small.overlap
    assert plan_launch(4, 6, 16, interpreter=False).block_v == 16
    assert plan_launch(4, 6, 17, interpreter=False).block_v == 32
    assert plan_launch(8, 6, 1025, interpreter=False).flat_rows == 8


@pytest.mark.parametrize(
    ("batch", "tile"),
    [
        (1, (1, 2, 1024, 4)),
        (2, (2, 4, 512, 4)),
        (3, (2, 4, 512, 4)),
        (4, (2, 4, 512, 4)),
        (5, (2, 4, 512, 4)),
        (6, (8, 2, 256, 8)),
        (15, (8, 2, 256, 8)),
    ],
)
@pytest.mark.parametrize("rows", [5, 6])
def test_small_batches_tile_one_or_two_flat_rows(
    batch: int, tile: tuple[int, int, int, int], rows: int
) -> None:
    """V = 129280, K = 4 and 5, below 16 requests: one request reads one flat row a program
    in [1, 2, 1024] tiles at 4 warps (v5 step 40), two to five two flat rows in [2, 4, 512]
    tiles at 4 warps (steps 41-42; both one step a chunk), six to fifteen eight in [8, 2, 256]
    at 8 (four steps); 2048-token chunks, pointer loads, no kind order, whatever the q
    form."""
    for q in ("point", "sparse64", "sparse4096", "dense"):
        support = int(q.removeprefix("sparse")) if q.startswith("sparse") else 1
        plan = plan_launch(
            batch, rows, 129_280, interpreter=False, support=support, dense=q == "dense"
        )
        assert (plan.flat_rows, plan.groups, plan.block_v, plan.num_warps) == tile, q
        assert plan.chunk == 2048 and plan.chunk % (plan.groups * plan.block_v) == 0, q
        assert not plan.tma and not plan.kind_order, q


@pytest.mark.parametrize("batch", [15, 16, 63, 64, 255, 256])
def test_chunks_tiles_and_warps_by_batch(batch: int) -> None:
    """V = 129280, K = 5 (R = 8): below 16 requests [8, 256] tiles (2048 / R), two groups,
    8 warps; from 16 [8, 128] tiles (1024 / R), four groups, 4 warps; chunks of 2048 below
    64 requests and 4096 from 64; from 256 on TMA, and a pair of flat rows a program at one
    warp ([2, 128] tiles, v5 step 47), with no kind order. K = 4 (odd K+1) alike: the same
    tiles, the pairs from 256 on too (step 48), though two of five straddle two requests."""
    plan = plan_launch(batch, 6, 129_280, interpreter=False)
    large = batch >= 16
    pairs = batch >= 256
    assert plan.block_v == (128 if large else 256)
    assert plan.groups == (4 if large else 2)
    assert plan.num_warps == (1 if pairs else 4 if large else 8)
    assert plan.flat_rows == (2 if pairs else 8)
    chunk = 4096 if batch >= 64 else 2048
    assert (plan.chunk, plan.nsplit) == (chunk, -(-129_280 // chunk))
    assert plan.tma == (batch >= 256) and not plan.kind_order
    odd = plan_launch(batch, 5, 129_280, interpreter=False)
    assert odd == plan


def test_block_v_is_at_least_64_lanes() -> None:
    """Phase-1 tiles of R * block_v elements with block_v >= 64: R = 64 (K = 33) at 16
    requests would give 1024 / 64 = 16 lanes, held at 64."""
    assert plan_launch(16, 34, 129_280, interpreter=False).block_v == 64
    assert plan_launch(16, 33, 129_280, interpreter=False).block_v == 64  # R = 64 too
    assert plan_launch(16, 8, 129_280, interpreter=False).block_v == 128


def test_chunks_grow_in_whole_draw_tiles_past_256_splits() -> None:
    """Past 256 * 2048 tokens the chunk grows in whole 1024-token draw tiles instead of
    the split count: V = 524289 needs chunks of ceil(V / 256) = 2049, rounded up to 3072."""
    plan = plan_launch(4, 6, 524_289, interpreter=False)
    assert (plan.chunk, plan.nsplit, plan.block_f) == (3072, 171, 1024)
    plan = plan_launch(4, 6, 524_288, interpreter=False)
    assert (plan.chunk, plan.nsplit, plan.block_f) == (2048, 256, 2048)


@pytest.mark.parametrize("support", [1, 64, 65, 127, 128, 1024, 1025, 2048, 4096])
@pytest.mark.parametrize("batch", [1, 15, 16, 64])
def test_sparse_q_phase2_by_support_and_batch(batch: int, support: int) -> None:
    """Sparse q (NOTES steps 25-28): a slot axis of 128 or more splits the support; below
    16 requests in tiles of 256 at 8 warps with a ticket (no finish launch), from 16 in
    tiles of 128 at 4 warps, or 256 at 8 from a slot axis of 2048; phase 2 at 16 warps from
    a slot axis of 2048, else 8; carveout 100 below 16 requests for 65-1024 slots only."""
    plan = plan_launch(batch, 6, 129_280, interpreter=False, support=support)
    s_p2 = max(2, _ceil_power_of_2(support))
    split, wide, small = s_p2 >= 128, s_p2 >= 2048, batch < 16
    assert plan.finish_warps == (16 if wide else 8)
    assert plan.ticket == (split and small)
    want = (0, 0) if not split else (256, 8) if small or wide else (128, 4)
    assert (plan.support_tile, plan.support_warps) == want
    assert plan.carveout == (100 if small and split and not wide else -1)
    # the finish alone on its multiprocessor, in 128 registers, where no launch asks for a
    # split and it launches at all (v5 step 38)
    alone = plan.carveout == -1 and not plan.ticket
    assert (plan.finish_carveout, plan.finish_maxnreg) == ((7, 128) if alone else (-1, 0))


@pytest.mark.parametrize("batch", [1, 4, 15, 16, 64, 128, 129, 256, 1024])
@pytest.mark.parametrize("q", ["point", "sparse64", "sparse1024", "sparse4096", "dense"])
def test_finish_alone_up_to_128_requests_where_no_launch_asks_a_split(batch: int, q: str) -> None:
    """v5 step 38: up to 128 requests (one finish program each, no more than the H100's and
    H200's 132 multiprocessors) the finish asks for the 16 KB split (7%) and 128 registers,
    unless the plan asks every launch for a split (dense q and 65-1024 slots below 16
    requests) or has no finish launch (the ticket); small vocabularies and the interpreter
    never."""
    support = int(q.removeprefix("sparse")) if q.startswith("sparse") else 1
    plan = plan_launch(batch, 6, 129_280, interpreter=False, support=support, dense=q == "dense")
    asks = batch < 16 and (q == "dense" or q == "sparse1024")
    alone = batch <= 128 and not asks and not (q == "sparse4096" and batch < 16)
    assert plan.ticket == (batch < 16 and q in ("sparse1024", "sparse4096", "dense"))
    assert (plan.finish_carveout, plan.finish_maxnreg) == ((7, 128) if alone else (-1, 0))
    for other in (
        plan_launch(batch, 6, 1000, interpreter=False, support=support, dense=q == "dense"),
        plan_launch(batch, 6, 129_280, interpreter=True, support=support, dense=q == "dense"),
    ):
        assert (other.finish_carveout, other.finish_maxnreg) == (-1, 0)


# ---- overlaps and reads_by_tma


_PLAN = LaunchPlan(block_b=1, block_v=8, nsplit=2, chunk=32, num_warps=4, flat_rows=4, tma=True)


@dataclass
class _CudaTensor:
    """Just what ``reads_by_tma`` reads of a CUDA tensor, without a GPU: a contiguous
    [B, K+1, V] fp32 layout at an aligned address."""

    shape: tuple[int, int, int] = (2, 3, 64)
    device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))

    def element_size(self) -> int:
        return 4

    def stride(self) -> tuple[int, int, int]:
        _, rows, vocab = self.shape
        return (rows * vocab, vocab, 1)

    def data_ptr(self) -> int:
        return 1 << 20


def _gpu(monkeypatch: pytest.MonkeyPatch, major: int) -> None:
    """Outside the interpreter, on a GPU of compute capability ``major``.0."""
    monkeypatch.setattr(selector_module, "is_interpreter", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))


@pytest.mark.parametrize(("major", "want"), [(8, False), (9, True), (10, True)])
def test_overlap_and_tma_need_sm90_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch, major: int, want: bool
) -> None:
    """Programmatic dependent launch and TMA start with compute capability 9.0."""
    _gpu(monkeypatch, major)
    cuda = torch.device("cuda", 0)
    assert overlaps(replace(_PLAN, overlap=True), cuda) is want
    assert not overlaps(_PLAN, cuda)  # the plan does not ask
    assert reads_by_tma(_PLAN, cast(torch.Tensor, _CudaTensor())) is want
    assert not reads_by_tma(replace(_PLAN, tma=False), cast(torch.Tensor, _CudaTensor()))


def test_no_overlap_or_tma_on_a_cpu_tensor_outside_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gpu(monkeypatch, 9)
    assert not overlaps(replace(_PLAN, overlap=True), torch.device("cpu"))
    assert not reads_by_tma(_PLAN, torch.zeros(2, 3, 64))


def test_no_overlap_in_the_interpreter_even_for_a_cuda_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(selector_module, "is_interpreter", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert not overlaps(replace(_PLAN, overlap=True), torch.device("cuda", 0))


def _offset(shape: tuple[int, int, int], elements: int) -> torch.Tensor:
    """A contiguous fp32 [B, K+1, V] view starting ``elements`` past an allocation."""
    flat = torch.zeros(shape[0] * shape[1] * shape[2] + elements)
    return flat[elements:].view(shape)


def _tma_layouts() -> list[tuple[str, LaunchPlan, torch.Tensor, bool]]:
    base = torch.zeros(2, 3, 64)
    return [
        ("contiguous", _PLAN, base, True),
        ("no tma asked", replace(_PLAN, tma=False), base, False),
        ("no flat rows", replace(_PLAN, flat_rows=0), base, False),
        ("token stride 3", _PLAN, torch.zeros(2, 64, 3).transpose(1, 2), False),
        ("batch stride 0", _PLAN, torch.zeros(1, 3, 64).expand(2, 3, 64), False),
        ("one request, gapped", _PLAN, torch.zeros(2, 4, 64)[:1, :3], True),
        ("two requests, gapped", _PLAN, torch.zeros(2, 4, 64)[:, :3], False),
        ("row of 264 bytes", _PLAN, torch.zeros(2, 3, 66), False),
        ("row stride of 272 bytes", _PLAN, torch.zeros(2, 3, 68)[:, :, :66], True),
        ("base 4 bytes off", _PLAN, _offset((2, 3, 64), 1), False),
        ("base 16 bytes off", _PLAN, _offset((2, 3, 64), 4), True),
        ("box row of 8 bytes", replace(_PLAN, block_v=2), base, False),
        ("bf16 box row of 16 bytes", _PLAN, base.bfloat16(), True),
        ("fp16 box row of 8 bytes", replace(_PLAN, block_v=4), base.half(), False),
        ("256 flat rows", replace(_PLAN, flat_rows=256), base, True),
        ("512 flat rows", replace(_PLAN, flat_rows=512), base, False),
        ("256 groups", replace(_PLAN, groups=256), base, True),
        ("512 groups", replace(_PLAN, groups=512), base, False),
        ("256-token boxes", replace(_PLAN, block_v=256, chunk=512), torch.zeros(2, 3, 512), True),
        ("512-token boxes", replace(_PLAN, block_v=512, chunk=512), torch.zeros(2, 3, 512), False),
        ("one whole chunk", _PLAN, torch.zeros(2, 3, 32), True),
        ("no whole chunk", _PLAN, torch.zeros(2, 3, 32)[:, :, :31], False),
    ]


@pytest.mark.parametrize(
    ("plan", "logits", "want"), [c[1:] for c in _tma_layouts()], ids=[c[0] for c in _tma_layouts()]
)
def test_reads_by_tma_layout_rules(
    monkeypatch: pytest.MonkeyPatch, plan: LaunchPlan, logits: torch.Tensor, want: bool
) -> None:
    """reads_by_tma's documented conditions one at a time, each just met and just missed
    (16-byte strides, base and box rows; boxes of at most 256; at least one whole chunk;
    rows that flatten, or one request)."""
    monkeypatch.setattr(selector_module, "is_interpreter", lambda: True)
    assert reads_by_tma(plan, logits) is want


# ---- launch_constants


def test_launch_constants_of_a_row_tiled_plan() -> None:
    """Not flat: phase 1 tiles block_b requests of R padded rows (BLOCK_R = block_b * R),
    kind order is off whatever the plan says, block_f 0 means block_v, dense q has no
    support tiles, the split axis is padded to 8 and the slot axis to 2."""
    plan = LaunchPlan(
        block_b=4, block_v=16, nsplit=3, chunk=64, num_warps=4, kind_order=True,
        support_tile=128, carveout=7,
    )  # fmt: skip
    stats, phase2 = launch_constants(plan, 3, Q_DENSE, 1, overlap=True)
    shape = {"K": 2, "R": 4, "BLOCK_B": 4}
    assert stats == {
        **shape, "BLOCK_V": 16, "BLOCK_R": 16, "FLAT": False, "GROUPS": 2, "OVERLAP": True,
        "TMA": False, "KIND_ORDER": False, "ARM_TICKET": False, "CARVEOUT": 7,
    }  # fmt: skip
    # phase 1 arms dense q's rescan tickets where the plan has them (v5 step 39), no others
    assert launch_constants(replace(plan, ticket=True), 3, Q_DENSE, 1, overlap=True)[0][
        "ARM_TICKET"
    ]
    assert not launch_constants(replace(plan, ticket=True), 3, Q_SPARSE, 1, overlap=True)[0][
        "ARM_TICKET"
    ]
    assert phase2 == {
        **shape, "S": 1, "S_P2": 2, "Q_MODE": Q_DENSE, "NSPLIT_P2": 8, "BLOCK_F": 16,
        "OVERLAP": True, "SUPPORT_TILE": 0, "CARVEOUT": 7,
    }  # fmt: skip


def test_launch_constants_of_a_flat_sparse_plan() -> None:
    """Flat rows: BLOCK_R = flat_rows, kind order as planned, the plan's block_f, sparse q's
    support tile, a split axis of 9 padded to 16 and 300 slots to 512."""
    plan = LaunchPlan(
        block_b=1, block_v=64, nsplit=9, chunk=256, num_warps=8, block_f=128, flat_rows=16,
        groups=4, kind_order=True, support_tile=128,
    )  # fmt: skip
    stats, phase2 = launch_constants(plan, 6, Q_SPARSE, 300, overlap=False, tma=True)
    assert (stats["K"], stats["R"], stats["BLOCK_R"], stats["FLAT"]) == (5, 8, 16, True)
    assert (stats["GROUPS"], stats["TMA"], stats["KIND_ORDER"]) == (4, True, True)
    assert (phase2["S_P2"], phase2["NSPLIT_P2"], phase2["BLOCK_F"]) == (512, 16, 128)
    assert (phase2["SUPPORT_TILE"], phase2["CARVEOUT"], phase2["OVERLAP"]) == (128, -1, False)
    assert launch_constants(plan, 6, Q_NONE, 1, overlap=False)[1]["SUPPORT_TILE"] == 0
    assert (
        launch_constants(replace(plan, kind_order=False), 6, Q_SPARSE, 300, overlap=False)[0][
            "KIND_ORDER"
        ]
        is False
    )


# ---- verify_chain without a launch


_KERNELS = ("stats", "rescan", "counts", "support", "finish")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> dict[str, LaunchRecorder]:
    out = {}
    for name in _KERNELS:
        recorder = LaunchRecorder(getattr(chain_kernels, f"chain_{name}_kernel"))
        monkeypatch.setattr(selector_module, f"_chain_{name}_kernel", recorder)
        out[name] = recorder
    return out


def _call(
    plan: LaunchPlan | None, batch: int = 3, rows: int = 3, vocab: int = 64, q: str = "none",
    support: int = 1,
) -> None:  # fmt: skip
    """verify_chain on zeros (nothing is launched, so nothing is read), unvalidated."""
    k = rows - 1
    q_args: dict[str, Any] = {}
    if q == "sparse":
        q_args = {
            "q_ids": torch.zeros((batch, k, support), dtype=torch.int32),
            "q_counts": torch.zeros((batch, k, support), dtype=torch.int32),
            "denominator": 16,
        }
    elif q == "dense":
        q_args = {"q_dense": torch.zeros((batch, k, vocab))}
    verify_chain(
        torch.zeros((batch, rows, vocab)),
        torch.zeros((batch, k), dtype=torch.int32),
        torch.ones(batch),
        torch.zeros(batch, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        validate=False,
        plan=plan,
        **q_args,
    )


_BASE = LaunchPlan(block_b=2, block_v=8, nsplit=2, chunk=32, num_warps=4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"block_v": 12}, "chunk must be a multiple of block_v and block_f"),
        ({"block_f": 12}, "chunk must be a multiple of block_v and block_f"),
        ({"flat_rows": 3}, "flat_rows must be 0 or a power of two"),
        ({"flat_rows": -4}, "flat_rows must be 0 or a power of two"),
        ({"groups": 0}, "groups must be a power of two >= 2"),
        ({"groups": 1}, "groups must be a power of two >= 2"),
        ({"groups": 6}, "groups must be a power of two >= 2"),
        ({"finish_warps": 0}, "finish_warps must be a power of two from 1 to 32"),
        ({"finish_warps": 64}, "finish_warps must be a power of two from 1 to 32"),
        ({"support_tile": 3}, "support_tile must be 0 or a power of two"),
        ({"support_tile": -4}, "support_tile must be 0 or a power of two"),
        ({"carveout": -2}, "carveout must be -1 or a percentage from 0 to 100"),
        ({"carveout": 101}, "carveout must be -1 or a percentage from 0 to 100"),
        ({"finish_carveout": -2}, "finish_carveout must be -1 or a percentage from 0 to 100"),
        ({"finish_carveout": 101}, "finish_carveout must be -1 or a percentage from 0 to 100"),
        ({"finish_maxnreg": -1}, "finish_maxnreg must be 0 or a register count from 24 to 255"),
        ({"finish_maxnreg": 23}, "finish_maxnreg must be 0 or a register count from 24 to 255"),
        ({"finish_maxnreg": 256}, "finish_maxnreg must be 0 or a register count from 24 to 255"),
        ({"support_warps": 3}, "support_warps must be 0 or a power of two from 1 to 32"),
        ({"support_warps": 64}, "support_warps must be 0 or a power of two from 1 to 32"),
    ],
    ids=str,
)
def test_bad_plans_are_refused_before_any_launch(
    launches: dict[str, LaunchRecorder], changes: dict[str, Any], message: str
) -> None:
    plan = replace(_BASE, **changes)
    with pytest.raises(ValueError, match=message) as refusal:
        _call(plan)
    assert str(refusal.value).startswith(f"{plan}: ")
    assert all(not recorder.launches for recorder in launches.values())


@pytest.mark.parametrize(
    "changes",
    [
        {"block_f": 0},
        {"block_f": 16},
        {"block_v": 32, "block_f": 32},
        {"flat_rows": 1},
        {"flat_rows": 4},
        {"groups": 2},
        {"groups": 4},
        *({"finish_warps": w} for w in (1, 2, 4, 8, 16, 32)),
        *({"support_warps": w} for w in (0, 1, 2, 4, 8, 16, 32)),
        *({"support_tile": t} for t in (0, 1, 2, 128)),
        *({"carveout": c} for c in (-1, 0, 50, 100)),
        *({"finish_carveout": c} for c in (-1, 0, 50, 100)),
        *({"finish_maxnreg": n} for n in (0, 24, 255)),
    ],
    ids=str,
)
def test_plans_at_the_bounds_are_accepted(
    launches: dict[str, LaunchRecorder], changes: dict[str, Any]
) -> None:
    _call(replace(_BASE, **changes), q="sparse", support=5)
    assert len(launches["stats"].launches) == 1


def test_buffers_and_launches_without_q(launches: dict[str, LaunchRecorder]) -> None:
    """No q: phase 1 over (request blocks, splits) then the finish over request blocks (3
    requests in blocks of 2: 2 blocks), both at their plan's warps; the partials are
    [B, K+1, nsplit]; scratch and masses are placeholders (the partial sums)."""
    _call(replace(_BASE, finish_warps=2))
    (stats,) = launches["stats"].launches
    (finish,) = launches["finish"].launches
    assert stats.grid == (2, 2) and stats.meta["num_warps"] == 4
    assert finish.grid == (2,) and finish.meta["num_warps"] == 2
    assert "launch_pdl" not in finish.meta  # no overlap off sm_90
    assert finish.args["part_sum_ptr"].shape == (3, 3, 2)
    assert finish.args["scratch_ptr"] is finish.args["part_sum_ptr"]
    assert finish.args["mass_ptr"] is finish.args["part_sum_ptr"]
    assert (finish.args["B"], finish.args["V"], finish.args["CHUNK"]) == (3, 64, 32)
    assert (finish.args["NSPLIT"], finish.args["denominator_f"]) == (2, 1.0)
    assert (finish.args["stride_db"], finish.args["stride_dk"]) == (2, 1)
    # no q: no q strides, and the dense-q pointer is the logits with zero strides
    q_strides = [finish.args[f"stride_q{axis}"] for axis in ("b", "k", "s", "db", "dk", "dv")]
    assert q_strides == [0] * 6
    assert stats.args["logits_desc"] is None  # no TMA descriptor without TMA
    assert not (launches["rescan"].launches or launches["counts"].launches)


def test_q_strides_and_denominator_reach_phase_2(launches: dict[str, LaunchRecorder]) -> None:
    """Sparse q passes its strides (one set for ids and counts: counts of other strides are
    made contiguous with the ids) and its denominator; dense q its own strides and a
    denominator of 1, the sparse strides 0."""
    batch, k, support = 3, 2, 5
    q_ids = torch.zeros((batch, k, support), dtype=torch.int32)
    q_counts = torch.zeros((batch, support, k), dtype=torch.int32).transpose(1, 2)
    verify_chain(
        torch.zeros((batch, k + 1, 64)),
        torch.zeros((batch, k), dtype=torch.int32),
        torch.ones(batch),
        torch.zeros(batch, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=16,
        validate=False,
        plan=_BASE,
    )
    args = launches["finish"].launches[0].args
    assert args["qcnt_ptr"].stride() == args["qid_ptr"].stride() == (10, 5, 1)
    assert (args["stride_qb"], args["stride_qk"], args["stride_qs"]) == (10, 5, 1)
    assert (args["stride_qdb"], args["stride_qdk"], args["stride_qdv"]) == (0, 0, 0)
    assert args["denominator_f"] == 16.0
    _call(_BASE, q="dense")
    args = launches["finish"].launches[-1].args
    assert (args["stride_qdb"], args["stride_qdk"], args["stride_qdv"]) == (128, 64, 1)
    assert (args["stride_qb"], args["stride_qk"], args["stride_qs"]) == (0, 0, 0)
    assert args["denominator_f"] == 1.0


def test_overlapped_launches_are_programmatic_dependent_ones(
    launches: dict[str, LaunchRecorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the launches overlap (sm_90), phase 1 is told so and every phase-2 launch
    (rescan, counts, support, finish) is a programmatic dependent launch; phase 1 is not."""
    monkeypatch.setattr(selector_module, "overlaps", lambda plan, device: True)
    _call(replace(_BASE, support_tile=128), q="sparse", support=300)
    _call(_BASE, q="dense")
    stats = launches["stats"].launches
    assert all(launch.meta["OVERLAP"] is True for launch in stats)
    assert all("launch_pdl" not in launch.meta for launch in stats)
    for name in ("rescan", "counts", "support", "finish"):
        assert launches[name].launches, name
        for launch in launches[name].launches:
            assert launch.meta["launch_pdl"] is True and launch.meta["OVERLAP"] is True, name


def test_verify_chain_plans_with_its_q_form(
    launches: dict[str, LaunchRecorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a plan, verify_chain asks plan_launch for its own shape and q form: sparse
    q's slots, dense or not, the interpreter's plan on the CPU."""
    asked: list[tuple[tuple[int, ...], dict[str, Any]]] = []

    def recording(*args: int, **kwargs: Any) -> LaunchPlan:
        asked.append((args, kwargs))
        return plan_launch(*args, **kwargs)

    monkeypatch.setattr(selector_module, "plan_launch", recording)
    _call(None, q="sparse", support=5)
    _call(None, q="dense")
    _call(None)
    cpu = {"interpreter": True}
    assert asked == [
        ((3, 3, 64), {**cpu, "support": 5, "dense": False}),
        ((3, 3, 64), {**cpu, "support": 1, "dense": True}),
        ((3, 3, 64), {**cpu, "support": 1, "dense": False}),
    ]


def test_validation_is_on_by_default(launches: dict[str, LaunchRecorder]) -> None:
    """A draft token outside the vocabulary is refused on the host unless the caller turns
    validation off (inside a CUDA graph, where the kernel reports it instead)."""
    args = (
        torch.zeros((1, 2, 8)),
        torch.full((1, 1), 8, dtype=torch.int32),
        torch.ones(1),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64),
    )
    with pytest.raises(SelectorInputError):
        verify_chain(*args, plan=_BASE)
    assert not launches["stats"].launches
    verify_chain(*args, plan=_BASE, validate=False)
    assert len(launches["stats"].launches) == 1


def test_flat_rows_tile_the_batchs_rows_in_phase_1(launches: dict[str, LaunchRecorder]) -> None:
    """Flat rows: phase 1's grid is ceil(B (K+1) / flat_rows) by the splits: 3 * 3 / 4."""
    _call(replace(_BASE, flat_rows=4))
    assert launches["stats"].launches[0].grid == (3, 2)


@pytest.mark.parametrize(("support", "scratch"), [(1, False), (4, False), (5, True)])
def test_sparse_q_scratch_row_past_four_slots(
    launches: dict[str, LaunchRecorder], support: int, scratch: bool
) -> None:
    """Sparse q of more than MAX_LOOPED_SLOTS = 4 slots draws through one fp32 row of
    block_f per request of every block (3 requests in blocks of 2: 4 rows of 16)."""
    _call(replace(_BASE, block_f=16), q="sparse", support=support)
    args = launches["finish"].launches[0].args
    if scratch:
        assert args["scratch_ptr"].shape == (4, 16)
        assert args["scratch_ptr"].dtype == torch.float32
    else:
        assert args["scratch_ptr"] is args["part_sum_ptr"]
    assert args["mass_ptr"] is args["part_sum_ptr"]


def test_dense_q_rescans_into_fp64_chunk_masses(launches: dict[str, LaunchRecorder]) -> None:
    """Dense q: the rescan over (request blocks, splits) writes [B, nsplit] fp64 masses that
    the finish reads; no scratch row."""
    _call(_BASE, q="dense")
    (rescan,) = launches["rescan"].launches
    (finish,) = launches["finish"].launches
    assert rescan.grid == (2, 2)
    masses = finish.args["mass_ptr"]
    assert masses is rescan.args["mass_ptr"]
    assert masses.shape == (3, 2) and masses.dtype == torch.float64
    assert finish.args["scratch_ptr"] is finish.args["part_sum_ptr"]


@pytest.mark.parametrize("q", ["none", "sparse", "dense"])
def test_only_the_finish_launch_takes_its_carveout_and_register_cap(
    launches: dict[str, LaunchRecorder], q: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish_carveout and finish_maxnreg reach the finish launch alone (its CARVEOUT
    constexpr, the carveout CUDA is asked for after it, and Triton's maxnreg option), the
    other launches keep the plan's carveout and no cap; -1 and 0 leave the finish as the
    others."""
    asked: list[int] = []
    monkeypatch.setattr(selector_module, "prefer_carveout", lambda _k, p: asked.append(p))
    support = 300 if q == "sparse" else 1
    base = replace(_BASE, support_tile=128 if q == "sparse" else 0, carveout=100)
    _call(replace(base, finish_carveout=7, finish_maxnreg=128), q=q, support=support)
    (finish,) = launches["finish"].launches
    assert finish.meta["CARVEOUT"] == 7 and finish.meta["maxnreg"] == 128
    others = [launch for name in _KERNELS[:-1] for launch in launches[name].launches]
    assert len(others) == {"none": 1, "sparse": 3, "dense": 2}[q]
    assert all(o.meta["CARVEOUT"] == 100 and "maxnreg" not in o.meta for o in others)
    assert asked == [100] * len(others) + [7]  # the finish launches last
    asked.clear()
    _call(base, q=q, support=support)
    plain = launches["finish"].launches[-1]
    assert plain.meta["CARVEOUT"] == 100 and "maxnreg" not in plain.meta
    assert asked == [100] * (len(others) + 1)


@pytest.mark.parametrize("ticket", [False, True])
def test_split_support_buffers_and_launches(
    launches: dict[str, LaunchRecorder], ticket: bool
) -> None:
    """support_tile 128 over 300 slots: 3 tiles. Counts over (blocks, K), support over
    (blocks, tiles) at support_warps, then the finish, or none with the ticket; each draft
    row's count (int32) and verdict (int8), one ticket per block, two fp64 sums per
    request, tile and chunk."""
    plan = replace(_BASE, support_tile=128, support_warps=2, finish_warps=8, ticket=ticket)
    _call(plan, q="sparse", support=300)
    (counts,) = launches["counts"].launches
    (support,) = launches["support"].launches
    assert counts.grid == (2, 2) and support.grid == (2, 3)
    assert counts.meta["num_warps"] == 8 and support.meta["num_warps"] == 2
    assert counts.meta["TICKET"] is ticket and support.meta["TICKET"] is ticket
    assert len(launches["finish"].launches) == (0 if ticket else 1)
    args = support.args
    assert args["count_ptr"].shape == (3, 2) and args["count_ptr"].dtype == torch.int32
    assert args["q_bad_ptr"].shape == (3, 2) and args["q_bad_ptr"].dtype == torch.int8
    assert args["ticket_ptr"].shape == (2,)
    assert args["sup_e_ptr"].shape == args["sup_r_ptr"].shape == (3, 3, 2)
    assert args["sup_e_ptr"].dtype == torch.float64
    assert args["sup_e_ptr"].data_ptr() != args["sup_r_ptr"].data_ptr()  # two sums, not one
    assert args["scratch_ptr"].shape == (4, 8)  # 300 slots: the scratch row too


def test_split_support_without_drafts_only_finishes(launches: dict[str, LaunchRecorder]) -> None:
    """K = 0: no draft row to count and no stop row that rejects, so neither the counts
    nor the support launch runs, and the finish runs even with a ticket; the draft pointer
    is a [B, 1] column of NO_TOKEN with a zero draft stride, the counts [B, max(K, 1)]."""
    plan = replace(_BASE, support_tile=128, ticket=True)
    _call(plan, rows=1, q="sparse", support=300)
    assert not (launches["counts"].launches or launches["support"].launches)
    (finish,) = launches["finish"].launches
    assert finish.args["draft_ptr"].shape == (3, 1)
    assert bool((finish.args["draft_ptr"] == -1).all())
    assert finish.args["stride_dk"] == 0
    assert finish.args["count_ptr"].shape == (3, 1)  # one count per request, never read


def test_one_draft_is_counted_and_drawn_from(launches: dict[str, LaunchRecorder]) -> None:
    """K = 1 is a chain like any other: its drafts are passed as given (not the K = 0
    stand-in column) and a split support counts its one draft row, sums the support and,
    with the ticket, finishes in the support launch."""
    plan = replace(_BASE, support_tile=128, ticket=True)
    _call(plan, rows=2, q="sparse", support=300)
    (counts,) = launches["counts"].launches
    (support,) = launches["support"].launches
    assert counts.grid == (2, 1) and support.grid == (2, 3)
    assert not launches["finish"].launches
    assert bool((support.args["draft_ptr"] == 0).all())  # the caller's drafts: zeros


def test_the_default_plan_off_a_gpu_is_the_interpreters(
    launches: dict[str, LaunchRecorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a plan, a CPU tensor gets the interpreter's plan even outside the
    interpreter (its row tiles: B = 3 in one block of 4, V = 64 in one split)."""
    monkeypatch.setattr(selector_module, "is_interpreter", lambda: False)
    _call(None)
    (stats,) = launches["stats"].launches
    assert stats.grid == (1, 1)
    assert (stats.meta["BLOCK_B"], stats.meta["BLOCK_V"], stats.meta["FLAT"]) == (4, 64, False)


def test_an_empty_batch_launches_nothing(launches: dict[str, LaunchRecorder]) -> None:
    _call(_BASE, batch=0)
    assert all(not recorder.launches for recorder in launches.values())
