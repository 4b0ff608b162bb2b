"""Where and when each program of a call runs, in CUDA-graph replay: which multiprocessor
(%smid) took each phase-1 program and each finish program, and when (%globaltimer, ns)
they started and ended, so that one can see whether the finish's programs start beside
phase 1's (what the programmatic dependent launch is for) or only once a multiprocessor has
drained.

    python3 bench/placement.py [--pkg DIR ...] [--cases "4 T1 point" ...] [--replays N]

Why (bench/NOTES.md, twenty-eighth session): the driver configures each multiprocessor's
L1 / shared-memory split per kernel; Nsight Compute reported phase 1 at an 8 KB
configuration and the finish at 16 KB (B4, point and S = 64 drafts), and a program of a
kernel that wants another split than the one a multiprocessor runs cannot start there
until it has drained. At B4 phase 1's 192 programs occupy every multiprocessor.

Like bench/finish_timeline.py (whose copier it uses), it instruments a copy of each
package's chain.py (each --pkg: a folder holding a pp3kernels/; this tree's kernels/ by
default): a stamp reads its special registers once a value of the step it closes is in a
register. Phase 1 (per program): SM, entry, exit after its partials' stores. Finish (per
request): SM, entry, the wait for phase 1 done, the token drawn (T1 requests). Each case
captures one graph of 10 calls rotating over 10 input sets (selector_ab's inputs), replays
it 2 + N times and reads the stamps of each replay's last call. Prints per case and package
the medians over replays, µs after the first phase-1 entry: the finish's first entry, the
last phase-1 exit, the finish's wait done and token; and the share of finish programs that
started on a multiprocessor while a phase-1 program ran on it. Writes DIR/placement.json.
GPU only.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from finish_timeline import instrumented_copy, read_register, run_workers, stamp_parser

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 4  # per program: SM, then up to three times
MAX_PROGRAMS = 16384  # phase-1 programs a call may have (B64 at V = 129280: 1536)
FINISH = SLOTS * MAX_PROGRAMS  # the finish programs' stamps start here
MAX_REQUESTS = 4096
GRAPH_CALLS = 10
# what a case reports, µs after the replay's first phase-1 entry
TIMES = ["finish entry", "phase 1 last exit", "finish wait done", "finish token"]

HELPER = (
    """

_STAMP_ADDR = tl.constexpr(int(__import__("os").environ.get("PP3_STAMP_ADDR", "0")))
"""
    + read_register("globaltimer")
    + read_register("smid", 32)
    + """

@triton.jit
def _place(x, program, SLOT: tl.constexpr, REGION: tl.constexpr):
    \"\"\"bench/placement.py: %globaltimer once ``x`` is ready at [program, SLOT] of the
    stamp buffer's REGION, and at SLOT 1 (entry) the SM at [program, 0].\"\"\"
    base = tl.full([1], _STAMP_ADDR, tl.int64).to(tl.pointer_type(tl.int64)) + REGION
    slot = base + program.to(tl.int64) * """
    + str(SLOTS)
    + """
    tl.store(slot + SLOT, _read_globaltimer(x))
    if SLOT == 1:
        tl.store(slot, _read_smid(x).to(tl.int64))
