"""What phase 2 costs by launch shape: the finish (and rescan) launches' warps and draw tile.

Run on the device machine (`python3 bench/phase2_sweep.py [--out DIR] [--only WORD ...]`);
`--cpu` runs two cases once at V = 3000 in Triton's interpreter, to test the script itself.

Both phase-2 launches run with the plan's ``finish_warps`` warps (4 before step 6; 8, or 16
for S >= 1025, since) and draw through tiles of ``block_f`` tokens (1024, two per 2048-token
chunk). Phase 2 is one
program per request, a chain of dependent steps on one multiprocessor: the partials, the
acceptance over the draft rows' q slots, the chunk masses, then the stop row's chunk walked
tile by tile and the token picked inside one tile. Sparse q's slots are held as
[S_P2]-wide tiles (32 elements per thread at S = 4096 with 4 warps). This sweep asks
whether more threads per program (8 or 16 warps) or fewer, wider draw tiles (block_f = the
chunk: one walk step fewer) shorten it, without touching the kernels: both are fields of
the ``plan=`` argument (before step 6 the warps were a module global, swapped instead).

Cases: bench/selector_ab.py's inputs (V = 129280 bf16, K = 5, all T1): point drafts at
B in {1, 4, 16, 64}; sparse supports of S = 64, 1024 and 4096 and dense q at B in {4, 64}.
For every case: phase 1 alone (the later launches swapped for no-ops), then the full call
under every (warps, block_f) variant, whose outputs must equal the default variant's bit for
bit. Timing is bench/selector_ab.py's (CUDA graphs of 10 calls rotating over input sets that
exceed 2 x L2, median of 100 replays, µs per call). All variants are compiled first, in
parallel processes. ``--variants 8x1024 16x512 ...`` picks the (warps, block_f) pairs (the
default one always runs too). Prints one table last (full call µs per variant, phase 1 alone) and
writes the records to DIR/phase2_sweep.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from launch_split import precompile, time_calls, without  # bench/ is the script's own folder
from selector_ab import case_plan, input_sets, make_inputs

from pp3kernels.selector import LaunchPlan, verify_chain

Variant = tuple[int, int]  # (phase-2 warps, block_f)
DEFAULT: Variant = (4, 1024)
VARIANTS: list[Variant] = [(w, f) for w in (4, 8, 16) for f in (1024, 2048)]


def cases(cpu: bool, only: list[str] | None) -> list[tuple[str, int, str]]:
    """(name, batch, q form) of every case (those naming a word of ``only``)."""
    if cpu:
        out = [("B4 point", 4, "point"), ("B4 sparse64", 4, "sparse64")]
    else:
        out = [(f"B{b} point", b, "point") for b in (1, 4, 16, 64)]
        out += [
            (f"B{b} {q}", b, q)
            for q in ("sparse64", "sparse1024", "sparse4096", "dense")
            for b in (4, 64)
        ]
    return [c for c in out if not only or any(word in c[0] for word in only)]


def variant_plan(batch: int, q: str, vocab: int, cpu: bool, warps: int, block_f: int) -> LaunchPlan:
    """The default plan for the case with phase 2 at ``warps`` warps and the draw tile
    ``block_f`` where it divides the chunk (the interpreter's plans keep their tiles)."""
    plan = case_plan(batch, q, vocab, cpu=cpu)
    fields = {**plan.__dict__, "finish_warps": warps}
    if not cpu and plan.chunk % block_f == 0:
        fields["block_f"] = block_f
    return LaunchPlan(**fields)


def _compile(work: list[tuple[int, str, int, int]]) -> int:
    """Worker: compile each (batch, q, warps, block_f) by one call on one input set."""
    for batch, q, warps, block_f in work:
        args = make_inputs(batch, "T1", q, 0, VOCAB, "cuda")
        plan = variant_plan(batch, q, VOCAB, False, warps, block_f)
        verify_chain(**args, validate=False, plan=plan)
    torch.cuda.synchronize()
    return len(work)


VOCAB = 129_280


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument(
        "--variants", nargs="+", metavar="WARPSxBLOCK_F", help="e.g. 8x1024 (default: 6 of them)"
    )
    args = parser.parse_args()
    device, vocab = ("cpu", 3000) if args.cpu else ("cuda", VOCAB)
    l2 = 60 << 20 if args.cpu else torch.cuda.get_device_properties(0).L2_cache_size
    selected = cases(args.cpu, args.only)
    variants = [DEFAULT, (8, 1024)] if args.cpu else VARIANTS
    if args.variants:  # the default variant first: every other is compared with its outputs
        given = [tuple(int(n) for n in v.split("x")) for v in args.variants]
        variants = [DEFAULT] + [(w, f) for w, f in given if (w, f) != DEFAULT]
    if not args.cpu:
        precompile(_compile, [(b, q, w, f) for _, b, q in selected for w, f in variants])
    records: list[dict[str, Any]] = []
    for name, batch, q in selected:
        sets = input_sets(batch, vocab, l2, cpu=args.cpu)
        inputs = [make_inputs(batch, "T1", q, i, vocab, device) for i in range(sets)]
        rec: dict[str, Any] = {"case": name, "sets": sets}
        base_calls = [lambda a=a: verify_chain(**a, validate=False) for a in inputs]
        with without("_chain_rescan_kernel", "_chain_finish_kernel"):
            rec["stats"] = time_calls(base_calls, args.cpu)
        want = [t.clone() for t in base_calls[0]()]
        for warps, block_f in variants:
            plan = variant_plan(batch, q, vocab, args.cpu, warps, block_f)
            calls = [lambda a=a, p=plan: verify_chain(**a, validate=False, plan=p) for a in inputs]
            got = calls[0]()
            same = all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
            rec[f"w{warps} f{block_f}"] = time_calls(calls, args.cpu) if same else None
            rec[f"w{warps} f{block_f} identical"] = same
        print(json.dumps(rec), flush=True)
        records.append(rec)
        del inputs, base_calls
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phase2_sweep.json").write_text(json.dumps(records, indent=1))
    labels = [f"w{w} f{f}" for w, f in variants]
    print(f"{'case':14s} {'stats':>8s} " + " ".join(f"{label:>11s}" for label in labels))
    for rec in records:
        cells = [
            f"{rec[label]:11.2f}" if rec[label] is not None else f"{'DIFFERS':>11s}"
            for label in labels
        ]
        print(f"{rec['case']:14s} {rec['stats']:8.2f} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
