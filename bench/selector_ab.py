"""A/B of two versions of pp3kernels on the GPU: identical outputs, and no speed loss.

Run on the device machine from the repository root:

    python3 bench/selector_ab.py --base PATH [--new PATH ...] [--out DIR] [--rounds N]
                                 [--only WORD ...]

PATH is a folder holding an older copy of the package (PATH/pp3kernels/); the other side
("new") is this tree's kernels/, or --new's folder; several --new folders are set against
one base in one run, base first in every round (each candidate's rows name its folder; the
JSON's top-level rows are the first candidate's). Smoke test of the script itself, on a CPU:

    TRITON_INTERPRET=1 python3 bench/selector_ab.py --base PATH --cpu

The script runs N (1 + candidates) worker subprocesses one after another, alternating base,
new, base, new (so that clock and thermal drift hit both alike). A worker imports pp3kernels
from its own folder, first on PYTHONPATH, and reports where it got it. It builds every
case's inputs on the GPU from fixed seeds (the same bytes in every worker: it hashes them too), runs
verify_chain(..., validate=False) eagerly on every input set and hashes tokens, accepted
and status, then times the call by CUDA-graph replay: graphs of 10 calls rotating over
enough input sets that their logits exceed 2 x the L2 cache (L2 size from
torch.cuda.get_device_properties), 3 warm-up replays of each graph, 100 timed replays
(CUDA events around each), median µs per call. With --cpu: V = 300, two batch sizes, no
graphs, wall-clock time of single calls.

Cases: V = 129280 bf16 logits (randn * 4), K = 5, drafts = the greedy token with one in
three requests off by one at row 2; point-mass q (S = 1, count C = 2^16) for
B in {1, 4, 16, 64, 256, 1024} x {all T1, all T0, half (the first half T0), mix (every
other request T0, as `pp3 probe --t0-share 0.5` spreads them; from B = 4)}; sparse q
(S = 64, 1024 and 4096 tokens of C / S each, the draft among them) for B in {4, 64} and
dense q (softmax of noisy logits) for B in {1, 4, 16, 64}, all T1; and at K = 4 ("K4"
cases: odd K+1, where a flat pair of rows may straddle two requests) point drafts at B4,
B256 and B1024, all T1, all T0 and mix. ``--only`` keeps the cases whose name contains one
of the given words.

Prints one table last (case, base µs, new µs, new/base, outputs identical; µs = median over
rounds of each worker's median) and writes everything to DIR/selector_ab.json. Graph
capture and timing are pp3cli.timing.measure's (the same as `pp3 probe`); nothing else of
pp3cli is imported, so the base package is never mixed with this tree's pp3kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
K = 5
DENOMINATOR = 1 << 16
GRAPH_CALLS = 10
WARMUP_REPLAYS = 3
TIMED_REPLAYS = 100


def cases(cpu: bool, only: list[str] | None = None) -> list[tuple[str, int, str, str, int]]:
    """(name, batch, temperatures, q form, K) of every case (those naming a word of
    ``only``)."""
    batches = (1, 4) if cpu else (1, 4, 16, 64, 256, 1024)
    out = [(f"B{b} {t} point", b, t, "point") for b in batches for t in ("T1", "T0", "half")]
    out += [(f"B{b} mix point", b, "mix", "point") for b in batches if b >= 4]
    # the last batch of two rows a program (v5 step 42) and the first of eight
    out += (
        []
        if cpu
        else [(f"B{b} {t} point", b, t, "point") for b in (5, 6) for t in ("T1", "T0", "mix")]
    )
    # sparse q on both sides of step 28's ticket line (16 requests)
    for b in (4,) if cpu else (1, 4, 16, 64):
        supports = (64,) if cpu else (64, 1024, 4096)  # V = 300 on the CPU
        out += [(f"B{b} T1 sparse{s}", b, "T1", f"sparse{s}") for s in supports]
    # dense q on both sides of the plans' small-batch line (16 requests)
    out += [(f"B{b} T1 dense", b, "T1", "dense") for b in ((4,) if cpu else (1, 4, 16, 64))]
    # K = 4 (odd K+1: a flat pair of rows may straddle two requests), point drafts
    odd = [
        (f"K4 B{b} {t} point", b, t, "point", 4)
        for b in ((4,) if cpu else (4, 256, 1024))
        for t in (("mix",) if cpu else ("T1", "T0", "mix"))
    ]
    both = [(*c, K) for c in out] + odd
    return [c for c in both if not only or any(word in c[0] for word in only)]


def input_sets(batch: int, vocab: int, l2_bytes: int, *, cpu: bool, depth: int = K) -> int:
    """Input sets of a case's bf16 logits [B, K+1, V] (K = ``depth``) so that the timed
    calls, rotating through them, read >= 2 x L2 bytes (so they miss the cache); 1 in the
    interpreter."""
    return 1 if cpu else max(1, -(-2 * l2_bytes // (batch * (depth + 1) * vocab * 2)))


def support_of(q: str) -> int:
    """S, the q slots of a case's q form ("point": 1, "sparseS": S, "dense": 1)."""
    return int(q.removeprefix("sparse")) if q.startswith("sparse") else 1


