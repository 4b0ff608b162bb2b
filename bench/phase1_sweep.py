"""What bounds phase 1: the statistics pass alone, across tile shapes and update variants.

Run on the device machine (`python3 bench/phase1_sweep.py [--out DIR] [--quick] [--only-a]
[--loads]`, `--only-a` for part A alone, about a minute; `--loads` for the load stage
alone, about 100 s); `--cpu` runs a few variants once at V = 3000 in Triton's interpreter
and checks them against torch, to test the script itself.

The load stage (``loads_stage``, eleventh session): max only, the exp2 update and the
greedy update over two tile shapes with the grid's order (row blocks or splits fastest)
and cache hints (none, ``.cg``, evict_first) varied, and ``stats_tma``: the same passes
over [ROWS, 256] boxes of the tensor memory accelerator, pipelined 1-4 deep; torch.amax
over the same logits for scale.

Part A, the selector as it is: ``verify_chain(validate=False)`` on point drafts, K = 5,
B in {1, 4, 16, 64, 256, 1024}, all T1, all T0 and half, under the default plan and under the
same plan with phase 1 tiling whole requests padded to R rows (``flat_rows = 0``): the
full call, and phase 1 alone (the finish launch swapped for a no-op); outputs of the two
plans compared bit for bit.

Part B, a stand-alone statistics kernel (this file's ``stats_variant``) that computes what
phase 1 computes per (row, chunk) of the flat B (K+1) rows -- max, sum of
exp((l - m)/tau), NaN flag, or for greedy rows max and first argmax -- with a
[ROWS, G, BV] tile per step (ROWS consecutive rows, G groups of BV tokens folded into each
lane with one rescale per step), optionally loading the next step's tile before updating
with this one (PF), for MODE:

- 0  max only (no exponential): the tile shape's memory-side bound
- 1  as chain_stats_kernel's sampled pair update: (x - m) * (1/tau) into exp, NaN flag
     per element
- 2  exp2 of one fused multiply-add, x c - m c with c = log2(e)/tau; the NaN flag read
     off the lane sums (a NaN turns its lane's sum into NaN) instead of per element
- 4  greedy: max and first argmax per lane, NaN flag per element

Every variant's partials are combined in torch and checked against torch's own row max
and sum of exponentials (relative 1e-4) or first argmax (exact) before it is timed. Timing
is bench/selector_ab.py's (CUDA graphs of 10 calls rotating over input sets that exceed
2 x L2, 3 warm-up and 100 timed replays, median µs per call); the table gives µs and the
logits read rate in TB/s, with a device-to-device copy's rate for scale.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from launch_split import precompile, time_calls, without  # bench/ is the script's own folder
from selector_ab import K, input_sets, make_inputs

from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain

_LOG2E = tl.constexpr(1.4426950408889634)


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit  # type: ignore[untyped-decorator]
def _load(ptrs, mask, CACHE: tl.constexpr):  # type: ignore[no-untyped-def]
    """A masked load (-inf where masked) with CACHE's hints: 0 none, 1 ``.cg`` (L2 only),
    2 evict_first, 3 both."""
    if CACHE == 0:
        x = tl.load(ptrs, mask=mask, other=float("-inf"))
    elif CACHE == 1:
        x = tl.load(ptrs, mask=mask, other=float("-inf"), cache_modifier=".cg")
    elif CACHE == 2:
        x = tl.load(ptrs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
    else:
        x = tl.load(
            ptrs,
            mask=mask,
            other=float("-inf"),
            cache_modifier=".cg",
            eviction_policy="evict_first",
        )
    return x


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit(do_not_specialize=["n_rows", "V", "NSPLIT"])  # type: ignore[untyped-decorator]
def stats_variant(  # type: ignore[no-untyped-def]
    x_ptr,
    tau_ptr,
    out_max,
    out_sum,
    out_flag,
    n_rows,
    V,
    NSPLIT,
    stride_row,
    K1: tl.constexpr,
    CHUNK: tl.constexpr,
    ROWS: tl.constexpr,
    G: tl.constexpr,
    BV: tl.constexpr,
    MODE: tl.constexpr,
    PF: tl.constexpr,
    ORDER: tl.constexpr = 0,
    CACHE: tl.constexpr = 0,
):
    if ORDER == 0:  # row blocks fastest (the selector's grid)
        pid_r = tl.program_id(0)
        pid_s = tl.program_id(1)
    else:  # splits fastest: concurrent programs sweep consecutive rows' contiguous memory
        pid_s = tl.program_id(0)
        pid_r = tl.program_id(1)
    rows = pid_r * ROWS + tl.arange(0, ROWS)
    mask_r = rows < n_rows
    tau = tl.load(tau_ptr + rows // K1, mask=mask_r, other=1.0)
    inv_tau = 1.0 / tl.where(tau > 0.0, tau, 1.0)
    c2 = (inv_tau * _LOG2E)[:, None]
    c3 = (inv_tau * _LOG2E)[:, None, None]
    it2 = inv_tau[:, None]
    it3 = inv_tau[:, None, None]
    base = x_ptr + rows.to(tl.int64)[:, None, None] * stride_row
    grp = tl.arange(0, G)[None, :, None] * BV + tl.arange(0, BV)[None, None, :]
    start = pid_s * CHUNK
    end = tl.minimum(start + CHUNK, V)
    STEP: tl.constexpr = G * BV
    m = tl.full([ROWS, BV], float("-inf"), tl.float32)
    s = tl.zeros([ROWS, BV], tl.float32)
    arg = tl.full([ROWS, BV], 2**30, tl.int32)
    nan = tl.zeros([ROWS, BV], tl.int1)
    offs = start + grp
    nxt = _load(base + offs, mask_r[:, None, None] & (offs < end), CACHE)
    for v0 in range(0, CHUNK, STEP):
        offs = start + v0 + grp
        if PF:
            x = nxt.to(tl.float32)
            offs_n = offs + STEP
            nxt = _load(base + offs_n, mask_r[:, None, None] & (offs_n < end), CACHE)
        else:
            x = _load(base + offs, mask_r[:, None, None] & (offs < end), CACHE).to(tl.float32)
        if MODE == 0:
            m = tl.maximum(m, tl.max(x, axis=1))
        elif MODE == 4:
            nan = nan | (tl.max((x != x).to(tl.int32), axis=1) > 0)
            tmax = tl.max(x, axis=1)
            targ = tl.argmax(x, axis=1, tie_break_left=True)
            gt = tmax > m
            arg = tl.where(gt, start + v0 + targ * BV + tl.arange(0, BV)[None, :], arg)
            m = tl.where(gt, tmax, m)
        else:
            new_m = tl.maximum(m, tl.max(x, axis=1))
            fin = (new_m != float("-inf")) & (new_m != float("inf"))
            ref = tl.where(fin, new_m, 0.0)
            old = tl.where((m != float("-inf")) & (m != float("inf")), m, 0.0)
            if MODE == 1:
                nan = nan | (tl.max((x != x).to(tl.int32), axis=1) > 0)
                rescale = tl.where(m == float("-inf"), 0.0, tl.exp((old - ref) * it2))
                e = tl.exp((x - ref[:, None, :]) * it3)
            else:
                rescale = tl.where(m == float("-inf"), 0.0, tl.math.exp2(old * c2 - ref * c2))
                e = tl.math.exp2(x * c3 - (ref * c2)[:, None, :])
            s = s * rescale + tl.sum(e, axis=1)
            m = new_m
    row_m = tl.max(m, axis=1)
    if MODE == 2:
        nan = s != s
    live = m != float("-inf")
    scale = tl.where(live, tl.exp((m - row_m[:, None]) * inv_tau[:, None]), 0.0)
    row_s = tl.sum(tl.where(live, s * scale, 0.0), axis=1)
    flag = tl.max(nan.to(tl.int32), axis=1)
    if MODE == 4:
        row_s = tl.min(tl.where(m == row_m[:, None], arg, 2**30), axis=1).to(tl.float32)
    part = rows * NSPLIT + pid_s
    tl.store(out_max + part, row_m, mask=mask_r)
    tl.store(out_sum + part, row_s, mask=mask_r)
    tl.store(out_flag + part, flag, mask=mask_r)


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit(do_not_specialize=["n_rows", "V", "NSPLIT"])  # type: ignore[untyped-decorator]
def stats_tma(  # type: ignore[no-untyped-def]
    desc,
    out_max,
    out_sum,
    out_flag,
    n_rows,
    V,
    NSPLIT,
    CHUNK: tl.constexpr,
    ROWS: tl.constexpr,
    BV: tl.constexpr,
    MODE: tl.constexpr,
    STAGES: tl.constexpr,
    ORDER: tl.constexpr,
):
    """MODE 0 (max) or 4 (greedy) over [ROWS, BV] tiles read by the tensor memory
    accelerator (a host-made descriptor of the [rows, V] logits; zero past its bounds, made
    -inf here past V), the chunk loop software-pipelined STAGES deep."""
    if ORDER == 0:
        pid_r = tl.program_id(0)
        pid_s = tl.program_id(1)
    else:
        pid_s = tl.program_id(0)
        pid_r = tl.program_id(1)
    rows = pid_r * ROWS + tl.arange(0, ROWS)
    mask_r = rows < n_rows
    start = pid_s * CHUNK
    m = tl.full([ROWS, BV], float("-inf"), tl.float32)
    arg = tl.full([ROWS, BV], 2**30, tl.int32)
    nan = tl.zeros([ROWS, BV], tl.int1)
    for v0 in tl.range(0, CHUNK, BV, num_stages=STAGES):
        offs = start + v0 + tl.arange(0, BV)
        x = desc.load([pid_r * ROWS, start + v0]).to(tl.float32)
        x = tl.where(offs[None, :] < V, x, float("-inf"))
        if MODE == 0:
            m = tl.maximum(m, x)
        else:
            nan = nan | (x != x)
            gt = x > m
            arg = tl.where(gt, offs[None, :], arg)
            m = tl.where(gt, x, m)
    row_m = tl.max(m, axis=1)
    row_s = tl.zeros([ROWS], tl.float32)
    if MODE == 4:
        row_s = tl.min(tl.where(m == row_m[:, None], arg, 2**30), axis=1).to(tl.float32)
    part = rows * NSPLIT + pid_s
    tl.store(out_max + part, row_m, mask=mask_r)
    tl.store(out_sum + part, row_s, mask=mask_r)
    tl.store(out_flag + part, tl.max(nan.to(tl.int32), axis=1), mask=mask_r)


Config = tuple[dict[str, int], int]  # (constexprs, num_warps)


def variant_call(
    logits: torch.Tensor, tau: torch.Tensor, config: Config, outs: list[torch.Tensor]
) -> Callable[[], None]:
    """One launch of ``stats_variant`` over all rows of ``logits`` [B, K+1, V]."""
    cfg, warps = config
    rows, vocab = logits.shape[0] * logits.shape[1], logits.shape[2]
    nsplit = triton.cdiv(vocab, cfg["CHUNK"])
    grid = (triton.cdiv(rows, cfg["ROWS"]), nsplit)
    if cfg.get("ORDER", 0):
        grid = grid[::-1]
    if cfg.get("TMA", 0):
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(logits.view(rows, vocab), [cfg["ROWS"], cfg["BV"]])
        tma = {k: cfg[k] for k in ("CHUNK", "ROWS", "BV", "MODE", "STAGES", "ORDER")}

        def call_tma() -> None:
            stats_tma[grid](desc, *outs, rows, vocab, nsplit, **tma, num_warps=warps)

        return call_tma

    def call() -> None:
        stats_variant[grid](
            logits, tau, *outs, rows, vocab, nsplit, vocab, K1=K + 1, **cfg, num_warps=warps
        )

    return call


def new_outputs(rows: int, config: Config, vocab: int, device: str) -> list[torch.Tensor]:
    nsplit = triton.cdiv(vocab, config[0]["CHUNK"])
    outs = [torch.empty(rows * nsplit, device=device) for _ in range(2)]
    return outs + [torch.empty(rows * nsplit, device=device, dtype=torch.int32)]


def truths(logits: torch.Tensor, tau: torch.Tensor) -> dict[str, torch.Tensor]:
    """Torch's row max, first argmax and sum of exp((x - max)/tau), fp32 inputs, fp64 sum."""
    x = logits.float().reshape(-1, logits.shape[2])
    m = x.max(dim=1).values
    it = (1.0 / tau.repeat_interleave(K + 1))[:, None]
    s = torch.exp(((x - m[:, None]) * it).double()).sum(dim=1)
    return {"max": m, "arg": x.argmax(dim=1), "sum": s, "inv_tau": it}


