"""Phase 1's rows in kind order (v5 step 17), in the interpreter (``TRITON_INTERPRET=1``).

With ``LaunchPlan.kind_order`` and flat rows, phase 1 takes the rows of each group of
flat_rows consecutive requests T1 requests first, then T0 ones, each kind in request order,
so that a mixed batch runs blocks of one kind. The order only moves rows between blocks:
every row's partial statistics, and so every output, must be the flat order's bit for bit
and the reference's. Blocks of a group holding both kinds read with pointer loads under a
TMA plan (their rows are not consecutive), the others through boxes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from test_selector import _assert_same, _kernel, _make, _reference

from pp3kernels.jit import chain
from pp3kernels.selector import LaunchPlan, launch_constants, plan_launch, reads_by_tma


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit  # type: ignore[untyped-decorator]
def _rows_kernel(  # type: ignore[no-untyped-def]
    temp_ptr, req_ptr, row_ptr, mask_ptr, kinds_ptr, B, K: tl.constexpr, R: tl.constexpr
):
    """Stores ``_kind_ordered_rows`` for the block of program p (rows p R to p R + R - 1);
    kinds: (pure, any_t1, any_t0) per block."""
    pid = tl.program_id(0)
    req, row, mask_r, pure, any_t1, any_t0 = chain._kind_ordered_rows(temp_ptr, pid * R, B, K, R)
    offs = pid * R + tl.arange(0, R)
    tl.store(req_ptr + offs, req)
    tl.store(row_ptr + offs, row)
    tl.store(mask_ptr + offs, mask_r.to(tl.int32))
    tl.store(kinds_ptr + 3 * pid, pure.to(tl.int32))
    tl.store(kinds_ptr + 3 * pid + 1, any_t1)
    tl.store(kinds_ptr + 3 * pid + 2, any_t0)


def _ordered_rows(temperature: torch.Tensor, k: int, block: int) -> list[Any]:
    """(req, row, mask, kinds) over the whole flat batch, ``block`` rows a block; kinds:
    [blocks, 3] of (pure, any_t1, any_t0)."""
    batch = temperature.shape[0]
    blocks = -(-batch * (k + 1) // block)
    req, row, mask = (torch.full((blocks * block,), -9, dtype=torch.int32) for _ in range(3))
    kinds = torch.full((blocks * 3,), -9, dtype=torch.int32)
    _rows_kernel[(blocks,)](temperature, req, row, mask, kinds, batch, k, block)
    return [req, row, mask, kinds.view(blocks, 3)]


def _expected_rows(temperature: torch.Tensor, k: int, block: int) -> list[tuple[int, int]]:
    """The contract of the order in plain Python: per group of ``block`` requests, the T1
    requests' rows (request order), then the T0 ones', K+1 rows each, then padding."""
    batch, rows = temperature.shape[0], k + 1
    total = -(-batch * rows // block) * block  # the grid's rows: whole blocks
    out: list[tuple[int, int]] = []
    for start in range(0, total, block * rows):
        group = [r for r in range(start // rows, start // rows + block) if r < batch]
        t1 = [r for r in group if float(temperature[r]) > 0]
        t0 = [r for r in group if not float(temperature[r]) > 0]
        out += [(r, i) for r in t1 + t0 for i in range(rows)]
        out += [(-1, -1)] * (block * rows - rows * len(group))
    return out[:total]


@pytest.mark.parametrize(
    ("pattern", "batch", "k", "block"),
    [
        ("alternate", 16, 5, 8),  # every other request T0: 3 of a group's 6 blocks T1
        ("alternate", 19, 5, 8),  # the last group short: 3 requests, then padding
        ("random", 37, 3, 4),  # K+1 = 4 rows: one request a block
        ("random", 23, 2, 4),  # blocks straddle requests of 3 rows
        ("all_t1", 11, 5, 8),
        ("all_t0", 11, 5, 8),
        ("one_t0", 8, 5, 8),  # 7 T1 requests: the group's sixth block mixed
        ("nan", 9, 1, 2),  # NaN temperature: T0 by _temperature's test (tau > 0)
        ("random", 13, 0, 4),  # K = 0: one row a request
    ],
)
def test_kind_ordered_rows_are_a_stable_partition_of_each_group(
    pattern: str, batch: int, k: int, block: int
) -> None:
    generator = torch.Generator().manual_seed(batch * 31 + k)
    temperature = torch.rand(batch, generator=generator) + 0.5
    if pattern == "alternate":
        temperature[1::2] = 0.0
    elif pattern == "random":
        temperature[torch.rand(batch, generator=generator) < 0.5] = 0.0
    elif pattern == "all_t0":
        temperature[:] = 0.0
    elif pattern == "one_t0":
        temperature[3] = 0.0
    elif pattern == "nan":
        temperature[::3] = float("nan")
    req, row, mask, kinds = _ordered_rows(temperature, k, block)
    want = _expected_rows(temperature, k, block)
    got = [(int(r), int(i)) if m else (-1, -1) for r, i, m in zip(req, row, mask, strict=True)]
    assert got == want
    # Every row of the batch exactly once.
    seen = sorted(p for p in got if p[0] >= 0)
    assert seen == [(r, i) for r in range(batch) for i in range(k + 1)]
    # pure: the block's group holds one kind, and then its rows are the flat order's.
    rows = k + 1
    # any_t1 / any_t0: the block holds a T1 / a T0 row (from the group's counts).
    for b, (flag, any_t1, any_t0) in enumerate(kinds.tolist()):
        group_start = b * block // (block * rows) * block
        in_group = {float(t) > 0 for t in temperature[group_start : group_start + block]}
        assert flag == int(len(in_group) == 1), (b, in_group)
        in_block = {
            float(temperature[r]) > 0 for r, _ in got[b * block : (b + 1) * block] if r >= 0
        }
        assert (any_t1, any_t0) == (int(True in in_block), int(False in in_block)), (b, in_block)
        if flag:
            flat = [(f // rows, f % rows) for f in range(b * block, (b + 1) * block)]
            assert got[b * block : (b + 1) * block] == [
                p if p[0] < batch else (-1, -1) for p in flat
            ]


def _plan(
    *, kind_order: bool, tma: bool, flat_rows: int, groups: int = 2, long: bool = False
) -> LaunchPlan:
    """Chunks of 16 tokens drawn in one tile; ``long``: the GPU's plan from 256 requests on
    in miniature (4 groups, 2 steps a chunk of 64, the draw walking 4 tiles of 16)."""
    return LaunchPlan(
        block_b=1,
        block_v=8,
        nsplit=2 if long else 3,
        chunk=64 if long else 16,
        num_warps=4,
        block_f=16,
        flat_rows=flat_rows,
        groups=groups,
        tma=tma,
        kind_order=kind_order,
    )


# (form, dtype, greedy share, batch, drafts, flat_rows, tma[, long])
_CASES: list[tuple[Any, ...]] = [
    ("point", torch.bfloat16, 0.5, 13, 5, 8, False),  # K+1 = 6: groups of 48 rows
    ("point", torch.bfloat16, 0.5, 13, 5, 8, True),  # TMA boxes in pure groups only
    ("sparse", torch.float32, 0.3, 9, 3, 4, True),
    ("dense", torch.bfloat16, 0.6, 7, 2, 4, False),  # blocks straddle requests of 3 rows
    ("none", torch.float32, 0.5, 10, 0, 2, True),  # K = 0
    ("sparse", torch.bfloat16, 1.0, 6, 3, 8, True),  # greedy only: the flat order
    ("point", torch.float32, 0.0, 6, 3, 8, True),  # sampled only
    ("point", torch.bfloat16, 0.5, 13, 5, 8, True, True),  # the B >= 256 plan in miniature
    ("sparse", torch.float32, 0.4, 11, 3, 8, True, True),
]


@pytest.mark.parametrize(
    "case", _CASES, ids=lambda c: f"{c[0]}-t0:{c[2]}-B{c[3]}-K{c[4]}-tma:{c[6]}-long:{c[7:]}"
)
def test_kind_order_gives_the_flat_order_bits_and_the_reference(case: tuple[Any, ...]) -> None:
    form, dtype, greedy, batch, drafts, flat_rows, tma = case[:7]
    long = len(case) > 7 and case[7]
    shape = {"tma": tma, "flat_rows": flat_rows, "long": long, "groups": 4 if long else 2}
    args = _make(
        batch=batch, drafts=drafts, vocab=120 if long else 40, seed=batch + 7 * drafts, q=form,
        dtype=dtype, greedy_share=greedy,
    )  # fmt: skip
    plan = _plan(kind_order=True, **shape)
    assert reads_by_tma(plan, args["logits"]) == tma and (plan.chunk > plan.block_f) == long
    ordered = _kernel(args, plan=plan)
    _assert_same(ordered, _kernel(args, plan=_plan(kind_order=False, **shape)), args)
    _assert_same(ordered, _reference(args), args)


def test_greedy_ties_in_kind_ordered_blocks_take_the_lowest_id() -> None:
    """Alternating T1 / T0 requests whose rows tie at their max in several lanes and steps:
    the T0 rows, gathered into greedy-only blocks, must still emit the lowest tied id."""
    vocab, batch, k = 48, 8, 2
    args = _make(batch=batch, drafts=k, vocab=vocab, seed=5, q="point", greedy_share=0.0)
    args["temperature"][1::2] = 0.0
    logits = torch.full((batch, k + 1, vocab), -3.0)
    for ties in (3, 11, 19, 30, 47):  # across lanes (block_v 8) and steps
        logits[:, :, ties] = 2.0
    args["logits"] = logits
    ordered = _kernel(args, plan=_plan(kind_order=True, tma=True, flat_rows=4, groups=2))
    _assert_same(ordered, _reference(args), args)
    assert (ordered.tokens[1::2, 0] == 3).all()


def test_no_plan_picks_the_kind_order_but_its_launch_constant_follows_the_plan() -> None:
    """Kind order is a plan option (measured by bench/plan_variants.py) that no plan picks
    since v5 step 48: from 256 requests every plan tiles pairs of flat rows at one warp,
    whatever the parity of K+1; below, kind order lost (step 17)."""
    for batch in (1, 4, 64, 255, 256, 1024):
        for rows in (5, 6):
            plan = plan_launch(batch, rows, 129_280, interpreter=False)
            # one request: one flat row a program (v5 step 40); two to five: two flat rows
            # (steps 41-42; B5 is not in this loop); from 256, a pair (steps 47-48)
            flat = 1 if batch == 1 else 2 if batch <= 4 or batch >= 256 else 8
            assert not plan.kind_order and plan.flat_rows == flat, (batch, rows)
            assert launch_constants(plan, rows, 0, 1, overlap=False)[0]["KIND_ORDER"] is False
            ordered = replace(plan, kind_order=True)
            assert launch_constants(ordered, rows, 0, 1, overlap=False)[0]["KIND_ORDER"] is True
    interp = plan_launch(4, 6, 129_280, interpreter=True)
    assert launch_constants(interp, 6, 0, 1, overlap=False)[0]["KIND_ORDER"] is False
