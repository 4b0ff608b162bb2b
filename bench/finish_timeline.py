"""Where the finish launch's time goes after phase 1, inside each request's program: clock
stamps at the steps of phase 2, on the device, with the launches overlapped as in a call.

    python3 bench/finish_timeline.py [--cases "4 T1 sparse64" ...] [--calls N] [--out DIR]

Nsight Compute's source view sampled a 12 µs finish of four programs 39 times (2026-12-04),
too few to say which step the time is in, and it serialises the launches. This script
instead copies this tree's pp3kernels to a temporary folder and inserts clock reads into
the copy's chain.py (anchored on exact source lines; it stops if one is missing): each
reads %clock64 (the multiprocessor's cycle counter) once a value of the step it closes is
in a register of the reading thread (the read is predicated on that value, so the
instruction cannot issue before it), and stores it to a stamp buffer, 16 slots a request.
Stamps (finish kernel): 0 entry, 1 after the wait for phase 1, 2 the stop row known, 3 the
chunk masses corrected (sparse q: the rescan test's value), 4 the chunk picked, 5 the token
drawn. The copy compiles to a slightly different program (a register per stamp, stores),
so its times are the instrumented program's; what it is for is the split between steps.

With ``--ticket``, the ticketed support launch instead (sparse q of 128 slots or more below
16 requests: every tile program of a request runs steps 0-2, then stores its support sums,
6, and takes the request's ticket; the last to arrive, 7, finishes the request in the same
program, 3-5). Each program stamps row (request, tile), so the tiles do not overwrite each
other; the table follows the last arriver of every request whose stop row rejected a
draft (the one that reaches stamp 6 and 7), and adds, in ns of %globaltimer, how long its
ticket came after the first of the request's tiles passed the wait, and the spread of the
tiles' stores.

Each case runs N eager calls (verify_chain, validate=False, selector_ab's inputs) after two
warm-up calls, and prints per step the median over calls and requests of the cycles since
the previous stamp, and the same in µs at the median SM clock the calls saw (cycles between
stamps 0 and 5 against %globaltimer ns). Writes DIR/finish_timeline.json. GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 16
TILE_ROWS = 32  # stamp rows a request: one a program along grid axis 1 (support tiles)
STEPS = ["entry", "wait done", "stop row", "masses corrected", "chunk picked", "token drawn"]

# A special register's value read once ``x`` (an int32 [1] value) is in a register: the read
# is predicated on x, so the instruction cannot issue before it.
_READ = """

@triton.jit
def _read_{reg}(x):
    return tl.inline_asm_elementwise(
        "{{ .reg .pred p; setp.ne.s32 p, $1, 2147483646; @p mov.u{bits} $0, %{reg}; "
        "@!p mov.u{bits} $0, 0; }}",
        "={constraint},r",
        [x.to(tl.int32)],
        dtype=tl.int{bits},
        is_pure=False,
        pack=1,
    )
"""


def read_register(reg: str, bits: int = 64) -> str:
    """Source of ``_read_<reg>(x)``: the special register ``reg`` (a u64 or u32 one)."""
    return _READ.format(reg=reg, bits=bits, constraint="l" if bits == 64 else "r")


HELPER = (
    """

_STAMP_ADDR = tl.constexpr(int(__import__("os").environ.get("PP3_STAMP_ADDR", "0")))
TILE_ROWS = tl.constexpr("""
    + str(TILE_ROWS)
    + """)
"""
    + read_register("clock64")
    + read_register("globaltimer")
    + """

@triton.jit
def _stamp(x, req, SLOT: tl.constexpr):
    \"\"\"bench/finish_timeline.py: %clock64 and %globaltimer once ``x`` is ready, stored at
    [req, SLOT] and [req, 8 + SLOT] of the stamp buffer.\"\"\"
    base = tl.full([1], _STAMP_ADDR, tl.int64).to(tl.pointer_type(tl.int64))
    slot = base + (req.to(tl.int64) * TILE_ROWS + tl.program_id(1)) * 16 + SLOT
    tl.store(slot, _read_clock64(x))
    tl.store(slot + 8, _read_globaltimer(x))
