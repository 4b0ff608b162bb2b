"""The selector under other launch plans than the one it picks: same outputs, which is faster.

Run on the device machine (`python3 bench/plan_variants.py [--only WORD ...] [--variants
WORD ...]`: the cases, and beside the default the variants, naming one of the words); `--cpu`
runs every case once at a small V in Triton's interpreter, to check the script itself.

Each case (bench/selector_ab.py's inputs and timing: CUDA graphs of 10 calls rotating over
enough input sets to exceed 2 x L2, median of 100 replays, µs per call) runs under the plan
``verify_chain`` picks ("default") and under the variants named beside it, each a
``dataclasses.replace`` of that plan; every variant's outputs (tokens, accepted, status on
every input set) must be the default's bit for bit, or the script fails. Variants:

- point drafts, B64 (all T1, all T0, every other request T0): phase 1 through TMA boxes,
  beside the default's pointer loads;
- point drafts, B256 (all T1, all T0, the first half T0, every other request T0): kind order
  off, TMA off, both off, and plain launches (where spread-mixed batches lose against all-T1
  ones, in the finish: is it the overlapped finish's tail?);
- sparse q of S = 64, 256, 1024 and 4096 slots at B4 and B64: the phase-2 launches
  overlapped with phase 1 (programmatic dependent launch and the finish's partials read
  last) and plain, whichever of the two the default plan is not; from S = 256, where the
  plan splits the support over programs (step 25), also the finish summing it alone
  (support_tile 0), overlapped and plain. The split sums a stop row's support in another
  order, so its outputs may differ from the unsplit ones where a uniform lands within
  rounding of a boundary: such a difference is reported as one, and fails the script;
- sparse q of S = 4096 at B4 and B64, also the split at tiles of 64 to 512 slots with the
  support launch at 4 and 8 warps, and at tiles of 128 with the plan's warps (step 26's
  sweep); at S = 256 and 1024 the nearest of those; at S = 64 the finish at 4 and 16 warps
  (the plan's: 8) and the support split at tiles of 32 slots (step 27's leads);
- at S = 256 to 4096, step 28's LaunchPlan.ticket (where a package has it),
  the support launch's last program per request block finishing it (no finish launch) at
  8 and 16 warps, and at tiles of 256 at 8 warps; variants whose fields this package's
  plans lack are skipped;
- step 28's cases ("step28", at B1, B4, B16 and B64, S = 256 to 4096): the plan against
  step 27's (tiles of 128 at 4 warps, a finish launch), the plan without its ticket (or
  with one, where it has none) and at tiles of 128 at 8 warps;
- step 29's cases ("step29"): point drafts at B1, B4 and B16 (all T1, and every other
  request T0) with the finish at 4 and 16 warps; sparse q of S = 1024 and 4096 at B1 and
  B4 with the ticketed support program in tiles of 512 at 8 warps and of 256 and 512 at 16.
- small row tiles ("small rows", point drafts at B1-B4, all T1, all T0 and every other
  request T0), after step 40: one or two rows of 1024 or 512 tokens at 4 warps, the
  eight-row tile, and at one request 1024-token chunks (the splits and the draw's tile
  follow a variant's chunk);
- after step 41 ("after41"): at B2 and B4 (sparse q of S = 64, 1024 and 4096, dense q) the
  eight-row and one-row tiles beside the plan's two rows; at B5-B8 (point drafts, all T1,
  all T0, every other request T0) the two-row tile beside the plan's eight;
- a wide vocabulary ("wide vocab", V = 600000: chunks of 3072 tokens; point drafts at B1
  and B3, all T1 and every other request T0): the eight-row tile and 4096-token chunks
  beside the one- and two-row tiles, whose 2048-token steps do not divide the chunk;
- chunk length below 64 requests ("chunks", the forty-seventh session: B1, B4 and B16,
  sparse q of S = 64, 1024 and 4096, dense q, and point drafts all T1, all T0 and every
  other request T0): 4096-token and 2048-token chunks (32 / 64 splits, the draw's tile
  following the chunk) beside the plan's; 4096 halves the chunk axis of the stop row's
  support sums per chunk (the narrow support's [slots, chunks] membership tile, the split
  support's per-tile sums) and doubles each phase-1 program's steps;
- mid row tiles ("mid rows", point drafts at B2-B64, all T1, all T0 and every other request
  T0): two rows of [2, 4, 512] at 4 or 8 warps, four at 8, one at 2 (after the small rows);
- row tiles ("rows", point drafts at B1-B1024, all T1, all T0 and every other request
  T0): phase 1 over one flat row a program (its tile [1, groups, 1024 or 2048]) or two
  (K = 5: a request's six rows make three pairs, so no block holds both kinds), without
  kind order or TMA, beside the plan's eight rows (target 4: a mixed batch's blocks of
  both kinds run the mixed loop);
- row pairs ("pairs", point drafts at B256 and B1024, all T1, all T0 and every other
  request T0): one pair of a request's rows a program at one warp, through TMA boxes of
  two rows (every block of one kind, the mixed batch's too) and through pointer loads,
  beside the plan's eight rows in kind order;
- row pairs at odd K + 1 ("pairs K4", the same at K = 4, where a pair may straddle two
  requests): the flat pairs (through boxes and through pointer loads), the pairs in kind
  order and one flat row a program at one warp (no program straddles two requests), beside
  the plan's pairs.

A variant that leaves the default plan as it is (e.g. overlap where the plan overlaps
already) is skipped, not timed twice.

Prints one table last: case, variant, µs, ratio to the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from functools import partial
from typing import Any

import torch
from launch_split import precompile, time_calls  # bench/ is the script's own folder
from selector_ab import K, case_plan, digest, input_sets, make_inputs

from pp3kernels.selector import LaunchPlan, verify_chain

_POINT_B64 = {"tma": {"tma": True}}
_POINT_B256 = {
    "no kind order": {"kind_order": False},
    "no tma": {"tma": False},
    "neither": {"tma": False, "kind_order": False},
    "plain": {"overlap": False},
}
_SPARSE: dict[str, dict[str, Any]] = {"overlap": {"overlap": True}, "plain": {"overlap": False}}
# Step 25's split support (from 128 padded slots) against the finish summing it alone.
_SPLIT: dict[str, dict[str, Any]] = {
    **_SPARSE,
    "unsplit": {"support_tile": 0},
    "unsplit plain": {"support_tile": 0, "overlap": False},
}
# Step 26's sweep: the support launch's tile and warps (0: the plan's finish_warps).
_SWEEP: dict[str, dict[str, Any]] = {
    **_SPLIT,
    **{
        f"tile {tile} w{warps}": {"support_tile": tile, "support_warps": warps}
        for tile in (64, 128, 256, 512)
        for warps in (4, 8)
    },
    "tile 128 wplan": {"support_tile": 128, "support_warps": 0},
}
# Step 26's plan (tiles of 128 at 4 warps) at S = 256 and 1024, against its near neighbours.
_SWEEP_NEAR: dict[str, dict[str, Any]] = {
    **_SPLIT,
    **{
        name: _SWEEP[name]
        for name in ("tile 64 w4", "tile 256 w4", "tile 128 w8", "tile 128 wplan")
    },
}
# Step 27's narrow support (S = 64: the finish reads the draft rows' support before its
# wait): the finish at 4 and 16 warps beside the plan's 8, and the split support at tiles of
# 32 slots (counts, support and finish launches, as from 128 padded slots).
_NARROW: dict[str, dict[str, Any]] = {
    **_SPARSE,
    "finish w4": {"finish_warps": 4},
    "finish w16": {"finish_warps": 16},
    "tile 32 w4": {"support_tile": 32, "support_warps": 4},
}
# Step 28's candidate (bench/pending): no finish launch, the support launch's last program of
# each request block finishing it (LaunchPlan.ticket), at the warps and tiles that compile
# without spills (bench/compile_sm90.py --ticket 1: 4 warps spill at S = 4096).
_TICKET: dict[str, dict[str, Any]] = {
    "ticket w8": {"ticket": True, "support_warps": 8},
    "ticket 256 w8": {"ticket": True, "support_tile": 256, "support_warps": 8},
    "ticket w16": {"ticket": True, "support_warps": 16},
}
# Step 28's plan (tiles of 256 at 8 warps; below 16 requests their last program per request
# block finishing it) against step 27's (tiles of 128 at 4 warps, the finish launch), and the
# ticket on the other side of its line; fields the package's plans lack are skipped.
_STEP28: dict[str, dict[str, Any]] = {
    "step 27 plan": {"ticket": False, "support_tile": 128, "support_warps": 4},
    "no ticket": {"ticket": False},
    "ticket": {"ticket": True},
    "tile 128 w8": {"support_tile": 128, "support_warps": 8},
}
# Step 29 (per-request values unpinned) moved the finish's costs: point drafts' finish at 4
# and 16 warps beside the plan's 8 at B1-B16, and the ticketed support program at S = 1024
# and 4096 below 16 requests in tiles of 512 and at 16 warps beside the plan's 256 at 8.
_STEP29_POINT: dict[str, dict[str, Any]] = {
    "finish w4": {"finish_warps": 4},
    "finish w16": {"finish_warps": 16},
}
_STEP29_TICKET: dict[str, dict[str, Any]] = {
    "tile 512 w8": {"support_tile": 512, "support_warps": 8},
    "tile 256 w16": {"support_tile": 256, "support_warps": 16},
    "tile 512 w16": {"support_tile": 512, "support_warps": 16},
}
# Phase 1's row tile (target 4): one or two flat rows a program, no kind order. With 256
# tokens a tile row ([1, groups, 256], the first call of 2026-12-06's forty-first session)
# the warps lie along the groups, whose max then crosses warps through shared memory every
# step (bench/compile_sm90.py: 8 KB, 12 barriers at B64): 3.6-37x slower. Tile rows of
# 1024 or 2048 tokens keep the groups in each thread's registers (16-32 bytes of shared
# memory); no TMA, whose boxes are at most 256 tokens wide.


def _row_tile(rows: int, lanes: int, groups: int, warps: int) -> dict[str, Any]:
    """Plan fields of phase 1's [rows, groups, lanes] tile at ``warps`` warps, in flat rows
    without kind order or TMA (a box row is at most 256 tokens)."""
    return {
        "flat_rows": rows,
        "block_v": lanes,
        "groups": groups,
        "num_warps": warps,
        "kind_order": False,
        "tma": False,
    }


def _row_tiles(*shapes: tuple[int, int, int, int]) -> dict[str, dict[str, Any]]:
    """One variant per (rows, lanes, groups, warps), named "r{rows} v{lanes} g{groups}
    w{warps}" (``_row_tile``)."""
    return {f"r{r} v{v} g{g} w{w}": _row_tile(r, v, g, w) for r, v, g, w in shapes}


