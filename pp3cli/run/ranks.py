"""Distributed runs: where a rank sits, its process group, its exchanges, and the launcher.

``torchrun --nproc-per-node N -m pp3cli qualify ...`` starts N ranks; ``pp3 qualify --gpus N``
launches exactly that through ``torch.distributed.run`` (its Python API, ``launch`` below).
torchrun's agent sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in each
worker; ``RankPlace.from_environment`` reads them (None: not distributed, today's path).

- Backend: NCCL when CUDA is available (rank r of a host uses ``cuda:<local rank>``), gloo
  on CPUs (the interpreter; CI tests the path with 2 CPU processes).
- CPUs: the CPUs this process may use (``--cpus`` or the inherited affinity) are split into
  ``LOCAL_WORLD_SIZE`` contiguous, disjoint blocks, one per local rank (``split_cpus``).
- Failure: every exchange has a timeout (``EXCHANGE_TIMEOUT_S``); an exchange that fails
  (a peer died, closed its connection, or did not arrive in time) raises ``RankFailed``
  (exit 5). When a worker dies, torchrun's agent (monitor interval 0.1 s) stops the others
  with SIGTERM and reports the failure; ``launch`` turns that into ``RankFailed``. Rank 0
  writes the receipt only after the last exchange, so a failed run leaves no receipt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pp3cli.run.errors import RankFailed, UsageProblem

if TYPE_CHECKING:
    import numpy as np

EXCHANGE_TIMEOUT_S = 900.0
"""Longest wait at one exchange (init, gather). Ranks meet once per battery; the longest
legitimate wait is a greedy pairing and edge battery on one rank (seconds on a GPU), so this only
bounds a rank that hangs without dying; a dead rank is noticed at once (closed socket) or by
torchrun's agent within its 0.1 s monitor interval."""

ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class RankPlace:
    """Where this process sits in a torchrun worker group."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environment(cls) -> RankPlace | None:
        """The place torchrun's agent wrote into the environment; None outside torchrun."""
        if "WORLD_SIZE" not in os.environ:
            return None
        values = {}
        for name in ENVIRONMENT:
            text = os.environ.get(name)
            if text is None or not text.isdigit():
                raise UsageProblem(
                    f"{name}={text!r}: a distributed run needs RANK, WORLD_SIZE, LOCAL_RANK and "
                    "LOCAL_WORLD_SIZE as torchrun sets them; start it with `torchrun "
                    "--nproc-per-node N -m pp3cli qualify ...` or `pp3 qualify --gpus N`"
                )
            values[name] = int(text)
        place = cls(
            values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"]
        )
        if not (
            0 <= place.rank < place.world_size and 0 <= place.local_rank < place.local_world_size
        ):
            raise UsageProblem(f"{place}: expected 0 <= rank < world size, local alike")
        return place

    def device(self, cuda: bool) -> str:
        """The rank's device: ``cuda:<local rank>`` on GPUs, else ``cpu``."""
        return f"cuda:{self.local_rank}" if cuda else "cpu"

    def uses_gpu(self) -> bool:
        """Whether this rank works on a GPU (``cuda:<local rank>``): CUDA is available."""
        import torch

        return bool(torch.cuda.is_available())

    def takes_lock(self) -> bool:
        """Whether this rank takes pp3's device lock itself (the guard's, non-blocking).

        No rank ever waits for a lock, so two local ranks cannot deadlock. A GPU rank takes
        its own GPU's lock (``pp3cli.run.locks``: one per device UUID), so a second pp3 on
        any of those GPUs is refused (exit 3) and torchrun stops the group. Without GPUs the
        lock is the host's: local rank 0 takes it for its host's ranks, the others none.
        """
        return self.local_rank == 0 or self.uses_gpu()


def split_cpus(cpus: Sequence[int], local_rank: int, local_world_size: int) -> list[int]:
    """Local rank r's block of ``cpus``: contiguous, disjoint, sizes differing by at most one.

    With fewer CPUs than local ranks, ranks share: rank r gets ``cpus[r % len(cpus)]``.
    """
    ordered = sorted(set(cpus))
    if not ordered:
        raise UsageProblem("no CPUs to split across ranks")
    if len(ordered) < local_world_size:
        return [ordered[local_rank % len(ordered)]]
    base, extra = divmod(len(ordered), local_world_size)
    start = local_rank * base + min(local_rank, extra)
    return ordered[start : start + base + (1 if local_rank < extra else 0)]