def check_variant(
    logits: torch.Tensor, tau: torch.Tensor, config: Config, truth: dict[str, torch.Tensor]
) -> str | None:
    """None if the variant's combined partials match torch's, else what differs."""
    rows, vocab = logits.shape[0] * logits.shape[1], logits.shape[2]
    mode = config[0]["MODE"]
    outs = new_outputs(rows, config, vocab, str(logits.device))
    variant_call(logits, tau, config, outs)()
    part_m, part_s = outs[0].view(rows, -1), outs[1].view(rows, -1)
    if not torch.equal(part_m.max(dim=1).values, truth["max"]):
        return "row max differs"
    if int(outs[2].sum()) != 0:
        return "NaN flagged on clean rows"
    if mode == 4:
        hit = torch.where(part_m == truth["max"][:, None], part_s, float(2**30))
        return None if torch.equal(hit.min(dim=1).values.long(), truth["arg"]) else "argmax differs"
    if mode == 0:
        return None
    scale = torch.exp(((part_m - truth["max"][:, None]) * truth["inv_tau"]).double())
    got = (part_s.double() * scale).sum(dim=1)
    err = float(((got - truth["sum"]).abs() / truth["sum"]).max())
    return None if err < 1e-4 else f"sum relative error {err:.2e}"


def _compile(configs: list[Config]) -> int:
    """Worker: compile each config by one launch on a one-request input (same specialisation)."""
    logits = torch.zeros(1, K + 1, VOCAB, dtype=torch.bfloat16, device="cuda")
    tau = torch.ones(1, device="cuda")
    for config in configs:
        try:  # a variant that does not compile is reported by its check, not here
            variant_call(logits, tau, config, new_outputs(K + 1, config, VOCAB, "cuda"))()
        except Exception as exc:  # noqa: BLE001 -- any compiler error
            print(f"compile failed: {config}: {exc!r}"[:400], flush=True)
    torch.cuda.synchronize()
    return len(configs)


