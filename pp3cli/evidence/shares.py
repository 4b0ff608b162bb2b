"""A qualification split over ranks: who runs which verifier call, merging, and the check.

Work split (``pp3cli.evidence.qualify.Battery``): a target's n requests are cut into the
same verifier calls as in a single-process run (``call_size``: at most ``batch`` and at
most ceil(n / repeats) requests, positions (target << 40) + 8 r, one run seed). Calls are
numbered over all targets, call c of target t being item ``t * calls_per_target + c``, and
item i belongs to rank ``i mod N``. The union of the ranks' calls is exactly the
single-process set of calls, each call with the same requests in the same batch, so every
verifier (also one whose counters are keyed by the batch index) produces the same outputs,
and the merged counts, G statistics, p-values and verdict are the same for any N.

Per battery (the verifier, then each control) every rank's counts are gathered; their sum
is judged (every rank judges the same sum, so a control stops at the same part everywhere).
Battery i's greedy pairing and edge battery, which are not split (the strict profile's
greedy pairing is one call), run whole on rank i mod N, after all families, so the ranks
run them side by side (``pp3cli.evidence.qualify._batteries_on_ranks``). The receipt
keeps each rank's counts (``distributed.counts``); ``check_rank_counts`` (run by
``verify-receipts``) checks that they add up to the judged counts, member by member.

Pure apart from numpy: ``verify-receipts`` imports ``check_rank_counts`` without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pp3cli.evidence.family import MemberLaw
    from pp3cli.run.ranks import RankGroup

VERIFIER = "verifier"
"""Key of the verifier under test's battery in ``distributed.counts`` (controls: defect)."""

RankCounts = dict[str, list[list[int]]]
"""Member name -> one count vector per rank (rank order)."""


@dataclass
class RankShare:
    """This rank's place in the split, and each battery's per-rank counts as gathered."""

    group: RankGroup
    gathered: list[RankCounts] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.group.rank

    def owns_call(self, target_index: int, call: int, calls_per_target: int) -> bool:
        """Whether this rank runs call ``call`` of target ``target_index``."""
        return self.group.owns(target_index * calls_per_target + call)

    def merge(
        self, laws: Sequence[MemberLaw], counts: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Gather every rank's counts (missing members: zeros) and return their sum.

        The per-rank counts are appended to ``gathered`` (one entry per battery, in order).
        """
        lengths = [len(law.probs) for law in laws]
        own = np.concatenate(
            [
                np.asarray(counts[law.name], dtype=np.int64)
                if law.name in counts
                else np.zeros(length, dtype=np.int64)
                for law, length in zip(laws, lengths, strict=True)
            ]
        )
        table = self.group.gather_counts(own)
        per_rank: RankCounts = {}
        merged: dict[str, np.ndarray] = {}
        start = 0
        for law, length in zip(laws, lengths, strict=True):
            block = table[:, start : start + length]
            per_rank[law.name] = [[int(c) for c in row] for row in block]
            merged[law.name] = block.sum(axis=0)
            start += length
        self.gathered.append(per_rank)
        return merged

    def take(self) -> list[RankCounts]:
        """The per-rank counts gathered since the last ``take``."""
        taken, self.gathered = self.gathered, []
        return taken


def check_rank_counts(data: Mapping[str, Any]) -> list[str]:
    """Problems with a receipt's ``distributed`` block; [] when absent or consistent.

    Checks: one rank record per rank 0..N-1, and for the verifier and every control, for
    every judged member, N count vectors of the member's length whose sum is the member's
    ``observed`` counts (and no per-rank counts for a member that was not judged).
    """
    block = data.get("distributed")
    if block is None:
        return []
    problems: list[str] = []
    world = int(block["world_size"])
    ranks = [int(record["rank"]) for record in block["ranks"]]
    if ranks != list(range(world)):
        problems.append(f"distributed: rank records {ranks} for world size {world}")
    batteries = {VERIFIER: data["members"]} | {
        str(control["defect"]): control["members"] for control in data["controls"]
    }
    stored = block["counts"]
    if set(stored) != set(batteries):
        problems.append(
            f"distributed: per-rank counts for {sorted(stored)}, judged {sorted(batteries)}"
        )
    for battery, members in batteries.items():
        per_member = stored.get(battery, {})
        judged = {str(member["name"]): member for member in members}
        if set(per_member) != set(judged):
            problems.append(f"distributed {battery}: per-rank members differ from the judged")
        for name, member in judged.items():
            vectors = per_member.get(name)
            if vectors is None:
                continue
            observed = [int(c) for c in member["observed"]]
            if len(vectors) != world or any(len(v) != len(observed) for v in vectors):
                problems.append(
                    f"distributed {battery} {name}: expected {world} per-rank vectors of "
                    f"{len(observed)} counts"
                )
                continue
            if any(int(c) < 0 for v in vectors for c in v):
                problems.append(f"distributed {battery} {name}: a negative per-rank count")
            total = [sum(int(v[i]) for v in vectors) for i in range(len(observed))]
            if total != observed:
                problems.append(
                    f"distributed {battery} {name}: per-rank counts do not add up to the "
                    f"judged counts ({sum(total)} vs {sum(observed)} requests)"
                )
    return problems
