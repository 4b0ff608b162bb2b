"""The Triton selector in the interpreter: agreement with the torch reference, edge cases, law.

Run with ``TRITON_INTERPRET=1`` set outside Python. Every kernel call costs a few seconds
per program instance in the interpreter, so each test groups many cases into one batch
(one program holds up to 8192 requests with the default interpreter plan) and the forced
split-vocabulary plan is only used with B * splits <= 12 programs.

What the selector must reproduce is ``pp3kernels.contract``; the torch reference
(``reference_verify_chain``) draws the same Philox uniforms and runs the same inverse CDF,
so T0 outputs agree exactly and T1 outputs agree token for token except where a uniform
falls within a float rounding of a token boundary (never seen on these inputs; a
mismatch fails the test and is listed row by row).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import replace
from typing import Any

import pytest
import torch
from launches import NoLaunch, RecordingLaunch
from layout import assert_uniform_layout
from scipy.stats import power_divergence

import pp3kernels.selector as selector_module
from pp3kernels.contract import (
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    SelectorInputError,
)
from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts
from pp3kernels.interface import ChainResult
from pp3kernels.jit import chain as chain_kernels
from pp3kernels.jit.launch import (
    MAX_LOOPED_SLOTS,
    MAX_MEMBERSHIP_TILE,
    MAX_PREFETCH_SLOTS,
    MAX_SLOT_TILE,
    Q_DENSE,
    Q_SPARSE,
)
from pp3kernels.philox import acceptance_uniform, sample_uniform
from pp3kernels.reference import reference_verify_chain
from pp3kernels.selector import (
    LaunchPlan,
    launch_constants,
    overlaps,
    plan_launch,
    reads_by_tma,
    slot_axis,
    verify_chain,
)

ALPHA = 1e-6
NEG = float("-inf")
Args = dict[str, Any]


# --------------------------------------------------------------------------------------
# Inputs and comparison helpers
# --------------------------------------------------------------------------------------


def _lowest_argmax(rows: torch.Tensor) -> torch.Tensor:
    """Lowest id of the maximum along the last axis (-0.0 == +0.0), computed independently."""
    values = rows.float()
    at_max = values == values.amax(dim=-1, keepdim=True)
    return at_max.to(torch.int8).argmax(dim=-1)


def _layout(logits: torch.Tensor, layout: str, generator: torch.Generator) -> torch.Tensor:
    """The same values as ``logits`` [B, K+1, V] in a different memory layout."""
    batch, rows, vocab = logits.shape
    if layout == "contiguous":
        return logits
    if layout == "expanded":  # one target shared by every request: batch stride 0
        return logits[:1].expand(batch, rows, vocab)
    if layout == "sliced":  # a window of a larger tensor, every dimension offset
        big = torch.randn((batch + 3, rows + 2, vocab + 7), generator=generator).to(logits.dtype)
        big[1 : batch + 1, 1 : rows + 1, 3 : vocab + 3] = logits
        return big[1 : batch + 1, 1 : rows + 1, 3 : vocab + 3]
    if layout == "strided":  # every other token of a wider row: vocabulary stride 2
        big = torch.randn((batch, rows, 2 * vocab), generator=generator).to(logits.dtype)
        big[:, :, ::2] = logits
        return big[:, :, ::2]
    if layout == "transposed":  # storage [V, K+1, B]: batch stride 1
        return logits.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    raise ValueError(f"unknown layout {layout!r}")


def _make(
    *,
    batch: int,
    drafts: int,
    vocab: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    q: str = "sparse",
    support: int = 3,
    greedy_share: float = 0.25,
    invalid_share: float = 0.1,
    mask_share: float = 0.15,
    denominator: int = 1024,
    layout: str = "contiguous",
) -> Args:
    """A mixed T0/T1 batch: -inf masks, drafts drawn from q, invalidated proposals.

    q = "sparse" (``support`` tokens per row, quantised over ``denominator``), "point"
    (S = 1), "dense" (float [B, K, V] with zeros) or "none" (T1 requests propose -1 only).
    The q support is the top of a noisy copy of the target, so that drafts are often
    accepted and chains reach deep rows. T0 requests mostly propose the greedy token.
    """
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn((batch, drafts + 1, vocab), generator=generator) * 2.5
    masked = torch.rand(base.shape, generator=generator) < mask_share
    keep = torch.randint(0, vocab, (batch, drafts + 1, 1), generator=generator)
    masked.scatter_(2, keep, False)
    base = torch.where(masked, NEG, base)
    logits = _layout(base.to(dtype), layout, generator)
    values = logits.float()  # what the verifier sees after the dtype cast

    temperature = torch.rand(batch, generator=generator) * 1.5 + 0.3
    greedy = torch.randperm(batch, generator=generator)[: int(round(greedy_share * batch))]
    temperature[greedy] = 0.0
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    args: Args = {
        "logits": logits,
        "temperature": temperature,
        "seed": seeds,
        "position": positions,
    }
    if drafts == 0:
        args["draft_tokens"] = torch.zeros((batch, 0), dtype=torch.int32)
        return args

    noisy = torch.where(values[:, :drafts].isinf(), -4.0, values[:, :drafts])
    noisy = noisy + torch.randn(noisy.shape, generator=generator) * 1.5
    if q in ("sparse", "point"):
        width = 1 if q == "point" else min(support, vocab)
        top = noisy.topk(width, dim=-1).indices
        weights = torch.rand(top.shape, generator=generator) + 0.1
        probs = torch.zeros(noisy.shape).scatter_(2, top, weights)
        q_ids, q_counts = quantise_q(probs, denominator)
        proposals = sample_drafts(q_ids, q_counts, denominator, seeds, positions)
        args.update(q_ids=q_ids, q_counts=q_counts, denominator=denominator)
    elif q == "dense":
        dense = torch.softmax(noisy.double(), dim=-1)
        dense = torch.where(torch.rand(dense.shape, generator=generator) < 0.3, 0.0, dense)
        dense[..., 0] += 1e-3  # never an all-zero row
        dense = (dense / dense.sum(-1, keepdim=True)).to(torch.float32)
        flat = torch.multinomial(dense.reshape(-1, vocab), 1, generator=generator)
        proposals = flat.reshape(batch, drafts).to(torch.int32)
        args["q_dense"] = dense
    elif q == "none":
        proposals = torch.full((batch, drafts), -1, dtype=torch.int32)
    else:
        raise ValueError(f"unknown q form {q!r}")

    t0 = (temperature == 0)[:, None]
    greedy_pick = _lowest_argmax(values[:, :drafts]).to(torch.int32)
    use_greedy = torch.rand((batch, drafts), generator=generator) < 0.7
    proposals = torch.where(t0 & use_greedy, greedy_pick, proposals)
    if q == "none":
        random_pick = torch.randint(0, vocab, (batch, drafts), generator=generator)
        proposals = torch.where(t0 & ~use_greedy, random_pick.to(torch.int32), proposals)
    invalid = torch.rand((batch, drafts), generator=generator) < invalid_share
    args["draft_tokens"] = torch.where(invalid, -1, proposals).to(torch.int32)
    return args


def _kernel(args: Args, **extra: Any) -> ChainResult:
    return verify_chain(**args, **extra)


def _reference(args: Args, **extra: Any) -> ChainResult:
    return reference_verify_chain(**args, **extra)


def _select(args: Args, index: torch.Tensor) -> Args:
    """The requests ``index`` of a call (batch-indexed tensors only)."""
    return {k: v[index] if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _differing_rows(got: ChainResult, want: ChainResult) -> list[int]:
    differ = (got.tokens != want.tokens).any(-1)
    differ |= (got.accepted != want.accepted) | (got.status != want.status)
    return differ.nonzero().flatten().tolist()


def _assert_same(got: ChainResult, want: ChainResult, args: Args | None = None) -> None:
    """Bit-for-bit equality of all three outputs, listing every differing request."""
    for name, x, y in zip(ChainResult._fields, got, want, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, y.dtype, x.shape)
    rows = _differing_rows(got, want)
    if rows:
        lines = []
        for b in rows[:20]:
            tau = float(args["temperature"][b]) if args is not None else float("nan")
            lines.append(
                f"request {b} (tau {tau}): tokens {got.tokens[b].tolist()} vs "
                f"{want.tokens[b].tolist()}, accepted {int(got.accepted[b])} vs "
                f"{int(want.accepted[b])}, status {int(got.status[b])} vs {int(want.status[b])}"
            )
        raise AssertionError(f"{len(rows)} requests differ:\n" + "\n".join(lines))


def _assert_well_formed(result: ChainResult, args: Args) -> None:
    """OK rows echo accepted drafts, emit accepted + 1 tokens with p > 0, then -1 padding."""
    tokens, accepted, status = result
    ok = status == STATUS_OK
    emitted = (tokens >= 0).sum(-1)
    assert torch.equal(emitted[ok], accepted[ok] + 1)
    assert bool((tokens[~ok] == -1).all()) and bool((accepted[~ok] == 0).all())
    values = args["logits"].float()
    for b in ok.nonzero().flatten().tolist():
        a = int(accepted[b])
        assert tokens[b, :a].tolist() == args["draft_tokens"][b, :a].tolist()
        assert values[b, a, int(tokens[b, a])] > NEG, f"request {b} emitted a masked token"


def _split_plan(nsplit: int, chunk_tiles: int) -> LaunchPlan:
    """One request per program, ``nsplit`` vocabulary chunks of 8 * chunk_tiles tokens."""
    return LaunchPlan(block_b=1, block_v=8, nsplit=nsplit, chunk=8 * chunk_tiles, num_warps=4)


# --------------------------------------------------------------------------------------
# Agreement with the reference on fresh random inputs
# --------------------------------------------------------------------------------------

AGREEMENT_CASES: dict[str, dict[str, Any]] = {
    "v37-k5-fp32-sparse": {"batch": 512, "drafts": 5, "vocab": 37},
    "v37-k5-fp16-sparse": {"batch": 512, "drafts": 5, "vocab": 37, "dtype": torch.float16},
    "v37-k5-bf16-sparse": {"batch": 512, "drafts": 5, "vocab": 37, "dtype": torch.bfloat16},
    "v37-k5-point": {"batch": 512, "drafts": 5, "vocab": 37, "q": "point"},
    "v37-k5-dense": {"batch": 512, "drafts": 5, "vocab": 37, "q": "dense"},
    "v37-k3-no-q": {"batch": 256, "drafts": 3, "vocab": 37, "q": "none", "greedy_share": 0.5},
    "v37-k3-s8-c2^24": {
        "batch": 256,
        "drafts": 3,
        "vocab": 37,
        "support": 8,
        "denominator": 2**24,
    },
    "b1-k1-t1": {"batch": 1, "drafts": 1, "vocab": 37, "greedy_share": 0.0},
    # All-T1 batches: phase 1 takes the sampled-only pair update (no argmax tracked).
    "v37-k5-t1-sparse": {"batch": 512, "drafts": 5, "vocab": 37, "greedy_share": 0.0},
    "v37-k5-t1-bf16-dense": {
        "batch": 256,
        "drafts": 5,
        "vocab": 37,
        "q": "dense",
        "dtype": torch.bfloat16,
        "greedy_share": 0.0,
    },
    "v2100-k2-t1": {"batch": 128, "drafts": 2, "vocab": 2100, "greedy_share": 0.0},
    "b1-k5-t0": {"batch": 1, "drafts": 5, "vocab": 37, "greedy_share": 1.0},
    "k0": {"batch": 256, "drafts": 0, "vocab": 37, "q": "none"},
    "v1-k3": {"batch": 256, "drafts": 3, "vocab": 1, "mask_share": 0.0},
    "v2-k3": {"batch": 256, "drafts": 3, "vocab": 2, "mask_share": 0.1},
    "v8-k2-b9000": {"batch": 9000, "drafts": 2, "vocab": 8},  # two programs of 8192
    "v2100-k2-bf16": {  # three 1024-token tiles per row in the interpreter
        "batch": 128,
        "drafts": 2,
        "vocab": 2100,
        "support": 4,
        "dtype": torch.bfloat16,
    },
    "expanded": {"batch": 256, "drafts": 3, "vocab": 37, "layout": "expanded"},
    "sliced-bf16": {
        "batch": 256,
        "drafts": 3,
        "vocab": 37,
        "layout": "sliced",
        "dtype": torch.bfloat16,
    },
    "strided-fp16": {
        "batch": 256,
        "drafts": 3,
        "vocab": 37,
        "layout": "strided",
        "dtype": torch.float16,
    },
    "transposed-dense": {
        "batch": 256,
        "drafts": 3,
        "vocab": 37,
        "layout": "transposed",
        "q": "dense",
    },
}


@pytest.mark.parametrize("case", list(AGREEMENT_CASES))
def test_agrees_with_reference(case: str) -> None:
    spec = AGREEMENT_CASES[case]
    args = _make(seed=len(case) * 7919 + sum(map(ord, case)), **spec)
    got = _kernel(args)
    want = _reference(args)
    assert got.tokens.dtype == torch.int32 and got.tokens.shape == want.tokens.shape
    assert got.accepted.dtype == torch.int32 and got.status.dtype == torch.int8
    _assert_same(got, want, args)
    _assert_well_formed(got, args)
    assert bool((got.status == STATUS_OK).all())
    if spec["batch"] >= 256 and spec.get("vocab", 37) > 1 and spec["drafts"] > 0:
        # the batch really exercises both paths: some accepts, some stops before the bonus
        assert 0 < int(got.accepted.sum()) < spec["batch"] * spec["drafts"]


def test_strided_q_tensors_are_honoured() -> None:
    """q_ids / q_counts and draft_tokens as views of larger tensors give the same bits."""
    args = _make(batch=256, drafts=3, vocab=37, seed=41, support=4)
    wide_ids = torch.full((256, 3, 9), 7, dtype=torch.int32)
    wide_counts = torch.full((256, 3, 9), 99, dtype=torch.int32)
    wide_ids[:, :, 2:6] = args["q_ids"]
    wide_counts[:, :, 2:6] = args["q_counts"]
    wide_drafts = torch.full((256, 7), 5, dtype=torch.int32)
    wide_drafts[:, ::2][:, :3] = args["draft_tokens"]
    views = {
        **args,
        "q_ids": wide_ids[:, :, 2:6],
        "q_counts": wide_counts[:, :, 2:6],
        "draft_tokens": wide_drafts[:, ::2][:, :3],
    }
    assert not views["q_ids"].is_contiguous() and not views["draft_tokens"].is_contiguous()
    _assert_same(_kernel(views), _reference(args), args)


# --------------------------------------------------------------------------------------
# The forced split-vocabulary plan (partials per chunk, combined by the finish launch)
# --------------------------------------------------------------------------------------


def _split_sparse_case() -> Args:
    """Three requests at V = 30 (chunks of 8: 0-7, 8-15, 16-23, 24-29; last one partial).

    0: T1, row 0 proposes token 3 with p(3) ~ e^-40 and q support {3, 12, 27} spanning
       chunks 0, 1 and 3: certainly rejected, residual rescans two extra chunks.
    1: T0 with an argmax tie across chunks (4.0 at 9 and 25 -> 9) in row 0 and a signed
       zero tie (-0.0 at 5, +0.0 at 20 -> 5) in row 1; the drafts match, bonus from row 2.
    2: T1 with an invalidated proposal at row 0 (sample from p over all chunks).
    """
    generator = torch.Generator().manual_seed(17)
    vocab = 30
    logits = torch.randn((3, 3, vocab), generator=generator)
    logits[0, 0, 3] = -40.0
    logits[0, 0, 12] = 3.0
    logits[0, 0, 27] = 2.5
    logits[1, 0] = -1.0
    logits[1, 0, 9] = 4.0
    logits[1, 0, 25] = 4.0
    logits[1, 1] = -2.0
    logits[1, 1, 5] = -0.0
    logits[1, 1, 20] = 0.0
    ids = torch.tensor(
        [
            [[3, 12, 27], [0, 1, 2]],
            [[0, -1, -1], [0, -1, -1]],
            [[4, 17, -1], [0, 29, -1]],
        ],
        dtype=torch.int32,
    )
    counts = torch.tensor(
        [
            [[4, 8, 4], [6, 5, 5]],
            [[16, 0, 0], [16, 0, 0]],
            [[8, 8, 0], [8, 8, 0]],
        ],
        dtype=torch.int32,
    )
    return {
        "logits": logits,
        "draft_tokens": torch.tensor([[3, 1], [9, 5], [-1, 0]], dtype=torch.int32),
        "temperature": torch.tensor([0.9, 0.0, 1.3]),
        "seed": torch.tensor([11, -5, 2**40 + 3], dtype=torch.int64),
        "position": torch.tensor([0, 7, 2**33], dtype=torch.int64),
        "q_ids": ids,
        "q_counts": counts,
        "denominator": 16,
    }


def _split_dense_case() -> Args:
    """Four requests at V = 30 with dense q, chunks of 16 (0-15, 16-29).

    0: T1, proposal 2 with p(2) ~ e^-40 and q mass on both chunks: rejected, dense residual.
    1: T1, an ordinary proposal (accepted or not).
    2: NaN at token 29 (last, partial chunk) of row 1 -> STATUS_NAN.
    3: row 0 all -inf and +inf at token 3 of row 1 -> STATUS_POSINF (checked before masked).
    """
    generator = torch.Generator().manual_seed(19)
    vocab = 30
    logits = torch.randn((4, 2, vocab), generator=generator)
    logits[0, 0, 2] = -40.0
    logits[2, 1, 29] = float("nan")
    logits[3, 0] = NEG
    logits[3, 1, 3] = float("inf")
    dense = torch.rand((4, 1, vocab), generator=generator)
    dense[0, 0, 2] = 2.0
    dense = (dense.double() / dense.double().sum(-1, keepdim=True)).float()
    return {
        "logits": logits,
        "draft_tokens": torch.tensor([[2], [7], [4], [5]], dtype=torch.int32),
        "temperature": torch.tensor([1.0, 0.6, 1.0, 0.0]),
        "seed": torch.tensor([1, 2, 3, 4], dtype=torch.int64),
        "position": torch.tensor([5, 6, 7, 8], dtype=torch.int64),
        "q_dense": dense,
    }


def test_split_plan_sparse_equals_default_plan() -> None:
    args = _split_sparse_case()
    split = _kernel(args, plan=_split_plan(nsplit=4, chunk_tiles=1))
    default = _kernel(args)
    _assert_same(split, default, args)
    _assert_same(split, _reference(args), args)
    assert split.status.tolist() == [STATUS_OK] * 3
    assert int(split.accepted[0]) == 0  # the rejected draft whose support spans chunks
    assert split.tokens[0, 0] not in (3,)
    assert split.tokens[1].tolist()[:2] == [9, 5]  # ties across chunks, signed zero
    assert int(split.tokens[1, 2]) == int(_lowest_argmax(args["logits"][1, 2]))
    assert int(split.accepted[2]) == 0 and int(split.tokens[2, 1]) == -1


def test_split_plan_dense_and_statuses_equal_default_plan() -> None:
    args = _split_dense_case()
    split = _kernel(args, plan=_split_plan(nsplit=2, chunk_tiles=2))
    _assert_same(split, _kernel(args), args)
    _assert_same(split, _reference(args), args)
    assert split.status.tolist() == [STATUS_OK, STATUS_OK, STATUS_NAN, STATUS_POSINF]
    assert int(split.accepted[0]) == 0 and int(split.tokens[0, 0]) != 2


@pytest.mark.parametrize(
    ("form", "nsplit", "chunk_tiles"),
    [("sparse", 4, 1), ("dense", 2, 2)],
    ids=["sparse-4x8", "dense-2x16"],
)
def test_split_plan_random_batch_equals_default_plan(
    form: str, nsplit: int, chunk_tiles: int
) -> None:
    """Eight random mixed requests at V = 30 (partial last chunk), supports of 5 tokens."""
    args = _make(batch=8, drafts=3, vocab=30, seed=131 + nsplit, q=form, support=5)
    split = _kernel(args, plan=_split_plan(nsplit=nsplit, chunk_tiles=chunk_tiles))
    _assert_same(split, _kernel(args), args)
    _assert_same(split, _reference(args), args)
    assert int((split.accepted < 3).sum()) > 0  # some request stopped on a sampled row


@pytest.mark.parametrize(
    ("form", "batch", "drafts", "flat_rows", "nsplit"),
    [
        ("sparse", 5, 3, 1, 1),  # one row per program
        ("sparse", 5, 3, 8, 4),  # blocks of 8 rows straddle requests of 4; the last is short
        ("dense", 3, 5, 4, 2),  # 18 rows in blocks of 4
        ("point", 7, 1, 2, 3),  # K = 1: a request's two rows fill a block exactly
        ("none", 2, 0, 4, 2),  # K = 0: one row per request, four requests' rows per block
    ],
    ids=["sparse-1", "sparse-8x4", "dense-4x2", "point-2x3", "k0-4x2"],
)
def test_flat_row_plans_equal_the_reference_and_the_default_plan(
    form: str, batch: int, drafts: int, flat_rows: int, nsplit: int
) -> None:
    """Phase 1 over consecutive flat rows (no padding rows; blocks straddle requests and a
    T0 and a T1 request may share one): the same partials row by row, so the same bits as
    the default plan and the reference, at a V (= 30) that no chunk divides."""
    args = _make(batch=batch, drafts=drafts, vocab=30, seed=17 * batch + flat_rows, q=form)
    plan = LaunchPlan(
        block_b=1,
        block_v=8,
        nsplit=nsplit,
        chunk=8 * (-(-30 // (8 * nsplit))),
        num_warps=4,
        flat_rows=flat_rows,
    )
    flat = _kernel(args, plan=plan)
    _assert_same(flat, _reference(args), args)
    _assert_same(flat, _kernel(args), args)


def test_flat_rows_must_be_a_power_of_two() -> None:
    args = _make(batch=2, drafts=1, vocab=30, seed=3)
    plan = LaunchPlan(block_b=1, block_v=8, nsplit=1, chunk=32, num_warps=4, flat_rows=3)
    with pytest.raises(ValueError, match="flat_rows must be 0 or a power of two"):
        _kernel(args, plan=plan)


@pytest.mark.parametrize("support_tile", [0, 64], ids=["in-finish", "split-64"])
def test_split_plan_wide_support_in_every_chunk_equals_reference(support_tile: int) -> None:
    """A 600-token support over five chunks of 400 tokens: the finish kernel sums the
    support's corrections four chunks at a time (S_P2 * NSPLIT_P2 > 4096), or (support_tile
    64) chain_counts_kernel counts the drafts and chain_support_kernel sums the corrections
    in 10 tiles of 64 slots; either way the residual reaches each drawn tile through the
    scratch row; same bits as the default plan and the reference, and every request stops
    on a sampled row at least once."""
    args = _make(batch=8, drafts=3, vocab=2000, seed=7, support=600, greedy_share=0.0)
    plan = replace(_split_plan(nsplit=5, chunk_tiles=50), support_tile=support_tile)
    split = _kernel(args, plan=plan)
    _assert_same(split, _kernel(args), args)
    _assert_same(split, _reference(args), args)
    assert int((split.accepted < 3).sum()) == 8
    assert bool((split.status == STATUS_OK).all())


def test_four_chunk_corrections_use_each_chunks_own_support_mass() -> None:
    """The four-chunks-at-a-time sums without the rescan's cover: near-flat logits (every
    e_v near 1) in chunks of 1,280 tokens, more than the 1,024 slots of a 600-token support
    (S_P2 * NSPLIT_P2 = 8,192 > MAX_MEMBERSHIP_TILE), so a chunk's corrected remainder
    M_c - sum_s e_s is far above the rescan threshold and its mass W_c is used as computed.
    A slot counted in a chunk it is not in (or a padding slot counted anywhere) changes W_c
    by up to a thousand tokens' mass and moves the residual draws off the reference's."""
    args = _make(
        batch=8, drafts=3, vocab=6000, seed=13, support=600, greedy_share=0.0, mask_share=0.0
    )
    args["logits"] = args["logits"] * 0.004  # randn * 0.01: e_v >= exp(-0.1 / 0.3) > 0.7
    plan = LaunchPlan(block_b=1, block_v=64, nsplit=5, chunk=1280, num_warps=4)
    assert slot_axis(600) * 8 > MAX_MEMBERSHIP_TILE and 1280 > slot_axis(600)
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    assert int((got.accepted < 3).sum()) == 8  # every request draws from its residual


@pytest.mark.parametrize(
    ("drafts", "support", "prefetched"),
    [(5, 64, True), (5, 4, False), (15, 128, False)],
    ids=["k5-s64-read-before-the-wait", "k5-s4-looped", "k15-s128-read-after"],
)
def test_narrow_support_read_before_the_wait_or_after_equals_reference(
    drafts: int, support: int, prefetched: bool
) -> None:
    """Step 27: the finish reads every draft row's support and the logits at its ids
    before its wait where 4 < S and R * S_P2 <= MAX_PREFETCH_SLOTS, and the stop row's
    support terms and residual scatter take them from there; elsewhere it reads them after.
    Both sides of that line draw the reference's tokens, residual rows among them."""
    rows = 1 << drafts.bit_length()  # R: K + 1 rows padded to a power of two
    slots = slot_axis(support)  # S_P2
    reads_early = MAX_LOOPED_SLOTS < support and rows * slots <= MAX_PREFETCH_SLOTS
    assert reads_early == prefetched and slots <= MAX_SLOT_TILE
    args = _make(batch=24, drafts=drafts, vocab=300, seed=29, support=support)
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert int(((got.accepted < drafts) & (args["temperature"] > 0)).sum()) > 0