VOCAB = 129_280


def shapes(quick: bool) -> list[tuple[int, int, int, int]]:
    """(ROWS, G, BV, warps) with 16 to 64 (32 with --quick) elements per thread per step."""
    out = []
    grid = itertools.product((1, 2, 4, 8), (2, 4), (128, 256, 512, 1024, 2048), (4, 8))
    for rows_, g, bv, w in grid:
        per_thread = rows_ * g * bv // (32 * w)
        if 16 <= per_thread <= (32 if quick else 64) and bv >= 32 * w // 4:
            out.append((rows_, g, bv, w))
    return out


def part_a(batches: tuple[int, ...], vocab: int, device: str, l2: int, cpu: bool) -> list[Any]:
    """The selector's own launches: full call and phase 1 alone, flat and padded plans."""
    out = []
    for batch in batches:
        for temps in ("T1", "T0", "half"):
            sets = input_sets(batch, vocab, l2, cpu=cpu)
            inputs = [make_inputs(batch, temps, "point", i, vocab, device) for i in range(sets)]
            plan = plan_launch(batch, K + 1, vocab, interpreter=cpu)
            padded = LaunchPlan(**{**plan.__dict__, "flat_rows": 0})
            res: dict[str, Any] = {"case": f"B{batch} {temps}", "sets": sets, "plan": str(plan)}
            outs = {}
            for label, p in (("flat", plan), ("padded", padded)):
                calls = [lambda a=a, p=p: verify_chain(**a, validate=False, plan=p) for a in inputs]
                outs[label] = [t.clone() for t in calls[0]()]
                res[f"{label}_full"] = time_calls(calls, cpu)
                with without("_chain_finish_kernel"):
                    res[f"{label}_stats"] = time_calls(calls, cpu)
            res["identical"] = all(
                torch.equal(a, b) for a, b in zip(outs["flat"], outs["padded"], strict=True)
            )
            res["logits_bytes"] = batch * (K + 1) * vocab * 2
            print(json.dumps(res), flush=True)
            out.append(res)
            del inputs
    return out


