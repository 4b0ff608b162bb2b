"""The device lock: one per GPU (by UUID) or per host, in a folder independent of scratch."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import torch

import pp3cli.run.locks as locks_module
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.guard import GuardOptions, guarded
from pp3cli.run.locks import (
    DEFAULT_LOCK_DIR,
    _ensure_lock_dir,
    _open_lock_file,
    _pid_alive,
    device_lock_name,
    gpu_uuid,
    hold_device,
    hold_scratch,
    lock_dir,
)
from pp3cli.run.scratch import ensure_scratch
from pp3cli.run.settings import Settings

DIES_HOLDING = textwrap.dedent(
    """
    import os, signal, sys
    from pp3cli.run.locks import hold_device
    with hold_device(sys.argv[1], "killed-command"):
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def options() -> GuardOptions:
    return GuardOptions(nice=os.nice(0), threads=1)


def test_the_lock_folder_is_fixed_and_only_the_variable_moves_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PP3_LOCK_DIR")
    monkeypatch.setenv("PP3_SCRATCH", str(tmp_path / "elsewhere"))
    assert lock_dir() == DEFAULT_LOCK_DIR == Path("/tmp/pp3-locks")
    monkeypatch.setenv("PP3_LOCK_DIR", str(tmp_path / "locks"))
    assert lock_dir() == tmp_path / "locks"


def test_two_scratch_roots_on_one_device_are_refused(
    tmp_path: Path, private_lock_dir: Path
) -> None:
    """Finding 2: the lock used to live in scratch, so another PP3_SCRATCH was not refused."""
    first = Settings(scratch=tmp_path / "scratch-a", receipts=tmp_path / "r")
    second = Settings(scratch=tmp_path / "scratch-b", receipts=tmp_path / "r")
    with guarded("first", first, options(), require_gpu=False) as record:
        assert record.lock_path.parent == private_lock_dir
        assert not record.lock_path.is_relative_to(tmp_path / "scratch-a")
        with pytest.raises(EnvironmentProblem) as err:
            with guarded("second", second, options(), require_gpu=False):
                pass
    message = str(err.value)
    assert err.value.exit_code == 3 and f"pid {os.getpid()}" in message, message
    assert "command first" in message and "in use by another pp3" in message, message
    assert not (tmp_path / "scratch-b").exists()  # refused before anything was created


