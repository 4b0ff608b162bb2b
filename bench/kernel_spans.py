"""Each launch's span in CUDA-graph replay, from CUPTI's kernel records (torch.profiler), with
the kernels as they are: no stamps, so no register the instrumentation adds.

    python3 bench/kernel_spans.py [--pkg DIR ...] [--cases "4 T1 sparse64" ...] [--replays N]

Why (bench/NOTES.md, thirty-eighth session): two finish changes (m36, step 37) that lower
the B4 S = 64 finish from 174 to ~125 registers lose ~20% at B4 and B16 and nothing at B1
and B64, and `bench/placement.py` cannot say why: its stamps take the same finish to 177
(main) and 181 (step 37) registers, erasing the very difference. CUPTI's records need no
change to the kernels. For a call of two launches (phase 1, then the finish, a programmatic
dependent launch), they say whether the time went to phase 1 (its span longer: something
beside it on the multiprocessors slowed it) or after it (the finish's tail past phase 1's
end longer: the finish's own work after the wait).

Inputs and graphs are bench/selector_ab.py's (V = 129280 bf16, K = 5; graphs of 10 calls
rotating over enough input sets that their logits exceed 2 x L2), each case in a process of
its own per package (each --pkg: a folder holding a pp3kernels/). After 3 warm-up replays
of every graph, N profiled replays. Per call, µs: phase 1's span, the finish's start after
phase 1's start, the finish's end after phase 1's end (its tail), the call's span (phase
1's start to the last launch's end) and the gap to the next call's phase 1. Prints the
medians over calls per case and package; writes DIR/kernel_spans.json. GPU only. CUPTI's
tracing adds its own overhead to each launch: compare packages with each other, not with
`pp3 probe`'s times.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from finish_timeline import stamp_parser  # bench/ is the script's own folder

ROOT = Path(__file__).resolve().parent.parent
CASES = ["1 T1 sparse64", "4 T1 sparse64", "16 T1 sparse64", "64 T1 sparse64", "4 T1 point"]
GRAPH_CALLS = 10
PHASE1 = "chain_stats_kernel"  # CUPTI names a Triton kernel without its leading "_"
SPANS = ["phase 1", "finish start", "finish tail", "call", "gap"]


def calls_of(kernels: list[tuple[str, float, float]]) -> list[dict[str, float]]:
    """One row per call from (name, start µs, end µs) kernel records: a call opens with a
    phase-1 launch and holds every launch up to the next one (its last launch is the
    finish); the gap is to the next call's phase 1 (absent for the last call)."""
    ordered = sorted(kernels, key=lambda k: k[1])
    opens = [i for i, k in enumerate(ordered) if k[0].lstrip("_") == PHASE1]
    rows: list[dict[str, float]] = []
    for n, first in enumerate(opens):
        last = (opens[n + 1] if n + 1 < len(opens) else len(ordered)) - 1
        if last == first:
            continue  # phase 1 alone: the record of a call cut by the trace's end
        _, start, p1_end = ordered[first]
        _, finish_start, _ = ordered[first + 1]
        end = max(k[2] for k in ordered[first : last + 1])
        row = {
            "phase 1": p1_end - start,
            "finish start": finish_start - start,
            "finish tail": end - p1_end,
            "call": end - start,
        }
        if n + 1 < len(opens):
            row["gap"] = ordered[opens[n + 1]][1] - end
        rows.append(row)
    return rows


def worker(pkg_parent: str, case: str, replays: int, result_path: str) -> None:
    """One case in this process, pp3kernels imported from pkg_parent."""
    sys.path.insert(0, pkg_parent)
    sys.path.insert(1, str(ROOT / "bench"))
    sys.path.insert(2, str(ROOT))
    import torch
    from selector_ab import input_sets, make_inputs
    from torch.profiler import DeviceType, ProfilerActivity, profile

    import pp3kernels
    from pp3cli.timing.measure import cuda_graph_capture
    from pp3kernels.selector import verify_chain

    package = str(Path(pp3kernels.__file__).resolve())
    assert package.startswith(str(Path(pkg_parent).resolve())), package
    batch, temps, q = case.split()
    b = int(batch)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = input_sets(b, 129_280, l2, cpu=False)
    inputs = [make_inputs(b, temps, q, i, 129_280, "cuda") for i in range(sets)]
    graphs = []
    for first in range(0, sets, GRAPH_CALLS):
        group = [inputs[(first + r) % sets] for r in range(GRAPH_CALLS)]
        calls = [lambda args=args: verify_chain(**args, validate=False) for args in group]
        graphs.append(cuda_graph_capture(calls)[0])
    for _ in range(3):
        for replay in graphs:
            replay()
    torch.cuda.synchronize()
    rows: list[dict[str, float]] = []
    for replay in graphs:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                replay()
            torch.cuda.synchronize()
        kernels = [
            (e.name, float(e.time_range.start), float(e.time_range.end))
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and e.name.lstrip("_").startswith("chain_")
        ]
        rows += calls_of(kernels)
    names = sorted({e.name for e in prof.events() if e.device_type == DeviceType.CUDA})
    result = {"case": case, "package": package, "sets": sets, "kernels": names, "rows": rows}
    Path(result_path).write_text(json.dumps(result))


def summarise(case: str, package: str, rows: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over calls of each span (µs)."""
    medians = {}
    for span in SPANS:
        values = [r[span] for r in rows if span in r]
        medians[span] = statistics.median(values) if values else float("nan")
    return {"case": case, "package": package, "calls": len(rows), "us": medians}


def main() -> int:
    parser = stamp_parser(__doc__, CASES, "replays", 20)
    parser.add_argument("--pkg", nargs="+", default=[str(ROOT / "kernels")])
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.replays, args.worker[2])
        return 0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        result_path = str(Path(tmp) / "case.json")
        for case in args.cases:  # packages alternate within a case, so drift hits each alike
            for pkg in args.pkg:
                cmd = [sys.executable, __file__, "--replays", str(args.replays)]
                subprocess.run([*cmd, "--worker", pkg, case, result_path], check=True)
                got = json.loads(Path(result_path).read_text())
                results.append(summarise(case, pkg, got["rows"]) | {"kernels": got["kernels"]})
    Path(args.out, "kernel_spans.json").write_text(json.dumps(results, indent=1))
    print(f"{'package':22s} {'case':16s} " + " ".join(f"{s:>13s}" for s in SPANS))
    for r in results:
        cells = " ".join(f"{r['us'][s]:13.2f}" for s in SPANS)
        print(f"{r['package'][-22:]:22s} {r['case']:16s} {cells}   ({r['calls']} calls, µs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