def part_b(
    batches: tuple[int, ...], vocab: int, device: str, l2: int, cpu: bool, configs: list[Config]
) -> list[dict[str, Any]]:
    """Check, then time, every config at every batch size (all T1 inputs)."""
    out: list[dict[str, Any]] = []
    for batch in batches:
        sets = input_sets(batch, vocab, l2, cpu=cpu)
        inputs = [make_inputs(batch, "T1", "point", i, vocab, device) for i in range(sets)]
        rows = batch * (K + 1)
        truth = truths(inputs[0]["logits"], inputs[0]["temperature"])
        for config in configs:
            try:
                problem = check_variant(
                    inputs[0]["logits"], inputs[0]["temperature"], config, truth
                )
            except Exception as exc:  # noqa: BLE001 -- a variant that fails to build or run
                problem = f"raised {exc!r}"[:300]
                out.append({"B": batch, **config[0], "warps": config[1], "problem": problem})
                print(json.dumps(out[-1]), flush=True)
                continue
            calls = [
                variant_call(
                    a["logits"], a["temperature"], config, new_outputs(rows, config, vocab, device)
                )
                for a in inputs
            ]
            us = float("nan") if problem else time_calls(calls, cpu)
            rec = {"B": batch, **config[0], "warps": config[1], "us": us, "problem": problem}
            rec["TBps"] = rows * vocab * 2 / us / 1e6 if us == us else 0.0
            print(json.dumps(rec), flush=True)
            out.append(rec)
        del inputs, truth
        if not cpu:
            torch.cuda.empty_cache()
    return out


