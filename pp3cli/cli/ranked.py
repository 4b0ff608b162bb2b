"""What a receipt-writing command does differently as one rank of a torchrun worker group.

- ``rank_run_options``: the rank's guard: its own block of the CPUs (``--cpus`` or the
  inherited affinity, split over the host's ranks by ``pp3cli.run.ranks.split_cpus``),
  at most that many threads, and pp3's lock taken by local rank 0 only
  (``RankPlace.takes_lock``).
- ``run_as_rank``: joins the group (NCCL on GPUs, gloo on CPUs), runs the rank's share,
  and gathers every rank's record (device, host, pid, CPUs, lock, wall time). Rank 0 gets
  the receipt's ``distributed`` block; the other ranks get None and write nothing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pp3cli.cli.options import RunOptions
from pp3cli.run.errors import UsageProblem

if TYPE_CHECKING:
    from pp3cli.evidence.qualify import QualificationReport
    from pp3cli.evidence.shares import RankShare
    from pp3cli.run.guard import GuardRecord
    from pp3cli.run.ranks import RankPlace


def rank_run_options(place: RankPlace, run: RunOptions) -> RunOptions:
    """The run options of one rank: its CPU block, its thread count, its lock duty."""
    from pp3cli.run.guard import format_cpu_list, parse_cpu_list
    from pp3cli.run.ranks import split_cpus

    if run.guard.detach:
        raise UsageProblem(
            "--detach inside a torchrun worker: detach the launcher instead "
            "(`pp3 qualify --gpus N --detach`)"
        )
    cpus = (
        parse_cpu_list(run.guard.cpus)
        if run.guard.cpus is not None
        else sorted(os.sched_getaffinity(0))
    )
    own = split_cpus(cpus, place.local_rank, place.local_world_size)
    guard = replace(
        run.guard,
        cpus=format_cpu_list(own),
        threads=min(run.guard.threads, len(own)),
        lock=place.takes_lock(),
    )
    return replace(run, guard=guard)


def run_as_rank(
    place: RankPlace,
    record: GuardRecord,
    started: float,
    qualification: Callable[[RankShare | None, str], QualificationReport],
) -> tuple[QualificationReport, dict[str, Any] | None]:
    """Run this rank's share; rank 0 also gets the receipt's ``distributed`` block."""
    from pp3cli.evidence.shares import RankShare
    from pp3cli.run.ranks import process_group

    cuda = record.cuda_available
    with process_group(place, cuda) as group:
        report = qualification(RankShare(group), group.device)
        gpu_name = None
        if cuda:
            import torch

            gpu_name = torch.cuda.get_device_name(place.local_rank)
        own = {
            "rank": place.rank,
            "local_rank": place.local_rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "device": group.device,
            "gpu_name": gpu_name,
            "affinity": list(record.affinity),
            "threads": record.threads,
            "holds_lock": place.takes_lock(),
            "wall_s": round(time.monotonic() - started, 3),
        }
        records = group.gather_objects(own)  # the last exchange: every rank is alive here
    if place.rank != 0:
        return report, None
    return report, {
        "world_size": place.world_size,
        "backend": group.backend,
        "ranks": records,
        "counts": report.rank_counts,
    }
