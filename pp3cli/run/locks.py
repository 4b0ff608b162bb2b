"""pp3's locks: one per device in a fixed system folder, and one on each scratch root.

**Device lock.** Two pp3 runs must never time or qualify on the same device at once,
whatever their scratch roots. Each device has one lock file in ``lock_dir()`` —
``/tmp/pp3-locks`` (the environment variable ``PP3_LOCK_DIR`` overrides it, for tests),
a folder every user can write (mode 1777) so that two users are refused too:

- a GPU: ``gpu-<UUID>.lock``, the UUID NVML and CUDA give the card (``GPU-8f3c...``), so
  the same card is one lock whatever ``CUDA_VISIBLE_DEVICES`` or index names it;
- no GPU (Triton's interpreter on the CPU): ``host-<hostname>.lock``, one per host.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on that file: taken without waiting (a contender
fails at once, exit 3, naming the holder), and released by the kernel when the holder
exits in any way, so a lock can never outlive its process. While held, the file's content
is the holder's record (JSON: holder, pid, command, argv, device, host, start time); on a
clean exit it is emptied. A record found on a lock that is free was left by a process that
died holding it: the new holder reports it (pid, command, and whether that pid still
runs) and takes the lock over. Lock files are never unlinked (unlinking a lock file races
with a process that has it open), and are opened without following links.

**Scratch lock.** ``<scratch>/pp3.lock``: every guarded run holds it shared, and
``clean-scratch`` holds it exclusive, so cleaning never removes a running run's folder
while runs on different devices (one rank per GPU) share one scratch root.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import os
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from pp3cli.run.errors import EnvironmentProblem, UsageProblem

LOCK_DIR_VARIABLE = "PP3_LOCK_DIR"
DEFAULT_LOCK_DIR = Path("/tmp/pp3-locks")
SCRATCH_LOCK_NAME = "pp3.lock"

__all__ = [
    "DEFAULT_LOCK_DIR",
    "LOCK_DIR_VARIABLE",
    "SCRATCH_LOCK_NAME",
    "device_lock_name",
    "gpu_uuid",
    "hold_device",
    "hold_scratch",
    "lock_dir",
]


def lock_dir() -> Path:
    """The device locks' folder: ``$PP3_LOCK_DIR``, else ``/tmp/pp3-locks``."""
    return Path(os.environ.get(LOCK_DIR_VARIABLE) or DEFAULT_LOCK_DIR)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_uuid(device: int | str) -> str:
    """The UUID (``GPU-...``) of a CUDA device given by torch index or by UUID.

    An index is torch's (relative to ``CUDA_VISIBLE_DEVICES``): its UUID comes from CUDA
    (``torch.cuda.get_device_properties``), which sees the same order torch does, and is
    confirmed through NVML; without a torch UUID, NVML maps the index through
    ``CUDA_VISIBLE_DEVICES``. UsageProblem for an index with no device.
    """
    if isinstance(device, str):
        if device.startswith(("GPU-", "MIG-")):
            return device
        if not device.isdigit():
            raise UsageProblem(f"device {device!r}: expected a CUDA index or a GPU-<uuid>")
        device = int(device)
    import torch

    if not 0 <= device < torch.cuda.device_count():
        raise UsageProblem(
            f"device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    from_cuda = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if from_cuda is not None:
        return f"GPU-{from_cuda}"
    import pynvml

    pynvml.nvmlInit()
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entry = str(device)
        if visible is not None:
            entry = [part.strip() for part in visible.split(",")][device]
        if entry.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        else:
            handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
        return _text(pynvml.nvmlDeviceGetUUID(handle))
    finally:
        pynvml.nvmlShutdown()


def device_lock_name(device: int | str | None, *, cuda_available: bool) -> str:
    """``gpu-<UUID>`` for a CUDA device (default: torch's current one), else ``host-<name>``."""
    if not cuda_available:
        return f"host-{socket.gethostname()}"
    if device is None:
        import torch

        device = torch.cuda.current_device()
    return f"gpu-{gpu_uuid(device)}"


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _open_lock_file(path: Path) -> int:
    """Open (creating, mode 0666) a lock file without following a link; EnvironmentProblem."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        raise EnvironmentProblem(
            f"cannot open the lock file {path}: {err.strerror}"
            + (" (it is a symbolic link)" if err.errno == errno.ELOOP else "")
        ) from None
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)  # whatever the umask: other users must be able to lock it
    except OSError:
        pass
    return fd


def _ensure_lock_dir(folder: Path) -> None:
    """Create the lock folder (mode 1777: everyone may lock, nobody may unlink another's)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mode = os.lstat(folder)
        if not stat.S_ISDIR(mode.st_mode):
            raise EnvironmentProblem(f"lock folder {folder} is not a folder (a link?)")
        if mode.st_uid == os.getuid() and folder == DEFAULT_LOCK_DIR:
            os.chmod(folder, 0o1777)
    except OSError as err:
        raise EnvironmentProblem(
            f"cannot use the lock folder {folder}: {err.strerror}; set {LOCK_DIR_VARIABLE}"
        ) from None


def _read_record(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    try:
        record = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError:
        return {"unreadable": raw[:200].decode(errors="replace")}
    return record if isinstance(record, dict) else None


def _write_record(fd: int, record: dict[str, Any] | None) -> None:
    os.ftruncate(fd, 0)
    if record is not None:
        os.pwrite(fd, orjson.dumps(record, option=orjson.OPT_SORT_KEYS) + b"\n", 0)
    os.fsync(fd)


def describe_holder(record: dict[str, Any] | None) -> str:
    """A person's description of a lock record."""
    if not record:
        return "a process that has not yet written its record"
    if "unreadable" in record:
        return f"a process whose record is unreadable ({record['unreadable']!r})"
    return (
        f"pid {record.get('pid')} of {record.get('holder')} (command {record.get('command')}, "
        f"started {record.get('started_utc')} on {record.get('hostname')})"
    )


@contextmanager
def hold_device(
    name: str,
    command: str,
    *,
    notify: Callable[[str], None] | None = None,
    folder: Path | None = None,
) -> Iterator[Path]:
    """Hold the device lock ``<lock_dir>/<name>.lock`` without waiting; yield its path.

    ``name`` comes from :func:`device_lock_name`. EnvironmentProblem (exit 3) naming the
    holder when another process holds it. ``notify`` (default: stderr) hears about a lock
    left by a process that died holding it, which is then taken over.
    """
    where = folder or lock_dir()
    _ensure_lock_dir(where)
    path = where / f"{name}.lock"
    fd = _open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvironmentProblem(
                f"{name} is in use by another pp3: {describe_holder(_read_record(fd))}; "
                f"wait for it to finish (lock {path})"
            ) from None
        left = _read_record(fd)
        if left:
            pid = left.get("pid")
            state = (
                "still runs (pid reused?)"
                if isinstance(pid, int) and _pid_alive(pid)
                else ("is gone")
            )
            (notify or _stderr)(
                f"pp3: taking over the lock {path} left by {describe_holder(left)}, "
                f"which died holding it; that pid {state}"
            )
        _write_record(
            fd,
            {
                "holder": _user(),
                "pid": os.getpid(),
                "command": command,
                "argv": list(sys.argv),
                "device": name,
                "hostname": socket.gethostname(),
                "started_utc": _utc_now(),
            },
        )
        try:
            yield path
        finally:
            _write_record(fd, None)
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def hold_scratch(root: Path, command: str, *, exclusive: bool) -> Iterator[Path]:
    """Hold ``<root>/pp3.lock`` shared (a run) or exclusive (clean-scratch), without waiting.

    EnvironmentProblem (exit 3) when the other kind holds it: a run while the scratch is
    being cleaned, or cleaning while a run uses it (naming the run when it is exclusive).
    """
    path = root / SCRATCH_LOCK_NAME
    fd = _open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            if exclusive:
                raise EnvironmentProblem(
                    f"another pp3 is running with scratch root {root}; wait for it to finish "
                    f"before {command} (lock {path})"
                ) from None
            raise EnvironmentProblem(
                f"scratch root {root} is held by {describe_holder(_read_record(fd))}; "
                f"wait for it to finish (lock {path})"
            ) from None
        if exclusive:
            _write_record(
                fd,
                {"holder": _user(), "pid": os.getpid(), "command": command,
                 "hostname": socket.gethostname(), "started_utc": _utc_now()},
            )  # fmt: skip
        try:
            yield path
        finally:
            if exclusive:
                _write_record(fd, None)
    finally:
        os.close(fd)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