KEYS = ("CHUNK", "ROWS", "G", "BV", "PF")
# Phase 1 as the selector runs it from B = 16 on (flat rows of [8, 128] tiles, two tiles a
# step, 4 warps, 2048-token chunks), and below (8 warps, [8, 256] tiles).
BASELINES: list[Config] = [
    ({"CHUNK": 2048, "ROWS": 8, "G": 2, "BV": 128, "PF": 0, "MODE": 1}, 4),
    ({"CHUNK": 2048, "ROWS": 8, "G": 2, "BV": 256, "PF": 0, "MODE": 1}, 8),
]


def _timed(record: dict[str, Any]) -> bool:
    """Whether a record holds a time (a variant that failed its check or raised has none)."""
    us = record.get("us")
    return us is not None and us == us


def _cell(records: list[dict[str, Any]], **match: Any) -> str:
    """The time of the first record whose fields equal ``match`` (TMA records only with
    TMA=1), as a table cell; "-" if none ran, "nan" if it failed."""
    match.setdefault("TMA", 0)
    for r in records:
        if all(r.get(k, 0 if k == "TMA" else None) == v for k, v in match.items()):
            return f"{r.get('us', float('nan')):.1f}"
    return "-"


# The load stage's shapes: the selector's from B = 16 on and stage 1's fastest (sixth session).
LOAD_SHAPES: list[Config] = [
    ({"CHUNK": 2048, "ROWS": 8, "G": 4, "BV": 128, "PF": 0}, 4),
    ({"CHUNK": 8192, "ROWS": 4, "G": 4, "BV": 256, "PF": 0}, 4),
]


