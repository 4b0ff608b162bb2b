"""Device-lock behaviour a mutation campaign over ``pp3cli/run/locks.py`` found unpinned.

(2026-12-05, second pass: the first pass's tests are at the end of ``test_locks.py``.)
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pp3cli.run.locks import _open_lock_file, _pid_alive

# A process that dies of SIGHUP (whatever its parent ignores: nohup, a detached shell), says
# so once it is ready, and exits 0 when its stdin closes.
HUP_KILLS_ME = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_asking_whether_a_pid_runs_sends_it_no_signal() -> None:
    """The takeover report says whether the dead holder's pid "still runs": asking must not
    disturb that process (a real signal, e.g. SIGHUP, would kill it)."""
    child = subprocess.Popen(
        [sys.executable, "-c", HUP_KILLS_ME],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        assert _pid_alive(child.pid)
        child.communicate(timeout=30)  # closes stdin: the child ends on its own
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, f"the probed process died of signal {-child.returncode}"
    assert child.returncode != -signal.SIGHUP


def test_a_lock_file_is_created_mode_0666_even_when_fchmod_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_open_lock_file``: "Open (creating, mode 0666)"; the later fchmod is best effort."""

    def refused(fd: int, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refused)
    old = os.umask(0)
    try:
        path = tmp_path / "host-x.lock"
        fd = _open_lock_file(path)  # a failing fchmod is not an error
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o666