_ROWS = _row_tiles((1, 1024, 2, 4), (1, 1024, 4, 4), (1, 2048, 2, 8), (2, 1024, 2, 8))
# After step 40 (one request: one row a program in [1, 2, 1024] tiles at 4 warps): between
# one request and four, one or two rows of 1024 or 512 tokens at 4 warps, the eight-row
# tile (the plan of two requests and more), and at one request 1024-token chunks (twice
# the programs again; the draw's tile and the finish's partials follow the chunk).
_ROWS_SMALL = {
    **_row_tiles((1, 1024, 2, 4), (2, 1024, 2, 4), (2, 512, 4, 4), (8, 256, 2, 8)),
    "r1 c1024 v512 g2 w2": {**_row_tile(1, 512, 2, 2), "chunk": 1024},
}
# After the forty-second session's first call ([2, 4, 512] at 4 warps won at B2-B4): that
# tile and its neighbours from two requests to sixty-four.
_ROWS_MID = _row_tiles((2, 512, 4, 4), (2, 512, 4, 8), (4, 512, 4, 8), (1, 512, 4, 2))
# After step 41 (two to four requests: [2, 4, 512] at 4 warps): the eight-row and one-row
# tiles beside it where the A/B saw it lose (B4 S = 4096, its ticketed support launch at
# 16 warps) and for the other q forms; and the two-row tile at five to eight requests,
# where the plan keeps eight rows (B5-B7 not measured, B8 T0 +2.5%).
_AFTER41_Q = _row_tiles((8, 256, 2, 8), (1, 1024, 2, 4))
_AFTER41_POINT = _row_tiles((2, 512, 4, 4))
# Past 256 x 2048 tokens the chunk grows in 1024-token draw tiles (V = 600000: 3072), which
# the 2048-token steps of the one- and two-row tiles do not divide (a chunk's second step
# masks half its lanes): beside those plans, the eight-row tile (512-token steps divide any
# such chunk) and the row tiles at 4096-token chunks (their steps divide it).
WIDE_VOCAB = 600_000
_WIDE = {**_row_tiles((8, 256, 2, 8)), "c4096": {"chunk": 4096}}
# Below 64 requests the plan's chunks are 2048 tokens (64 splits at V = 129280); sparse q's
# stop row sums its support per chunk over that axis (target 5 at B4): 4096-token and
# 2048-token chunks beside the plan's (the one equal to it is skipped), for every q form.
_CHUNKS: dict[str, dict[str, Any]] = {"c4096": {"chunk": 4096}, "c2048": {"chunk": 2048}}
# Target 4 at B256 (fifty-first session): a spread-mixed batch's kind-ordered groups hold
# both kinds, so none of their rows are consecutive and every block reads through pointer
# loads, while the uniform batches read through TMA boxes (greedy rows gained ~9% from them
# at B256, twelfth session). One request's pair of rows a program (K = 5: three pairs a
# request, so every block is of one kind and its box is two consecutive rows) at one warp:
# the [2, 4, 128] tile keeps the default's lanes and groups, and at one warp the groups stay
# in each thread's registers (at two, half the warps lie along the groups: sm_90a, 8 KB of
# shared memory and 56 barriers against 3 KB and 26; and the sums over them change order).
# Measured (H100): the pairs through pointer loads did as well as through boxes, so the
# gain (B256 1-3%) is the one-warp programs', not the boxes'; "p2 w1 tma" became step 47.
_PAIRS: dict[str, dict[str, Any]] = {
    "p2 w1 tma": {"flat_rows": 2, "num_warps": 1, "kind_order": False},
    "p2 w1 ptr": {"flat_rows": 2, "num_warps": 1, "kind_order": False, "tma": False},
}
# Odd K+1 (K = 4, fifty-second session): step 47 kept the eight kind-ordered rows there,
# since a pair may straddle two requests (two of a request's five rows' pairs do), and a
# straddling pair of a T1 and a T0 request runs the mixed loop. Beside the flat pairs, the
# pairs in kind order (groups of two requests, T1 first: at most one mixed pair a group,
# and a group holding both kinds reads through pointer loads).
_PAIRS_ODD: dict[str, dict[str, Any]] = {
    **_PAIRS,
    "p2 w1 kind": {"flat_rows": 2, "num_warps": 1, "kind_order": True},
    # One flat row a program at one warp (fifty-third session): no program straddles two
    # requests, at twice the pairs' programs.
    "r1 w1 tma": {"flat_rows": 1, "num_warps": 1, "kind_order": False},
}
# The interpreter's smoke: a split at tiles of 64 and 128 (its warps are ignored there).
_CPU_SWEEP: dict[str, dict[str, Any]] = {
    f"tile {tile} w4": {"support_tile": tile, "support_warps": 4} for tile in (64, 128)
}