"""
)

# (anchor, line inserted before (False) or after (True) it, with the anchor's indentation);
# each anchor must occur once in chain.py. Stamps 1 and 2 sit in _chain_stop, which only
# the finish launch runs in the cases below (sparse q of more than 128 slots would also run
# it in its support launch: not a case of this script).
INSERTS = [
    (
        "    pid_b = tl.program_id(0)\n    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)",
        "_stamp(tl.zeros([1], tl.int32) + pid_b, tl.zeros([1], tl.int32) + pid_b, 0)",
        True,
    ),
    (
        "        gdc_wait()  # the launches before (phase 1, and the rescan or counts) done,"
        " visible",
        "_stamp(offs_b, offs_b, 1)",
        True,
    ),
    ("    final = tl.where(is_t1, _NO_TOKEN, final)", "_stamp(stop_row, offs_b, 2)", True),
    (
        "        if Q_MODE == _Q_SPARSE:\n            mass = _rescan_chunks(",
        "_stamp(tl.zeros([1], tl.int32) + tl.max(tl.max(rescan.to(tl.int32), axis=1), axis=0),"
        " offs_b, 3)",
        False,
    ),
    (
        "        if BLOCK_B == 1:  # see _unpinned\n            pick = _unpinned(pick)",
        "_stamp(pick, offs_b, 4)",
        False,
    ),
    ("        final = tl.where(need_sample, chosen, final)", "_stamp(chosen, offs_b, 5)", True),
]
CASES = ["4 T1 point", "4 T1 sparse64", "1 T1 point", "1 T1 sparse64"]
# The ticketed support launch (--ticket): stamps 1-5 as above (1 and 2 in every tile
# program, 3-5 in the last arriver's finish), 0 at the support kernel's entry, 6 once a
# tile's support sums are stored, 7 once the ticket is won.
TICKET_INSERTS = [
    (
        "    pid_t = tl.program_id(1)\n    logits = (logits_ptr, stride_lb, stride_lk, stride_lv)",
        "_stamp(tl.zeros([1], tl.int32) + pid_t, tl.zeros([1], tl.int32) + pid_b, 0)",
        True,
    ),
    INSERTS[1],
    INSERTS[2],
    INSERTS[3],
    INSERTS[4],
    INSERTS[5],
    (
        "        tl.store(sup_r_ptr + idx, sup_r, mask=ok)",
        "_stamp(tl.sum(sup_r, axis=1).to(tl.int32), offs_b, 6)",
        True,
    ),
    (
        "        # launch); the finish reads the tiles past L1 (_summed_support_tiles).\n"
        "        if _last_to_arrive(ticket_ptr, pid_b):",
        "    _stamp(stop_row, offs_b, 7)",
        True,
    ),
]
TICKET_CASES = ["4 T1 sparse1024", "4 T1 sparse4096", "1 T1 sparse4096"]
TICKET_STEPS = [
    ("wait done", 0, 1),
    ("stop row", 1, 2),
    ("sums stored", 2, 6),
    ("ticket won", 6, 7),
    ("masses corrected", 7, 3),
    ("chunk picked", 3, 4),
    ("token drawn", 4, 5),
]


def instrumented_copy(
    dest: Path,
    helper: str = HELPER,
    inserts: list[tuple[str, str, bool]] = INSERTS,
    source: Path = ROOT / "kernels" / "pp3kernels",
) -> Path:
    """The pp3kernels at ``source`` (this tree's by default) under dest/, its chain.py with
    ``helper`` after its imports and each of ``inserts`` (anchor, line, after) in place."""
    pkg = dest / "pp3kernels"
    shutil.copytree(source, pkg)
    path = pkg / "jit" / "chain.py"
    text = path.read_text()
    anchor = "from pp3kernels.jit.philox import acceptance_coin, sample_uniform\n"
    if text.count(anchor) != 1:
        raise SystemExit(f"anchor not found once in chain.py: {anchor!r}")
    text = text.replace(anchor, anchor + helper)
    for anchor, line, after in inserts:
        if text.count(anchor) != 1:
            raise SystemExit(f"anchor not found once in chain.py: {anchor!r}")
        at = text.index(anchor)
        indent = anchor[: len(anchor) - len(anchor.lstrip(" "))]
        if after:
            end = at + len(anchor)
            text = text[:end] + "\n" + indent + line + text[end:]
        else:
            text = text[:at] + indent + line + "\n" + text[at:]
    path.write_text(text)
    return dest


def worker(pkg_parent: str, case: str, calls: int, result_path: str) -> None:
    """One case in this process, pp3kernels imported from the instrumented copy."""
    import torch

    batch, temps, q = case.split()
    stamps = torch.zeros(int(batch) * TILE_ROWS * SLOTS, dtype=torch.int64, device="cuda")
    os.environ["PP3_STAMP_ADDR"] = str(stamps.data_ptr())
    sys.path.insert(0, pkg_parent)
    sys.path.insert(1, str(ROOT / "bench"))
    from selector_ab import make_inputs, support_of

    if q.startswith("sparse") and support_of(q) > TILE_ROWS * 128:  # 128: the least tile
        raise SystemExit(f"{case}: more support tiles than the {TILE_ROWS} stamp rows a request")

    import pp3kernels
    from pp3kernels.selector import verify_chain

    assert str(Path(pp3kernels.__file__).resolve()).startswith(str(Path(pkg_parent).resolve()))
    inputs = make_inputs(int(batch), temps, q, 0, 129_280, "cuda")
    rows: list[list[int]] = []
    for call in range(calls + 2):
        stamps.zero_()
        torch.cuda.synchronize()
        verify_chain(**inputs, validate=False)
        torch.cuda.synchronize()
        if call < 2:
            continue
        got = stamps[: int(batch) * TILE_ROWS * SLOTS].view(int(batch), TILE_ROWS, SLOTS)
        rows.extend(got.tolist())
    Path(result_path).write_text(json.dumps({"case": case, "rows": rows}))


def summarise(case: str, tiles: list[list[list[int]]]) -> dict[str, Any]:
    """Median cycles per step (stamp k - stamp k-1 over every call and request where both
    were written), and the clock (cycles / ns between stamps 0 and 5); the finish kernel's
    programs stamp their request's first row."""
    rows = [t[0] for t in tiles]
    steps: dict[str, float] = {}
    for k in range(1, len(STEPS)):
        gaps = [r[k] - r[k - 1] for r in rows if r[k] > 0 and r[k - 1] > 0]
        steps[STEPS[k]] = statistics.median(gaps) if gaps else float("nan")
    ghz = [
        (r[5] - r[0]) / (r[8 + 5] - r[8 + 0])
        for r in rows
        if r[5] > 0 and r[0] > 0 and r[8 + 5] > r[8 + 0]
    ]
    clock = statistics.median(ghz) if ghz else float("nan")
    return {
        "case": case,
        "samples": len(rows),
        "cycles": steps,
        "ghz": clock,
        "us": {name: cycles / clock / 1000 for name, cycles in steps.items()},
    }


def summarise_ticket(case: str, tiles: list[list[list[int]]]) -> dict[str, Any]:
    """The ticketed support launch: per request (and call) whose last arriver stored sums
    and won the ticket, the median cycles of each of TICKET_STEPS in that program; the
    clock from its stamps 0 and 5; and, in ns of %globaltimer across the request's tiles,
    the first wait passed to the ticket, the spread of the tiles' stores, and the first
    wait passed to the token drawn."""
    steps: dict[str, list[int]] = {name: [] for name, _a, _b in TICKET_STEPS}
    across: dict[str, list[int]] = {
        "first wait -> ticket": [],
        "stores spread": [],
        "first wait -> drawn": [],
    }
    ghz: list[float] = []
    for request in tiles:
        last = [r for r in request if r[7] > 0 and r[6] > 0 and r[5] > 0]
        if len(last) != 1:
            continue
        r = last[0]
        for name, a, b in TICKET_STEPS:
            if r[a] > 0 and r[b] > 0:
                steps[name].append(r[b] - r[a])
        if r[8 + 5] > r[8 + 0]:
            ghz.append((r[5] - r[0]) / (r[8 + 5] - r[8 + 0]))
        waits = [t[8 + 1] for t in request if t[8 + 1] > 0]
        stores = [t[8 + 6] for t in request if t[8 + 6] > 0]
        if waits:
            across["first wait -> ticket"].append(r[8 + 7] - min(waits))
            across["first wait -> drawn"].append(r[8 + 5] - min(waits))
        if len(stores) > 1:
            across["stores spread"].append(max(stores) - min(stores))
    clock = statistics.median(ghz) if ghz else float("nan")
    cycles = {k: statistics.median(v) if v else float("nan") for k, v in steps.items()}
    return {
        "case": case,
        "samples": len(steps["token drawn"]),
        "cycles": cycles,
        "ghz": clock,
        "us": {name: c / clock / 1000 for name, c in cycles.items()},
        "across_us": {
            k: statistics.median(v) / 1000 if v else float("nan") for k, v in across.items()
        },
    }


def stamp_parser(doc: str, cases: list[str], count: str, default: int) -> argparse.ArgumentParser:
    """The command line of a stamping script: --cases, ``count`` (calls or replays a case),
    --out, and the hidden --worker PACKAGE_PARENT CASE RESULT of one case's process."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=cases)
    parser.add_argument(f"--{count}", type=int, default=default)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    return parser


def run_workers(
    script: str, count: str, value: int, pkg_parent: str, cases: list[str]
) -> list[Any]:
    """Each case in a process of its own (``script --COUNT value --worker pkg_parent case
    result``, which imports the instrumented copy under pkg_parent); their results' JSON."""
    results = []
    for case in cases:
        result_path = str(Path(pkg_parent) / "case.json")
        cmd = [sys.executable, script, f"--{count}", str(value), "--worker", pkg_parent, case]
        subprocess.run([*cmd, result_path], check=True)
        results.append(json.loads(Path(result_path).read_text()))
    return results


def main() -> int:
    parser = stamp_parser(__doc__, CASES, "calls", 50)
    parser.add_argument("--ticket", action="store_true", help="the ticketed support launch")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.calls, args.worker[2])
        return 0
    cases = TICKET_CASES if args.ticket and args.cases == CASES else args.cases
    with tempfile.TemporaryDirectory() as tmp:
        instrumented_copy(Path(tmp), inserts=TICKET_INSERTS if args.ticket else INSERTS)
        got = run_workers(__file__, "calls", args.calls, tmp, cases)
    if args.ticket:
        results = [summarise_ticket(g["case"], g["rows"]) for g in got]
        names = [name for name, _a, _b in TICKET_STEPS]
    else:
        results = [summarise(g["case"], g["rows"]) for g in got]
        names = STEPS[1:]
    name = "support_timeline.json" if args.ticket else "finish_timeline.json"
    Path(args.out, name).write_text(json.dumps(results, indent=1))
    print(f"{'case':16s} " + " ".join(f"{n[:12]:>12s}" for n in names) + "   GHz")
    for r in results:
        cells = " ".join(f"{r['us'][n]:12.3f}" for n in names)
        print(f"{r['case']:16s} {cells} {r['ghz']:5.2f}   (µs; {r['samples']} programs)")
        if "across_us" in r:
            print("    " + ", ".join(f"{k} {v:.3f}" for k, v in r["across_us"].items()) + " µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
