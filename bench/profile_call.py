"""One selector case called a few times, eagerly: the program that bench/ncu_phases.sh profiles.

    python3 bench/profile_call.py --batch 1 --temps T1 --q point [--calls 6]

Inputs are bench/selector_ab.py's (V = 129280 bf16, K = 5, fixed seeds; on a CPU, with
--cpu, V = 3000 in Triton's interpreter, to test the script). Every call is
verify_chain(..., validate=False) on the same inputs, so that after the first (which
compiles) each launch of a kernel is the same work; the profiler skips the first calls.
"""

from __future__ import annotations

import argparse

import torch
from selector_ab import make_inputs  # bench/ is the script's own folder

import pp3kernels
from pp3kernels.selector import verify_chain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temps", choices=("T1", "T0", "half"), default="T1")
    parser.add_argument("--q", default="point", help="point, sparseS or dense")
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    args = parser.parse_args()
    device, vocab = ("cpu", 3000) if args.cpu else ("cuda", 129_280)
    inputs = make_inputs(args.batch, args.temps, args.q, 0, vocab, device)
    for _ in range(args.calls):
        result = verify_chain(**inputs, validate=False)
    if not args.cpu:
        torch.cuda.synchronize()
    print(f"B{args.batch} {args.temps} {args.q}: accepted {result.accepted.tolist()[:8]}")
    print(f"pp3kernels from {pp3kernels.__file__}")  # ncu_phases.sh's NCU_PKG took effect?
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