@dataclass
class RankGroup:
    """A live process group: which work items this rank owns, and the exchanges."""

    place: RankPlace
    backend: str
    device: str

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def world_size(self) -> int:
        return self.place.world_size

    def owns(self, item: int) -> bool:
        """Work item ``item`` (numbered globally, from 0) belongs to rank ``item % world``."""
        return item % self.place.world_size == self.place.rank

    def gather_counts(self, counts: np.ndarray) -> np.ndarray:
        """Every rank's int64 vector ``counts`` (same length everywhere): [world, length]."""
        import numpy as np
        import torch
        import torch.distributed as dist

        vector = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.int64)).to(self.device)
        parts = [torch.empty_like(vector) for _ in range(self.world_size)]
        with _exchange(self, "gather counts"):
            dist.all_gather(parts, vector)
        return torch.stack(parts).cpu().numpy()

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's picklable ``value``, by rank."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        with _exchange(self, "gather rank records"):
            dist.all_gather_object(gathered, value)
        return gathered


@contextmanager
def _exchange(group: RankGroup, what: str) -> Iterator[None]:
    """Turn a failed collective (a peer died or timed out) into ``RankFailed``."""
    try:
        yield
    except RuntimeError as err:  # torch.distributed's errors derive from RuntimeError
        raise RankFailed(
            f"rank {group.rank}/{group.world_size}: {what} failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no message'}); another rank died or "
            f"did not answer within {EXCHANGE_TIMEOUT_S:g} s; no receipt is written"
        ) from err


@contextmanager
def process_group(place: RankPlace, cuda: bool) -> Iterator[RankGroup]:
    """Join torchrun's group (NCCL on GPUs, gloo on CPUs) with a timeout; leave it on exit."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if cuda else "gloo"
    device = place.device(cuda)
    if cuda:
        if place.local_rank >= torch.cuda.device_count():
            raise UsageProblem(
                f"local rank {place.local_rank} has no GPU: torch sees "
                f"{torch.cuda.device_count()}; start at most that many ranks per host"
            )
        torch.cuda.set_device(place.local_rank)
    group = RankGroup(place, backend, device)
    try:
        with _exchange(group, f"joining the {backend} group"):
            dist.init_process_group(
                backend,
                timeout=timedelta(seconds=EXCHANGE_TIMEOUT_S),
                device_id=torch.device(device) if cuda else None,
            )
        yield group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def torchrun_arguments(world_size: int, arguments: Sequence[str], module: str) -> list[str]:
    """The torchrun command line after ``torchrun``: one host, ``world_size`` workers.

    ``torchrun --nproc-per-node N -m pp3cli ARGS``; with one node and no rendezvous
    endpoint torchrun picks a free local port itself, so concurrent runs do not collide.
    """
    return ["--nproc-per-node", str(world_size), "-m", module, *arguments]


def launch(world_size: int, arguments: Sequence[str], *, module: str = "pp3cli") -> None:
    """Run ``torchrun --nproc-per-node N -m <module> ARGS`` through ``torch.distributed.run``.

    Returns when every worker exited 0; RankFailed (exit 5) names the failed ranks and
    their exit codes when any did not (torchrun has then stopped the others).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if world_size < 1:
        raise UsageProblem(f"--gpus {world_size}: expected at least 1")
    try:
        parsed = parse_args(torchrun_arguments(world_size, arguments, module))  # type: ignore[no-untyped-call]
        run(parsed)  # type: ignore[no-untyped-call]
    except ChildFailedError as err:
        failed = ", ".join(
            f"rank {rank} exit {failure.exitcode}" for rank, failure in sorted(err.failures.items())
        )
        raise RankFailed(
            f"distributed run of {world_size} ranks failed ({failed}); torchrun stopped the "
            "other ranks; no receipt is written"
        ) from None


def strip_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` / ``option=VALUE`` (the launcher's own option)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept
