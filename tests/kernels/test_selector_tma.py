"""Phase 1 through the tensor memory accelerator, and the greedy-only statistics, in the
interpreter (v5 step 12; run with ``TRITON_INTERPRET=1`` set outside Python).

With ``LaunchPlan.tma`` and flat rows, phase 1 reads every whole chunk as
[groups, flat_rows, block_v] boxes of a descriptor over the logits and the last, partial
chunk with pointer loads; where the device or the logits' layout does not allow it
(``reads_by_tma``), everything is read with pointer loads. Either way the outputs must be
the pointer plan's bit for bit, and the reference's. Greedy-only blocks keep per lane the
max and its first index (the lowest group holding a step's max, where it beats the lane's
max): ties must still give the lowest id.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from test_selector import NEG, _assert_same, _kernel, _make, _reference

import pp3kernels.selector as selector_module
from pp3kernels.contract import STATUS_ALL_MASKED, STATUS_NAN, STATUS_OK, STATUS_POSINF
from pp3kernels.drafts import point_mass_q
from pp3kernels.selector import LaunchPlan, reads_by_tma


def _plan(*, chunk: int, nsplit: int, block_v: int, flat_rows: int, groups: int, tma: bool) -> Any:
    return LaunchPlan(
        block_b=1,
        block_v=block_v,
        nsplit=nsplit,
        chunk=chunk,
        num_warps=4,
        block_f=chunk,
        flat_rows=flat_rows,
        groups=groups,
        tma=tma,
    )


class _DescriptorSeen:
    """Wraps phase 1's launch and records whether it was given a TMA descriptor."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.descriptors: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        # logits_desc's place among the positional arguments, from the kernel's signature
        where = list(inspect.signature(self.kernel.fn).parameters).index("logits_desc")

        def launch(*args: Any, **meta: Any) -> None:
            self.descriptors.append(args[where])
            self.kernel[grid](*args, **meta)

        return launch


# (form, dtype, greedy share, batch, drafts, vocab, chunk, nsplit, block_v, flat_rows, groups)
_CASES = [
    # two whole chunks by TMA, a tail of 8 tokens by pointers; blocks of 8 flat rows
    # straddle requests of 4 rows, and the last box runs past the batch's 24 rows
    ("point", torch.bfloat16, 0.25, 6, 3, 40, 16, 3, 8, 8, 2),
    ("sparse", torch.float32, 0.0, 5, 2, 48, 16, 3, 4, 4, 2),  # V a whole number of chunks
    ("dense", torch.bfloat16, 0.5, 3, 5, 96, 64, 2, 8, 8, 4),  # four groups a step
    ("none", torch.float32, 1.0, 4, 0, 40, 16, 3, 4, 2, 4),  # K = 0, greedy only, 4 groups
    ("sparse", torch.bfloat16, 1.0, 7, 3, 72, 32, 3, 8, 8, 4),  # greedy only, 4 groups
    ("sparse", torch.float32, 0.5, 9, 4, 100, 32, 4, 4, 16, 2),  # mixed blocks, tail of 4
]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}-{c[1]}-t0:{c[2]}-V{c[5]}")
def test_tma_plans_equal_the_pointer_plan_and_the_reference(
    monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...]
) -> None:
    form, dtype, greedy, batch, drafts, vocab, chunk, nsplit, block_v, flat, groups = case
    args = _make(
        batch=batch, drafts=drafts, vocab=vocab, seed=vocab + batch, q=form, dtype=dtype,
        greedy_share=greedy,
    )  # fmt: skip
    shape = {"chunk": chunk, "nsplit": nsplit, "block_v": block_v, "flat_rows": flat}
    tma, pointers = (
        _plan(**shape, groups=groups, tma=True),
        _plan(**shape, groups=groups, tma=False),
    )
    assert reads_by_tma(tma, args["logits"]) and not reads_by_tma(pointers, args["logits"])
    seen = _DescriptorSeen(selector_module._chain_stats_kernel)
    monkeypatch.setattr(selector_module, "_chain_stats_kernel", seen)
    got = _kernel(args, plan=tma)
    _assert_same(got, _kernel(args, plan=pointers), args)
    _assert_same(got, _reference(args), args)
    assert seen.descriptors[0] is not None and seen.descriptors[1] is None


