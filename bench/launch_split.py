"""Where phase 2's time goes for draft distributions: each of the selector's launches alone.

Run on the device machine (`python3 bench/launch_split.py [--only WORD ...]`); `--cpu`
runs every case once at a small V in Triton's interpreter, to check the script itself.

Cases: V = 129280 bf16 logits (randn * 4), K = 5, all T1, B in {4, 64}; q as sparse
supports of S = 64, 1024 and 4096 tokens (C / S each, the draft first, ids V // S apart) and
as dense rows (softmax of noisy logits); drafts are the greedy tokens with one in three
requests off by one at row 2 (bench/selector_ab.py's inputs and timing: CUDA graphs of 10
calls rotating over enough input sets to exceed 2 x L2, median of 100 replays), µs per call:

- full     verify_chain(validate=False)
- stats    phase 1 alone (the later launches replaced by no-ops)
- rescan, counts, support: what each of those launches adds to the launches before it (the
           launches after it replaced by no-ops), in launch order; a launch the case's plan
           does not make adds only the spread of two timings (dense q launches the rescan,
           sparse q of 128 padded slots or more the counts and the support)
- finish   full minus the launches before it

With ``--point B ...``, point drafts instead: all T1, all T0 and spread-mixed (every other
request T0) at the given batch sizes (what phase 2 costs beside phase 1 where phase 1 is
most of the call). Run beside another package with ``PYTHONPATH=FOLDER`` (it imports the
first pp3kernels on the path, and prints which).

The no-op launches are module globals of pp3kernels.selector swapped for the timing only
(bench/phase_timings.py does the same for the finish launch). Prints one table last.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import torch
from selector_ab import input_sets, make_inputs, time_case  # bench/ is the script's own folder

import pp3kernels.selector as selector
from pp3kernels.jit import Launchable
from pp3kernels.selector import verify_chain


class _NoLaunch:
    """A stand-in launcher that launches nothing."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@contextmanager
def replaced(**launches: Launchable) -> Iterator[None]:
    """Replace the named launch globals of pp3kernels.selector for the block."""
    saved = {name: getattr(selector, name) for name in launches}
    try:
        for name, launch in launches.items():
            setattr(selector, name, launch)
        yield
    finally:
        for name, kernel in saved.items():
            setattr(selector, name, kernel)


def without(*names: str) -> AbstractContextManager[None]:
    """Replace the named launch globals of pp3kernels.selector by no-ops for the block."""
    return replaced(**{name: _NoLaunch() for name in names})


def time_calls(calls: Sequence[Callable[[], Any]], cpu: bool) -> float:
    """Median µs per call, timed as bench/selector_ab.py times (CUDA-graph replays)."""
    return statistics.median(time_case(calls, cpu))


Work = TypeVar("Work")


def precompile(
    compile_slice: Callable[[list[Work]], int], work: Sequence[Work], workers: int = 12
) -> None:
    """Fill the Triton cache in parallel: ``compile_slice`` (a module-level function, so that
    spawned processes can import it) compiles one slice of ``work`` and returns its length."""
    slices = [list(work[i::workers]) for i in range(workers)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        done = sum(pool.map(compile_slice, [part for part in slices if part]))
    print(f"compiled {done} variants", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="smoke test in the interpreter")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument("--point", nargs="+", type=int, metavar="B", help="point-draft batches")
    args = parser.parse_args()
    print("pp3kernels from", selector.__file__, flush=True)
    device, vocab = ("cpu", 3000) if args.cpu else ("cuda", 129_280)
    l2 = 60 << 20 if args.cpu else torch.cuda.get_device_properties(0).L2_cache_size
    forms = ("sparse64", "dense") if args.cpu else ("sparse64", "sparse1024", "sparse4096", "dense")
    if args.point:
        plan = [(b, temps, "point") for b in args.point for temps in ("T1", "T0", "mix")]
    else:
        plan = [(b, "T1", q) for b in ((4,) if args.cpu else (4, 64)) for q in forms]
    rows = []
    for batch, temps, q in plan:
        name = f"B{batch} {q}" if temps == "T1" and q != "point" else f"B{batch} {temps} {q}"
        if args.only and not any(word in name for word in args.only):
            continue
        sets = input_sets(batch, vocab, l2, cpu=args.cpu)
        inputs = [make_inputs(batch, temps, q, i, vocab, device) for i in range(sets)]
        check = verify_chain(**inputs[0], validate=False)
        ok = int((check.status == 0).sum())
        calls = [lambda a=a: verify_chain(**a, validate=False) for a in inputs]
        full = time_calls(calls, args.cpu)
        prefixes = []  # µs with the launches up to each of _LATER, the rest no-ops
        for cut in range(len(_LATER)):
            with without(*_LATER[cut:]):
                prefixes.append(time_calls(calls, args.cpu))
        parts = [prefixes[0]] + [
            b - a for a, b in zip(prefixes, [*prefixes[1:], full], strict=True)
        ]
        rows.append((name, full, parts, ok, batch, sets))
        print(f"{name}: full {full:.2f} us, " + _cells(parts, "{:.2f}", " "), flush=True)
        del inputs, calls
    print(f"{'case':16s} {'full':>9s} " + _cells(_PARTS, "{:>9s}", " ") + "  ok  sets")
    for name, full, parts, ok, batch, sets in rows:
        print(f"{name:16s} {full:9.2f} " + _cells(parts, "{:9.2f}", " ") + f"  {ok}/{batch} {sets}")
    return 0


# The launches after phase 1, in the order verify_chain makes them, and the table's columns.
_LATER = (
    "_chain_rescan_kernel",
    "_chain_counts_kernel",
    "_chain_support_kernel",
    "_chain_finish_kernel",
)
_PARTS = ("stats", "rescan", "counts", "support", "finish")


def _cells(values: Sequence[Any], form: str, sep: str) -> str:
    return sep.join(form.format(v) for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
