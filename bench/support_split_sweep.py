"""Step 25's split support swept: tile size and the support launch's warps, beside the finish
summing the support itself.

Run on the device machine (`python3 bench/support_split_sweep.py [--only WORD ...]`); `--cpu`
runs a small case once in Triton's interpreter, to check the script itself.

Why: at B64 S = 4096 the split (support_tile 128, 16 warps for every phase-2 launch) ran
148.8 µs against 96.8 for the finish summing the support (twenty-second session), while
at B4 it won 3.2x. ``bench/compile_sm90.py`` puts the support kernel there at 128
registers, one program a multiprocessor, 2048 programs. This times, without changing the
package, the support kernel at other tiles (``LaunchPlan.support_tile``, a plan field) and
other warps (the launch global ``pp3kernels.selector._chain_support_kernel`` wrapped so that
its launches take another ``num_warps``: the device code is the same, its compile is not).

Cases (bench/selector_ab.py's inputs and timing, µs per call, all T1, K = 5): sparse q of
S = 4096 at B64 (planned unsplit since step 25) and B4 (planned split). Variants: the
default plan; "unsplit" (support_tile 0) where the default splits; support_tile 64 to 512
at 4 and 8 support warps, and 128 at the plan's finish_warps (step 25's split). The split
adds a stop row's support in another order for another tile, so outputs may differ from
the default's where a uniform lands within rounding of a boundary: the count of differing
input sets is printed, not failed on. Prints one table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from launch_split import time_calls  # bench/ is the script's own folder
from selector_ab import case_plan, digest, input_sets, make_inputs

import pp3kernels.selector as selector
from pp3kernels.jit import Launchable
from pp3kernels.selector import LaunchPlan, verify_chain

_ORIGINAL: Launchable = selector._chain_support_kernel


class _WithWarps:
    """The support launch with ``warps`` warps instead of the plan's finish_warps."""

    def __init__(self, kernel: Launchable, warps: int) -> None:
        self.kernel, self.warps = kernel, warps

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
        launcher = self.kernel[grid]
        warps = self.warps

        def launch(*args: Any, **meta: Any) -> object:
            return launcher(*args, **{**meta, "num_warps": warps})

        return launch


def variants(
    default: LaunchPlan, tiles: list[int], warps: list[int], cpu: bool
) -> dict[str, tuple[LaunchPlan, int]]:
    """{name: (plan, support warps; 0 = the plan's finish_warps)}: the default plan, the
    finish summing the support (unless that is the default), and tiles x warps."""
    out = {"default": (default, 0)}
    if default.support_tile:
        out["unsplit"] = (dataclasses.replace(default, support_tile=0), 0)
    for tile in tiles:
        for w in warps:
            out[f"tile {tile} w{w}"] = (dataclasses.replace(default, support_tile=tile), w)
    if not cpu:  # the plan's own warps (finish_warps) at the step-25 tile of 128
        out["tile 128 wplan"] = (dataclasses.replace(default, support_tile=128), 0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument("--tiles", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--warps", nargs="+", type=int, default=[4, 8])
    args = parser.parse_args()
    tiles, warps = ([64, 128], [4]) if args.cpu else (args.tiles, args.warps)
    device, vocab = ("cpu", 3000) if args.cpu else ("cuda", 129_280)
    l2 = 60 << 20 if args.cpu else torch.cuda.get_device_properties(0).L2_cache_size
    cases = (
        [("B4 sparse64", 4, "sparse64")]
        if args.cpu
        else [("B64 sparse4096", 64, "sparse4096"), ("B4 sparse4096", 4, "sparse4096")]
    )
    rows: list[tuple[str, str, float, float, int]] = []
    for name, batch, q in cases:
        if args.only and not any(word in name for word in args.only):
            continue
        sets = input_sets(batch, vocab, l2, cpu=args.cpu)
        inputs = [make_inputs(batch, "T1", q, i, vocab, device) for i in range(sets)]
        default: LaunchPlan = case_plan(batch, q, vocab, cpu=args.cpu)
        reference: list[str] = []
        base_us = 0.0
        for variant, (plan, w) in variants(default, tiles, warps, args.cpu).items():
            selector._chain_support_kernel = _WithWarps(_ORIGINAL, w) if w else _ORIGINAL
            try:
                outputs = [verify_chain(**a, validate=False, plan=plan) for a in inputs]
                got = [digest(list(out)) for out in outputs]
                reference = reference or got
                differ = sum(a != b for a, b in zip(got, reference, strict=True))
                calls = [partial(verify_chain, **a, validate=False, plan=plan) for a in inputs]
                us = time_calls(calls, args.cpu)
            finally:
                selector._chain_support_kernel = _ORIGINAL
            base_us = base_us or us
            rows.append((name, variant, us, us / base_us, differ))
            print(f"{name} {variant}: {us:.2f} us, {differ} input sets differ", flush=True)
        del inputs
    print(f"{'case':16s} {'variant':14s} {'us':>9s} {'/default':>9s} {'differ':>7s}")
    for name, variant, us, ratio, differ in rows:
        print(f"{name:16s} {variant:14s} {us:9.2f} {ratio:9.3f} {differ:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