@pytest.mark.parametrize(
    ("layout", "vocab", "dtype"),
    [
        ("expanded", 48, torch.float32),  # batch stride 0: the rows do not flatten
        ("sliced", 48, torch.bfloat16),  # a row stride of 55 tokens (110 bytes)
        ("strided", 48, torch.float32),  # token stride 2
        ("contiguous", 30, torch.bfloat16),  # rows of 60 bytes
        ("contiguous", 12, torch.float32),  # no whole chunk of 16
    ],
)
def test_tma_plans_fall_back_to_pointer_loads_where_the_layout_needs_it(
    layout: str, vocab: int, dtype: torch.dtype
) -> None:
    args = _make(batch=5, drafts=3, vocab=vocab, seed=vocab, dtype=dtype, layout=layout)
    plan = _plan(chunk=16, nsplit=-(-vocab // 16), block_v=8, flat_rows=8, groups=2, tma=True)
    assert not reads_by_tma(plan, args["logits"])
    _assert_same(_kernel(args, plan=plan), _reference(args), args)


def test_the_gpu_plans_ask_for_tma_from_256_requests_on() -> None:
    """Large vocabularies on a GPU ask for TMA boxes from 256 requests on (below, the
    pointer program was faster on sampled rows); the interpreter's and small-vocabulary
    plans never do (they tile whole requests, not flat rows)."""
    assert selector_module.plan_launch(256, 6, 129_280, interpreter=False).tma
    assert selector_module.plan_launch(1024, 2, 129_280, interpreter=False).tma
    assert not selector_module.plan_launch(255, 6, 129_280, interpreter=False).tma
    assert not selector_module.plan_launch(64, 6, 129_280, interpreter=False).tma
    assert not selector_module.plan_launch(4, 6, 129_280, interpreter=False).tma
    assert not selector_module.plan_launch(256, 6, 1000, interpreter=False).tma
    assert not selector_module.plan_launch(4, 6, 1000, interpreter=False).tma
    assert not selector_module.plan_launch(4, 6, 129_280, interpreter=True).tma


@pytest.mark.parametrize("greedy_share", [1.0, 0.25], ids=["greedy-only", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_statuses_under_tma_boxes(dtype: torch.dtype, greedy_share: float) -> None:
    """NaN, +inf and all--inf rows, in chunks read by TMA and in the pointer-read tail
    (V = 40: chunks [0, 16) and [16, 32) by TMA, [32, 40) by pointers), in greedy-only and
    mixed blocks: the statuses of the contract, other requests untouched."""
    args = _make(batch=24, drafts=3, vocab=40, seed=71, dtype=dtype, greedy_share=greedy_share)
    clean = _reference(args)
    logits = args["logits"].clone()
    nan, inf = float("nan"), float("inf")
    logits[1, 0, 3] = nan  # a TMA chunk
    logits[2, 3, 38] = nan  # the tail, bonus row
    logits[3, 2, 17] = inf
    logits[4, 1, 33] = inf  # the tail
    logits[5, 1, 20:23] = inf  # several: POSINF, not NaN
    logits[6, 0, :] = NEG
    logits[7, 2, 5] = inf
    logits[7, 2, 36] = nan  # NaN before +inf
    logits[8, 0, :32] = NEG  # the TMA chunks all -inf, the tail finite: OK
    statuses = {1: STATUS_NAN, 2: STATUS_NAN, 3: STATUS_POSINF, 4: STATUS_POSINF}
    statuses |= {5: STATUS_POSINF, 6: STATUS_ALL_MASKED, 7: STATUS_NAN}
    corrupted = {**args, "logits": logits}
    plan = _plan(chunk=16, nsplit=3, block_v=8, flat_rows=8, groups=2, tma=True)
    assert reads_by_tma(plan, logits)
    got = _kernel(corrupted, plan=plan)
    _assert_same(got, _reference(corrupted), corrupted)
    for b in range(24):
        if b in statuses:
            assert int(got.status[b]) == statuses[b], b
            assert got.tokens[b].tolist() == [-1] * 4 and int(got.accepted[b]) == 0
        elif b != 8:
            assert int(got.status[b]) == STATUS_OK
            assert got.tokens[b].tolist() == clean.tokens[b].tolist(), b
    assert int(got.status[8]) == STATUS_OK


def _greedy_only_args(logits: torch.Tensor) -> dict[str, Any]:
    """An all-T0 batch over ``logits`` [B, 2, V] with one point-mass draft each, V - 1 (never
    a row max in these tests)."""
    batch, _, vocab = logits.shape
    drafts = torch.full((batch, 1), vocab - 1, dtype=torch.int32)
    q_ids, q_counts = point_mass_q(drafts, 16)
    return dict(
        logits=logits,
        draft_tokens=drafts,
        temperature=torch.zeros(batch),
        seed=torch.arange(batch, dtype=torch.int64),
        position=torch.zeros(batch, dtype=torch.int64),
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=16,
    )


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("groups", [2, 4])
def test_greedy_only_ties_take_the_lowest_id(groups: int, tma: bool) -> None:
    """All-T0 blocks (per lane: the max and its first index, from each step's lowest group
    holding the step's max, taken where it beats the lane's max): a row max held by
    several ids gives the lowest, whether they sit in one lane's groups of one step, in one
    lane across steps, in different lanes of one step or of different steps, in different
    chunks, or are -0.0 and +0.0; a chunk of only -inf gives its row's max to the other.
    Lanes of 4 tokens, steps of 4 * groups tokens, chunks of 32, V = 64 (fp32)."""
    vocab, lanes = 64, 4
    step = lanes * groups
    patterns = [  # (ids holding the max, max value, the first id)
        ([9, 5], 5.0, 5),  # lane 1: groups 1 and 2 of step 0 (groups = 4)
        ([17, 13], 5.0, 13),  # lane 1, one group or one step apart
        ([40, 6, 3], 5.0, 3),  # other lanes, the other chunk
        ([step + 1, step + 2], 4.0, step + 1),  # lanes 1 and 2 of one step
        ([2 * step + 1, step + 3], 4.0, step + 3),  # lane 3 rose a step before lane 1
        ([9, 5], 0.0, 5),  # -0.0 at 5, +0.0 at 9: signed zeros tie
        ([2 + step, 2], 7.0, 2),  # lane 2: one step apart
        ([33, 60], 3.0, 33),  # only the second chunk holds the max
    ]
    batch = len(patterns) + 1
    generator = torch.Generator().manual_seed(groups)
    logits = torch.rand((batch, 2, vocab), generator=generator) - 2.0
    for i, (ids, value, _) in enumerate(patterns):
        logits[i, 0, ids] = value
        if value == 0.0:
            logits[i, 0, ids[1]] = -0.0
    logits[len(patterns) - 1, 0, :32] = NEG  # the first chunk all -inf
    args = _greedy_only_args(logits)
    plan = _plan(chunk=32, nsplit=2, block_v=lanes, flat_rows=8, groups=groups, tma=tma)
    assert reads_by_tma(plan, logits) == tma
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    for i, (_, _, first) in enumerate(patterns):
        assert int(got.tokens[i, 0]) == first, patterns[i]


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_greedy_only_blocks_see_a_nan_in_any_group_of_a_step(
    dtype: torch.dtype, groups: int, tma: bool
) -> None:
    """All-T0 blocks keep per lane the max over a step's groups (on the GPU a max ignores
    NaN) and a NaN test of the step's tokens: a NaN in any group of any step, before or
    after its row's max, in a chunk read by boxes or in the tail, makes its request NAN and
    no other. Lanes of 16 bytes (a TMA box row's least), chunks of two steps of 4
    groups (two chunks read by boxes), a tail of 8 tokens."""
    lanes = 16 // torch.empty((), dtype=dtype).element_size()
    step = lanes * groups
    chunk = 8 * lanes
    vocab = 2 * chunk + 8
    nans = [g * lanes + 1 for g in range(groups)]  # each group of step 0, lane 1
    nans += [step + g * lanes + 3 for g in range(groups)]  # each group of step 1, lane 3
    nans += [chunk + 8 * lanes - 2, vocab - 3]  # the second chunk's last token; the tail
    batch = len(nans) + 2
    generator = torch.Generator().manual_seed(groups)
    logits = (torch.rand((batch, 2, vocab), generator=generator) - 2.0).to(dtype)
    for i, token in enumerate(nans):
        logits[i, i % 2, (token + (5 if i % 2 else -5)) % vocab] = 3.0  # the max: after, before
        logits[i, i % 2, token] = float("nan")
    args = _greedy_only_args(logits)
    plan = _plan(chunk=chunk, nsplit=3, block_v=lanes, flat_rows=8, groups=groups, tma=tma)
    assert reads_by_tma(plan, logits) == tma
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    assert got.status[: len(nans)].tolist() == [STATUS_NAN] * len(nans)
    assert got.status[len(nans) :].tolist() == [STATUS_OK] * 2