@pytest.mark.parametrize("support_tile", [16, 64], ids=["split-16", "split-64"])
def test_ticket_plan_finishes_in_the_support_launch_with_the_same_bits(support_tile: int) -> None:
    """plan.ticket (step 28): no finish launch; the support launch's last program of each
    request block (an atomic ticket, armed by the counts launch) finishes it. Mixed T0 / T1
    requests over a support in every chunk: the same bits as the finish launch and the
    reference, twice in a row (the counts launch re-arms the tickets every call)."""
    args = _make(batch=6, drafts=3, vocab=2000, seed=11, support=600, greedy_share=0.3)
    plan = replace(_split_plan(nsplit=5, chunk_tiles=50), support_tile=support_tile)
    finished = _kernel(args, plan=plan)
    for _ in range(2):
        ticketed = _kernel(args, plan=replace(plan, ticket=True))
        _assert_same(ticketed, finished, args)
    _assert_same(ticketed, _reference(args), args)
    assert int((ticketed.accepted < 3).sum()) > 0
    assert int((args["temperature"] == 0).sum()) not in (0, 6)


@pytest.mark.parametrize(
    ("batch", "block_b", "flat_rows"),
    [(6, 1, 0), (5, 2, 0), (19, 1, 8)],
    ids=["six-blocks", "blocks-of-2", "flat-19-blocks"],
)
def test_dense_ticket_plan_finishes_in_the_rescan_launch_with_the_same_bits(
    batch: int, block_b: int, flat_rows: int
) -> None:
    """plan.ticket with dense q: no finish launch; the rescan launch's last program of each
    request block (an atomic ticket that phase 1 arms, ARM_TICKET) finishes it. Mixed T0 /
    T1 requests over five chunks: the same bits as the finish launch and the reference,
    twice in a row (phase 1 re-arms the tickets every call; 19 requests arm two rounds of
    16), and a ticket left dirty by an earlier call does not leak into the next."""
    args = _make(batch=batch, drafts=3, vocab=2000, seed=13 + batch, q="dense", greedy_share=0.3)
    plan = replace(_split_plan(nsplit=5, chunk_tiles=50), block_b=block_b, flat_rows=flat_rows)
    finished = _kernel(args, plan=plan)
    for _ in range(2):
        ticketed = _kernel(args, plan=replace(plan, ticket=True))
        _assert_same(ticketed, finished, args)
    _assert_same(ticketed, _reference(args), args)
    assert int(((ticketed.accepted < 3) & (args["temperature"] > 0)).sum()) > 0
    assert int((args["temperature"] == 0).sum()) not in (0, batch)


