"""The guard: the context every GPU command runs in.

``guarded`` takes pp3's non-blocking lock on its device (one per GPU, by UUID, or one per
host in the interpreter, in a system folder: ``pp3cli.run.locks``; a second pp3 on the same
device fails at once, naming the holder), pins the CPUs, lowers the priority, fixes the
thread count, and records the GPU power limit before and after (``pp3cli.run.power``,
read-only: pp3 never changes a power limit, a clock or any other device setting).
``GuardRecord.environment()`` is a receipt's environment block.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.locks import device_lock_name, hold_device, hold_scratch, lock_dir
from pp3cli.run.power import PowerReading, read_power
from pp3cli.run.scratch import RUN_TAG, RUNS_DIR, ensure_scratch, has_marker, new_run_dir
from pp3cli.run.settings import Settings

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
POWER_TOLERANCE_W = 0.5


@dataclass(frozen=True)
class GuardOptions:
    """How a guarded command runs (see the option aliases below for the flags)."""

    cpus: str | None = None
    nice: int = 19
    threads: int = 8
    expect_power_limit: float | None = None
    detach: bool = False
    lock: bool = True  # False: a CPU rank of a distributed run; local rank 0 holds the host's


def parse_cpu_list(text: str) -> list[int]:
    """Parse taskset list syntax: ``0,3,8-11`` or ``0-10:2`` (range with stride); sorted, unique."""
    cpus: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        try:
            if "-" in item:
                span, _, stride_text = item.partition(":")
                first_text, _, last_text = span.partition("-")
                first, last = int(first_text), int(last_text)
                stride = int(stride_text) if stride_text else 1
                if first < 0 or last < first or stride < 1:
                    raise ValueError(item)
                cpus.update(range(first, last + 1, stride))
            else:
                cpu = int(item)
                if cpu < 0:
                    raise ValueError(item)
                cpus.add(cpu)
        except ValueError:
            raise UsageProblem(
                f"--cpus {text!r}: {item!r} is not a CPU number or range; "
                "expected taskset list syntax such as 12-15,28-31"
            ) from None
    return sorted(cpus)


def format_cpu_list(cpus: Sequence[int]) -> str:
    """Inverse of :func:`parse_cpu_list` for display: ``[0,1,2,5]`` -> ``0-2,5``."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[index], ordered[end]
        parts.append(str(first) if first == last else f"{first}-{last}")
        index = end + 1
    return ",".join(parts)


def _checked_cpus(text: str) -> list[int]:
    cpus = parse_cpu_list(text)
    available = os.sched_getaffinity(0)
    absent = [cpu for cpu in cpus if cpu not in available]
    if absent:
        raise UsageProblem(
            f"--cpus {text!r}: CPU(s) {format_cpu_list(absent)} do not exist or are not "
            f"allowed here; this process may use {format_cpu_list(sorted(available))}"
        )
    return cpus


def guard_options(
    cpus: str | None,
    nice: int,
    threads: int,
    expect_power_limit: float | None,
    detach: bool,
) -> GuardOptions:
    """Validate the guard flags (UsageProblem naming the bad value) and bundle them."""
    if cpus is not None:
        _checked_cpus(cpus)
    if not -20 <= nice <= 19:
        raise UsageProblem(f"--nice {nice} is outside -20..19")
    if threads < 1:
        raise UsageProblem(f"--threads {threads} must be at least 1")
    if expect_power_limit is not None and not expect_power_limit > 0:
        raise UsageProblem(f"--expect-power-limit {expect_power_limit} must be positive watts")
    return GuardOptions(cpus, nice, threads, expect_power_limit, detach)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class GuardRecord:
    """What the guard did and saw; ``environment()`` is the receipt's environment block."""

    command: str
    lock_path: Path
    run_dir: Path
    started_utc: str
    cuda_available: bool
    affinity: list[int]
    nice: int
    threads: int
    before: PowerReading
    after: PowerReading | None = None
    active: bool = field(default=True, repr=False)

    def measure_after(self) -> None:
        """Read the power limit again (the guard does so on exit; call it to record earlier)."""
        self.after = read_power(self.cuda_available)

    def environment(self) -> dict[str, Any]:
        """JSON-safe environment block. Inside the block the 'after' limit is read now."""
        if self.active:
            self.measure_after()
        after = self.after
        gpu_name = self.before.gpu_name
        if self.cuda_available:
            import torch

            gpu_name = torch.cuda.get_device_name(0)
        return {
            "command": self.command,
            "gpu_name": gpu_name,
            "driver": self.before.driver,
            "torch": _version("torch"),
            "triton": _version("triton"),
            "python": platform.python_version(),
            "cuda_available": self.cuda_available,
            "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
            "power_limit_before_w": self.before.limit_w,
            "power_limit_after_w": None if after is None else after.limit_w,
            "power_management_limit_w": self.before.management_w,
            "nvml_error": self.before.error,
            "affinity": list(self.affinity),
            "nice": self.nice,
            "threads": self.threads,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "lock_path": str(self.lock_path),
            "run_dir": str(self.run_dir),
            "started_utc": self.started_utc,
        }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_dir_for(settings: Settings, root: Path, command: str) -> Path:
    """The run folder a detached parent prepared (PP3_RUN_DIR), else a new one."""
    inherited = os.environ.get("PP3_RUN_DIR")
    if inherited:
        candidate = Path(inherited)
        if (
            candidate.parent == root / RUNS_DIR
            and candidate.name.startswith(f"{command}-")
            and has_marker(candidate, RUN_TAG)
        ):
            return candidate
    return new_run_dir(settings, command)


