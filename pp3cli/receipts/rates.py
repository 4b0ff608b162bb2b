"""A measured qualification rate, read from a receipt, and the wall time it predicts.

``pp3 qualify --plan --gpus N`` estimates how long a run would take on N GPUs from the
newest verified (``verify-receipts`` OK or STALE, never FAIL) single-GPU H200 strict
qualification receipt in the receipts folder:

    rate = family requests / elapsed_s,
    family requests = sum over targets of n_t + controls * sum over uncapped targets of n_c

(every battery runs the whole family: the verifier's with n_t requests for target t, which
is n or a capped target's own cap, and each control's with n_c on the uncapped targets; the
greedy pairing, edge battery and start-up are inside elapsed_s, so they are folded into the
rate; the counts are read from the receipt's members). A run of that many family requests
on N GPUs is then expected to take

    family requests / (N * rate)

seconds: the family is split evenly over the ranks (``pp3cli.evidence.shares``). Not
modelled: a greedy pairing is not split (each runs whole on one rank, a few seconds on a
GPU), and each process's start-up (imports, kernel compilation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pp3cli.receipts.verify import FAIL, verify_receipts

RATE_GPU = "H200"
RATE_PROFILE = "strict"


@dataclass(frozen=True)
class MeasuredRate:
    """Family requests per second of one GPU, and the receipt it was read from."""

    requests_per_s: float
    receipt: str
    status: str  # OK or STALE (verify-receipts)
    gpu_name: str
    requests: int
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _battery_requests(members: list[dict[str, Any]]) -> int:
    """Requests one battery's family ran: per target, its members' (largest) n, summed."""
    per_target: dict[str, int] = {}
    for member in members:
        target = str(member["target"])
        per_target[target] = max(per_target.get(target, 0), int(member["result"]["n"]))
    return sum(per_target.values())


def family_requests(predicate: dict[str, Any]) -> int:
    """Requests a qualification's families ran: the verifier's battery and every control's,
    each counted from its members (a target's requests are its members' n)."""
    data = predicate["data"]
    batteries = [data["members"], *(control["members"] for control in data["controls"])]
    return sum(_battery_requests(members) for members in batteries)


def newest_rate(receipts_dir: Path, root: Path) -> MeasuredRate | None:
    """The rate of the newest verified single-GPU H200 strict PASS qualification, if any."""
    found: list[tuple[str, MeasuredRate]] = []
    for result in verify_receipts(receipts_dir, root=root):
        if not result.file.startswith("qualification-") or result.status == FAIL:
            continue
        predicate = orjson.loads((receipts_dir / result.file).read_bytes())["predicate"]
        data, environment = predicate["data"], predicate["environment"]
        gpu_name = str(environment.get("gpu_name") or "")
        world = int(data.get("distributed", {}).get("world_size", 1))
        if (
            RATE_GPU not in gpu_name
            or predicate["parameters"].get("profile") != RATE_PROFILE
            or predicate["verdict"] != "PASS"
            or world != 1
            or not data.get("elapsed_s")
        ):
            continue
        requests = family_requests(predicate)
        elapsed = float(data["elapsed_s"])
        rate = MeasuredRate(
            requests / elapsed, result.file, result.status, gpu_name, requests, elapsed
        )
        found.append((str(predicate["created_utc"]), rate))
    return max(found, key=lambda item: item[0])[1] if found else None


def expected_wall_s(rate: MeasuredRate, requests: int, ranks: int) -> float:
    """Seconds for ``requests`` family requests spread over ``ranks`` GPUs."""
    return requests / (ranks * rate.requests_per_s)