def test_split_plan_repeated_calls_give_the_same_bits() -> None:
    """Two calls with the split plan (no state kept between launches) give the same bits."""
    args = _split_sparse_case()
    args = _select(args, torch.tensor([0, 2]))
    plan = _split_plan(nsplit=4, chunk_tiles=1)
    first = _kernel(args, plan=plan)
    second = _kernel(args, plan=plan)
    _assert_same(first, second, args)
    _assert_same(first, _reference(args), args)


# --------------------------------------------------------------------------------------
# Edge cases from the design brief
# --------------------------------------------------------------------------------------


def test_far_tail_tokens_are_emitted_where_the_uniform_lands() -> None:
    """V = 1000: tokens 0..996 at logit -14 (p ~ 2.8e-7 each), three head tokens at 0.

    Requests are picked so that their sample uniform falls inside the tail mass (found with
    the torch Philox); the kernel must emit exactly the tail token the inverse CDF names.
    """
    vocab, tail = 1000, 997
    row = torch.full((vocab,), -14.0)
    row[tail:] = 0.0
    candidates = 1 << 20
    generator = torch.Generator().manual_seed(23)
    seeds = torch.randint(-(2**62), 2**62, (candidates,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (candidates,), generator=generator, dtype=torch.int64)
    u = sample_uniform(seeds, positions)
    weights = torch.exp(row.double())
    tail_mass = float(weights[:tail].sum() / weights.sum())
    in_tail = (u < tail_mass).nonzero().flatten()[:64]
    assert in_tail.numel() >= 32, "not enough tail uniforms among the candidates"
    pick = torch.cat([in_tail, torch.arange(64)])
    batch = pick.numel()
    args: Args = {
        "logits": row.view(1, 1, vocab).expand(batch, 1, vocab),
        "draft_tokens": torch.zeros((batch, 0), dtype=torch.int32),
        "temperature": torch.ones(batch),
        "seed": seeds[pick],
        "position": positions[pick],
    }
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    tail_hits = got.tokens[: in_tail.numel(), 0]
    assert bool((tail_hits < tail).all()), tail_hits.tolist()
    expected = torch.searchsorted(
        weights.cumsum(0), (u[in_tail] * weights.sum())[:, None], right=True
    )[:, 0]
    assert tail_hits.tolist() == expected.tolist()


def test_sparse_full_target_tails_agree_with_reference() -> None:
    """V = 1000, mixed T0/T1, heavy heads and many tiny tokens, rejected sparse drafts."""
    generator = torch.Generator().manual_seed(29)
    batch, drafts, vocab = 128, 2, 1000
    logits = torch.randn((batch, drafts + 1, vocab), generator=generator) - 16.0
    heads = torch.randint(0, vocab, (batch, drafts + 1, 4), generator=generator)
    logits.scatter_(2, heads, torch.randn(heads.shape, generator=generator))
    args = _make(batch=batch, drafts=drafts, vocab=vocab, seed=31, support=4)
    args["logits"] = logits
    # T0 requests must still propose their own greedy tokens sometimes
    t0 = (args["temperature"] == 0)[:, None]
    args["draft_tokens"] = torch.where(
        t0, _lowest_argmax(logits[:, :drafts]).to(torch.int32), args["draft_tokens"]
    )
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    _assert_well_formed(got, args)


def test_disjoint_support_is_never_accepted() -> None:
    """q puts all its mass where p = 0 (-inf, or a logit whose exp underflows to 0)."""
    generator = torch.Generator().manual_seed(37)
    batch, drafts, vocab = 2048, 3, 16
    logits = torch.randn((batch, drafts + 1, vocab), generator=generator)
    logits[:, :, 8:12] = NEG
    logits[:, :, 12:] = -300.0  # exp(-300 / tau) is 0 in fp32 for tau <= 2
    probs = torch.zeros((batch, drafts, vocab))
    probs[:, :, 8:] = torch.rand((batch, drafts, 8), generator=generator) + 0.05
    q_ids, q_counts = quantise_q(probs, 64)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    args: Args = {
        "logits": logits,
        "draft_tokens": sample_drafts(q_ids, q_counts, 64, seeds, positions),
        "temperature": torch.rand(batch, generator=generator) * 1.5 + 0.5,
        "seed": seeds,
        "position": positions,
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": 64,
    }
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert int(got.accepted.max()) == 0
    assert bool((got.tokens[:, 0] < 8).all())  # the residual is p itself: only p > 0 tokens
    assert bool((got.tokens[:, 1:] == -1).all())


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_equal_q_is_always_accepted(form: str) -> None:
    """q = p exactly (p uniform on 1, 2, 4 or 8 tokens): U < 1 always accepts."""
    generator = torch.Generator().manual_seed(41 if form == "sparse" else 43)
    batch, drafts, vocab, denominator = 2048, 3, 16, 1024
    sizes = 2 ** torch.randint(0, 4, (batch, drafts + 1), generator=generator)
    order = torch.rand((batch, drafts + 1, vocab), generator=generator).argsort(-1)
    in_support = order < sizes[..., None]
    logits = torch.where(in_support, 0.5, NEG)
    probs = in_support[:, :drafts].double() / sizes[:, :drafts, None]
    q_ids, q_counts = quantise_q(probs, denominator)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    proposals = sample_drafts(q_ids, q_counts, denominator, seeds, positions)
    args: Args = {
        "logits": logits,
        "draft_tokens": proposals,
        "temperature": torch.rand(batch, generator=generator) + 0.2,
        "seed": seeds,
        "position": positions,
    }
    if form == "sparse":
        args.update(q_ids=q_ids, q_counts=q_counts, denominator=denominator)
    else:
        args["q_dense"] = probs.float()
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert got.accepted.tolist() == [drafts] * batch
    assert torch.equal(got.tokens[:, :drafts], proposals)
    bonus = got.tokens[:, drafts]
    assert bool(in_support[torch.arange(batch), drafts, bonus.long()].all())


def test_t0_ties_go_to_the_lowest_id_and_signed_zeros_tie() -> None:
    """V = 2100 (three tiles of 1024 in the interpreter): ties within and across lanes."""
    vocab, rows = 2100, 3
    logits = torch.full((8, rows, vocab), -5.0)
    expected = torch.zeros((8, rows), dtype=torch.int64)

    def put(b: int, r: int, ids: list[int], value: float, want: int) -> None:
        logits[b, r, ids] = value
        expected[b, r] = want

    for b in range(8):
        for r in range(rows):
            put(b, r, [(37 * b + 11 * r) % vocab], 1.0, (37 * b + 11 * r) % vocab)
    put(0, 0, [5, 1029], 2.0, 5)  # same lane, different tiles
    put(0, 1, [6, 1029], 2.0, 6)  # later tile, lower lane
    put(0, 2, [2099, 2098], 2.0, 2098)
    logits[1, 0] = -1.0
    logits[1, 0, 40] = -0.0
    put(1, 0, [1500], 0.0, 40)  # -0.0 at 40 ties +0.0 at 1500
    logits[1, 1] = -1.0
    logits[1, 1, 2000] = -0.0
    put(1, 1, [3], 0.0, 3)
    logits[2] = 3.0  # every token equal
    expected[2] = 0
    logits[3, :, :2098] = NEG
    put(3, 0, [2098, 2099], 0.25, 2098)
    put(3, 1, [2098, 2099], 0.25, 2098)
    put(3, 2, [2099], 0.25, 2099)
    generator = torch.Generator().manual_seed(47)
    rounded = (torch.randn((4, rows, vocab), generator=generator) * 2).round()  # many ties
    logits[4:] = rounded
    expected[4:] = _lowest_argmax(rounded)
    maxima = (rounded == rounded.amax(-1, keepdim=True)).sum(-1)
    assert int(maxima.max()) > 1  # the rounded rows really hold several maxima
    drafts = expected[:, :2].to(torch.int32)
    args: Args = {
        "logits": logits.to(torch.bfloat16),
        "draft_tokens": drafts,
        "temperature": torch.zeros(8),
        "seed": torch.arange(8, dtype=torch.int64),
        "position": torch.zeros(8, dtype=torch.int64),
    }
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert got.tokens.tolist() == expected.to(torch.int32).tolist()
    assert got.accepted.tolist() == [2] * 8


@functools.lru_cache(maxsize=1)
def _battery() -> tuple[Args, ChainResult]:
    """256 mixed requests and the kernel's output on them (shared by several tests)."""
    args = _make(batch=256, drafts=3, vocab=37, seed=53, support=4)
    return args, _kernel(args)


def test_same_inputs_give_the_same_bits_twice() -> None:
    args, first = _battery()
    _assert_same(_kernel(args), first, args)


def test_permuting_requests_permutes_outputs_bit_for_bit() -> None:
    args, result = _battery()
    permutation = torch.randperm(256, generator=torch.Generator().manual_seed(59))
    permuted = _kernel(_select(args, permutation))
    _assert_same(permuted, ChainResult(*(t[permutation] for t in result)))


def test_a_request_alone_or_in_another_batch_gives_the_same_tokens() -> None:
    args, result = _battery()
    alone = _kernel(_select(args, torch.tensor([77])))
    _assert_same(alone, ChainResult(*(t[77:78] for t in result)))
    subset = torch.tensor([200, 3, 77, 140, 0])
    _assert_same(_kernel(_select(args, subset)), ChainResult(*(t[subset] for t in result)))


# Phase 1 in four-group steps over flat rows (sampled-only programs flag NaN from their lane
# sums, not per element): two chunks of 24 tokens at V = 37, the second step of the first
# chunk half past its end.
_FOUR_GROUPS = LaunchPlan(
    block_b=8, block_v=4, nsplit=2, chunk=24, num_warps=4, block_f=8, flat_rows=8, groups=4
)


@pytest.mark.parametrize("plan", [None, _FOUR_GROUPS], ids=["default", "four-groups"])
@pytest.mark.parametrize("greedy_share", [0.25, 0.0], ids=["mixed", "all-t1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_statuses_in_any_row_and_other_requests_unaffected(
    dtype: torch.dtype, greedy_share: float, plan: LaunchPlan | None
) -> None:
    args = _make(batch=64, drafts=3, vocab=37, seed=61, dtype=dtype, greedy_share=greedy_share)
    clean = _reference(args)
    logits = args["logits"].clone()
    nan, inf = float("nan"), float("inf")
    logits[3, 3, 36] = nan  # bonus row, last token: the chain never needs it
    logits[5, 0, 0] = nan
    logits[10, 0, 2] = inf
    logits[11, 2, 20] = inf
    logits[12, 1, 3:6] = inf  # several +inf in one row: POSINF, not NaN (inf - inf)
    logits[20, 1, :] = NEG
    logits[21, 3, :] = NEG
    logits[30, 0, 0] = inf
    logits[30, 2, 0] = nan  # NaN is checked before +inf
    logits[31, 0, :] = NEG
    logits[31, 3, 4] = inf  # +inf is checked before all -inf
    logits[32, 1, :] = NEG
    logits[32, 2, 9] = nan
    logits[33, :, :] = NEG
    logits[33, :, 0] = -1e30 if dtype == torch.float32 else -1e38  # finite: still OK
    statuses = {
        3: STATUS_NAN,
        5: STATUS_NAN,
        10: STATUS_POSINF,
        11: STATUS_POSINF,
        12: STATUS_POSINF,
        20: STATUS_ALL_MASKED,
        21: STATUS_ALL_MASKED,
        30: STATUS_NAN,
        31: STATUS_POSINF,
        32: STATUS_NAN,
    }
    corrupted = {**args, "logits": logits}
    got = _kernel(corrupted, plan=plan)
    _assert_same(got, _reference(corrupted), corrupted)
    assert int(got.status[33]) == STATUS_OK and int(got.tokens[33, int(got.accepted[33])]) == 0
    for b in range(64):
        if b in statuses:
            assert int(got.status[b]) == statuses[b], b
            assert got.tokens[b].tolist() == [-1] * 4 and int(got.accepted[b]) == 0
        elif b != 33:
            assert int(got.status[b]) == STATUS_OK
            assert got.tokens[b].tolist() == clean.tokens[b].tolist(), b
            assert int(got.accepted[b]) == int(clean.accepted[b])


def test_t0_draws_nothing() -> None:
    """Eight T0 requests, each repeated 64 times with random seeds and positions."""
    base = _make(batch=8, drafts=3, vocab=37, seed=67, greedy_share=1.0, q="point")
    repeat = torch.arange(8).repeat_interleave(64)
    args = _select(base, repeat)
    generator = torch.Generator().manual_seed(71)
    args["seed"] = torch.randint(-(2**62), 2**62, (512,), generator=generator, dtype=torch.int64)
    args["position"] = torch.randint(-(2**62), 2**62, (512,), generator=generator)
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    for name, tensor in zip(ChainResult._fields, got, strict=True):
        grouped = tensor.reshape(8, 64, -1)
        assert bool((grouped == grouped[:, :1]).all()), f"{name} depends on seed/position"
    assert len(set(got.accepted.tolist())) > 1  # chains stop at different rows


def test_temperature_extremes() -> None:
    """tau = 1e-3 on logits with gaps >= 1 is greedy; tau = 1e4 is near uniform, no NaN."""
    generator = torch.Generator().manual_seed(73)
    n, drafts, vocab = 256, 3, 37
    logits = torch.stack(
        [torch.randperm(vocab, generator=generator).float() * 1.5 for _ in range(n * 4)]
    ).reshape(n, drafts + 1, vocab)
    greedy = _lowest_argmax(logits[:, :drafts]).to(torch.int32)
    random_pick = torch.randint(0, vocab, (n, drafts), generator=generator, dtype=torch.int32)
    proposals = torch.where(torch.rand((n, drafts), generator=generator) < 0.6, greedy, random_pick)
    q_ids, q_counts = point_mass_q(proposals, 8)
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (n,), generator=generator, dtype=torch.int64)
    triple = torch.arange(3 * n) % n
    temperature = torch.cat([torch.zeros(n), torch.full((n,), 1e-3), torch.full((n,), 1e4)])
    args: Args = {
        "logits": logits[triple],
        "draft_tokens": proposals[triple],
        "temperature": temperature,
        "seed": seeds[triple],
        "position": positions[triple],
        "q_ids": q_ids[triple],
        "q_counts": q_counts[triple],
        "denominator": 8,
    }
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert bool((got.status == STATUS_OK).all())
    greedy_out, tiny, huge = (ChainResult(*(t[k * n : (k + 1) * n] for t in got)) for k in range(3))
    _assert_same(tiny, greedy_out)
    _assert_well_formed(huge, _select(args, torch.arange(2 * n, 3 * n)))
    emitted = huge.tokens.gather(1, huge.accepted.long()[:, None])[:, 0]
    assert len(set(emitted.tolist())) > vocab // 2  # spread out, not collapsed on the argmax
    # accepting a point mass has probability p(x) ~ 1/37 at tau = 1e4
    assert float(huge.accepted.float().mean()) < 0.2


# --------------------------------------------------------------------------------------
# Validation: refusal before launch, or STATUS_BAD_DRAFT without it
# --------------------------------------------------------------------------------------


def _small_call() -> Args:
    """Request 0 T1, request 1 T0, request 2 T1; V = 8, K = 2, C = 16."""
    return {
        "logits": torch.zeros((3, 3, 8)),
        "draft_tokens": torch.tensor([[1, 2], [3, -1], [5, 6]], dtype=torch.int32),
        "temperature": torch.tensor([1.0, 0.0, 0.7]),
        "seed": torch.arange(3, dtype=torch.int64),
        "position": torch.arange(3, dtype=torch.int64) * 10,
        "q_ids": torch.tensor(
            [[[1, 4], [2, -1]], [[-1, -1], [-1, -1]], [[5, 0], [6, 7]]], dtype=torch.int32
        ),
        "q_counts": torch.tensor(
            [[[8, 8], [16, 0]], [[0, 0], [0, 0]], [[12, 4], [8, 8]]], dtype=torch.int32
        ),
        "denominator": 16,
    }


def _edited(name: str, index: tuple[int, ...], value: float) -> Args:
    args = _small_call()
    args[name] = args[name].clone()
    args[name][index] = value
    return args


def _dense_small_call() -> Args:
    args = _small_call()
    for key in ("q_ids", "q_counts", "denominator"):
        del args[key]
    dense = torch.full((3, 2, 8), 1 / 8)
    args["q_dense"] = dense
    return args


REFUSALS: dict[str, tuple[Any, str]] = {
    "q-mass": (
        lambda: _edited("q_counts", (0, 0, 1), 9),
        r"request 0, row 0: q mass 17 != denominator 16",
    ),
    "q-of-proposal-zero": (
        lambda: _edited("draft_tokens", (2, 1), 3),
        r"request 2, row 1: T1 proposal 3 has q count 0",
    ),
    "draft-at-V": (
        lambda: _edited("draft_tokens", (0, 1), 8),
        r"request 0, row 1: draft token 8 is out of range; expected -1 .* \[0, 8\)",
    ),
    "draft-below-minus-one": (
        lambda: _edited("draft_tokens", (1, 0), -2),
        r"request 1, row 0: draft token -2 is out of range",
    ),
    "support-id-outside-V": (
        lambda: _edited("q_ids", (2, 0, 1), 8),
        r"request 2, row 0: slot 1 has a positive count but id 8",
    ),
    "support-duplicate": (
        lambda: _edited("q_ids", (2, 1, 1), 6),
        r"request 2, row 1: support id 6 appears more than once",
    ),
    "count-negative": (
        lambda: _edited("q_counts", (2, 0, 1), -4),
        r"request 2, row 0: q count -4 at slot 1 is negative",
    ),
    "negative-temperature": (
        lambda: _edited("temperature", (2,), -0.5),
        r"request 2: temperature -0.5 is invalid; expected a finite value >= 0",
    ),
    "nan-temperature": (
        lambda: _edited("temperature", (0,), float("nan")),
        r"request 0: temperature nan is invalid",
    ),
    "draft-shape": (
        lambda: {**_small_call(), "draft_tokens": torch.zeros((3, 3), dtype=torch.int32)},
        r"draft_tokens has shape \(3, 3\); expected \(3, 2\)",
    ),
    "draft-dtype": (
        lambda: {**_small_call(), "draft_tokens": torch.zeros((3, 2), dtype=torch.int64)},
        r"draft_tokens has dtype int64; expected int32",
    ),
    "logits-dtype": (
        lambda: {**_small_call(), "logits": torch.zeros((3, 3, 8), dtype=torch.float64)},
        r"logits has dtype float64; expected bfloat16, float16 or float32",
    ),
    "seed-device": (
        lambda: {**_small_call(), "seed": torch.zeros(3, dtype=torch.int64, device="meta")},
        r"seed is on meta but logits is on cpu",
    ),
    "denominator": (
        lambda: {**_small_call(), "denominator": 24},
        r"denominator 24 is not a power of two",
    ),
    "dense-q-of-proposal-zero": (
        lambda: {
            **_dense_small_call(),
            "q_dense": torch.tensor([0.25, 0.0, 0.25, 0.25, 0.25, 0, 0, 0]).expand(3, 2, 8),
        },
        r"request 0, row 0: T1 proposal 1 has q_dense = 0.0",
    ),
    "dense-q-sum": (
        lambda: {**_dense_small_call(), "q_dense": torch.full((3, 2, 8), 0.2)},
        r"request 0, row 0: q_dense sums to 1.6",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_validate_refuses_contract_violations(case: str) -> None:
    build, pattern = REFUSALS[case]
    with pytest.raises(SelectorInputError, match=pattern):
        _kernel(build())


def _bad_rows_case() -> tuple[Args, dict[int, str]]:
    """Sparse-q batch with one contract violation on the first chain row of some requests."""
    args = _make(batch=64, drafts=3, vocab=37, seed=79, support=3, invalid_share=0.0)
    drafts = args["draft_tokens"].clone()
    ids, counts = args["q_ids"].clone(), args["q_counts"].clone()
    t1 = (args["temperature"] > 0).nonzero().flatten().tolist()
    t0 = (args["temperature"] == 0).nonzero().flatten().tolist()
    bad: dict[int, str] = {}

    def mark(b: int, why: str) -> None:
        bad[b] = why

    drafts[t1[0], 0] = 37
    mark(t1[0], "T1 draft = V")
    drafts[t1[1], 0] = 2**31 - 1
    mark(t1[1], "T1 draft 2^31 - 1")
    drafts[t0[0], 0] = -(2**31)
    mark(t0[0], "T0 draft -2^31")
    drafts[t0[1], 0] = 1000
    mark(t0[1], "T0 draft >= V")
    victim = t1[2]  # proposal outside its q support
    drafts[victim, 0] = next(v for v in range(37) if v not in ids[victim, 0].tolist())
    mark(victim, "q(x) = 0")
    victim = t1[3]  # a support id far outside [0, V) beside the proposal
    slot = int((ids[victim, 0] != drafts[victim, 0]).nonzero()[0])
    ids[victim, 0, slot] = 2**30
    mark(victim, "support id 2^30")
    victim = t1[4]  # mass != C
    counts[victim, 0, int((ids[victim, 0] == drafts[victim, 0]).nonzero()[0])] += 1
    mark(victim, "mass C + 1")
    return {**args, "draft_tokens": drafts, "q_ids": ids, "q_counts": counts}, bad


def test_without_validation_bad_rows_report_bad_draft() -> None:
    args, bad = _bad_rows_case()
    with pytest.raises(SelectorInputError):
        _kernel(args)
    got = _kernel(args, validate=False)
    clean = _reference(args, validate=False)
    for b in range(64):
        if b in bad:
            assert int(got.status[b]) == STATUS_BAD_DRAFT, f"request {b}: {bad[b]}"
            assert got.tokens[b].tolist() == [-1] * 4 and int(got.accepted[b]) == 0
        else:
            assert int(got.status[b]) == STATUS_OK
    _assert_same(got, clean, args)


def test_without_validation_dense_and_missing_q_report_bad_draft() -> None:
    dense = _dense_small_call()
    dense["q_dense"] = dense["q_dense"].clone()
    dense["q_dense"][0, 0, 1] = 0.0  # q(x) = 0 for request 0's first proposal
    dense["draft_tokens"] = dense["draft_tokens"].clone()
    dense["draft_tokens"][2, 0] = 2**31 - 1
    got = _kernel(dense, validate=False)
    assert got.status.tolist() == [STATUS_BAD_DRAFT, STATUS_OK, STATUS_BAD_DRAFT]
    _assert_same(got, _reference(dense, validate=False), dense)
    bare = {k: v for k, v in _small_call().items() if k not in ("q_ids", "q_counts", "denominator")}
    got = _kernel(bare, validate=False)  # T1 proposals without any q
    assert got.status.tolist() == [STATUS_BAD_DRAFT, STATUS_OK, STATUS_BAD_DRAFT]
    _assert_same(got, _reference(bare, validate=False), bare)


def test_without_validation_bad_draft_status_does_not_depend_on_where_the_chain_stops() -> None:
    """A violation on a row after the stopping row is still the request's own violation.

    validate=True refuses these calls whatever the coins say, and the reference reports
    STATUS_BAD_DRAFT for them; a status that appears or not depending on whether an
    earlier draft happened to be rejected would make the in-graph status a random variable.
    """
    vocab = 10
    logits = torch.zeros((4, 3, vocab))
    logits[:, 0, 5] = -30.0  # proposal 5 at row 0: p ~ e^-30, always rejected (T1)
    logits[1:3, 0, 4] = 5.0  # T0 requests stop at row 0 (argmax 4, proposal 5)
    drafts = torch.tensor([[5, 99], [5, -7], [5, 3], [5, 3]], dtype=torch.int32)
    q_ids, q_counts = point_mass_q(drafts.clamp(0, vocab - 1), 16)
    q_counts = q_counts.clone()
    q_counts[2, 1, 0] = 5  # T0 request: q row 1 has mass 5 != C (refused by validation)
    q_counts[3, 1, 0] = 3  # T1 request: q row 1 has mass 3 != C
    args: Args = {
        "logits": logits,
        "draft_tokens": drafts,
        "temperature": torch.tensor([1.0, 0.0, 0.0, 1.0]),
        "seed": torch.arange(4, dtype=torch.int64),
        "position": torch.zeros(4, dtype=torch.int64),
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": 16,
    }
    for b in range(4):
        with pytest.raises(SelectorInputError, match="request 0, row 1"):
            _kernel(_select(args, torch.tensor([b])))
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_BAD_DRAFT] * 4
    got = _kernel(args, validate=False)
    assert got.status.tolist() == want.status.tolist(), (
        f"kernel statuses {got.status.tolist()}, reference {want.status.tolist()}: a "
        "violation after the stopping row is not reported"
    )


MALFORMED_Q: dict[str, tuple[list[int], list[int], float]] = {
    # name: (ids, counts, temperature) of the first row of request 1; its proposal is 1
    "duplicate-support-id": ([1, 1], [8, 8], 1.0),
    "negative-count-mass-C": ([1, 2], [20, -4], 1.0),
    "padding-slot-with-an-id": ([1, 5], [16, 0], 1.0),
    "t0-row-mass-not-C": ([1, 2], [8, 9], 0.0),
}


@pytest.mark.parametrize("case", list(MALFORMED_Q))
def test_without_validation_malformed_q_on_a_live_row_reports_bad_draft(case: str) -> None:
    """DESIGN: a malformed q (mass != C, duplicate or out-of-range support ids) is a contract
    violation; without validation the request reports STATUS_BAD_DRAFT, as the reference
    does. Request 0 and 2 are well formed and must be unaffected."""
    ids, counts, tau = MALFORMED_Q[case]
    vocab = 10
    args: Args = {
        "logits": torch.zeros((3, 2, vocab)),
        "draft_tokens": torch.tensor([[1], [1], [1]], dtype=torch.int32),
        "temperature": torch.tensor([1.0, tau, 1.0]),
        "seed": torch.arange(3, dtype=torch.int64),
        "position": torch.zeros(3, dtype=torch.int64),
        "q_ids": torch.tensor([[[1, -1]], [ids], [[1, 3]]], dtype=torch.int32),
        "q_counts": torch.tensor([[[16, 0]], [counts], [[8, 8]]], dtype=torch.int32),
        "denominator": 16,
    }
    with pytest.raises(SelectorInputError, match="request 1, row 0"):
        _kernel(args)
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_OK, STATUS_BAD_DRAFT, STATUS_OK]
    got = _kernel(args, validate=False)
    _assert_same(got, want, args)


@pytest.mark.parametrize("support_tile", [0, 128], ids=["in-finish", "split-128"])
def test_without_validation_wide_support_checks_every_slot_tile(support_tile: int) -> None:
    """S = 600 slots (padded to 1024, read in tiles of MAX_SLOT_TILE = 256 by the acceptance
    test): the draft's count, the row's mass and the per-slot rules are gathered over every
    tile. Request 0 is well formed with its draft in the third tile; requests 1-3 each break
    one rule in a different tile (a negative count with mass C, a zero-count slot that names
    an id, mass C - 1). The kernel agrees with the reference on every status and token,
    with the finish reading the slots itself and with chain_counts_kernel reading them
    (support_tile 128: its tiles of R x 256 slots, R = 2)."""
    assert MAX_SLOT_TILE == 256
    vocab, support, den = 1000, 600, 1024
    ids = torch.arange(support, dtype=torch.int32).repeat(4, 1, 1)  # [4, 1, 600]
    counts = torch.ones((4, 1, support), dtype=torch.int32)
    counts[:, 0, 0] = den - (support - 1)  # mass C
    counts[1, 0, 100] = -1  # tile 0: a negative count; mass kept at C below
    counts[1, 0, 0] += 2
    counts[2, 0, 300] = 0  # tile 1: a zero count on a slot naming id 300 (not -1)
    counts[2, 0, 0] += 1
    counts[3, 0, 550] = 0  # tile 2: mass C - 1 (the slot is padding, id -1)
    ids[3, 0, 550] = -1
    generator = torch.Generator().manual_seed(5)
    args: Args = {
        "logits": torch.randn((4, 2, vocab), generator=generator),
        "draft_tokens": torch.full((4, 1), 520, dtype=torch.int32),  # slot 520: tile 2
        "temperature": torch.ones(4),
        "seed": torch.arange(4, dtype=torch.int64) + 11,
        "position": torch.zeros(4, dtype=torch.int64),
        "q_ids": ids,
        "q_counts": counts,
        "denominator": den,
    }
    for b in (1, 2, 3):
        with pytest.raises(SelectorInputError, match="request 0, row 0"):
            _kernel(_select(args, torch.tensor([b])))
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_OK] + [STATUS_BAD_DRAFT] * 3
    plan = replace(_split_plan(nsplit=1, chunk_tiles=125), support_tile=support_tile)
    got = _kernel(args, validate=False, plan=plan)
    _assert_same(got, want, args)


