"""``--detach``: re-run a guarded command inside pp3's private tmux server.

The detached run survives the terminal; its output goes to ``<scratch>/runs/<id>/log`` and
its exit status to ``exit_status`` beside it. The server is pp3's own (socket under the
scratch root) and ``clean-scratch`` stops it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pp3cli.run.errors import EnvironmentProblem
from pp3cli.run.locks import device_lock_name, hold_device, hold_scratch
from pp3cli.run.scratch import TMUX_CONF, ensure_scratch, new_run_dir, tmux_socket
from pp3cli.run.settings import Settings

# Variables a detached run takes from the shell that launched it, not from the tmux server.
_DETACH_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "TRITON_INTERPRET",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)
_TMUX_CONF_TEXT = (
    "# pp3's private tmux server: written by pp3, removed by clean-scratch.\n"
    "set-option -g default-shell /bin/sh\n"
    "set-window-option -g remain-on-exit on\n"
    "set-option -g history-limit 100000\n"
)


def _detach_environment(settings: Settings, root: Path, run_dir: Path) -> list[str]:
    """``env`` arguments: the launching shell's variables, pp3's settings, unbuffered output."""
    unset: list[str] = []
    assign: list[str] = []
    for name in _DETACH_ENV:
        value = os.environ.get(name)
        if value is None:
            unset += ["-u", name]
        else:
            assign.append(f"{name}={value}")
    args = ["env", *unset, *assign]  # env takes every -u before the first assignment
    for name, value in sorted(os.environ.items()):
        if name.startswith("PP3_") and name not in {"PP3_SCRATCH", "PP3_RECEIPTS", "PP3_RUN_DIR"}:
            args.append(f"{name}={value}")
    args += [
        f"PP3_SCRATCH={root}",
        f"PP3_RECEIPTS={settings.receipts.resolve()}",
        f"PP3_RUN_DIR={run_dir}",
        "PYTHONUNBUFFERED=1",
    ]
    return args


def start_detached(command: str, settings: Settings, argv: Sequence[str]) -> str:
    """Re-run ``argv`` minus ``--detach`` in pp3's tmux server; return how to follow it.

    ``argv`` is the command line after the program name (``sys.argv[1:]``). The run gets
    ``<scratch>/runs/<command>-<id>/`` with ``log`` (everything it prints) and
    ``exit_status``; the session ``pp3-<command>-<id>`` stays after the run ends (so its
    output can be read by attaching) until clean-scratch stops the server. When the run ends
    it signals the tmux channel ``pp3-<command>-<id>-done`` (``tmux -S SOCK wait-for``).
    """
    tmux = shutil.which("tmux")
    if tmux is None:
        raise EnvironmentProblem(
            "tmux is missing: --detach needs it "
            "(apt-get install tmux, or bash .ci/install-system.sh)"
        )
    import torch

    # Fail now, not inside the log, if another pp3 uses the device or cleans the scratch.
    name = device_lock_name(None, cuda_available=bool(torch.cuda.is_available()))
    with hold_device(name, command):
        pass
    root = ensure_scratch(settings)
    with hold_scratch(root, command, exclusive=False):
        pass
    sock = tmux_socket(root)
    if len(os.fsencode(sock)) > 100:
        raise EnvironmentProblem(
            f"tmux socket path {sock} is too long for a Unix socket (over 100 bytes); "
            "choose a shorter --scratch"
        )
    sock.parent.mkdir(mode=0o700, exist_ok=True)
    conf = sock.parent / TMUX_CONF
    conf.write_text(_TMUX_CONF_TEXT)
    run_dir = new_run_dir(settings, command)
    session = f"pp3-{run_dir.name}"
    channel = f"{session}-done"
    log = run_dir / "log"
    status = run_dir / "exit_status"
    child = [
        *_detach_environment(settings, root, run_dir),
        sys.executable,
        "-m",
        "pp3cli",
        *(arg for arg in argv if arg != "--detach"),
    ]
    script = (
        f"{{ {shlex.join(child)}; code=$?; echo $code > {shlex.quote(str(status))}; "
        f'echo "pp3: {command} finished with exit status $code"; }} 2>&1 '
        f"| tee -a {shlex.quote(str(log))}; "
        f"{shlex.quote(tmux)} -S {shlex.quote(str(sock))} wait-for -S {shlex.quote(channel)}"
    )
    started = subprocess.run(
        [tmux, "-f", str(conf), "-S", str(sock), "new-session", "-d", "-s", session,
         "-c", os.getcwd(), "-x", "200", "-y", "50", script],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if started.returncode != 0:
        raise EnvironmentProblem(
            f"tmux could not start session {session}: {started.stderr.strip() or started.stdout}"
        )
    return (
        f"pp3: {command} detached into tmux session {session}\n"
        f"  attach: tmux -S {sock} attach -t {session}\n"
        f"  log:    {log}\n"
        f"  wait:   tmux -S {sock} wait-for {channel}"
    )