@contextmanager
def guarded(
    command: str,
    settings: Settings,
    options: GuardOptions,
    *,
    require_gpu: bool,
    device: int | str | None = None,
    precheck: Callable[[bool], None] | None = None,
) -> Iterator[GuardRecord]:
    """Run the block under pp3's device lock with affinity, nice and threads applied.

    ``device`` is the CUDA device this process works on (torch index or ``GPU-<uuid>``;
    default torch's current device): each rank of a distributed run passes its own and so
    locks its own GPU. Without a GPU the lock is the host's. ``precheck(cuda_available)`` is
    the command's own check of the machine (raising EnvironmentProblem or UsageProblem).

    Order: GPU present if ``require_gpu`` -> ``precheck`` -> the device lock
    (EnvironmentProblem at once if held) -> power limit read, compared with
    ``expect_power_limit`` (EnvironmentProblem) -> the scratch root, held shared -> the run
    folder -> affinity, nice, threads -> block: nothing is created in scratch before every
    check has passed. On exit the power limit is read again and the affinity, thread
    variables and torch threads are restored (niceness cannot be lowered
    by an unprivileged process, so it stays).
    """
    cpus = _checked_cpus(options.cpus) if options.cpus is not None else None
    if not 1 <= options.threads:
        raise UsageProblem(f"threads {options.threads} must be at least 1")
    import torch

    cuda_available = bool(torch.cuda.is_available())
    if require_gpu and not cuda_available:
        raise EnvironmentProblem(
            f"no GPU: {command} needs a CUDA GPU and torch {torch.__version__} sees none "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    if precheck is not None:
        precheck(cuda_available)
    lock_name = device_lock_name(device, cuda_available=cuda_available)
    with ExitStack() as held:
        if options.lock:
            lock_path = held.enter_context(hold_device(lock_name, command))
        else:  # a distributed rank whose host lock another local rank holds
            lock_path = lock_dir() / f"{lock_name}.lock"
        before = read_power(cuda_available)
        if options.expect_power_limit is not None:
            actual = before.limit_w
            if actual is None:
                raise EnvironmentProblem(
                    f"--expect-power-limit {options.expect_power_limit:g} W given but the power "
                    f"limit cannot be read ({before.error})"
                )
            if abs(actual - options.expect_power_limit) > POWER_TOLERANCE_W:
                raise EnvironmentProblem(
                    f"GPU power limit is {actual:g} W, expected {options.expect_power_limit:g} W "
                    "(--expect-power-limit); pp3 never changes it: set it yourself or drop "
                    "the option"
                )
        root = ensure_scratch(settings)
        held.enter_context(hold_scratch(root, command, exclusive=False))
        saved_affinity = os.sched_getaffinity(0)
        saved_env = {name: os.environ.get(name) for name in THREAD_VARIABLES}
        saved_threads = torch.get_num_threads()
        try:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            current_nice = os.nice(0)
            if options.nice > current_nice:
                os.nice(options.nice - current_nice)
            for name in THREAD_VARIABLES:
                os.environ[name] = str(options.threads)
            torch.set_num_threads(options.threads)
            record = GuardRecord(
                command=command,
                lock_path=lock_path,
                run_dir=_run_dir_for(settings, root, command),
                started_utc=_utc_now(),
                cuda_available=cuda_available,
                affinity=sorted(os.sched_getaffinity(0)),
                nice=os.nice(0),
                threads=options.threads,
                before=before,
            )
            try:
                yield record
            finally:
                record.active = False
                record.measure_after()
        finally:
            os.sched_setaffinity(0, saved_affinity)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            torch.set_num_threads(saved_threads)