Case = tuple[str, int, str, str, dict[str, dict[str, Any]], int]


def cases(cpu: bool) -> list[Case]:
    """(name, batch, temperatures, q form, {variant: plan fields}, K) of every case."""
    if cpu:
        out = [(f"B4 {t} point", 4, t, "point", _POINT_B64) for t in ("T1", "T0", "mix")]
        out += [(f"B4 rows {t} point", 4, t, "point", _ROWS) for t in ("T1", "mix")]
        out += [(f"B{b} small rows T1 point", b, "T1", "point", _ROWS_SMALL) for b in (1, 3)]
        out += [("B4 sparse64", 4, "T1", "sparse64", _SPARSE | _CPU_SWEEP)]
        return [(*case, K) for case in out] + [
            ("B4 pairs K4 mix point", 4, "mix", "point", _PAIRS_ODD, 4)
        ]
    out = [(f"B64 {t} point", 64, t, "point", _POINT_B64) for t in ("T1", "T0", "mix")]
    out += [(f"B256 {t} point", 256, t, "point", _POINT_B256) for t in ("T1", "T0", "half", "mix")]
    out += [
        (
            f"B{b} sparse{s}",
            b,
            "T1",
            f"sparse{s}",
            {64: _NARROW, 4096: _SWEEP | _TICKET}.get(s, _SWEEP_NEAR | _TICKET),
        )
        for b in (4, 64)
        for s in (64, 256, 1024, 4096)
    ]
    out += [
        (f"B{b} step28 sparse{s}", b, "T1", f"sparse{s}", _STEP28)
        for b in (1, 4, 16, 64)
        for s in (256, 1024, 4096)
    ]
    out += [
        (f"B{b} step29 {t} point", b, t, "point", _STEP29_POINT)
        for b in (1, 4, 16)
        for t in ("T1", "mix")
        if b > 1 or t == "T1"
    ]
    out += [
        (f"B{b} step29 sparse{s}", b, "T1", f"sparse{s}", _STEP29_TICKET)
        for b in (1, 4)
        for s in (1024, 4096)
    ]
    out += [
        (f"B{b} rows {t} point", b, t, "point", _ROWS)
        for b in (1, 4, 16, 64, 256, 1024)
        for t in ("T1", "T0", "mix")
    ]
    out += [
        (f"B{b} small rows {t} point", b, t, "point", _ROWS_SMALL)
        for b in (1, 2, 3, 4)
        for t in ("T1", "T0", "mix")
    ]
    out += [
        (f"B{b} mid rows {t} point", b, t, "point", _ROWS_MID)
        for b in (2, 4, 8, 16, 32, 64)
        for t in ("T1", "T0", "mix")
    ]
    out += [
        (f"B{b} after41 {q}", b, "T1", q, _AFTER41_Q)
        for b in (2, 4)
        for q in ("sparse64", "sparse1024", "sparse4096", "dense")
    ]
    out += [
        (f"B{b} after41 {t} point", b, t, "point", _AFTER41_POINT)
        for b in (5, 6, 7, 8)
        for t in ("T1", "T0", "mix")
    ]
    out += [
        (f"B{b} chunks {q}", b, "T1", q, _CHUNKS)
        for b in (1, 4, 16)
        for q in ("sparse64", "sparse1024", "sparse4096", "dense")
    ]
    out += [
        (f"B{b} chunks {t} point", b, t, "point", _CHUNKS)
        for b in (1, 4, 16)
        for t in ("T1", "T0", "mix")
        if b > 1 or t != "mix"
    ]
    out += [
        (f"B{b} wide vocab {t} point", b, t, "point", _WIDE) for b in (1, 3) for t in ("T1", "mix")
    ]
    out += [
        (f"B{b} pairs {t} point", b, t, "point", _PAIRS)
        for b in (256, 1024)
        for t in ("T1", "T0", "mix")
    ]
    odd = [
        (f"B{b} pairs K4 {t} point", b, t, "point", _PAIRS_ODD, 4)
        for b in (256, 1024)
        for t in ("T1", "T0", "mix")
    ]
    return [(*case, K) for case in out] + odd