def case_plan(batch: int, q: str, vocab: int, *, cpu: bool, depth: int = K) -> Any:
    """The LaunchPlan that verify_chain picks for a case of q form ``q`` (K = ``depth``): the
    probe's ``case_launch_plan``, which imports ``pp3kernels`` when called (the A/B workers each put
    their own first on the path). Where the plan sweeps start."""
    from pp3cli.timing.cases import ProbeCase
    from pp3cli.timing.probe import case_launch_plan

    draft = "sparse" if q.startswith("sparse") else q
    case = ProbeCase(batch, depth, vocab, "bfloat16", draft, 0, support_of(q))
    return case_launch_plan(case, interpreter=cpu)


def make_inputs(
    batch: int, temps: str, q: str, index: int, vocab: int, device: str, depth: int = K
) -> Any:
    """verify_chain's keyword arguments for one input set of a case (K = ``depth``)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(7919 * batch + 104729 * index + len(q))
    logits = (torch.randn(batch, depth + 1, vocab, generator=gen, device=device) * 4).bfloat16()
    drafts = logits.float().argmax(-1)[:, :depth].to(torch.int32).contiguous()
    drafts[1::3, 2] = (drafts[1::3, 2] + 1) % vocab
    tau = torch.ones(batch, device=device)
    if temps == "mix":
        tau[::2] = 0.0
    elif temps != "T1":
        tau[: batch if temps == "T0" else batch // 2] = 0.0
    args: dict[str, Any] = dict(
        logits=logits,
        draft_tokens=drafts,
        temperature=tau,
        seed=torch.arange(batch, dtype=torch.int64, device=device) + 1000 * index,
        position=torch.arange(batch, dtype=torch.int64, device=device) * 11 + 100,
    )
    if q == "point":
        counts = torch.full((batch, depth, 1), DENOMINATOR, dtype=torch.int32, device=device)
        args.update(q_ids=drafts[..., None].clone(), q_counts=counts, denominator=DENOMINATOR)
    elif q.startswith("sparse"):  # S distinct ids (stride V // S), the draft first
        support = support_of(q)
        step = torch.arange(support, device=device) * (vocab // support)
        ids = ((drafts[..., None].long() + step) % vocab).to(torch.int32)
        counts = torch.full(
            (batch, depth, support), DENOMINATOR // support, dtype=torch.int32, device=device
        )
        args.update(q_ids=ids, q_counts=counts, denominator=DENOMINATOR)
    else:
        noise = torch.randn(batch, depth, vocab, generator=gen, device=device)
        args["q_dense"] = torch.softmax(logits[:, :depth].float() + noise, dim=-1)
    return args


def digest(tensors: list[Any]) -> str:
    """SHA-256 (16 hex digits) of the tensors' dtypes, shapes and bytes, in order."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def time_case(call_sets: Sequence[Any], cpu: bool) -> list[float]:
    """µs per call: wall clock of single calls (--cpu), else CUDA-graph replays timed as
    ``pp3 probe`` times them (``pp3cli.timing.measure``, which imports no pp3kernels)."""
    if cpu:
        samples: list[float] = []
        for call in call_sets[:2]:
            began = time.perf_counter()
            call()
            samples.append((time.perf_counter() - began) * 1e6)
        return samples
    from pp3cli.timing.measure import cuda_event_timer, cuda_graph_capture, time_replays

    groups = [
        [call_sets[(first + r) % len(call_sets)] for r in range(GRAPH_CALLS)]
        for first in range(0, len(call_sets), GRAPH_CALLS)
    ]
    replays = [cuda_graph_capture(group)[0] for group in groups]
    return time_replays(
        replays,
        rounds=GRAPH_CALLS,
        warmup=WARMUP_REPLAYS,
        replays=TIMED_REPLAYS,
        timer=cuda_event_timer,
    )


