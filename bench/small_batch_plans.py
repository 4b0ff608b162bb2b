"""Phase 1's loop length at small batches: the selector's launch plan by chunk and tile.

Run on the device machine (`python3 bench/small_batch_plans.py [--out DIR] [--only WORD ...]`);
`--cpu` runs two cases once at V = 3000 in Triton's interpreter, to test the script itself.

At B <= 16 phase 1 is a latency chain, not a stream: one program per (8 flat rows, chunk)
walks its chunk in chunk / (groups * block_v) dependent steps, and every shape the phase-1
sweep measured at B1 took 4 of them (bench/NOTES.md, "what bounds phase 1"): 4.9-5.4 µs
alone, against 7.1 with 8 steps. This sweep varies the steps per program through the plan
alone (the ``plan=`` argument; no kernel changes): chunks of 512 to 4096 tokens, [8, G,
block_v] tiles of 2 or 4 groups, 8 or 16 warps; every variant keeps the draw tile block_f =
min(1024, chunk). More splits cost phase 2 a wider partials axis (NSPLIT_P2 = 256 at chunk
512), so the full call is what is timed. It also runs phase 2 in 1, 2 and 4 warps: compiled
for sm_90a (bench/compile_sm90.py) the point-draft finish has 83 block barriers at 4 and 8
warps and 7 in one warp, whose reductions are warp shuffles.

Cases: bench/selector_ab.py's inputs (V = 129280 bf16, K = 5): point drafts at B in {1, 2, 4,
8, 16} all T1, B in {1, 4} all T0, B4 half T0, B4 sparse S = 64 and dense q; B64 T1 as the
control whose plan the sweep does not target. For every case and variant: phase 1 alone (the finish
launch swapped for a no-op) and the full call, timed as bench/selector_ab.py times (CUDA
graphs of 10 calls over input sets that exceed 2 x L2, median of 100 replays, µs per call),
and the number of requests whose outputs differ from the default plan's. A different chunk
changes where the inverse-CDF draw's sums are rounded, so a request may differ when its
uniform falls within rounding of a token boundary (expected: none in these few thousand
requests); more than that is a bug. All variants are compiled first, in parallel processes.
Prints one table last (full call / phase 1 µs per variant) and writes DIR/small_batch_plans.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from launch_split import precompile, time_calls, without  # bench/ is the script's own folder
from selector_ab import K, make_inputs

from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain

VOCAB = 129_280
# (chunk, block_v, groups, warps, finish warps): steps per program = chunk / (groups *
# block_v); the finish warps are phase 2's (the plan's finish_warps; 8 today).
Variant = tuple[int, int, int, int, int]
VARIANTS: list[Variant] = [
    (2048, 256, 2, 8, 8),  # today's B < 16 plan: 4 steps, 64 splits
    (2048, 256, 2, 8, 1),  # phase 2 in one warp: its reductions without block barriers
    (2048, 256, 2, 8, 2),
    (2048, 256, 2, 8, 4),
    (1024, 256, 2, 8, 8),  # 2 steps, 127 splits
    (1024, 128, 4, 8, 8),  # 2 steps, 127 splits, 4 groups
    (512, 256, 2, 8, 8),  # 1 step, 253 splits (the finish spills: compile_sm90.py)
    (2048, 512, 2, 8, 8),  # 2 steps, 64 splits, 32 elements a thread
    (2048, 1024, 2, 16, 8),  # 1 step, 64 splits, 16 warps
    (2048, 1024, 2, 16, 1),  # 1 step and phase 2 in one warp
    (4096, 1024, 2, 16, 8),  # 2 steps, 32 splits, 16 warps
]
CPU_VARIANTS: list[Variant] = [(1024, 128, 2, 4, 4), (512, 128, 2, 4, 1)]


def cases(cpu: bool, only: list[str] | None) -> list[tuple[str, int, str, str]]:
    """(name, batch, temperatures, q form) of every case (those naming a word of ``only``)."""
    if cpu:
        out = [("B1 T1 point", 1, "T1", "point"), ("B4 T1 sparse64", 4, "T1", "sparse64")]
    else:
        out = [(f"B{b} T1 point", b, "T1", "point") for b in (1, 2, 4, 8, 16)]
        out += [(f"B{b} T0 point", b, "T0", "point") for b in (1, 4)]
        out += [("B4 half point", 4, "half", "point"), ("B4 T1 sparse64", 4, "T1", "sparse64")]
        out += [("B4 T1 dense", 4, "T1", "dense"), ("B64 T1 point", 64, "T1", "point")]
    return [c for c in out if not only or any(word in c[0] for word in only)]


def variant_plan(batch: int, q: str, vocab: int, cpu: bool, variant: Variant) -> LaunchPlan:
    """The default plan for the case with phase 1's chunk, tile, groups and warps and phase
    2's warps replaced."""
    chunk, block_v, groups, warps, finish_warps = variant
    support = int(q.removeprefix("sparse")) if q.startswith("sparse") else 1
    plan = plan_launch(batch, K + 1, vocab, interpreter=cpu, support=support)
    fields: dict[str, Any] = {
        **plan.__dict__,
        "chunk": chunk,
        "nsplit": -(-vocab // chunk),
        "block_v": block_v,
        "groups": groups,
        "num_warps": warps,
        "block_f": min(1024, chunk),
        "finish_warps": finish_warps,
    }
    if cpu:  # the interpreter tiles whole requests (flat rows are a GPU plan)
        fields["flat_rows"] = 0
    return LaunchPlan(**fields)


def _compile(work: list[tuple[int, str, str, Variant]]) -> int:
    """Worker: compile each (batch, temperatures, q, variant) by one call on one input set."""
    for batch, temps, q, variant in work:
        args = make_inputs(batch, temps, q, 0, VOCAB, "cuda")
        verify_chain(**args, validate=False, plan=variant_plan(batch, q, VOCAB, False, variant))
    torch.cuda.synchronize()
    return len(work)


def label(variant: Variant) -> str:
    chunk, block_v, groups, warps, finish_warps = variant
    return f"c{chunk} v{block_v} g{groups} w{warps} f{finish_warps}"


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
        precompile(_compile, [(b, t, q, v) for _, b, t, q in selected for v in variants])
    records: list[dict[str, Any]] = []
    for name, batch, temps, q in selected:
        sets = 1 if args.cpu else max(1, -(-2 * l2 // (batch * (K + 1) * vocab * 2)))
        inputs = [make_inputs(batch, temps, q, i, vocab, device) for i in range(sets)]
        rec: dict[str, Any] = {"case": name, "sets": sets}
        default_calls = [lambda a=a: verify_chain(**a, validate=False) for a in inputs]
        rec["default"] = time_calls(default_calls, args.cpu)
        want = [[t.clone() for t in call()] for call in default_calls]
        for variant in variants:
            plan = variant_plan(batch, q, vocab, args.cpu, variant)
            calls = [lambda a=a, p=plan: verify_chain(**a, validate=False, plan=p) for a in inputs]
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
    print(f"{'case':16s} {'default':>8s} " + " ".join(f"{lab:>21s}" for lab in labels))
    for rec in records:
        cells = []
        for lab in labels:
            cell = rec[lab]
            text = f"{cell['full']:.2f} / {cell['stats']:.2f}"
            cells.append(f"{text}{' [' + str(cell['differ']) + ']' if cell['differ'] else ''}")
        print(f"{rec['case']:16s} {rec['default']:8.2f} " + " ".join(f"{c:>21s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