def test_split_support_sums_many_tiles_in_blocks() -> None:
    """chain_support_kernel's tiles added in the finish in blocks of MAX_MEMBERSHIP_TILE /
    NSPLIT_P2 tiles: 250 chunks of 8 tokens (NSPLIT_P2 = 256, blocks of 16 tiles) and a
    200-slot support in tiles of 4 slots (50 tiles: four blocks, the last one partial).
    Same tokens as the reference and as the finish summing the support alone."""
    args = _make(batch=2, drafts=1, vocab=2000, seed=29, support=200, greedy_share=0.0)
    base = _split_plan(nsplit=250, chunk_tiles=1)
    split = _kernel(args, plan=replace(base, support_tile=4))
    _assert_same(split, _reference(args), args)
    _assert_same(split, _kernel(args, plan=base), args)
    assert int((split.accepted < 1).sum()) > 0  # a stop row that rejected its draft


def test_support_tile_must_be_zero_or_a_power_of_two() -> None:
    args = _make(batch=2, drafts=1, vocab=30, seed=3, support=5)
    plan = LaunchPlan(block_b=1, block_v=8, nsplit=1, chunk=32, num_warps=4, support_tile=3)
    with pytest.raises(ValueError, match="support_tile must be 0 or a power of two"):
        _kernel(args, plan=plan)
    with pytest.raises(ValueError, match="support_warps must be 0 or a power of two"):
        _kernel(args, plan=replace(plan, support_tile=4, support_warps=3))