def worker(cpu: bool, result_path: str, only: list[str] | None) -> None:
    import torch

    import pp3kernels
    from pp3kernels.selector import verify_chain

    device, vocab = ("cpu", 300) if cpu else ("cuda", 129_280)
    l2 = 60 << 20 if cpu else torch.cuda.get_device_properties(0).L2_cache_size
    report: dict[str, Any] = {"package": str(Path(pp3kernels.__file__).parent), "cases": {}}
    for name, batch, temps, q, depth in cases(cpu, only):
        sets = input_sets(batch, vocab, l2, cpu=cpu, depth=depth)
        inputs = [make_inputs(batch, temps, q, i, vocab, device, depth) for i in range(sets)]
        outputs = [verify_chain(**args, validate=False) for args in inputs]
        calls = [lambda args=args: verify_chain(**args, validate=False) for args in inputs]
        samples = time_case(calls, cpu)
        report["cases"][name] = {
            "sets": sets,
            "inputs": digest([t for a in inputs for t in a.values() if torch.is_tensor(t)]),
            "outputs": digest([t for out in outputs for t in out]),
            "us": statistics.median(samples),
            "ok_share": sum(int((o.status == 0).sum()) for o in outputs) / (batch * sets),
        }
        del inputs, outputs, calls
        if not cpu:
            torch.cuda.empty_cache()
    Path(result_path).write_text(json.dumps(report))


def run_worker(side: str, package_root: Path, cpu: bool, only: list[str] | None) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(package_root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        command = [sys.executable, __file__, "--worker", str(result)] + (["--cpu"] if cpu else [])
        command += ["--only", *only] if only else []
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{side} worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        report: dict[str, Any] = json.loads(result.read_text())
    got = Path(report["package"]).resolve()
    if got != (package_root / "pp3kernels").resolve():
        raise SystemExit(f"{side} worker imported pp3kernels from {got}, not {package_root}")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, help="folder holding the older pp3kernels/")
    parser.add_argument(
        "--new",
        type=Path,
        nargs="+",
        default=[ROOT / "kernels"],
        help="folders holding the candidates' pp3kernels/",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument("--worker", metavar="RESULT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.cpu, args.worker, args.only)
        return 0
    sides = {"base": args.base, **{f"new{i}": root for i, root in enumerate(args.new)}}
    for side, root in sides.items():
        if root is None or not (root / "pp3kernels" / "__init__.py").is_file():
            parser.error(
                f"--{side.rstrip('0123456789')} must be a folder holding a pp3kernels "
                f"package, not {root}"
            )
    roots = {side: root.resolve() for side, root in sides.items()}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in roots}
    for round_index in range(args.rounds):
        for side in roots:
            runs[side].append(run_worker(side, roots[side], args.cpu, args.only))
            print(f"round {round_index + 1}/{args.rounds}: {side} done", file=sys.stderr)
    by_candidate: dict[str, list[dict[str, Any]]] = {}
    all_identical = True
    for side in roots:
        if side == "base":
            continue
        rows = by_candidate.setdefault(side, [])
        for name, *_ in cases(args.cpu, args.only):
            per_side = {s: [run["cases"][name] for run in runs[s]] for s in ("base", side)}
            digests = {(c["inputs"], c["outputs"]) for s in per_side for c in per_side[s]}
            identical = len(digests) == 1
            all_identical &= identical
            base_us = statistics.median(c["us"] for c in per_side["base"])
            new_us = statistics.median(c["us"] for c in per_side[side])
            rows.append(
                {
                    "case": name,
                    "candidate": str(roots[side]),
                    "base_us": base_us,
                    "new_us": new_us,
                    "ratio": new_us / base_us,
                    "identical": identical,
                    "sets": per_side[side][0]["sets"],
                    "ok_share": per_side[side][0]["ok_share"],
                }
            )
    rows = by_candidate["new0"]
    args.out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"cpu": args.cpu, "rounds": args.rounds, "roots": {}}
    meta["roots"] = {side: str(root) for side, root in roots.items()}
    meta["candidates"] = {str(roots[side]): by_candidate[side] for side in by_candidate}
    if not args.cpu:
        import torch
        import triton

        meta.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
        meta["triton"] = triton.__version__
    (args.out / "selector_ab.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=1)
    )
    unit = "µs (wall clock, interpreter)" if args.cpu else "µs per call (CUDA graph)"
    for side, side_rows in by_candidate.items():
        print(f"new = {roots[side]}")
        print(f"{'case':18s} {'base':>10s} {'new':>10s} {'new/base':>9s}  identical   [{unit}]")
        for row in side_rows:
            print(
                f"{row['case']:18s} {row['base_us']:10.2f} {row['new_us']:10.2f} "
                f"{row['ratio']:9.3f}  {'yes' if row['identical'] else 'NO'}"
            )
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