def loads_stage(vocab: int, device: str, l2: int, cpu: bool) -> list[dict[str, Any]]:
    """Grid order (ORDER 1: splits fastest) and cache hints (CACHE 1 .cg, 2 evict_first) for
    MODE 0 / 2 / 4 on two shapes, each checked against torch, then timed; torch.amax over
    the same logits for scale. Prints a table: µs per (shape, mode) and B, by variant."""
    shapes_ = LOAD_SHAPES[:1] if cpu else LOAD_SHAPES
    configs = [
        ({**c, "MODE": mode, "ORDER": order, "CACHE": cache}, w)
        for c, w in shapes_
        for mode in (0, 2, 4)
        for order in (0, 1)
        for cache in (0, 1, 2)
    ]
    # The tensor memory accelerator's loads, pipelined 1-4 deep, splits fastest or not.
    tma_shapes = [(8, 2048), (4, 8192), (2, 8192)]
    configs += [
        (
            dict(
                CHUNK=ch, ROWS=r, G=1, BV=256, PF=0, MODE=mode, ORDER=o, CACHE=0, TMA=1, STAGES=st
            ),
            4,
        )
        for r, ch in (tma_shapes[:1] if cpu else tma_shapes)
        for mode in (0, 4)
        for o in (0, 1)
        for st in ((1, 3) if cpu else (1, 2, 3, 4))
    ]
    if cpu:
        configs = [({**c, "CHUNK": 1024}, w) for c, w in configs if c["MODE"] != 2]
    else:
        precompile(_compile, configs)
    batches = (4,) if cpu else (64, 256, 1024)
    records = part_b(batches, vocab, device, l2, cpu, configs)
    for batch in batches:
        sets = input_sets(batch, vocab, l2, cpu=cpu)
        inputs = [make_inputs(batch, "T1", "point", i, vocab, device) for i in range(sets)]
        amax_calls = [lambda a=a: torch.amax(a["logits"], dim=-1) for a in inputs]
        us = time_calls(amax_calls, cpu)
        rec = {"B": batch, "torch_amax_us": us, "TBps": batch * (K + 1) * vocab * 2 / us / 1e6}
        print(json.dumps(rec), flush=True)
        records.append(rec)
        del inputs
    print("\n== loads: µs by B, variant (ORDER, CACHE) = 00 / 01 / 02 / 10 / 11 / 12")
    for c, w in shapes_:
        for mode in (0, 2, 4):
            line = [f"CHUNK={c['CHUNK']} ROWS={c['ROWS']} G={c['G']} BV={c['BV']} w{w} M{mode}"]
            for batch in batches:
                cells = [
                    _cell(
                        records,
                        B=batch,
                        MODE=mode,
                        ORDER=order,
                        CACHE=cache,
                        ROWS=c["ROWS"],
                        BV=c["BV"],
                    )
                    for order, cache in itertools.product((0, 1), (0, 1, 2))
                ]
                line.append(f"B{batch}:" + "/".join(cells))
            print(" ".join(line))
    print("== TMA: µs by B, (ORDER, STAGES) = 01 / 02 / 03 / 04 / 11 / 12 / 13 / 14")
    for r_, ch in tma_shapes[:1] if cpu else tma_shapes:
        for mode in (0, 4):
            line = [f"TMA CHUNK={ch} ROWS={r_} BV=256 w4 M{mode}"]
            for batch in batches:
                cells = [
                    _cell(records, TMA=1, B=batch, MODE=mode, ORDER=order, STAGES=st, ROWS=r_)
                    for order, st in itertools.product((0, 1), (1, 2, 3, 4))
                ]
                line.append(f"B{batch}:" + "/".join(cells))
            print(" ".join(line))
    amax = [f"B{r['B']} {r['torch_amax_us']:.1f}" for r in records if "torch_amax_us" in r]
    print("torch.amax:", ", ".join(amax))
    bad = [r for r in records if r.get("problem")]
    print(f"variants failing their check: {len(bad)}", bad[:5])
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--quick", action="store_true", help="at most 32 elements per thread")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--skip-a", action="store_true", help="no part A")
    parser.add_argument("--only-a", action="store_true", help="part A only (no sweep)")
    parser.add_argument("--best", type=int, default=6, help="shapes carried to stage 2")
    parser.add_argument(
        "--loads", action="store_true", help="only the grid-order and cache-hint stage"
    )
    args = parser.parse_args()
    cpu = args.cpu
    device, vocab = ("cpu", 3000) if cpu else ("cuda", VOCAB)
    l2 = 60 << 20 if cpu else torch.cuda.get_device_properties(0).L2_cache_size
    report: dict[str, Any] = {}
    # The variants compile into their own cache, apart from the selector's kernels (the
    # device session returns the latter's cache, within a size limit).
    own_cache = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = "/tmp/phase1-sweep-cache"
    if not cpu:
        big = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        copy_us = time_calls([lambda: big.clone()], False)
        report["copy_TBps"] = 2 * big.numel() / copy_us / 1e6
        print(f"copy: {report['copy_TBps']:.2f} TB/s (read + write)", flush=True)
        del big
    if args.loads:
        report["loads"] = loads_stage(vocab, device, l2, cpu)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "phase1_loads.json").write_text(json.dumps(report, indent=1))
        return 0
    batches = (4,) if cpu else (1, 4, 16, 64, 256, 1024)
    b1: list[dict[str, Any]] = []
    ranked: list[dict[str, Any]] = []
    carried: list[Config] = []
    report["B2"] = []
    if not args.only_a:
        # Stage 1: every tile shape and chunk, MODE 2, at B = 64 (B = 4 on the CPU).
        stage1: list[Config] = []
        tiles = [(1, 2, 256, 4), (4, 2, 128, 4)] if cpu else shapes(args.quick)
        for (rows_, g, bv, w), chunk in itertools.product(
            tiles, (2048,) if cpu else (2048, 4096, 8192, 16384)
        ):
            if chunk % (g * bv) == 0 and chunk // (g * bv) >= 2:
                for pf in (0, 1):
                    cfg = {"CHUNK": chunk, "ROWS": rows_, "G": g, "BV": bv, "MODE": 2, "PF": pf}
                    stage1.append((cfg, w))
        if not cpu:
            precompile(_compile, stage1)
        b1 = part_b((4,) if cpu else (64,), vocab, device, l2, cpu, stage1)
        ranked = sorted((r for r in b1 if _timed(r)), key=lambda r: r["us"])
        # Stage 2: the fastest shapes and the selector's own, every mode, every batch size.
        carried = [({k: r[k] for k in KEYS}, r["warps"]) for r in ranked[: args.best]]
        carried += [({k: c[k] for k in KEYS}, w) for c, w in BASELINES]
        stage2 = [({**c, "MODE": mode}, w) for c, w in carried for mode in (0, 1, 2, 4)]
        if not cpu:
            precompile(_compile, stage2)
        report["B1"] = b1
        report["B2"] = part_b(batches, vocab, device, l2, cpu, stage2)
    if own_cache is None:
        del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = own_cache
    if not args.skip_a:
        report["A"] = part_a(batches, vocab, device, l2, cpu)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phase1_sweep.json").write_text(json.dumps(report, indent=1))
    if not args.only_a:
        print(f"\n== stage 1 (B = {64 if not cpu else 4}, MODE 2): 16 fastest of {len(b1)}")
        for r in ranked[:16]:
            print({k: r[k] for k in (*KEYS, "warps", "us", "TBps")})
        bad = [r for r in b1 + report["B2"] if r["problem"]]
        print(f"variants failing their check: {len(bad)}", bad[:5])
        print(
            "\n== stage 2: µs by B for MODE 0 / 1 / 2 / 4 (max only / as now / exp2+FMA / greedy)"
        )
        for c, w in carried:
            line = [f"{k}={c[k]}" for k in KEYS] + [f"w{w}"]
            for batch in batches:
                cells = [
                    _cell(report["B2"], B=batch, MODE=mode, warps=w, **{k: c[k] for k in KEYS})
                    for mode in (0, 1, 2, 4)
                ]
                line.append(f"B{batch}:" + "/".join(cells))
            print(" ".join(line))
    if "A" in report:
        print("\n== part A: selector full / phase-1-alone µs, flat plan vs padded plan")
        for r in report["A"]:
            print(
                f"{r['case']:9s} flat {r['flat_full']:8.1f} / {r['flat_stats']:8.1f}   "
                f"padded {r['padded_full']:8.1f} / {r['padded_stats']:8.1f}   phase-1 TB/s "
                f"{r['logits_bytes'] / r['flat_stats'] / 1e6:.2f}  identical {r['identical']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