@pytest.mark.parametrize("carveout", [-2, 101])
def test_carveout_must_be_a_percentage(carveout: int) -> None:
    args = _make(batch=2, drafts=1, vocab=30, seed=3)
    plan = LaunchPlan(block_b=1, block_v=8, nsplit=1, chunk=32, num_warps=4, carveout=carveout)
    with pytest.raises(ValueError, match="carveout must be -1 or a percentage from 0 to 100"):
        _kernel(args, plan=plan)


def test_finish_carveout_and_register_cap_leave_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan.finish_carveout and plan.finish_maxnreg (v5 step 38) reach the finish launch
    (its CARVEOUT constexpr, Triton's maxnreg option) and change no output: placement only."""
    args = _make(batch=5, drafts=3, vocab=300, seed=41, support=9)
    plan = plan_launch(5, 4, 300, interpreter=True, support=9)
    assert (plan.finish_carveout, plan.finish_maxnreg) == (-1, 0)
    finish = RecordingLaunch(selector_module._chain_finish_kernel)
    monkeypatch.setattr(selector_module, "_chain_finish_kernel", finish)
    plain = _kernel(args, plan=plan)
    assert "maxnreg" not in finish.meta and finish.meta["CARVEOUT"] == -1
    alone = _kernel(args, plan=replace(plan, finish_carveout=7, finish_maxnreg=128))
    assert finish.meta["maxnreg"] == 128 and finish.meta["CARVEOUT"] == 7
    _assert_same(alone, plain, args)
    _assert_same(alone, _reference(args), args)


# --------------------------------------------------------------------------------------
# Philox counter layout
# --------------------------------------------------------------------------------------


def test_uniforms_come_from_seed_and_position_through_the_contract_counters() -> None:
    """Equal logits make both draws readable: V = 32 equal tokens, K = 1.

    Row 0 proposes x with q = {x: n, y: C - n}, p(x) = 1/32, so the kernel accepts iff
    U(seed, position) * n < C / 32 (threshold 1/(32 n / C) varies per request). After an
    accept the bonus row (rowpos = position + 1) emits floor(u(seed, position + 1) * 32).
    """
    generator = torch.Generator().manual_seed(83)
    batch, vocab, denominator = 4096, 32, 2**20
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions[:8] = 2**32 - 1  # rowpos + 1 carries into the high counter word
    positions[8:16] = -1  # rowpos + 1 wraps to 0 (uint64)
    counts_x = torch.randint(denominator // 32, denominator, (batch,), generator=generator)
    x = torch.randint(0, vocab, (batch,), generator=generator, dtype=torch.int32)
    y = (x + 1 + torch.randint(0, vocab - 1, (batch,), generator=generator)) % vocab
    q_ids = torch.stack([x, y.to(torch.int32)], -1)[:, None, :]
    q_counts = torch.stack([counts_x, denominator - counts_x], -1).to(torch.int32)[:, None, :]
    args: Args = {
        "logits": torch.zeros((1, 2, vocab)).expand(batch, 2, vocab),
        "draft_tokens": x[:, None],
        "temperature": torch.full((batch,), 0.7),
        "seed": seeds,
        "position": positions,
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": denominator,
    }
    got = _kernel(args)
    assert_uniform_layout(got, seeds, positions, counts_x, denominator, vocab)
    # the batch index never enters: the same request at many batch indices, same tokens
    same = torch.zeros(batch, dtype=torch.long)
    replicated = _kernel(_select(args, same))
    assert bool((replicated.tokens == replicated.tokens[:1]).all())
    _assert_same(ChainResult(*(t[:1] for t in replicated)), ChainResult(*(t[:1] for t in got)))


# --------------------------------------------------------------------------------------
# Statistical smoke: the first emitted token follows p on every sampled path
# --------------------------------------------------------------------------------------

_TARGET = torch.tensor([1.0, 0.2, NEG, -0.7, 2.0, 0.5])
_TAU = 0.8
_N = 20_000


def _law(tau: float = _TAU) -> torch.Tensor:
    return torch.softmax(_TARGET.double() / tau, dim=-1)


def _g_test_p_value(observed: torch.Tensor, p: torch.Tensor) -> float:
    """G-test of counts against p; any count on a p = 0 token fails outright."""
    possible = p > 0
    assert int(observed[~possible].sum()) == 0, f"p = 0 tokens emitted: {observed.tolist()}"
    expected = p[possible] * observed.sum()
    assert float(expected.min()) >= 20
    _, p_value = power_divergence(
        observed[possible].double().numpy(), expected.numpy(), lambda_="log-likelihood"
    )
    return float(p_value)


def _seeds_positions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**62), 2**62, (_N,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (_N,), generator=generator, dtype=torch.int64)
    return seeds, positions


def _target_args(
    seeds: torch.Tensor, positions: torch.Tensor, drafts: torch.Tensor, **q: Any
) -> Args:
    """_N requests of the shared 3-row target at _TAU with these drafts and q."""
    return {
        "logits": _TARGET.view(1, 1, -1).expand(_N, 3, -1),
        "draft_tokens": drafts,
        "temperature": torch.full((_N,), _TAU),
        "seed": seeds,
        "position": positions,
        **q,
    }


def _emitted_counts(args: Args, column: int) -> torch.Tensor:
    result = _kernel(args)
    assert bool((result.status == STATUS_OK).all())
    return torch.bincount(result.tokens[:, column].long(), minlength=_TARGET.numel())


@functools.lru_cache(maxsize=1)
def _point_mass_counts() -> torch.Tensor:
    seeds, positions = _seeds_positions(89)
    generator = torch.Generator().manual_seed(97)
    drafts = torch.randint(0, 6, (_N, 2), generator=generator, dtype=torch.int32)
    q_ids, q_counts = point_mass_q(drafts, 8)
    args = _target_args(seeds, positions, drafts, q_ids=q_ids, q_counts=q_counts, denominator=8)
    return _emitted_counts(args, 0)


def test_first_token_law_point_mass_drafts() -> None:
    assert _g_test_p_value(_point_mass_counts(), _law()) > ALPHA


def test_first_token_law_wrong_target_is_rejected() -> None:
    """The negative control: the same counts against p at tau = 1 instead of 0.8 must fail."""
    assert _g_test_p_value(_point_mass_counts(), _law(1.0)) < ALPHA


def test_first_token_law_sparse_drafts_from_sample_drafts() -> None:
    seeds, positions = _seeds_positions(101)
    probs = torch.tensor([0.0, 0.5, 0.25, 0.0, 0.25, 0.0]).expand(_N, 2, 6)  # includes p = 0
    q_ids, q_counts = quantise_q(probs, 64)
    assert q_ids.shape[-1] == 3
    drafts = sample_drafts(q_ids, q_counts, 64, seeds, positions)
    args = _target_args(seeds, positions, drafts, q_ids=q_ids, q_counts=q_counts, denominator=64)
    assert _g_test_p_value(_emitted_counts(args, 0), _law()) > ALPHA


def test_first_token_law_dense_q() -> None:
    seeds, positions = _seeds_positions(103)
    q_row = torch.tensor([0.1, 0.3, 0.1, 0.2, 0.1, 0.2])
    generator = torch.Generator().manual_seed(107)
    drafts = torch.multinomial(q_row, 2 * _N, replacement=True, generator=generator)
    args = _target_args(
        seeds, positions, drafts.reshape(_N, 2).to(torch.int32), q_dense=q_row.expand(_N, 2, 6)
    )
    assert _g_test_p_value(_emitted_counts(args, 0), _law()) > ALPHA


def test_first_token_law_invalidated_proposal() -> None:
    seeds, positions = _seeds_positions(109)
    args = _target_args(seeds, positions, torch.full((_N, 2), -1, dtype=torch.int32))
    assert _g_test_p_value(_emitted_counts(args, 0), _law()) > ALPHA


def test_bonus_token_law_when_drafts_equal_the_target() -> None:
    """Rows 0, 1 uniform on {0, 1, 3, 5} with q = p: always accepted; bonus ~ p_K."""
    seeds, positions = _seeds_positions(113)
    uniform = torch.tensor([0.0, 0.0, NEG, 0.0, NEG, 0.0])
    probs = torch.tensor([0.25, 0.25, 0.0, 0.25, 0.0, 0.25]).expand(_N, 2, 6)
    q_ids, q_counts = quantise_q(probs, 4)
    logits = torch.stack([uniform, uniform, _TARGET]).view(1, 3, 6).expand(_N, 3, 6)
    args: Args = {
        "logits": logits,
        "draft_tokens": sample_drafts(q_ids, q_counts, 4, seeds, positions),
        "temperature": torch.full((_N,), _TAU),
        "seed": seeds,
        "position": positions,
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": 4,
    }
    result = _kernel(args)
    assert result.accepted.tolist() == [2] * _N
    counts = torch.bincount(result.tokens[:, 2].long(), minlength=6)
    assert _g_test_p_value(counts, _law()) > ALPHA


def test_interpreter_splits_large_vocabularies_like_the_gpu() -> None:
    """Past V = 8192 the interpreter's plan has several splits, so CPU runs take the split
    path (chunk masses, support corrections, rescans) that the GPU takes; same bits as the
    reference, for every q form."""
    plan = plan_launch(96, 4, 32_768, interpreter=True, support=16)
    assert plan.nsplit == 4 and plan.chunk == 8192 and plan.block_b > 1
    for q in ("sparse", "dense", "point"):
        args = _make(batch=96, drafts=3, vocab=32_768, seed=11, q=q, support=16)
        _assert_same(_kernel(args), _reference(args), args)


@pytest.mark.parametrize(
    ("vocab", "q", "support"), [(1, "point", 1), (37, "dense", 4), (300, "sparse", 256)], ids=str
)
def test_gpu_small_vocabulary_plans_agree_with_reference(vocab: int, q: str, support: int) -> None:
    """The GPU's small-vocabulary plan (one request per program, the row padded to at least
    16 lanes as one split and one draw tile), run in the interpreter: same bits as the
    reference, the scratch-row draw of a 256-slot support included."""
    args = _make(batch=24, drafts=3, vocab=vocab, seed=vocab + 5, q=q, support=support)
    plan = plan_launch(24, 4, vocab, interpreter=False, support=support)
    assert plan.nsplit == 1 and plan.chunk == plan.block_v == plan.block_f >= 16
    _assert_same(_kernel(args, plan=plan), _reference(args), args)


@pytest.mark.parametrize(
    ("q", "support", "drafts"),
    [("point", 1, 5), ("sparse", 100, 3), ("sparse", 600, 5), ("dense", 1, 3), ("dense", 1, 5)],
    ids=str,
)
def test_gpu_split_plans_agree_with_reference(q: str, support: int, drafts: int) -> None:
    """The GPU's split-vocabulary plan (V > 1024: chunks of 2048 tokens, the last one short,
    each drawn in one tile, dense q's in 1024-token tiles; the small-batch tile shape), run in
    the interpreter on six mixed
    requests with K = 3 (rows = R = 4) or K = 5 (6 rows, R = 8): same bits as the reference.
    S = 600 takes the split support (counts, then sums per tile of 64 slots and chunk: step
    25) and the scratch-row draw; dense q the rescan launch."""
    vocab = 4100
    args = _make(batch=6, drafts=drafts, vocab=vocab, seed=support + drafts, q=q, support=support)
    plan = plan_launch(6, drafts + 1, vocab, interpreter=False, support=support, dense=q == "dense")
    assert (plan.nsplit, plan.chunk, plan.block_f) == (3, 2048, 1024 if q == "dense" else 2048)
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    if q != "point":
        assert int((got.accepted < drafts).sum()) > 0  # some request drew from a residual


@pytest.mark.parametrize(("q", "support"), [("point", 1), ("sparse", 100)], ids=str)
def test_gpu_large_batch_plan_agrees_with_reference(q: str, support: int) -> None:
    """The GPU's plan from B = 16 on (phase 1 over flat rows in [8, 128] tiles, four of them
    a step in sampled-only programs; 2048-token chunks, the last one 4 tokens), run in the
    interpreter on 16 all-sampled requests with K = 5: same bits as the reference."""
    vocab = 4100
    args = _make(
        batch=16, drafts=5, vocab=vocab, seed=support + 41, q=q, support=support, greedy_share=0.0
    )
    plan = plan_launch(16, 6, vocab, interpreter=False, support=support)
    assert (plan.groups, plan.flat_rows, plan.block_v, plan.nsplit) == (4, 8, 128, 3)
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    assert int((got.accepted < 5).sum()) > 0  # some request drew from a residual


@pytest.mark.parametrize(("q", "support"), [("point", 1), ("sparse", 64), ("dense", 1)], ids=str)
@pytest.mark.parametrize(
    ("batch", "greedy", "tile"),
    [
        (1, 0.0, (1, 1024, 2, 4)),
        (1, 1.0, (1, 1024, 2, 4)),
        (3, 0.0, (2, 512, 4, 4)),
        (3, 1.0, (2, 512, 4, 4)),
        (3, 0.5, (2, 512, 4, 4)),  # two T0 requests of three
        (5, 0.5, (2, 512, 4, 4)),  # two T0 requests of five (step 42)
    ],
    ids=["B1-T1", "B1-T0", "B3-T1", "B3-T0", "B3-mixed", "B5-mixed"],
)
def test_gpu_small_batch_row_tiles_agree_with_reference(
    q: str, support: int, batch: int, greedy: float, tile: tuple[int, int, int, int]
) -> None:
    """The GPU's plans below six requests, run in the interpreter with K = 5 (2048-token
    chunks, the last one 4 tokens): one request's phase 1 over one flat row a program in
    [1, 2, 1024] tiles at 4 warps (v5 step 40), three and five requests' over two flat rows
    in [2, 4, 512] tiles (steps 41-42; 18 rows make 9 pairs, 30 make 15, and a mixed
    batch's pairs hold both kinds where a T0 request's rows meet a T1 one's). T1, T0 and
    mixed: the same bits as the reference and as a plan of eight flat rows in [8, 2, 256]
    tiles (the plan of six to fifteen requests)."""
    vocab = 4100
    args = _make(
        batch=batch,
        drafts=5,
        vocab=vocab,
        seed=support + 43 + int(4 * greedy) + 7 * batch,
        q=q,
        support=support,
        greedy_share=greedy,
    )
    plan = plan_launch(batch, 6, vocab, interpreter=False, support=support, dense=q == "dense")
    assert (plan.flat_rows, plan.block_v, plan.groups, plan.num_warps) == tile
    assert (plan.chunk, plan.nsplit) == (2048, 3)
    # a TMA box row is at most 256 tokens wide: these tiles are read through pointer loads
    assert not reads_by_tma(replace(plan, tma=True), args["logits"])
    assert reads_by_tma(replace(plan, tma=True, block_v=256), args["logits"])
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    eight = plan_launch(6, 6, vocab, interpreter=False, support=support, dense=q == "dense")
    assert (eight.flat_rows, eight.block_v) == (8, 256)
    _assert_same(got, _kernel(args, plan=eight), args)


@pytest.mark.parametrize(("q", "support"), [("point", 1), ("sparse", 64)], ids=str)
@pytest.mark.parametrize("batch", [1, 3], ids=["B1", "B3"])
def test_row_tiles_cover_a_chunk_of_one_and_a_half_steps(q: str, support: int, batch: int) -> None:
    """Past 256 x 2048 tokens the chunk grows in whole 1024-token draw tiles (V = 600000:
    3072), which the 2048-token steps of the one- and two-row tiles do not divide: a chunk's
    second step reads its last 1024 tokens and masks the next chunk's. Here V = 7000 in
    chunks of 3072 (the last one 856 tokens), B1 under [1, 2, 1024] and B3 (mixed) under
    [2, 4, 512], in the interpreter: the same bits as the reference and as the eight-row
    tile's 512-token steps, which divide the chunk."""
    vocab = 7000
    args = _make(
        batch=batch, drafts=5, vocab=vocab, seed=batch + support, q=q, support=support,
        greedy_share=0.5,
    )  # fmt: skip

    def chunked(plan: LaunchPlan) -> LaunchPlan:
        return replace(plan, chunk=3072, nsplit=3, block_f=1024)

    plan = chunked(plan_launch(batch, 6, vocab, interpreter=False, support=support))
    assert plan.chunk % (plan.groups * plan.block_v) == 1024
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    eight = chunked(plan_launch(6, 6, vocab, interpreter=False, support=support))
    assert eight.flat_rows == 8 and eight.chunk % (eight.groups * eight.block_v) == 0
    _assert_same(got, _kernel(args, plan=eight), args)


@pytest.mark.parametrize(("support", "warps"), [(1, 8), (64, 8), (1024, 8), (1025, 16), (4096, 16)])
def test_phase2_warps_grow_with_a_wide_support(support: int, warps: int) -> None:
    """The large-vocabulary plans run phase 2 at 8 warps, and at 16 once sparse q's padded
    slot axis reaches 2048 (bench/NOTES.md, "phase 2 by launch shape"); the small-vocabulary
    and interpreter plans keep 4."""
    assert plan_launch(4, 6, 129_280, interpreter=False, support=support).finish_warps == warps
    assert plan_launch(4, 6, 1000, interpreter=False, support=support).finish_warps == 4
    assert plan_launch(4, 6, 129_280, interpreter=True, support=support).finish_warps == 4


@pytest.mark.parametrize(("batch", "warps"), [(1, 2), (4, 2), (15, 2), (16, 8), (64, 8)])
def test_dense_q_finishes_in_two_warps_below_the_large_batch(batch: int, warps: int) -> None:
    """Dense q's phase 2 runs at 2 warps below 16 requests (bench/NOTES.md, the small-batch
    plan sweep: B4 32.2 -> 25.5 us) and at 8 from there; point drafts and sparse q keep
    theirs, and the small-vocabulary and interpreter plans keep 4."""
    assert plan_launch(batch, 6, 129_280, interpreter=False, dense=True).finish_warps == warps
    assert plan_launch(batch, 6, 129_280, interpreter=False).finish_warps == 8
    assert plan_launch(batch, 6, 129_280, interpreter=False, support=4096).finish_warps == 16
    assert plan_launch(batch, 6, 1000, interpreter=False, dense=True).finish_warps == 4
    assert plan_launch(batch, 6, 129_280, interpreter=True, dense=True).finish_warps == 4


def test_launches_overlap_on_the_large_vocabulary_gpu_plans_only() -> None:
    """Programmatic dependent launch is planned on every large-vocabulary GPU plan (point
    drafts, dense q, sparse q of any support: bench/NOTES.md steps 8, 8b and 25), and the
    support is split over programs from a slot axis of 128 on (steps 25-26: tiles of 128
    slots, the support launch at 4 warps; from a slot axis of 2048, tiles of 256 at 8
    warps), below 16 requests in tiles of 256 at 8 warps whose last program per request
    block finishes it (step 28: plan.ticket); the small-vocabulary plans, the interpreter
    and a CPU tensor never overlap, whatever the plan says."""
    for batch in (1, 4, 15, 16, 64, 1024):
        assert plan_launch(batch, 6, 129_280, interpreter=False).overlap
        assert plan_launch(batch, 6, 129_280, interpreter=False, dense=True).overlap
        for support in (2, 4, 5, 64, 65, 1024, 1025, 4096):  # 1025: a slot axis of 2048
            plan = plan_launch(batch, 6, 129_280, interpreter=False, support=support)
            assert plan.overlap
            split, wide = support > 64, support > 1024
            assert plan.ticket == (split and batch < 16), (batch, support, plan)
            if not split:
                assert plan.support_tile == plan.support_warps == 0, (support, plan)
            elif plan.ticket or wide:
                assert (plan.support_tile, plan.support_warps) == (256, 8), (support, plan)
            else:
                assert (plan.support_tile, plan.support_warps) == (128, 4), (support, plan)
        assert plan_launch(batch, 6, 129_280, interpreter=False, dense=True).support_tile == 0
        # dense q below 16 requests: the rescan's last program finishes (v5 step 39)
        assert plan_launch(batch, 6, 129_280, interpreter=False, dense=True).ticket == (batch < 16)
    assert plan_launch(4, 6, 1000, interpreter=False, support=4096).support_tile == 0
    assert plan_launch(4, 6, 129_280, interpreter=True, support=4096).support_tile == 0
    assert not plan_launch(4, 6, 1000, interpreter=False, support=4096).ticket
    assert not plan_launch(4, 6, 129_280, interpreter=True, support=4096).ticket
    assert not plan_launch(4, 6, 1000, interpreter=False).overlap
    assert not plan_launch(4, 6, 129_280, interpreter=True).overlap
    assert not overlaps(plan_launch(4, 6, 129_280, interpreter=False), torch.device("cpu"))


@pytest.mark.parametrize("q", ["point", "dense"])
def test_an_overlapping_plan_off_sm90_gives_the_reference_bits(q: str) -> None:
    """A plan that asks for overlapped launches, run where they cannot overlap (here the
    interpreter), launches as usual and draws exactly the reference's tokens."""
    args = _make(batch=6, drafts=3, vocab=300, seed=97, q=q, greedy_share=0.5)
    plan = LaunchPlan(block_b=2, block_v=64, nsplit=3, chunk=128, num_warps=4, overlap=True)
    _assert_same(_kernel(args, plan=plan), _reference(args), args)


@pytest.mark.parametrize(("q_mode", "support"), [(Q_SPARSE, 1), (Q_SPARSE, 1024), (Q_DENSE, 1)])
@pytest.mark.parametrize("overlap", [False, True])
def test_launch_constants_name_every_compile_time_argument(
    q_mode: int, support: int, overlap: bool
) -> None:
    """launch_constants gives each kernel every constexpr it declares except CHUNK, which
    verify_chain passes by position (bench/compile_sm90.py compiles with the same dicts)."""
    plan = plan_launch(16, 6, 129_280, interpreter=False, support=support)
    stats, phase2 = launch_constants(plan, 6, q_mode, support, overlap=overlap)

    def constexprs(kernel: Any) -> set[str]:  # a JITFunction, or the interpreter's wrapper
        declared = inspect.signature(kernel.fn).parameters.items()
        return {name for name, param in declared if "constexpr" in str(param.annotation)} - {
            "CHUNK"
        }

    assert set(stats) == constexprs(chain_kernels.chain_stats_kernel)
    assert set(phase2) == constexprs(chain_kernels.chain_finish_kernel)
    # the rescan's TICKET, like the counts and support launches', is verify_chain's own
    assert set(phase2) | {"TICKET"} == constexprs(chain_kernels.chain_rescan_kernel)
    assert stats["OVERLAP"] is overlap and phase2["OVERLAP"] is overlap
    assert (stats["K"], stats["R"], stats["BLOCK_R"], stats["FLAT"]) == (5, 8, 8, True)
    assert (phase2["S"], phase2["Q_MODE"], phase2["NSPLIT_P2"]) == (support, q_mode, 64)
    # each carveout its own compiled kernels (pp3kernels.carveout)
    assert stats["CARVEOUT"] == phase2["CARVEOUT"] == plan.carveout
    asking = launch_constants(replace(plan, carveout=100), 6, q_mode, support, overlap=overlap)
    assert asking[0]["CARVEOUT"] == asking[1]["CARVEOUT"] == 100


def test_the_draw_reads_its_chunk_as_one_tile_below_256_requests_except_for_dense_q() -> None:
    """The large-vocabulary plans draw from a chunk in one tile (block_f = chunk:
    ``_one_tile_draw``): 2048 tokens below 64 requests, 4096 from 64 to 255; dense q keeps
    1024-token tiles, as do chunks grown past those and the chunks of 4096 from 256 on."""
    assert plan_launch(4, 6, 129_280, interpreter=False).block_f == 2048
    assert plan_launch(16, 6, 129_280, interpreter=False, support=1024).block_f == 2048
    plan = plan_launch(64, 6, 129_280, interpreter=False, support=1024)
    assert plan.chunk == plan.block_f == 4096
    assert plan_launch(255, 6, 129_280, interpreter=False).block_f == 4096
    assert plan_launch(256, 6, 129_280, interpreter=False).block_f == 1024
    assert plan_launch(4, 6, 129_280, interpreter=False, dense=True).block_f == 1024
    assert plan_launch(64, 6, 129_280, interpreter=False, dense=True).block_f == 1024
    assert plan_launch(4, 6, 600_000, interpreter=False).block_f == 1024


@pytest.mark.parametrize(
    ("q", "support"), [("point", 1), ("sparse", 3), ("sparse", 8), ("dense", 1)]
)
def test_one_tile_draw_and_tile_walk_both_give_the_reference_bits(q: str, support: int) -> None:
    """A chunk drawn in one tile (chunk = block_f: one read, ``_one_tile_draw``) and the same
    chunk walked in four tiles (``_chunk_walk``, ``_tile_pick``) both give the reference's
    tokens, on sampled batches where most requests draw from a residual (sparse q of 8
    slots through the scratch row)."""
    args = _make(
        batch=24, drafts=4, vocab=3000, seed=61 + support, q=q, support=support, greedy_share=0.0
    )
    want = _reference(args)
    one = LaunchPlan(block_b=2, block_v=256, nsplit=3, chunk=1024, num_warps=4, block_f=1024)
    walked = LaunchPlan(block_b=2, block_v=256, nsplit=3, chunk=1024, num_warps=4, block_f=256)
    _assert_same(_kernel(args, plan=one), want, args)
    _assert_same(_kernel(args, plan=walked), want, args)
    assert int((want.accepted < 4).sum()) > 0  # some request drew from a residual


def test_finish_warps_must_be_a_power_of_two_up_to_32() -> None:
    args = _make(batch=2, drafts=1, vocab=30, seed=3)
    for warps in (0, 3, 64):
        plan = LaunchPlan(block_b=1, block_v=8, nsplit=1, chunk=32, num_warps=4, finish_warps=warps)
        with pytest.raises(ValueError, match="finish_warps must be a power of two from 1 to 32"):
            _kernel(args, plan=plan)


def test_groups_must_be_a_power_of_two_of_at_least_two() -> None:
    args = _make(batch=2, drafts=1, vocab=30, seed=3)
    for groups in (1, 3):
        plan = LaunchPlan(block_b=1, block_v=8, nsplit=1, chunk=32, num_warps=4, groups=groups)
        with pytest.raises(ValueError, match="groups must be a power of two >= 2"):
            _kernel(args, plan=plan)


@pytest.mark.parametrize("greedy_share", [0.0, 0.5, 1.0], ids=["t1", "mixed", "t0"])
@pytest.mark.parametrize("batch_plan", [None, 4, 16], ids=["interpreter", "gpu-b4", "gpu-b16"])
def test_phase1_partials_combine_to_each_rows_statistics(
    monkeypatch: pytest.MonkeyPatch, batch_plan: int | None, greedy_share: float
) -> None:
    """Phase 1 alone, under the interpreter's plan and the GPU's small- and large-batch plans
    (two and four groups a step): its per-chunk partials, combined in fp64, give every T1
    row's sum of exp((l - m)/tau) within a relative 1e-5 of fp64 torch over the same fp32
    logits, and every row's max and every T0 row's first argmax exactly. (A temperature off
    by 1e-4 in phase 1's exponent shows here long before it shows in emitted tokens.)"""
    vocab, drafts = 4100, 5
    args = _make(
        batch=16, drafts=drafts, vocab=vocab, seed=97, q="point", greedy_share=greedy_share
    )
    args["temperature"] = torch.where(
        args["temperature"] > 0, torch.linspace(0.3, 3.0, 16), args["temperature"]
    )
    plan = None
    if batch_plan is not None:
        plan = plan_launch(batch_plan, drafts + 1, vocab, interpreter=False)
    stats = RecordingLaunch(selector_module._chain_stats_kernel)
    monkeypatch.setattr(selector_module, "_chain_stats_kernel", stats)
    monkeypatch.setattr(selector_module, "_chain_finish_kernel", NoLaunch())
    _kernel(args, plan=plan)
    part_max, part_sum, part_arg = (t.double() for t in stats.args[5:8])
    x = args["logits"].double()
    row_max = x.amax(dim=2)
    assert torch.equal(part_max.amax(dim=2), row_max)
    tau = args["temperature"].double()[:, None]
    t1 = (tau > 0).expand_as(row_max)
    inv_tau = torch.where(tau > 0, 1.0 / tau, 1.0)
    scale = torch.exp((part_max - row_max[..., None]) * inv_tau[..., None])
    got = (part_sum * torch.where(part_max > NEG, scale, 0.0)).sum(dim=2)
    want = torch.exp((x - row_max[..., None]) * inv_tau[..., None]).sum(dim=2)
    error = ((got - want).abs() / want)[t1]
    assert bool((error < 1e-5).all()), float(error.max())
    first = torch.where(part_max == row_max[..., None], part_arg, float(2**30)).amin(dim=2)
    assert torch.equal(first[~t1].long(), x.argmax(dim=2)[~t1])
    # The batch takes the path it names: sampled-only, mixed or greedy-only programs.
    assert bool(t1.any()) == (greedy_share < 1.0) and bool(t1.all()) == (greedy_share == 0.0)


@pytest.mark.parametrize("groups", [2, 4])
def test_greedy_ties_in_mixed_grouped_blocks_take_the_lowest_id(groups: int) -> None:
    """Greedy rows that share a phase-1 block with sampled rows (flat rows, GROUPS tiles a
    step): a row max held by several ids gives the lowest, whether the ids sit in one lane's
    groups of one step, in one lane across steps, in different lanes or chunks, or are
    -0.0 and +0.0. Lanes of 4 tokens, steps of 4 * groups tokens, chunks of 32."""
    vocab, lanes = 64, 4
    patterns = [  # (ids holding the max, max value, the first id)
        ([9, 5], 5.0, 5),  # lane 1: groups 1 and 2 of step 0 (groups = 4)
        ([17, 13], 5.0, 13),  # lane 1: group 3 of step 0, then group 0 of step 1
        ([40, 6, 3], 5.0, 3),  # other lanes, the other chunk
        ([9, 5], 0.0, 5),  # -0.0 at 5, +0.0 at 9: signed zeros tie
        ([2 + lanes * groups, 2], 7.0, 2),  # lane 2: one step apart, whatever groups is
    ]
    batch = 2 * len(patterns)
    generator = torch.Generator().manual_seed(groups)
    logits = torch.rand((batch, 2, vocab), generator=generator) - 2.0
    for i, (ids, value, _) in enumerate(patterns):
        logits[2 * i, 0, ids] = value
        if value == 0.0:
            logits[2 * i, 0, ids[1]] = -0.0
    temperature = torch.tensor([0.0, 1.0] * len(patterns))
    drafts = torch.full((batch, 1), vocab - 1, dtype=torch.int32)  # never a row max
    q_ids, q_counts = point_mass_q(drafts, 16)
    args: Args = dict(
        logits=logits,
        draft_tokens=drafts,
        temperature=temperature,
        seed=torch.arange(batch, dtype=torch.int64),
        position=torch.zeros(batch, dtype=torch.int64),
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=16,
    )
    plan = LaunchPlan(
        block_b=1, block_v=lanes, nsplit=2, chunk=32, num_warps=4, flat_rows=8, groups=groups
    )
    got = _kernel(args, plan=plan)
    _assert_same(got, _reference(args), args)
    for i, (_, _, first) in enumerate(patterns):
        assert int(got.tokens[2 * i, 0]) == first, patterns[i]


def test_interpreter_plan_is_one_split() -> None:
    """The plans the tests above rely on: one split, up to 8192 requests per program."""
    plan = plan_launch(20_000, 3, 6, interpreter=True)
    assert plan.nsplit == 1 and plan.block_b == 8192 and plan.chunk >= 6
    plan = plan_launch(128, 3, 1000, interpreter=True)
    assert plan.nsplit == 1 and plan.block_b == 128 and plan.chunk == 1024


# (batch, drafts, vocab, support, denominator, greedy_share): shapes whose finish-kernel
# tiles broke Triton's 2^20-element limit in the interpreter before plan_launch counted the
# q-slot tiles (the [R, S_P2, S_P2] duplicate check for S <= 16, [R, S_P2] beyond): S = 16
# and S = 8 at batches the old plan put into one program, and the largest supported shape,
# K = 15 with S = 4096, greedy and sampled (the draw applies a 4096-slot residual to a tile
# in O(tile + S), through the scratch row).
_NUMEL_CASES = [
    (1024, 5, 32, 16, 1024, 0.25),
    (4096, 5, 32, 8, 1024, 0.25),
    (32, 15, 4100, 4096, 1 << 16, 1.0),
    (32, 15, 4100, 4096, 1 << 16, 0.0),
]


@pytest.mark.parametrize("case", _NUMEL_CASES, ids=str)
def test_interpreter_plan_respects_tritons_tile_limit(
    case: tuple[int, int, int, int, int, float],
) -> None:
    batch, drafts, vocab, support, denominator, greedy_share = case
    args = _make(
        batch=batch,
        drafts=drafts,
        vocab=vocab,
        seed=batch + support,
        support=support,
        denominator=denominator,
        greedy_share=greedy_share,
        mask_share=0.0 if support > vocab // 4 else 0.15,
    )
    assert args["q_ids"].shape[2] == support
    _assert_same(_kernel(args), _reference(args), args)


# (batch, rows, vocab, interpreter) -> (block_b, block_v, nsplit, chunk, num_warps, block_f,
# and where set flat_rows, groups, finish_warps, overlap, tma, kind_order):
# the launch shapes measured on the H200 (bench/NOTES.md) and the interpreter's, pinned so
# that a refactor of plan_launch cannot change them unnoticed.
# Values: LaunchPlan's fields in order, ints then bools (so Any: no one element type fits).
PINNED_PLANS: dict[tuple[int, int, int, bool], tuple[Any, ...]] = {
    (1, 6, 129_280, False): (1, 1024, 64, 2048, 4, 2048, 1, 2, 8, True, False),
    (1, 2, 129_280, False): (1, 1024, 64, 2048, 4, 2048, 1, 2, 8, True, False),
    (2, 6, 129_280, False): (1, 512, 64, 2048, 4, 2048, 2, 4, 8, True, False),
    (5, 6, 129_280, False): (1, 512, 64, 2048, 4, 2048, 2, 4, 8, True, False),
    (6, 6, 129_280, False): (1, 256, 64, 2048, 8, 2048, 8, 2, 8, True, False),
    (64, 6, 129_280, False): (1, 128, 32, 4096, 4, 4096, 8, 4, 8, True, False),
    (16, 6, 129_280, False): (1, 128, 64, 2048, 4, 2048, 8, 4, 8, True, False),
    (256, 6, 129_280, False): (1, 128, 32, 4096, 1, 1024, 2, 4, 8, True, True, False),
    (256, 5, 129_280, False): (1, 128, 32, 4096, 1, 1024, 2, 4, 8, True, True, False),
    (256, 2, 129_280, False): (1, 128, 32, 4096, 1, 1024, 2, 4, 8, True, True, False),
    (255, 6, 129_280, False): (1, 128, 32, 4096, 4, 4096, 8, 4, 8, True, False),
    (1024, 6, 600_000, False): (1, 128, 147, 4096, 1, 1024, 2, 4, 8, True, True, False),
    (1024, 5, 600_000, False): (1, 128, 147, 4096, 1, 1024, 2, 4, 8, True, True, False),
    (1024, 6, 2_000_000, False): (1, 128, 245, 8192, 1, 1024, 2, 4, 8, True, True, False),
    (15, 6, 129_280, False): (1, 256, 64, 2048, 8, 2048, 8, 2, 8, True, False),
    (4, 2, 129_280, False): (1, 512, 64, 2048, 4, 2048, 2, 4, 8, True, False),
    (8, 2, 129_280, False): (1, 1024, 64, 2048, 8, 2048, 2, 2, 8, True, False),
    (4, 1, 129_280, False): (1, 512, 64, 2048, 4, 2048, 2, 4, 8, True, False),
    (8, 1, 129_280, False): (1, 2048, 64, 2048, 8, 2048, 1, 2, 8, True, False),
    (4, 33, 129_280, False): (1, 512, 64, 2048, 4, 2048, 2, 4, 8, True, False),
    (8, 33, 129_280, False): (1, 64, 64, 2048, 8, 2048, 64, 2, 8, True, False),
    (4, 6, 1000, False): (1, 1024, 1, 1024, 4, 1024),
    (4, 6, 5, False): (1, 16, 1, 16, 4, 16),
    (4, 6, 300, False): (1, 512, 1, 512, 4, 512),
    (4, 6, 1025, False): (1, 512, 1, 2048, 4, 2048, 2, 4, 8, True, False),
    (4, 6, 600_000, False): (1, 512, 196, 3072, 4, 1024, 2, 4, 8, True, False),
    (8, 6, 600_000, False): (1, 256, 196, 3072, 8, 1024, 8, 2, 8, True, False),
    (4, 6, 2_000_000, False): (1, 512, 245, 8192, 4, 1024, 2, 4, 8, True, False),
    (1, 1, 1, True): (1, 1, 1, 1, 4, 1),
    (20_000, 3, 6, True): (8192, 8, 1, 8, 4, 8),
    (128, 3, 1000, True): (128, 1024, 1, 1024, 4, 1024),
    (5, 6, 2100, True): (8, 1024, 1, 3072, 4, 1024),
    (9000, 3, 8, True): (8192, 8, 1, 8, 4, 8),
    (4, 6, 8192, True): (4, 1024, 1, 8192, 4, 1024),
    (512, 4, 32_768, True): (128, 1024, 4, 8192, 4, 1024),
    (4, 6, 129_280, True): (4, 1024, 16, 8192, 4, 1024),
}


@pytest.mark.parametrize("shape", list(PINNED_PLANS), ids=str)
def test_plan_launch_choices_are_pinned(shape: tuple[int, int, int, bool]) -> None:
    batch, rows, vocab, interpreter = shape
    plan = plan_launch(batch, rows, vocab, interpreter=interpreter)
    pinned = LaunchPlan(*PINNED_PLANS[shape])
    if pinned.overlap and batch <= 128:  # the finish alone, in 128 registers (v5 step 38)
        pinned = replace(pinned, finish_carveout=7, finish_maxnreg=128)
    # point drafts (support 1, not dense) leave every launch's carveout to the driver
    assert plan == pinned and plan.carveout == -1


@pytest.mark.parametrize("batch", [1, 4, 15, 16, 64, 1024])
@pytest.mark.parametrize("support", [1, 2, 64, 65, 127, 128, 1024, 1025, 2048, 4096])
def test_one_split_only_where_phase_2_reads_most_before_its_wait(batch: int, support: int) -> None:
    """Below 16 requests, dense q and a split support that is not wide (65-1024 slots)
    ask every launch for the whole shared memory (v5 step 33, narrowed); everything else,
    and every interpreter or small-vocabulary plan, leaves the split to the driver."""
    for dense in (False, True):
        q_support = 1 if dense else support
        plan = plan_launch(batch, 6, 129_280, interpreter=False, support=q_support, dense=dense)
        asks = batch < 16 and (dense or 64 < q_support <= 1024)
        assert plan.carveout == (100 if asks else -1), (batch, support, dense)
        for interpreter, vocab in ((True, 129_280), (False, 1000)):
            other = plan_launch(
                batch, 6, vocab, interpreter=interpreter, support=q_support, dense=dense
            )
            assert other.carveout == -1


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-01)


