"""The selector's kernels compiled for the H200 (sm_90a) on a machine with no GPU: registers,
spills, shared memory and SASS counts per launch shape, without spending device time.

    python3 bench/compile_sm90.py [--pkg PATH ...] [--only WORD ...] [--finish-warps N]
                                  [--stages N] [--overlap 0|1] [--tma 0|1] [--barrier-lines]

Triton compiles to a cubin without a driver (its wheel carries ptxas); this script builds
each kernel's signature as a real launch specialises it (pointers by dtype and 16-byte
aligned, an int equal to 1 made the constant 1 and a multiple of 16 marked divisible, the
constexprs that `pp3kernels.selector.launch_constants` gives the plan that `plan_launch` picks
for the case, as verify_chain launches them) and asks
the bundled ptxas for its resource report on the PTX; cuobjdump counts the cubin's
instructions, block barriers (BAR.SYNC) and cp.async loads (LDGSTS). --finish-warps and
--stages override those plan fields (stages needs a package that has the field);
--overlap 0 compiles the launches without programmatic dependent launch's waits and triggers;
--finish-maxnreg N caps the finish launch's registers (Triton's maxnreg option, ptx .maxnreg;
spills show what the cap costs), in place of the plan's own cap where it has one
(LaunchPlan.finish_maxnreg, step 38; without the option it is compiled as launched);
--plan FIELD=INT sets any other plan field (e.g. `--plan flat_rows=1 block_v=1024`);
--tma 0 compiles phase 1 without a TMA descriptor where the plan asks for one (a package
from step 12 on: phase 1's whole chunks as TMA boxes; the descriptor's type is what a
contiguous bf16 call passes);
--barrier-lines charges each barrier to the last chain.py line before it in `nvdisasm -gi`
(inlined helpers such as tl.sum report Triton's own lines, so the caller's is the useful
one). With PP3_SM90_DUMP=DIR in the environment, each launch's TTGIR, PTX and cubin are
written to DIR (to read the layouts Triton chose, and the convert_layout ops between them, which
become shared-memory round trips with block barriers). Each --pkg (a folder holding
a `pp3kernels/` that has `selector.launch_constants`, i.e. from v5 step 8 on) is compiled in
its own subprocess; the default
is this tree's kernels/. Cases: phase 1 and phase 2 of point drafts at B4, B16, B64 and B256, sparse
S = 64, 1024 and 4096 at B4 and S = 64, 1024 and 4096 at B64 (with step 25's counts and
support launches where the plan splits the support), dense q at B4, V = 129280, K = 5
(PP3_SM90_DEPTH=K in the environment: another chain depth for every case).
A static view only: it says where registers spill, not how long anything takes (that is
`pp3 probe` on the device).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 129_280
K = int(os.environ.get("PP3_SM90_DEPTH", "5"))  # K: the chain depth of every case
CASES = [
    ("B4 point", 4, "point", 1),
    ("B16 point", 16, "point", 1),
    ("B64 point", 64, "point", 1),
    ("B256 point", 256, "point", 1),
    ("B1 sparse64", 1, "sparse", 64),
    ("B4 sparse64", 4, "sparse", 64),
    ("B16 sparse64", 16, "sparse", 64),
    ("B4 sparse1024", 4, "sparse", 1024),
    ("B4 sparse4096", 4, "sparse", 4096),
    ("B64 sparse64", 64, "sparse", 64),
    ("B64 sparse1024", 64, "sparse", 1024),
    ("B64 sparse4096", 64, "sparse", 4096),
    ("B4 dense", 4, "dense", 1),
]
# Pointer dtypes of the kernels' arguments (a sparse call passes the logits as the unused
# dense-q pointer, a non-dense call a partials array as the unused mass pointer; overridden
# per case below).
_POINTERS = {
    "logits_ptr": "*bf16",
    "draft_ptr": "*i32",
    "qid_ptr": "*i32",
    "qcnt_ptr": "*i32",
    "temp_ptr": "*fp32",
    "seed_ptr": "*i64",
    "pos_ptr": "*i64",
    "part_max_ptr": "*fp32",
    "part_sum_ptr": "*fp32",
    "part_arg_ptr": "*i32",
    "part_flag_ptr": "*i32",
    "scratch_ptr": "*fp32",
    "tokens_ptr": "*i32",
    "accepted_ptr": "*i32",
    "status_ptr": "*i8",
    "count_ptr": "*i32",
    "q_bad_ptr": "*i8",
    "sup_e_ptr": "*fp64",
    "sup_r_ptr": "*fp64",
}


def _ptxas_report(ptx: str, arch: str) -> dict[str, int]:
    """Registers, spill stores/loads and stack frame bytes from ``ptxas -v`` on ``ptx``."""
    ptxas = _tool("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        run = subprocess.run(
            [ptxas, "-v", f"--gpu-name={arch}", str(path), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=False,
        )
    text = run.stdout + run.stderr
    found = {
        "registers": re.search(r"Used (\d+) registers", text),
        "spill_stores": re.search(r"(\d+) bytes spill stores", text),
        "spill_loads": re.search(r"(\d+) bytes spill loads", text),
        "stack": re.search(r"(\d+) bytes stack frame", text),
    }
    return {key: int(m.group(1)) if m else -1 for key, m in found.items()}


def _tool(name: str) -> Path:
    """One of the CUDA tools Triton's wheel carries (ptxas, cuobjdump, nvdisasm)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _sass_report(cubin: bytes, barrier_lines: bool) -> dict[str, Any]:
    """Instruction, BAR.SYNC and LDGSTS counts of a cubin; with ``barrier_lines``, the
    barriers by the last chain.py line that precedes each."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run(
            [_tool("cuobjdump"), "-sass", str(path)], capture_output=True, text=True, check=False
        ).stdout
        listing = ""
        if barrier_lines:
            listing = subprocess.run(
                [_tool("nvdisasm"), "-gi", "-c", str(path)],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
    instructions = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]
    report: dict[str, Any] = {
        "instructions": len(instructions),
        "barriers": sum("BAR.SYNC" in line for line in instructions),
        "ldgsts": sum("LDGSTS" in line for line in instructions),
    }
    if barrier_lines:
        by_line: dict[int, int] = {}
        current = 0
        for line in listing.splitlines():
            where = re.search(r'//## File ".*?chain\.py", line (\d+)', line)
            if where:
                current = int(where.group(1))
            elif "BAR.SYNC" in line:
                by_line[current] = by_line.get(current, 0) + 1
        report["barrier_lines"] = by_line
    return report


def _compile(
    kernel: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    attrs: dict[tuple[int, ...], list[list[Any]]],
    warps: int,
    maxnreg: int | None = None,
) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options: dict[str, Any] = {"num_warps": warps}
    if maxnreg is not None:  # ptx .maxnreg: ptxas holds the kernel to this many registers
        options["maxnreg"] = maxnreg
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _int_values(batch: int, q: str, support: int, nsplit: int) -> dict[str, int]:
    """The integer arguments of a real call (verify_chain on contiguous inputs)."""
    rows, slots = K + 1, max(support, 1)
    values = {
        "stride_lb": rows * VOCAB,
        "stride_lk": VOCAB,
        "stride_lv": 1,
        "stride_db": K,
        "stride_dk": 1,
        "stride_qb": K * slots,
        "stride_qk": slots,
        "stride_qs": 1,
        "B": batch,
        "V": VOCAB,
        "NSPLIT": nsplit,
    }
    if q == "dense":
        values.update(stride_qb=0, stride_qk=0, stride_qs=0)
        values.update(stride_qdb=K * VOCAB, stride_qdk=VOCAB, stride_qdv=1)
    else:  # the logits stand in for the unused dense-q pointer, with zero strides
        values.update(stride_qdb=0, stride_qdk=0, stride_qdv=0)
    return values


def _specialise(
    kernel: Any,
    constexprs: dict[str, Any],
    overrides: dict[str, str],
    values: dict[str, int],
    desc: str | None = None,
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """(signature, constexprs, attrs) as Triton's launcher specialises a real call: pointers
    16-byte aligned; an int equal to 1 becomes the constant 1 and a multiple of 16 is marked
    divisible by 16 (unless the kernel names it in do_not_specialize); other ints i32."""
    signature, constants = {}, dict(constexprs)
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    divisible = [["tt.divisibility", 16]]
    for index, param in enumerate(kernel.params):
        name = param.name
        if name in constexprs:
            signature[name] = "constexpr"
        elif name == "logits_desc":  # a host TMA descriptor (step 12), or None
            signature[name] = desc or "constexpr"
            if desc is None:
                constants[name] = None
        elif name.endswith("_ptr"):
            signature[name] = overrides.get(name, _POINTERS.get(name, "*fp32"))
            attrs[(index,)] = divisible
        elif name == "denominator_f":
            signature[name] = "fp32"
        else:
            value = values[name]
            if param.do_not_specialize:
                signature[name] = "i32"
            elif value == 1:
                signature[name] = "constexpr"
                constants[name] = 1
            else:
                signature[name] = "i32"
                if value % 16 == 0:
                    attrs[(index,)] = divisible
    return signature, constants, attrs


def worker(
    only: list[str] | None,
    overrides: dict[str, int | bool],
    barrier_lines: bool,
    finish_maxnreg: int | None = None,
) -> list[dict[str, Any]]:
    """Compile every case's launches (the plan's fields replaced by ``overrides``)."""
    from dataclasses import replace

    import pp3kernels
    from pp3kernels import selector
    from pp3kernels.jit import chain
    from pp3kernels.jit.launch import Q_DENSE, Q_SPARSE
    from pp3kernels.selector import LaunchPlan, launch_constants, plan_launch

    # the finish launch's plan (selector.finish_launch_plan) where the package has one
    finish_plan_of: Callable[[LaunchPlan], LaunchPlan] = getattr(
        selector, "finish_launch_plan", lambda plan: plan
    )

    unknown = sorted(set(overrides) - set(LaunchPlan.__dataclass_fields__))
    if unknown:  # e.g. --stages on a tree without bench/pending/v5-step7-phase1-stages.patch
        raise SystemExit(f"this package's LaunchPlan has no field {unknown}")
    rows = []
    for name, batch, q, support in CASES:
        if only and not any(word in name for word in only):
            continue
        plan = plan_launch(
            batch, K + 1, VOCAB, interpreter=False, support=support, dense=q == "dense"
        )
        # overrides' names are LaunchPlan's fields (checked above), each given its field's type
        plan = replace(plan, **cast(dict[str, Any], overrides))
        q_mode = {"dense": Q_DENSE, "sparse": Q_SPARSE, "point": Q_SPARSE}[q]
        tma = bool(getattr(plan, "tma", False)) and max(plan.groups, plan.block_v) <= 256
        extra = {"tma": tma} if "tma" in inspect.signature(launch_constants).parameters else {}
        stats_const, finish_const = launch_constants(
            plan, K + 1, q_mode, support, overlap=plan.overlap, **extra
        )
        box = f"{plan.groups}, {plan.flat_rows}, {plan.block_v}"
        desc = f"tensordesc<bf16[{box}]>" if tma else None
        # CHUNK is a constexpr that verify_chain passes by position, with (B, V, NSPLIT).
        stats_const = {**stats_const, "CHUNK": plan.chunk}
        finish_const = {**finish_const, "CHUNK": plan.chunk}
        # TICKET: the counts and support launches' constexpr where the package has one
        # (bench/pending's v5 step 28: the support launch's last program finishes)
        support_const = {**finish_const, "TICKET": bool(getattr(plan, "ticket", False))}
        # the constants verify_chain gives the separate finish launch: its own carveout
        # where the plan has one (finish_launch_plan). No kernel reads CARVEOUT, so a
        # package without the function (before v5 step 41) compiles to the same code.
        finish_launch = {
            **finish_const,
            "CARVEOUT": finish_plan_of(plan).carveout,
        }
        dense = {"qdense_ptr": "*fp32", "mass_ptr": "*fp64"}
        other = {"qdense_ptr": "*bf16", "mass_ptr": "*fp32"}
        launches: list[tuple[str, Any, dict[str, int | bool], int, dict[str, str]]] = [
            ("stats", chain.chain_stats_kernel, stats_const, plan.num_warps, {})
        ]
        launches.append(
            (
                "finish",
                chain.chain_finish_kernel,
                finish_launch,
                plan.finish_warps,
                dense if q == "dense" else other,
            )
        )
        if q == "dense":
            rescan = chain.chain_rescan_kernel
            # TICKET: dense q's rescan finishes where phase 1 arms its tickets (ARM_TICKET)
            rescan_const = {**finish_const, "TICKET": bool(stats_const.get("ARM_TICKET", False))}
            launches.append(("rescan", rescan, rescan_const, plan.finish_warps, dense))
        if q == "sparse" and int(getattr(plan, "support_tile", 0)):  # step 25's split support
            for phase in ("counts", "support"):
                kernel = getattr(chain, f"chain_{phase}_kernel")
                warps = int(getattr(plan, "support_warps", 0)) if phase == "support" else 0
                launches.append((phase, kernel, support_const, warps or plan.finish_warps, other))
        values = _int_values(batch, q, support, plan.nsplit)
        for phase, kernel, constexprs, warps, pointer_types in launches:
            names = {p.name for p in kernel.params}
            constexprs = {k: v for k, v in constexprs.items() if k in names}
            signature, constants, attrs = _specialise(
                kernel, constexprs, pointer_types, values, desc if phase == "stats" else None
            )
            try:
                # the plan's own cap (LaunchPlan.finish_maxnreg, step 38) unless overridden
                planned = int(getattr(plan, "finish_maxnreg", 0)) or None
                cap = (finish_maxnreg or planned) if phase == "finish" else None
                compiled = _compile(kernel, signature, constants, attrs, warps, cap)
                report: dict[str, Any] = _ptxas_report(compiled.asm["ptx"], "sm_90a")
                report["shared"] = int(compiled.metadata.shared)
                report.update(_sass_report(compiled.asm["cubin"], barrier_lines))
                if dump := os.environ.get("PP3_SM90_DUMP"):  # TTGIR and PTX, for reading
                    stem = Path(dump) / f"{name.replace(' ', '_')}_{phase}"
                    stem.parent.mkdir(parents=True, exist_ok=True)
                    stem.with_suffix(".ttgir").write_text(compiled.asm["ttgir"])
                    stem.with_suffix(".ptx").write_text(compiled.asm["ptx"])
                    stem.with_suffix(".cubin").write_bytes(compiled.asm["cubin"])
            except Exception as err:  # a shape that does not compile is a finding, not a crash
                report = {"error": f"{type(err).__name__}: {str(err)[-1500:]}"}
            rows.append({"case": name, "phase": phase, "warps": warps, **report})
    print(f"package {Path(pp3kernels.__file__).parent}", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pkg", nargs="*", default=[], help="folders holding a pp3kernels/")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="cases naming one of these")
    parser.add_argument("--finish-warps", type=int, help="phase 2's warps instead of the plan's")
    parser.add_argument("--stages", type=int, help="phase 1's pipeline depth (LaunchPlan.stages)")
    parser.add_argument("--overlap", type=int, choices=(0, 1), help="LaunchPlan.overlap")
    parser.add_argument("--tma", type=int, choices=(0, 1), help="LaunchPlan.tma (step 12)")
    parser.add_argument("--ticket", type=int, choices=(0, 1), help="LaunchPlan.ticket (step 28)")
    parser.add_argument("--support-warps", type=int, help="LaunchPlan.support_warps")
    parser.add_argument("--barrier-lines", action="store_true", help="barriers by chain.py line")
    parser.add_argument(
        "--finish-maxnreg", type=int, help="cap the finish launch's registers (ptx .maxnreg)"
    )
    parser.add_argument(
        "--plan",
        nargs="+",
        default=[],
        metavar="FIELD=INT",
        help="any other LaunchPlan field (an int; 0 / 1 for a bool field), e.g. flat_rows=1",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = {
        field: value
        for field, value in (
            ("finish_warps", args.finish_warps),
            ("stages", args.stages),
            ("overlap", None if args.overlap is None else bool(args.overlap)),
            ("tma", None if args.tma is None else bool(args.tma)),
            ("ticket", None if args.ticket is None else bool(args.ticket)),
            ("support_warps", args.support_warps),
        )
        if value is not None
    }
    for item in args.plan:
        field, _, value = item.partition("=")
        try:
            overrides[field] = int(value)
        except ValueError:
            parser.error(f"--plan {item!r}: expected FIELD=INT, e.g. flat_rows=1")
    if args.worker:
        print(json.dumps(worker(args.only, overrides, args.barrier_lines, args.finish_maxnreg)))
        return 0
    results = {}
    for pkg in [str(ROOT / "kernels"), *args.pkg]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([pkg, str(ROOT)])}
        env.pop("TRITON_INTERPRET", None)
        cmd = [sys.executable, __file__, "--worker", *sys.argv[1:]]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        results[pkg] = json.loads(run.stdout.strip().splitlines()[-1])
    names = "  ".join(f"{Path(p).name:>52s}" for p in results)
    print(f"{'case':15s} {'phase':7s} {'warps':>5s}  " + names)
    first = next(iter(results.values()))
    for i, row in enumerate(first):
        cells = []
        for rows in results.values():
            cell = rows[i]
            if "error" in cell:
                cells.append(f"{'ERROR':>52s}")
            else:
                spill = f"{cell['spill_stores']}/{cell['spill_loads']}"
                text = (
                    f"{cell['registers']} reg {spill} spill {cell['shared']} shm "
                    f"{cell['instructions']} ins {cell['barriers']} bar {cell['ldgsts']} ldgsts"
                )
                cells.append(f"{text:>52s}")
        print(f"{row['case']:15s} {row['phase']:7s} {row['warps']:5d}  " + "  ".join(cells))
    if args.barrier_lines:
        source = (ROOT / "kernels" / "pp3kernels" / "jit" / "chain.py").read_text().splitlines()
        for pkg, rows in results.items():
            for cell in rows:
                lines = sorted(cell.get("barrier_lines", {}).items(), key=lambda kv: -kv[1])
                print(f"{Path(pkg).name} {cell['case']} {cell['phase']}: barriers by line")
                for line, count in lines:
                    text = (
                        source[int(line) - 1].strip()[:70] if 0 < int(line) <= len(source) else ""
                    )
                    print(f"  {count:3d}  chain.py:{line}  {text}")
    for rows in results.values():
        for cell in rows:
            if "error" in cell:
                print(f"{cell['case']} {cell['phase']}: {cell['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