def case_plans(
    batch: int,
    q: str,
    vocab: int,
    variants: dict[str, dict[str, Any]],
    words: list[str] | None,
    cpu: bool,
    depth: int = K,
) -> dict[str, LaunchPlan]:
    """The default plan of a case and its variants (those naming one of ``words``), each a
    ``dataclasses.replace`` of it; a variant equal to one already there is left out."""
    default: LaunchPlan = case_plan(batch, q, vocab, cpu=cpu, depth=depth)
    plans = {"default": default}
    for variant, fields in variants.items():
        if words and not any(word in variant for word in words):
            continue
        if any(field not in LaunchPlan.__dataclass_fields__ for field in fields):
            continue  # a field this package's plans do not have (e.g. step 28's ticket)
        plan = dataclasses.replace(default, **fields)
        if plan.chunk != default.chunk:  # the splits, and the draw's tile, follow the chunk
            tile = plan.chunk if default.block_f == default.chunk else default.block_f
            nsplit = -(-vocab // plan.chunk)
            plan = dataclasses.replace(plan, nsplit=nsplit, block_f=min(tile, plan.chunk))
        if plan.chunk % plan.block_v:
            continue  # a tile row wider than the case's chunk (the interpreter's V)
        if plan not in plans.values():
            plans[variant] = plan
    return plans


Work = tuple[int, str, str, int, dict[str, LaunchPlan], int]


def _compile(work: list[Work]) -> int:
    """Worker: compile every plan of each case (batch, temperatures, q form, V, plans) by one
    call on one input set of the case's own shape (same specialisation)."""
    for batch, temps, q, vocab, plans, depth in work:
        inputs = make_inputs(batch, temps, q, 0, vocab, "cuda", depth)
        for plan in plans.values():
            verify_chain(**inputs, validate=False, plan=plan)
    torch.cuda.synchronize()
    return len(work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument(
        "--variants", nargs="+", metavar="WORD", help="variants naming one of these (and default)"
    )
    parser.add_argument("--out", metavar="JSON", help="also write the table's rows here")
    args = parser.parse_args()
    device, usual_vocab = ("cpu", 3000) if args.cpu else ("cuda", 129_280)
    l2 = 60 << 20 if args.cpu else torch.cuda.get_device_properties(0).L2_cache_size
    selected: list[tuple[str, int, str, str, int, dict[str, LaunchPlan], int]] = []
    for name, batch, temps, q, variants, depth in cases(args.cpu):
        if args.only and not any(word in name for word in args.only):
            continue
        vocab = WIDE_VOCAB if "wide vocab" in name else usual_vocab
        plans = case_plans(batch, q, vocab, variants, args.variants, args.cpu, depth)
        selected.append((name, batch, temps, q, vocab, plans, depth))
    if not args.cpu:  # every plan compiled in parallel first (the timings then hit the cache)
        precompile(_compile, [(b, t, q, v, plans, k) for _name, b, t, q, v, plans, k in selected])
    rows: list[tuple[str, str, float, float]] = []
    same = True
    for name, batch, temps, q, vocab, plans, depth in selected:
        sets = input_sets(batch, vocab, l2, cpu=args.cpu, depth=depth)
        inputs = [make_inputs(batch, temps, q, i, vocab, device, depth) for i in range(sets)]
        base_us = 0.0
        reference = ""
        for variant, plan in plans.items():
            outputs = [verify_chain(**a, validate=False, plan=plan) for a in inputs]
            got = digest([t for out in outputs for t in out])
            reference = reference or got
            if got != reference:
                print(f"{name} {variant}: outputs differ from the default plan's", flush=True)
                same = False
            calls = [partial(verify_chain, **a, validate=False, plan=plan) for a in inputs]
            us = time_calls(calls, args.cpu)
            base_us = base_us or us
            rows.append((name, variant, us, us / base_us))
            print(f"{name} {variant}: {us:.2f} us ({plan})", flush=True)
        del inputs
    print(f"{'case':16s} {'variant':14s} {'us':>9s} {'/default':>9s}")
    for name, variant, us, ratio in rows:
        print(f"{name:16s} {variant:14s} {us:9.2f} {ratio:9.3f}")
    if args.out:
        table = [dict(case=n, variant=v, us=us, ratio=r) for n, v, us, r in rows]
        with open(args.out, "w") as out:
            json.dump({"rows": table, "outputs_identical": same}, out, indent=1)
    if not same:
        print("FAILED: a variant's outputs differ from the default plan's")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