def _candidate_requests(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """2^18 random seeds at position 0, among which a test picks requests whose acceptance
    coin (``acceptance_uniform``, the kernel's own Philox stream) falls where it needs."""
    seeds = torch.randint(-(2**62), 2**62, (1 << 18,), generator=generator, dtype=torch.int64)
    return seeds, torch.zeros(1 << 18, dtype=torch.int64)


def test_kernel_zero_residual_falls_back_to_p() -> None:
    """p = (1/2, 1/2), dense q = (1/2 + 4e-5) x 2: a rejection leaves a residual of 0 in
    floats, so the kernel must sample p with the row's uniform (token = u >= 1/2), as the
    reference does, and report OK. Requests are picked so that about half are rejected."""
    seeds, positions = _candidate_requests(torch.Generator().manual_seed(7))
    q_x = float(torch.tensor(0.5 + 4e-5, dtype=torch.float32))
    rejects = acceptance_uniform(seeds, positions) * q_x >= 0.5
    pick = torch.cat([rejects.nonzero().flatten()[:16], (~rejects).nonzero().flatten()[:16]])
    batch = pick.numel()
    args: Args = {
        "logits": torch.zeros((1, 2, 2)).expand(batch, -1, -1),
        "draft_tokens": torch.zeros((batch, 1), dtype=torch.int32),
        "temperature": torch.ones(batch),
        "seed": seeds[pick],
        "position": positions[pick],
        "q_dense": torch.full((batch, 1, 2), q_x),
    }
    got = _kernel(args)
    _assert_same(got, _reference(args), args)
    assert got.status.tolist() == [0] * batch
    assert got.accepted.tolist() == [0] * 16 + [1] * 16
    u = sample_uniform(seeds[pick[:16]], positions[pick[:16]])
    assert 0 < int((u >= 0.5).sum()) < 16  # both tokens are drawn
    assert got.tokens[:16, 0].tolist() == (u >= 0.5).long().tolist()
    assert got.tokens[:16, 1].tolist() == [-1] * 16


# ---- kernel status rules without validation (chain.py _accept_sparse_q / _accept_dense_q)


def test_valid_small_call_with_a_t0_zero_mass_q_row_is_ok() -> None:
    """Request 1 is T0 with all-padding q rows (mass 0, allowed for T0): a valid call,
    so every request is OK, in the kernel as in the reference."""
    args = _small_call()
    got = _kernel(args)
    assert got.status.tolist() == [STATUS_OK] * 3
    _assert_same(got, _reference(args), args)
    got = _kernel(args, validate=False)
    assert got.status.tolist() == [STATUS_OK] * 3


def test_without_validation_support_id_equal_to_v_reports_bad_draft() -> None:
    """A positive count on id V (one past the vocabulary) is malformed q: refused with
    validation, STATUS_BAD_DRAFT without, as the reference says."""
    vocab = 10
    args: Args = {
        "logits": torch.zeros((3, 2, vocab)),
        "draft_tokens": torch.tensor([[1], [1], [1]], dtype=torch.int32),
        "temperature": torch.tensor([1.0, 1.0, 1.0]),
        "seed": torch.arange(3, dtype=torch.int64),
        "position": torch.zeros(3, dtype=torch.int64),
        "q_ids": torch.tensor([[[1, -1]], [[1, vocab]], [[1, 3]]], dtype=torch.int32),
        "q_counts": torch.tensor([[[16, 0]], [[8, 8]], [[8, 8]]], dtype=torch.int32),
        "denominator": 16,
    }
    with pytest.raises(SelectorInputError, match="request 1, row 0: slot 1 has a positive count"):
        _kernel(args)
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_OK, STATUS_BAD_DRAFT, STATUS_OK]
    _assert_same(_kernel(args, validate=False), want, args)