def test_a_lock_left_by_a_dead_process_is_reported_and_taken_over(tmp_path: Path) -> None:
    name = device_lock_name(None, cuda_available=False)
    died = subprocess.run(
        [sys.executable, "-c", DIES_HOLDING, name], capture_output=True, text=True, timeout=60
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    left = orjson.loads((lock_dir() / f"{name}.lock").read_bytes())
    assert left["command"] == "killed-command"
    heard: list[str] = []
    with hold_device(name, "next", notify=heard.append) as path:
        assert orjson.loads(path.read_bytes())["pid"] == os.getpid()
    assert len(heard) == 1 and f"pid {left['pid']}" in heard[0], heard
    assert "killed-command" in heard[0] and "died holding it" in heard[0], heard


def test_each_device_has_its_own_lock_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks of one run lock their own GPUs; one card is one lock under any name."""
    uuids = ["8f3c0000-0000-0000-0000-000000000000", "11110000-0000-0000-0000-000000000001"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=uuids[index])
    )
    assert gpu_uuid(1) == gpu_uuid("1") == f"GPU-{uuids[1]}"
    assert gpu_uuid(f"GPU-{uuids[0]}") == f"GPU-{uuids[0]}"
    first = device_lock_name(0, cuda_available=True)
    second = device_lock_name(1, cuda_available=True)
    assert first == f"gpu-GPU-{uuids[0]}" and second == f"gpu-GPU-{uuids[1]}"
    with hold_device(first, "rank0"), hold_device(second, "rank1"):
        with pytest.raises(EnvironmentProblem, match="rank0"):
            with hold_device(device_lock_name(f"GPU-{uuids[0]}", cuda_available=True), "again"):
                pass
    with pytest.raises(UsageProblem, match="2 CUDA device"):
        gpu_uuid(2)


def test_gpu_uuid_through_nvml_follows_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pynvml

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    for name, function in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda handle: f"GPU-physical-{handle}".encode(),
    }.items():
        monkeypatch.setattr(pynvml, name, function)
    assert gpu_uuid(0) == "GPU-physical-3" and gpu_uuid(1) == "GPU-physical-1"


def test_clean_scratch_is_refused_while_a_run_uses_the_scratch(tmp_path: Path) -> None:
    root = ensure_scratch(Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r"))
    with hold_scratch(root, "run-a", exclusive=False), hold_scratch(root, "run-b", exclusive=False):
        with pytest.raises(EnvironmentProblem, match="another pp3 is running"):
            with hold_scratch(root, "clean-scratch", exclusive=True):
                pass
    with hold_scratch(root, "clean-scratch", exclusive=True):
        with pytest.raises(EnvironmentProblem, match="clean-scratch"):
            with hold_scratch(root, "run", exclusive=False):
                pass


def test_a_link_planted_as_the_lock_file_is_refused(tmp_path: Path) -> None:
    name = device_lock_name(None, cuda_available=False)
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    lock_dir().mkdir(parents=True, exist_ok=True)
    (lock_dir() / f"{name}.lock").symlink_to(target)
    with pytest.raises(EnvironmentProblem, match="symbolic link"):
        with hold_device(name, "x"):
            pass
    assert target.read_text() == "keep me\n"


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-05)


def test_pid_alive_tells_a_running_process_from_a_reaped_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not _pid_alive(child.pid)

    def not_yours(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_yours)
    assert _pid_alive(child.pid), "a process of another user is alive"


def test_a_lock_file_is_everyones_only_when_it_is_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        ours = tmp_path / "ours.lock"
        os.close(_open_lock_file(ours))
        assert stat.S_IMODE(os.lstat(ours).st_mode) == 0o666, "other users must lock it too"
        theirs = tmp_path / "theirs.lock"
        theirs.touch(mode=0o600)
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)  # the file is now someone else's
        os.close(_open_lock_file(theirs))
        assert stat.S_IMODE(os.lstat(theirs).st_mode) == 0o600, "another's file is left alone"
    finally:
        os.umask(old)
    with pytest.raises(EnvironmentProblem) as err:
        _open_lock_file(ours / "below-a-file.lock")
    assert "cannot open the lock file" in str(err.value)
    assert "symbolic link" not in str(err.value), "only ELOOP is called a link"


def test_only_the_fixed_lock_folder_is_opened_to_everyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        private = tmp_path / "a" / "b" / "locks"  # parents made too
        _ensure_lock_dir(private)
        assert stat.S_IMODE(os.lstat(private).st_mode) == 0o755
        fixed = tmp_path / "fixed"
        monkeypatch.setattr(locks_module, "DEFAULT_LOCK_DIR", fixed)
        _ensure_lock_dir(fixed)
        assert stat.S_IMODE(os.lstat(fixed).st_mode) == 0o1777, "sticky, everyone may lock"
        other = tmp_path / "other-owner"
        other.mkdir()
        real = os.getuid()
        monkeypatch.setattr(locks_module, "DEFAULT_LOCK_DIR", other)
        monkeypatch.setattr(os, "getuid", lambda: real + 1)
        _ensure_lock_dir(other)
        assert stat.S_IMODE(os.lstat(other).st_mode) == 0o755, "another's folder is left alone"
    finally:
        os.umask(old)
    monkeypatch.undo()
    linked = tmp_path / "linked-locks"
    linked.symlink_to(private, target_is_directory=True)
    with pytest.raises(EnvironmentProblem, match="is not a folder"):
        _ensure_lock_dir(linked)


def test_a_lock_names_whether_the_dead_holders_pid_still_runs(private_lock_dir: Path) -> None:
    name = "host-test"
    path = private_lock_dir / f"{name}.lock"
    heard: list[str] = []
    for pid, state in [(os.getpid(), "still runs (pid reused?)"), ("?", "is gone")]:
        path.write_bytes(orjson.dumps({"pid": pid, "command": "old", "holder": "x"}))
        with hold_device(name, "next", notify=heard.append):
            pass
        assert heard[-1].endswith(f"that pid {state}"), heard[-1]
        assert path.stat().st_size == 0, "a clean exit empties the record"


def test_an_unreadable_record_is_shown_cut_to_200_characters(private_lock_dir: Path) -> None:
    name = "host-garbled"
    (private_lock_dir / f"{name}.lock").write_bytes(b"{" + b"x" * 499)
    heard: list[str] = []
    with hold_device(name, "next", notify=heard.append):
        pass
    shown = "{" + "x" * 199
    assert f"record is unreadable ({shown!r})" in heard[0], heard[0]