"""
)

INSERTS = [
    (
        "    # One [BLOCK_R, GROUPS, BLOCK_V] tile stream over this split's chunk",
        "_place(tl.zeros([1], tl.int32) + pid_s, tl.zeros([1], tl.int32) + pid_b * NSPLIT"
        " + pid_s, 1, 0)",
        False,
    ),
    (
        "    tl.store(part_flag_ptr + part, row_flag, mask=mask_r)",
        "_place(tl.zeros([1], tl.int32) + tl.max(row_flag, axis=0), tl.zeros([1], tl.int32)"
        " + pid_b * NSPLIT + pid_s, 2, 0)",
        True,
    ),
    (
        "    pid_b = tl.program_id(0)\n    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)",
        f"_place(tl.zeros([1], tl.int32) + pid_b, tl.zeros([1], tl.int32) + pid_b, 1, {FINISH})",
        True,
    ),
    (
        "        gdc_wait()  # the launches before (phase 1, and the rescan or counts) done,"
        " visible",
        f"_place(offs_b, offs_b, 2, {FINISH})",
        True,
    ),
    (
        "        final = tl.where(need_sample, chosen, final)",
        f"_place(chosen, offs_b, 3, {FINISH})",
        True,
    ),
]
CASES = ["4 T1 point", "4 T1 sparse64", "1 T1 point", "16 T1 point"]


def worker(pkg_parent: str, case: str, replays: int, result_path: str) -> None:
    """One case in this process, pp3kernels imported from the instrumented copy."""
    import torch

    stamps = torch.zeros(FINISH + SLOTS * MAX_REQUESTS, dtype=torch.int64, device="cuda")
    os.environ["PP3_STAMP_ADDR"] = str(stamps.data_ptr())
    sys.path.insert(0, pkg_parent)
    sys.path.insert(1, str(ROOT / "bench"))
    sys.path.insert(2, str(ROOT))
    from selector_ab import make_inputs, support_of

    import pp3kernels
    from pp3cli.timing.measure import cuda_graph_capture
    from pp3kernels.selector import plan_launch, verify_chain

    assert str(Path(pp3kernels.__file__).resolve()).startswith(str(Path(pkg_parent).resolve()))
    batch, temps, q = case.split()
    b = int(batch)
    inputs = [make_inputs(b, temps, q, i, 129_280, "cuda") for i in range(GRAPH_CALLS)]
    support = support_of(q) if q.startswith("sparse") else 1
    plan = plan_launch(b, 6, 129_280, interpreter=False, support=support, dense=q == "dense")
    blocks = -(-b * 6 // plan.flat_rows) if plan.flat_rows else -(-b // plan.block_b)
    programs = blocks * plan.nsplit
    if programs > MAX_PROGRAMS or b > MAX_REQUESTS:
        raise SystemExit(f"{case}: {programs} phase-1 programs, more than the stamp buffer holds")
    replay, _ = cuda_graph_capture(
        [functools.partial(verify_chain, **args, validate=False) for args in inputs]
    )
    got: list[dict[str, Any]] = []
    for index in range(2 + replays):
        stamps.zero_()
        replay()
        torch.cuda.synchronize()
        if index < 2:
            continue
        stats = stamps[: SLOTS * programs].view(programs, SLOTS).tolist()
        finish = stamps[FINISH : FINISH + SLOTS * b].view(b, SLOTS).tolist()
        got.append({"stats": stats, "finish": finish})
    Path(result_path).write_text(json.dumps({"case": case, "programs": programs, "got": got}))


def summarise(case: str, package: str, got: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over replays of each replay's times (µs after its first phase-1 entry)."""
    per: dict[str, list[float]] = {k: [] for k in TIMES}
    shared: list[float] = []
    doubled: list[float] = []
    for replay in got:
        stats = [s for s in replay["stats"] if s[1] > 0 and s[2] > 0]
        finish = [f for f in replay["finish"] if f[1] > 0]
        if not stats or not finish:
            continue
        t0 = min(s[1] for s in stats)
        per["finish entry"].append((min(f[1] for f in finish) - t0) / 1e3)
        per["phase 1 last exit"].append((max(s[2] for s in stats) - t0) / 1e3)
        waits = [f[2] for f in finish if f[2] > 0]
        tokens = [f[3] for f in finish if f[3] > 0]
        if waits:
            per["finish wait done"].append((max(waits) - t0) / 1e3)
        if tokens:
            per["finish token"].append((max(tokens) - t0) / 1e3)
        beside = [any(s[0] == f[0] and s[1] <= f[1] < s[2] for s in stats) for f in finish]
        shared.append(sum(beside) / len(beside))
        # finish programs that ran (entry to their last stamp) beside another on one SM
        spans = [(f[0], f[1], max(f[1:])) for f in finish]
        beside_finish = [
            any(
                j != i and b[0] == a[0] and b[1] < a[2] and a[1] < b[2] for j, b in enumerate(spans)
            )
            for i, a in enumerate(spans)
        ]
        doubled.append(sum(beside_finish) / len(spans))
    return {
        "case": case,
        "package": package,
        "replays": len(got),
        "us": {k: statistics.median(v) if v else float("nan") for k, v in per.items()},
        "finish beside phase 1": statistics.median(shared) if shared else float("nan"),
        "finish sharing an SM": statistics.median(doubled) if doubled else float("nan"),
        "phase-1 SMs": len({s[0] for s in got[-1]["stats"] if s[1] > 0}) if got else 0,
    }


def main() -> int:
    parser = stamp_parser(__doc__, CASES, "replays", 30)
    parser.add_argument("--pkg", nargs="+", default=[str(ROOT / "kernels")])
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.replays, args.worker[2])
        return 0
    results = []
    for pkg in args.pkg:
        with tempfile.TemporaryDirectory() as tmp:
            instrumented_copy(Path(tmp), HELPER, INSERTS, Path(pkg) / "pp3kernels")
            got = run_workers(__file__, "replays", args.replays, tmp, args.cases)
        results += [summarise(g["case"], pkg, g["got"]) for g in got]
    Path(args.out, "placement.json").write_text(json.dumps(results, indent=1))
    print(f"{'package':14s} {'case':16s} " + " ".join(f"{n[:17]:>17s}" for n in TIMES))
    for r in results:
        cells = " ".join(f"{r['us'][n]:17.2f}" for n in TIMES)
        print(
            f"{Path(r['package']).name:14s} {r['case']:16s} {cells}"
            f"   beside {r['finish beside phase 1']:.2f}, sharing {r['finish sharing an SM']:.2f},"
            f" {r['phase-1 SMs']} SMs (µs)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