def test_without_validation_dense_q_of_inf_at_the_proposal_reports_bad_draft() -> None:
    """q_dense(x) = +inf at a T1 proposal: not a probability; STATUS_BAD_DRAFT."""
    args = _dense_small_call()
    args["q_dense"] = args["q_dense"].clone()
    args["q_dense"][0, 0, 1] = float("inf")  # request 0's first proposal is token 1
    with pytest.raises(SelectorInputError, match=r"request 0, row 0: q_dense\[token 1\] = inf"):
        _kernel(args)
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_BAD_DRAFT, STATUS_OK, STATUS_OK]
    _assert_same(_kernel(args, validate=False), want, args)


# ---- host validation (validate.py)


def test_validate_refuses_a_duplicate_support_id_0() -> None:
    args = _edited("q_ids", (2, 0, 0), 0)  # request 2, row 0: ids [0, 0]
    with pytest.raises(SelectorInputError, match=r"request 2, row 0: support id 0 appears more"):
        _kernel(args)


def test_validate_refuses_a_padding_slot_with_a_negative_id() -> None:
    args = _edited("q_ids", (0, 1, 1), -5)  # request 0, row 1: count 0 on id -5
    with pytest.raises(SelectorInputError, match=r"request 0, row 1: slot 1 has count 0 but id -5"):
        _kernel(args)
    got = _kernel(args, validate=False)
    assert got.status.tolist() == [STATUS_BAD_DRAFT, STATUS_OK, STATUS_OK]
    _assert_same(got, _reference(args, validate=False), args)


