"""What a small batch cannot go below: launch gaps and dependent-load latency on the GPU.

Run on the device machine (`python3 bench/launch_floor.py [--out DIR]`, about a minute);
`--cpu` runs each kernel once in Triton's interpreter and checks the pointer chase, to test
the script itself.

At B <= 4 the selector's call is two dependent launches: phase 1 (5.6-6.6 µs alone, launch
included) and phase 2, one program per request walking a chain of dependent steps (~8.5
µs; bench/NOTES.md, "phase 2 by launch shape": it does not answer to warps or tile width).
The issue asks for <= 8 µs. This script measures the two quantities that bound any design
of that call, timed as `pp3 probe` times (CUDA graphs of 10 calls, 3 warm-up and 100 timed
replays, median µs per call; bench/launch_split.py's `time_calls`):

- launches: one empty kernel, and two and three empty kernels one after another on the
  stream (each waits for the one before, as phase 2 waits for phase 1): the graph's cost of
  a launch and of one dependent launch more;
- chase: one program following a random cycle of N pointers (N = 1, 4, 16, 64), each load's
  address the previous load's value, over a table that fits in L2 (1 MiB) and one that
  does not (1 GiB): the latency of one dependent step, which a one-launch finish would still
  pay for every step of its chain (partials, acceptance gathers, chunk pick, tile walk, pick).

Prints one table last and writes DIR/launch_floor.json. The lower bound on a two-launch call
is then phase 1 alone + (two launches - one launch) + steps x latency; a one-launch call
(the last program of a request finishing it) saves only the middle term.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from launch_split import time_calls  # bench/ is the script's own folder


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit  # type: ignore[untyped-decorator]
def empty_kernel(out_ptr, WRITE: tl.constexpr):  # type: ignore[no-untyped-def]
    """Nothing, or (WRITE) one store, so that no launch is optimised away."""
    if WRITE:
        tl.store(out_ptr, 1)


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit(do_not_specialize=["start"])  # type: ignore[untyped-decorator]
def chase_kernel(table_ptr, out_ptr, start, STEPS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Follow STEPS pointers from ``start`` (each address the previous load's value); one
    thread's worth of work in one program, stored so the chain is not dead code."""
    index = start.to(tl.int64)
    for _ in range(STEPS):
        index = tl.load(table_ptr + index).to(tl.int64)
    tl.store(out_ptr, index)


def cycle_table(entries: int, device: str, seed: int) -> torch.Tensor:
    """A random single cycle over ``entries`` int64 slots: table[p[i]] = p[i + 1]."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(entries, generator=gen)
    table = torch.empty(entries, dtype=torch.int64)
    table[order] = torch.roll(order, -1)
    return table.to(device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    out = torch.zeros(4, dtype=torch.int64, device=device)
    records: dict[str, float] = {}

    def launches(n: int) -> None:
        for _ in range(n):
            empty_kernel[(1,)](out, WRITE=True, num_warps=4)

    for n in (1, 2, 3):
        launch_calls = [lambda n=n: launches(n)]
        records[f"{n} empty launches"] = time_calls(launch_calls, args.cpu)

    tables = {"L2 (1 MiB)": 1 << 17, "HBM (1 GiB)": 1 << 27}
    if args.cpu:
        tables = {"L2 (1 MiB)": 1 << 10}
    for label, entries in tables.items():
        table = cycle_table(entries, device, seed=entries)
        for steps in (1, 4, 16, 64):
            chase_kernel[(1,)](table, out, 0, STEPS=steps, num_warps=1)
            expected = 0
            for _ in range(steps):  # the same walk on the host
                expected = int(table[expected])
            if int(out[0]) != expected:
                raise SystemExit(f"chase {label} {steps}: got {int(out[0])}, expected {expected}")
            start = [int(v) for v in torch.randint(0, entries, (10,))]
            calls = [
                lambda s=s, steps=steps, table=table: chase_kernel[(1,)](
                    table, out, s, STEPS=steps, num_warps=1
                )
                for s in start
            ]
            records[f"chase {label}, {steps} steps"] = time_calls(calls, args.cpu)
        del table

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launch_floor.json").write_text(json.dumps(records, indent=1))
    for name, us in records.items():
        print(f"{name:34s} {us:10.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
