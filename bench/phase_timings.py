"""Where the selector's time goes on the GPU: phase split, launch floor, L2 vs HBM, plans.

Run on the device machine (`python3 bench/phase_timings.py`); `--cpu` runs every
configuration once at a small V in Triton's interpreter, to check the script itself.

For B in (1, 4, 64), K = 5, point drafts, V = 129280 bf16, all-T1 and all-T0:
- full      verify_chain(validate=False), a CUDA graph of 10 calls, one input set (L2-warm)
- hbm       the same, rotating over enough input sets to exceed 2 x L2 (as `pp3 probe`)
- stats     the statistics kernel alone (the finish launch replaced by a no-op)
- finish    full - stats
and a floor: a graph of 10 x (two trivial Triton launches). For B = 64 (and B = 4 T1),
statistics-kernel plans (block_v, num_warps, chunk) beside the default. Medians of 50
replays, µs per call. Prints one table.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

import pp3kernels.selector as selector
from pp3cli.timing import measure
from pp3kernels import point_mass_q
from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain

CPU = "--cpu" in sys.argv
DEV = "cpu" if CPU else "cuda"
V = 1531 if CPU else 129280
K = 5
ROUNDS = 1 if CPU else 10
REPLAYS = 1 if CPU else 50


@triton.jit
def _tiny_kernel(x_ptr):  # type: ignore[no-untyped-def]
    tl.store(x_ptr, tl.load(x_ptr) + 1)


def make_inputs(batch: int, t0: bool, index: int) -> dict[str, Any]:
    gen = torch.Generator(device=DEV).manual_seed(1000 * batch + index)
    logits = (torch.randn(batch, K + 1, V, generator=gen, device=DEV) * 4).to(torch.bfloat16)
    drafts = logits.float().argmax(-1)[:, :K].to(torch.int32).contiguous()
    drafts[1::3, 2] = (drafts[1::3, 2] + 1) % V
    ids, counts = point_mass_q(drafts, 1 << 16)
    return dict(
        logits=logits,
        draft_tokens=drafts,
        temperature=torch.full((batch,), 0.0 if t0 else 1.0, device=DEV),
        seed=torch.arange(batch, dtype=torch.int64, device=DEV) + 7 * index,
        position=torch.arange(batch, dtype=torch.int64, device=DEV) * 11 + 100,
        q_ids=ids,
        q_counts=counts,
        denominator=1 << 16,
    )


def time_graph(calls: Sequence[Callable[[], Any]]) -> float:
    """Median µs per call: graphs of ROUNDS calls rotating over ``calls``, timed as the probe
    times (``pp3cli.timing.measure``: capture after a side-stream warm-up, one warm-up replay per
    graph, REPLAYS event-timed replays rotating over the graphs)."""
    if CPU:
        for call in calls:
            call()
        return float("nan")
    replays = []
    for start in range(0, len(calls), ROUNDS):
        group = [calls[(start + r) % len(calls)] for r in range(ROUNDS)]
        replays.append(measure.cuda_graph_capture(group)[0])
    samples = measure.time_replays(
        replays, rounds=ROUNDS, warmup=1, replays=REPLAYS, timer=measure.cuda_event_timer
    )
    return statistics.median(samples)


class _NoLaunch:
    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def run_case(inputs: dict[str, Any], plan: LaunchPlan | None = None) -> Any:
    return verify_chain(**inputs, validate=False, plan=plan)


def stats_only(inputs: dict[str, Any], plan: LaunchPlan | None = None) -> float:
    finish = selector._chain_finish_kernel
    selector._chain_finish_kernel = _NoLaunch()
    try:
        return time_graph([lambda: run_case(inputs, plan)])
    finally:
        selector._chain_finish_kernel = finish


def main() -> int:
    rows = []
    x = torch.zeros(1, device=DEV)
    floor = time_graph([lambda: (_tiny_kernel[(1,)](x), _tiny_kernel[(1,)](x))])
    rows.append(f"floor: two trivial launches per call            {floor:8.2f}")
    l2 = 60 << 20 if CPU else torch.cuda.get_device_properties(0).L2_cache_size
    for batch in (1, 4, 64):
        for t0 in (False, True):
            inputs = make_inputs(batch, t0, 0)
            check = run_case(inputs)
            assert int((check.status != 0).sum()) == 0, "status not OK"
            case_bytes = inputs["logits"].numel() * 2
            sets = max(1, min(64, -(-2 * l2 // case_bytes)))
            rotating = [inputs] + [make_inputs(batch, t0, i) for i in range(1, sets)]
            full_calls = [lambda inputs=inputs: run_case(inputs)]
            full = time_graph(full_calls)
            hbm_calls = [lambda s=s: run_case(s) for s in rotating]
            hbm = time_graph(hbm_calls)
            stats = stats_only(inputs)
            name = f"B{batch}K{K} {'T0' if t0 else 'T1'}"
            rows.append(
                f"{name:10s} full {full:7.2f}  hbm {hbm:7.2f} ({sets} sets)  stats {stats:7.2f}"
                f"  finish {full - stats:7.2f}  {plan_launch(batch, K + 1, V, interpreter=CPU)}"
            )
            print(rows[-1], flush=True)
            del rotating
            if batch == 64 or (batch == 4 and not t0):
                for block_v, warps, chunk in [
                    (128, 4, 2048),
                    (512, 4, 2048),
                    (256, 8, 2048),
                    (256, 4, 4096),
                    (512, 8, 4096),
                    (256, 4, 1024),
                ]:
                    if CPU:
                        block_v, chunk = min(block_v, 256), 512
                    plan = LaunchPlan(1, block_v, -(-V // chunk), chunk, warps, min(1024, chunk))
                    try:
                        got = run_case(inputs, plan)
                        same = torch.equal(got.tokens, check.tokens)
                        plan_calls = [lambda i=inputs, p=plan: run_case(i, p)]
                        t_full = time_graph(plan_calls)
                        t_stats = stats_only(inputs, plan)
                    except Exception as err:  # a plan that does not compile is a result too
                        rows.append(f"    plan {plan}: {type(err).__name__}: {err}"[:300])
                        print(rows[-1], flush=True)
                        continue
                    rows.append(
                        f"    plan bv={block_v:4d} w={warps} chunk={chunk:5d} ns={plan.nsplit:4d}"
                        f"  full {t_full:7.2f}  stats {t_stats:7.2f}  same tokens {same}"
                    )
                    print(rows[-1], flush=True)
    print("\n== summary (µs per call, medians)\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