def test_validate_counts_further_offenders_only_when_there_are_some() -> None:
    with pytest.raises(SelectorInputError) as one:
        _kernel(_edited("q_counts", (2, 0, 1), -4))
    assert str(one.value).endswith("is negative; expected a count >= 0"), str(one.value)
    args = _edited("q_counts", (2, 0, 1), -4)
    args["q_counts"][2, 1, 1] = -3
    with pytest.raises(SelectorInputError) as two:
        _kernel(args)
    assert str(two.value).endswith("(1 more rows likewise)"), str(two.value)


# ---- _scatter_residuals: only the tile's own BLOCK_F slots of the scratch row


def test_scatter_residuals_stay_inside_each_requests_tile() -> None:
    """Four requests per program share the scratch buffer (row b = request b), tiles of 8
    tokens, and q's supports (S = 12 > MAX_LOOPED_SLOTS: the scatter path) differ per
    request, so a support id at s_pos = BLOCK_F (the next tile's first token) must not be
    written: it lies in the next request's scratch row, on a token that may be outside
    that request's support."""
    args = _make(batch=128, drafts=2, vocab=32, seed=89, support=12, greedy_share=0.0)
    plan = LaunchPlan(block_b=4, block_v=8, nsplit=1, chunk=32, num_warps=4, block_f=8)
    got = _kernel(args, plan=plan)
    assert int((got.accepted < 2).sum()) > 32  # many requests draw from a residual
    _assert_same(got, _reference(args), args)
    _assert_same(got, _kernel(args), args)


def test_without_validation_logits_statuses_take_precedence_over_bad_draft() -> None:
    """Every request has both a bad logits row and a draft violation: the contract checks
    NaN, +inf, all -inf first, so BAD_DRAFT never hides them (as in the reference)."""
    args = _small_call()
    logits = args["logits"].clone()
    logits[0, 2, 3] = float("nan")  # bonus row
    logits[1, 1, 0] = float("inf")
    logits[2, 0, :] = float("-inf")
    drafts = args["draft_tokens"].clone()
    drafts[0, 0] = 8  # = V
    drafts[1, 0] = -3
    drafts[2, 1] = 3  # T1 proposal outside q's support
    args = {**args, "logits": logits, "draft_tokens": drafts}
    want = _reference(args, validate=False)
    assert want.status.tolist() == [STATUS_NAN, STATUS_POSINF, STATUS_ALL_MASKED]
    _assert_same(_kernel(args, validate=False), want, args)


def test_validate_refuses_a_slightly_negative_dense_q() -> None:
    """q_dense = -1e-4 on one token (the row still sums to 1): not a probability."""
    args = _dense_small_call()
    dense = args["q_dense"].clone()
    dense[0, 0, 6] += dense[0, 0, 7] + 1e-4
    dense[0, 0, 7] = -1e-4
    args["q_dense"] = dense
    with pytest.raises(SelectorInputError, match=r"request 0, row 0: q_dense\[token 7\] = -9\.99"):
        _kernel(args)


def test_reference_row_sum_is_accumulated_in_fp64_and_rounded_once() -> None:
    """The reference's s = sum_v e_v in fp64, rounded once to fp32 (module docstring), not
    an fp32 sum: on 64 random rows of 100000 tokens the two differ in the last bits."""
    from pp3kernels.reference import _RowStats

    generator = torch.Generator().manual_seed(3)
    rows = torch.randn((64, 100_000), generator=generator) * 3
    tau = torch.full((64,), 0.7)
    stats = _RowStats(rows, tau, highest_tie=False)
    e = torch.exp((rows - rows.amax(-1, keepdim=True)) / tau[:, None])
    assert torch.equal(stats.s, e.double().sum(-1).float())
    assert not torch.equal(e.sum(-1), e.double().sum(-1).float())  # the inputs tell them apart


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-01)


def _absorbed_chunk_case(logit_seed: int, delta: float) -> Args:
    """V = 128 in two chunks of 64. Row 0: tokens 0..63 (chunk 0) are q's support, each
    with q_v >= p_v, so a rejection leaves chunk 0 no residual mass at all; tokens 64..127
    (chunk 1, outside the support) carry a tiny mass delta, all the residual there is.
    Chunk 0's mass from the partials then differs from the sum of its support
    exponentials by rounding only: the guard must rescan it, never draw from a phantom.
    Only requests whose draft (token 0) is rejected are kept (found with the torch Philox)."""
    vocab, den = 128, 2**24
    generator = torch.Generator().manual_seed(logit_seed)
    row = torch.empty(vocab)
    row[:64] = torch.randn(64, generator=generator) * 0.5
    head = torch.exp((row[:64] - row[:64].max()).double()).sum()
    row[64:] = float(row[:64].max() + math.log(delta * float(head) / 64))
    e = torch.exp((row - row.max()).double())
    p = e / e.sum()
    counts = torch.ceil(p[:64] * den).to(torch.int64)
    counts[0] += den - int(counts.sum())
    assert int(counts[0]) > 0 and int(counts.sum()) == den
    seeds, positions = _candidate_requests(generator)
    p0 = float(torch.exp(row[0] - row.max()) / torch.exp(row - row.max()).double().sum())
    rejected = acceptance_uniform(seeds, positions) * int(counts[0]) >= p0 * den
    pick = rejected.nonzero().flatten()[:48]
    batch = pick.numel()
    assert batch >= 16
    logits = torch.stack([row, torch.randn(vocab, generator=generator)])
    return {
        "logits": logits.expand(batch, 2, vocab),
        "draft_tokens": torch.zeros((batch, 1), dtype=torch.int32),
        "temperature": torch.ones(batch),
        "seed": seeds[pick],
        "position": positions[pick],
        "q_ids": torch.arange(64, dtype=torch.int32).expand(batch, 1, 64).contiguous(),
        "q_counts": counts.to(torch.int32).expand(batch, 1, 64).contiguous(),
        "denominator": den,
    }


@pytest.mark.parametrize("logit_seed", [4])  # a seed whose chunk-0 rounding remainder is > 0
@pytest.mark.parametrize("support_tile", [0, 16], ids=["in-finish", "split-16"])
def test_split_plan_never_draws_from_an_absorbed_chunk(logit_seed: int, support_tile: int) -> None:
    args = _absorbed_chunk_case(logit_seed, delta=1e-5)
    plan = replace(_split_plan(nsplit=2, chunk_tiles=8), support_tile=support_tile)
    got = _kernel(args, plan=plan)
    assert got.status.tolist() == [STATUS_OK] * got.status.numel()
    assert got.accepted.tolist() == [0] * got.status.numel()
    assert bool((got.tokens[:, 0] >= 64).all()), got.tokens[:, 0].tolist()
    _assert_same(got, _reference(args), args)
