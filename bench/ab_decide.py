"""A decision rule written before an A/B runs, applied to its result inside the same device
call, so that the stages after it run only for a candidate that won:

    python3 bench/ab_decide.py RESULT.json [--max-case R] [--max-total R] [--at-most CASE R ...]

RESULT.json: what bench/selector_ab.py wrote. Exit 0 when every case's outputs were
identical, no case's new/base ratio exceeds --max-case (default 1.02), the sum of the
new medians over the sum of the base medians does not exceed --max-total (default 1.0),
and each case named by --at-most (its full name, e.g. "B64 T0 point") has a ratio of at
most its R (the case a change is made for must gain that much; a named case missing from
the A/B loses); exit 1 otherwise, with the reason. bench/device_session.sh's `require`
stage stops the call on a non-zero exit.

With several --new folders in one A/B, --candidate FOLDER judges that candidate's rows
(default: the first's) and --against FOLDER judges it against another candidate of the
same run instead of the base: each case's ratio is then (candidate/base) over
(against/base), the total the candidate's medians over the other's, and the outputs count
as identical where both candidates' equal the base's. A folder names a candidate when it
is the path the A/B recorded or its last components (".cand/sel" matches
"/root/repo/.cand/sel").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def candidate_rows(meta: dict[str, Any], folder: str) -> list[dict[str, Any]]:
    """The rows of the candidate recorded as ``folder`` or as a path ending in it."""
    wanted = Path(folder).parts
    found = [
        rows
        for path, rows in meta["candidates"].items()
        if Path(path).parts[-len(wanted) :] == wanted
    ]
    if len(found) != 1:
        known = ", ".join(meta["candidates"])
        raise SystemExit(f"{folder!r} names {len(found)} candidates of this A/B (it has: {known})")
    return list(found[0])


def against(rows: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case of ``rows`` relative to the same case of ``other`` (both against one base)."""
    by_case = {r["case"]: r for r in other}
    relative = []
    for row in rows:
        peer = by_case.get(row["case"])
        if peer is None:
            raise SystemExit(f"{row['case']}: not in the candidate it is judged against")
        relative.append(
            {
                "case": row["case"],
                "base_us": peer["new_us"],
                "new_us": row["new_us"],
                "ratio": row["ratio"] / peer["ratio"],
                "identical": row["identical"] and peer["identical"],
            }
        )
    return relative


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--max-case", type=float, default=1.02)
    parser.add_argument("--max-total", type=float, default=1.0)
    parser.add_argument(
        "--at-most",
        nargs=2,
        action="append",
        default=[],
        metavar=("CASE", "R"),
        help="a case whose new/base ratio must not exceed R",
    )
    parser.add_argument("--candidate", metavar="FOLDER", help="the candidate judged")
    parser.add_argument("--against", metavar="FOLDER", help="judged against this candidate")
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    rows = result["rows"]
    if args.candidate or args.against:
        if "candidates" not in result["meta"]:
            raise SystemExit(f"{args.result}: an A/B without per-candidate rows")
    if args.candidate:
        rows = candidate_rows(result["meta"], args.candidate)
    if args.against:
        rows = against(rows, candidate_rows(result["meta"], args.against))
    if not rows:
        print("no cases in the A/B: no decision")
        return 1
    failures = [f"{r['case']}: outputs differ" for r in rows if not r["identical"]]
    failures += [
        f"{r['case']}: {r['ratio']:.3f} > {args.max_case}"
        for r in rows
        if r["ratio"] > args.max_case
    ]
    ratios = {r["case"]: r["ratio"] for r in rows}
    for case, bound in args.at_most:
        if case not in ratios:
            failures.append(f"{case}: not in the A/B")
        elif ratios[case] > float(bound):
            failures.append(
                f"{case}: {ratios[case]:.3f} > {float(bound)} (required of this change)"
            )
    total = sum(r["new_us"] for r in rows) / sum(r["base_us"] for r in rows)
    if total > args.max_total:
        failures.append(f"total {total:.4f} > {args.max_total}")
    print(f"{len(rows)} cases, total new/base {total:.4f}")
    for failure in failures:
        print("LOSES:", failure)
    print("decision:", "keep" if not failures else "drop")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
