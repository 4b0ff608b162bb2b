"""The selector's launch plan, field by field: phase 1's loop length at small batches,
phase 2's warps, and phase 1's software pipeline at every batch size.

Run on the device machine (`python3 bench/small_batch_plans.py [--out DIR] [--only WORD ...]`);
`--cpu` runs two cases once at V = 3000 in Triton's interpreter, to test the script itself.

At B <= 16 phase 1 is a latency chain, not a stream: one program per (8 flat rows, chunk)
walks its chunk in chunk / (groups * block_v) dependent steps, and every shape the phase-1
sweep measured at B1 took 4 of them (bench/NOTES.md, "what bounds phase 1"): 4.9-5.4 µs
alone, against 7.1 with 8 steps. The "small" variants (B <= 16 cases only) vary the steps
per program through the plan alone (the ``plan=`` argument): chunks of 512 to 4096 tokens,
[8, G, block_v] tiles of 2 or 4 groups, 8 or 16 warps, the draw tile block_f = min(1024,
chunk); more splits cost phase 2 a wider partials axis (NSPLIT_P2 = 256 at chunk 512), so
the full call is what is timed. They also run phase 2 in 1, 2 and 4 warps: compiled for
sm_90a (bench/compile_sm90.py) the point-draft finish has 83 block barriers at 4 and 8
warps and 7 in one warp, whose reductions are warp shuffles. The "all" variants set
``stages`` 2 to 4: phase 1's chunk loops then stage the next steps' loads through shared
memory (cp.async) while a step is folded in (stages = 1 compiles to today's SASS). The
"b64" variants (eighteenth session) vary the 64-request plan's chunk, warps and tile on all
T1, all T0 and spread-mixed rows (`--only "B64 T1 point" "B64 T0 point" "B64 mix point"`).

Cases: bench/selector_ab.py's inputs (V = 129280 bf16, K = 5): point drafts at B in {1, 2,
4, 8, 16} all T1, B in {1, 4} all T0, B4 half T0, B4 sparse S = 64 and dense q; B in {64,
256, 1024} all T1 and all T0, B64 spread-mixed, B256 half and B64 dense. For every case and
variant that applies (the default plan too): phase 1 alone (the later launches swapped for
no-ops) and the full call, timed as bench/selector_ab.py times (CUDA graphs of 10 calls over
input sets that exceed 2 x L2, median of 100 replays, µs per call), and the number of
requests whose outputs differ from the default plan's. A different chunk changes where the
inverse-CDF draw's sums are rounded, so a request may differ when its uniform falls within
rounding of a token boundary (expected: none in these few thousand requests); more than that
is a bug, and so is any difference under the other fields. All variants are compiled first,
in parallel processes. Prints one table last (full call / phase 1 µs per variant) and writes
DIR/small_batch_plans.json.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

import torch
from launch_split import precompile, time_calls, without  # bench/ is the script's own folder
from selector_ab import case_plan, input_sets, make_inputs

from pp3kernels.selector import LaunchPlan, verify_chain

VOCAB = 129_280
# Each variant overrides fields of the case's default plan (steps per phase-1 program =
# chunk / (groups * block_v); finish_warps is phase 2's; stages > 1 software-pipelines
# phase 1's loads). "small" variants run on the B <= 16 cases only, "all" on every case.
Variant = tuple[str, dict[str, int]]
VARIANTS: list[Variant] = [
    ("small", {"finish_warps": 1}),  # phase 2 in one warp: reductions without block barriers
    ("small", {"finish_warps": 2}),
    ("small", {"finish_warps": 4}),
    ("small", {"chunk": 1024, "block_v": 256, "groups": 2, "num_warps": 8}),  # 2 steps
    ("small", {"chunk": 1024, "block_v": 128, "groups": 4, "num_warps": 8}),  # 2 steps
    ("small", {"chunk": 512, "block_v": 256, "groups": 2, "num_warps": 8}),  # 1 step (spills)
    ("small", {"chunk": 2048, "block_v": 512, "groups": 2, "num_warps": 8}),  # 2 steps
    ("small", {"chunk": 2048, "block_v": 1024, "groups": 2, "num_warps": 16}),  # 1 step
    ("small", {"chunk": 2048, "block_v": 1024, "groups": 2, "num_warps": 16, "finish_warps": 1}),
    ("small", {"chunk": 4096, "block_v": 1024, "groups": 2, "num_warps": 16}),  # 2 steps
    # B = 64, where greedy rows' phase 1 is 30.4 of a 33.4 µs call since step 20 (eighteenth
    # session): the loop's length, its warps and its tile, on T1, T0 and spread-mixed rows
    ("b64", {"chunk": 4096}),  # 8 steps, 32 splits
    ("b64", {"chunk": 4096, "block_f": 2048}),  # and the draw's tile as below 256
    ("b64", {"chunk": 4096, "block_f": 4096}),
    ("b64", {"chunk": 1024}),  # 2 steps, 127 splits
    ("b64", {"num_warps": 8}),  # 6-10x slower on the H200 (eighteenth session)
    ("b64", {"block_v": 256, "groups": 2}),  # the same 512 tokens a step, 2 groups
    ("b64", {"block_v": 256, "groups": 4, "num_warps": 8}),  # 1024 tokens a step
    ("all", {"stages": 2}),
    ("all", {"stages": 3}),
    ("all", {"stages": 4}),
]
CPU_VARIANTS: list[Variant] = [
    ("all", {"chunk": 1024, "block_v": 128, "groups": 2, "num_warps": 4}),
    ("all", {"chunk": 512, "block_v": 128, "groups": 2, "num_warps": 4, "finish_warps": 1}),
    ("all", {"stages": 3}),
]
SMALL = 16


def cases(cpu: bool, only: list[str] | None) -> list[tuple[str, int, str, str]]:
    """(name, batch, temperatures, q form) of every case (those naming a word of ``only``)."""
    if cpu:
        out = [("B1 T1 point", 1, "T1", "point"), ("B4 T1 sparse64", 4, "T1", "sparse64")]
    else:
        out = [(f"B{b} T1 point", b, "T1", "point") for b in (1, 2, 4, 8, 16)]
        out += [(f"B{b} T0 point", b, "T0", "point") for b in (1, 4)]
        out += [("B4 half point", 4, "half", "point"), ("B4 T1 sparse64", 4, "T1", "sparse64")]
        out += [("B4 T1 dense", 4, "T1", "dense")]
        out += [(f"B{b} {t} point", b, t, "point") for b in (64, 256, 1024) for t in ("T1", "T0")]
        out += [("B64 mix point", 64, "mix", "point")]
        out += [("B256 half point", 256, "half", "point"), ("B64 T1 dense", 64, "T1", "dense")]
    return [c for c in out if not only or any(word in c[0] for word in only)]


def variant_plan(
    batch: int, q: str, vocab: int, cpu: bool, overrides: dict[str, int]
) -> LaunchPlan:
    """The case's default plan with ``overrides``; a new chunk brings its split count and a
    draw tile of min(1024, chunk)."""
    plan = case_plan(batch, q, vocab, cpu=cpu)
    fields: dict[str, Any] = {**plan.__dict__, **overrides}
    if "chunk" in overrides:
        fields["nsplit"] = -(-vocab // overrides["chunk"])
        fields["block_f"] = overrides.get("block_f", min(1024, overrides["chunk"]))
    if cpu:  # the interpreter tiles whole requests (flat rows are a GPU plan)
        fields["flat_rows"] = 0
    return LaunchPlan(**fields)


def applies(variant: Variant, batch: int) -> bool:
    """Whether the variant runs on a case of ``batch`` requests (and the plan has its fields:
    ``stages`` comes with bench/pending/v5-step7-phase1-stages.patch; "b64" variants run on
    the 64-request cases only)."""
    known = all(field in LaunchPlan.__dataclass_fields__ for field in variant[1])
    if variant[0] == "b64":
        return known and batch == 64
    return known and (variant[0] == "all" or batch <= SMALL)


def _compile(work: list[tuple[int, str, str, dict[str, int]]]) -> int:
    """Worker: compile each (batch, temperatures, q, overrides) by one call on one input set."""
    for batch, temps, q, overrides in work:
        args = make_inputs(batch, temps, q, 0, VOCAB, "cuda")
        verify_chain(**args, validate=False, plan=variant_plan(batch, q, VOCAB, False, overrides))
    torch.cuda.synchronize()
    return len(work)


def label(variant: Variant) -> str:
    short = {"chunk": "c", "block_v": "v", "groups": "g", "num_warps": "w"}
    short.update(finish_warps="f", stages="s", block_f="d")
    return " ".join(f"{short[k]}{v}" for k, v in variant[1].items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    args = parser.parse_args()
    device, vocab = ("cpu", 3000) if args.cpu else ("cuda", VOCAB)
    l2 = 60 << 20 if args.cpu else torch.cuda.get_device_properties(0).L2_cache_size
    selected = cases(args.cpu, args.only)
    variants = CPU_VARIANTS if args.cpu else VARIANTS
    if not args.cpu:
        work = [(b, t, q, v[1]) for _, b, t, q in selected for v in variants if applies(v, b)]
        precompile(_compile, work)
    records: list[dict[str, Any]] = []
    for name, batch, temps, q in selected:
        sets = input_sets(batch, vocab, l2, cpu=args.cpu)
        inputs = [make_inputs(batch, temps, q, i, vocab, device) for i in range(sets)]
        rec: dict[str, Any] = {"case": name, "sets": sets}
        default_calls = [functools.partial(verify_chain, **a, validate=False) for a in inputs]
        rec["default"] = time_calls(default_calls, args.cpu)
        with without("_chain_rescan_kernel", "_chain_finish_kernel"):
            rec["default_stats"] = time_calls(default_calls, args.cpu)
        want = [[t.clone() for t in call()] for call in default_calls]
        for variant in variants:
            if not applies(variant, batch):
                continue
            plan = variant_plan(batch, q, vocab, args.cpu, variant[1])
            calls = [
                functools.partial(verify_chain, **a, validate=False, plan=plan) for a in inputs
            ]
            differ = 0
            for call, expected in zip(calls, want, strict=True):
                tokens, accepted, status = call()
                same = (
                    (tokens == expected[0]).all(dim=1)
                    & (accepted == expected[1])
                    & (status == expected[2])
                )
                differ += int((~same).sum())
            with without("_chain_rescan_kernel", "_chain_finish_kernel"):
                stats = time_calls(calls, args.cpu)
            rec[label(variant)] = {
                "full": time_calls(calls, args.cpu),
                "stats": stats,
                "differ": differ,
                "requests": batch * len(inputs),
                "plan": str(plan),
            }
        print(json.dumps(rec), flush=True)
        records.append(rec)
        del inputs, default_calls, want
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "small_batch_plans.json").write_text(json.dumps(records, indent=1))
    labels = [label(v) for v in variants]
    print("full call / phase 1 alone, µs (differing requests in brackets when any)")
    print(f"{'case':16s} {'default':>15s} " + " ".join(f"{lab:>21s}" for lab in labels))
    for rec in records:
        cells = []
        for lab in labels:
            cell = rec.get(lab)
            if cell is None:
                cells.append("-")
                continue
            text = f"{cell['full']:.2f} / {cell['stats']:.2f}"
            cells.append(f"{text}{' [' + str(cell['differ']) + ']' if cell['differ'] else ''}")
        default = f"{rec['default']:.2f} / {rec['default_stats']:.2f}"
        print(f"{rec['case']:16s} {default:>15s} " + " ".join(f"{c:>21s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
