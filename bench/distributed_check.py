"""Compare two qualification receipts of one seed and size run on different numbers of ranks.

    python3 bench/distributed_check.py receipts/qualification-A.json receipts/qualification-B.json

Prints, for each part (members' counts and statistics, family, greedy, edge, controls,
verdict), whether the two receipts agree, each run's world size and elapsed_s, and the
speed-up elapsed_s(A) / elapsed_s(B). Exit 1 when any part differs. The verdicts themselves
are checked by `pp3 verify-receipts`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PARTS = ("requests_per_target", "members", "family", "greedy", "edge", "controls", "verdict")


def main(first: str, second: str) -> int:
    runs = [json.loads(Path(name).read_text())["predicate"] for name in (first, second)]
    differ = [part for part in PARTS if runs[0]["data"][part] != runs[1]["data"][part]]
    for name, run in zip((first, second), runs, strict=True):
        world = run["parameters"].get("world_size", 1)
        print(f"{name}: world size {world}, elapsed {run['data']['elapsed_s']} s")
    for part in PARTS:
        print(f"  {part}: {'DIFFERS' if part in differ else 'identical'}")
    speedup = runs[0]["data"]["elapsed_s"] / runs[1]["data"]["elapsed_s"]
    print(f"speed-up (first / second elapsed_s): {speedup:.3f}")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
