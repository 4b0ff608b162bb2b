"""The scratch area pp3 owns, and `clean-scratch`: remove only what carries pp3's marker.

Ownership is explicit. The scratch root holds ``.pp3-owned`` (JSON, tag ``pp3-scratch-root``),
written when pp3 creates the root; every run folder ``<root>/runs/<id>`` holds its own
``.pp3-owned`` (tag ``pp3-run``). pp3's private tmux server listens on ``<root>/tmux/sock``.
Cleaning removes exactly: marked run folders, that tmux server and its two files, and (on
request) ``__pycache__``/``*.pyc`` inside the project tree. Nothing is ever reached through a
symbolic link: entries are examined with ``lstat``, a link is unlinked (its target untouched),
and folders are removed with :func:`shutil.rmtree`, whose descriptor-based walk does not follow
links on Linux.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.settings import Settings

MARKER_NAME = ".pp3-owned"
ROOT_TAG = "pp3-scratch-root"
RUN_TAG = "pp3-run"
RUNS_DIR = "runs"
TMUX_DIR = "tmux"
TMUX_SOCKET = "sock"
TMUX_CONF = "tmux.conf"
# Interpreter folders whose bytecode belongs to installed packages, not to the project.
_BYTECODE_SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", ".tox", ".nox"})


def repo_root() -> Path:
    """The project tree: the folder holding the ``pp3cli`` package (this file's ../../..)."""
    return Path(__file__).resolve().parents[2]


def utc_stamp(moment: datetime | None = None) -> str:
    """``YYYYmmddTHHMMSSffffffZ`` in UTC (sortable, safe in file names)."""
    return (moment or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")


def _write_marker(folder: Path, tag: str, **fields: Any) -> None:
    payload = {"tag": tag, "created_utc": utc_stamp(), "pid": os.getpid(), **fields}
    fd = os.open(folder / MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS) + b"\n")


def has_marker(folder: Path, tag: str) -> bool:
    """True when ``folder`` is a real folder (not a link) holding a regular marker with ``tag``."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        marker = folder / MARKER_NAME
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        payload = orjson.loads(marker.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(payload, dict) and payload.get("tag") == tag


def _home_folders() -> set[Path]:
    homes = {Path.home().resolve(), Path("/home"), Path("/root")}
    for entry in pwd.getpwall():
        if entry.pw_dir:
            homes.add(Path(entry.pw_dir).resolve())
    return homes


def refuse_unsafe_root(root: Path, *, project_root: Path | None = None) -> Path:
    """Resolve ``root`` and refuse ``/``, a home folder or the repository root (UsageProblem)."""
    resolved = root.expanduser().resolve()
    project = (project_root or repo_root()).resolve()
    if resolved == Path(resolved.anchor):
        raise UsageProblem(f"scratch root {root} is the filesystem root; choose a folder for pp3")
    if resolved in _home_folders():
        raise UsageProblem(
            f"scratch root {root} is a home folder ({resolved}); choose a folder for pp3, "
            "e.g. ~/.cache/pp3/scratch"
        )
    if resolved == project:
        raise UsageProblem(
            f"scratch root {root} is the repository root ({project}); choose a folder for pp3"
        )
    return resolved


def ensure_scratch(settings: Settings) -> Path:
    """Create (or adopt an empty) scratch root with pp3's marker; return its resolved path.

    An existing root must carry the marker, or be empty: pp3 never claims a folder that
    already holds someone else's files (UsageProblem).
    """
    root = refuse_unsafe_root(settings.scratch)
    if has_marker(root, ROOT_TAG):
        return root
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise UsageProblem(f"scratch root {root} exists and is not a folder")
    if root.exists() and any(root.iterdir()):
        # Read after has_marker above: another pp3 process (a rank of the same run) may have
        # created the root and marked it in between, or be writing its marker now.
        if _marker_being_written(root):
            return root
        raise UsageProblem(
            f"scratch root {root} is not empty and has no {MARKER_NAME} marker: pp3 did not "
            "create it. Choose a new or empty folder with --scratch or PP3_SCRATCH."
        )
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        _write_marker(root, ROOT_TAG)
    except FileExistsError:  # another pp3 process created it concurrently
        _marker_being_written(root)
    if not has_marker(root, ROOT_TAG):
        raise EnvironmentProblem(f"could not mark scratch root {root} as pp3's")
    return root


def _marker_being_written(root: Path, wait_s: float = 5.0) -> bool:
    """True once the root marker a concurrent pp3 is writing is complete (wait up to wait_s).

    Concurrent processes (the ranks of one distributed run) may create a fresh root at the
    same moment: one creates the marker (O_EXCL) and writes it, the others see a folder
    whose only entry is that marker and wait for it instead of calling the folder foreign.
    A pp3 rank adds other entries only once the marker is complete, so a listing with more
    than the marker is foreign only if the marker is still incomplete after it: between
    the marker's check and the listing, its writer may have finished and a rank made its
    runs folder (CI, 2026-12-07: round 131 of test_scratch_race under load).
    """
    deadline = time.monotonic() + wait_s
    while not has_marker(root, ROOT_TAG):
        if [entry.name for entry in root.iterdir()] != [MARKER_NAME]:
            return has_marker(root, ROOT_TAG)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def new_run_dir(settings: Settings, command: str) -> Path:
    """Create ``<scratch>/runs/<command>-<UTC stamp>-<hex>`` with a run marker; return it."""
    root = ensure_scratch(settings)
    runs = root / RUNS_DIR
    runs.mkdir(exist_ok=True, mode=0o700)
    if runs.is_symlink() or not runs.is_dir():
        raise EnvironmentProblem(f"{runs} is not a real folder; pp3 will not write through it")
    run_id = f"{command}-{utc_stamp()}-{secrets.token_hex(3)}"
    run = runs / run_id
    run.mkdir(mode=0o700)
    _write_marker(run, RUN_TAG, command=command, run_id=run_id)
    return run


def tmux_socket(root: Path) -> Path:
    """Socket of pp3's private tmux server under the scratch root."""
    return root / TMUX_DIR / TMUX_SOCKET


@dataclass
class CleanPlan:
    """What `clean-scratch` removes (or would remove, with ``--dry-run``)."""

    scratch_root: Path | None
    run_dirs: list[Path] = field(default_factory=list)
    tmux_files: list[Path] = field(default_factory=list)
    tmux_server: bool = False
    bytecode: list[Path] = field(default_factory=list)

    def paths(self) -> list[Path]:
        """Every path the plan removes, in removal order."""
        return [*self.run_dirs, *self.tmux_files, *self.bytecode]


def _lstat_mode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


def _tmux_sessions(socket: Path) -> list[tuple[str, bool]]:
    """(session, pane_dead) for every pane of pp3's private server; empty when none runs."""
    tmux = shutil.which("tmux")
    if tmux is None:
        return []
    listing = subprocess.run(
        [tmux, "-S", str(socket), "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:  # no server behind the socket
        return []
    panes = []
    for line in listing.stdout.splitlines():
        name, _, dead = line.rpartition(" ")
        panes.append((name, dead == "1"))
    return panes


def iter_bytecode(project_root: Path) -> Iterator[Path]:
    """``__pycache__`` folders and ``*.pyc``/``*.pyo`` files in the project tree.

    Walks without following links, skipping .git and virtual environments (a folder holding
    ``pyvenv.cfg``): their bytecode belongs to installed packages, not to the project.
    """
    for folder, subdirs, files in os.walk(project_root, followlinks=False):
        here = Path(folder)
        keep: list[str] = []
        for name in subdirs:
            path = here / name
            if name == "__pycache__":
                yield path  # a real folder or a link; never descended into
            elif name in _BYTECODE_SKIP_DIRS or (path / "pyvenv.cfg").exists():
                continue
            elif not path.is_symlink():
                keep.append(name)
        subdirs[:] = keep
        for name in files:
            if name.endswith((".pyc", ".pyo")):
                yield here / name


def plan_clean(
    scratch: Path, *, bytecode: bool = False, project_root: Path | None = None
) -> CleanPlan:
    """Decide what to remove; refuse roots pp3 does not own (UsageProblem).

    A missing scratch root is nothing to clean. A root without pp3's marker is refused,
    so an unlucky ``--scratch`` cannot empty someone else's folder.
    """
    project = (project_root or repo_root()).resolve()
    root = refuse_unsafe_root(scratch, project_root=project)
    plan = CleanPlan(scratch_root=None)
    if _lstat_mode(root) is not None:
        if not has_marker(root, ROOT_TAG):
            raise UsageProblem(
                f"scratch root {root} has no pp3 marker ({MARKER_NAME} with tag {ROOT_TAG}): "
                "pp3 did not create it and will not clean it"
            )
        plan.scratch_root = root
        runs = root / RUNS_DIR
        runs_mode = _lstat_mode(runs)
        if runs_mode is not None and stat.S_ISDIR(runs_mode):
            for entry in sorted(runs.iterdir()):
                if has_marker(entry, RUN_TAG):
                    plan.run_dirs.append(entry)
        tmux_dir = root / TMUX_DIR
        tmux_mode = _lstat_mode(tmux_dir)
        if tmux_mode is not None and stat.S_ISDIR(tmux_mode):
            socket = tmux_socket(root)
            socket_mode = _lstat_mode(socket)
            if socket_mode is not None and stat.S_ISSOCK(socket_mode):
                live = [name for name, dead in _tmux_sessions(socket) if not dead]
                if live:
                    raise EnvironmentProblem(
                        f"pp3 tmux session(s) still running: {', '.join(sorted(set(live)))} "
                        f"(socket {socket}); attach or wait, then clean again"
                    )
                plan.tmux_server = True
                plan.tmux_files.append(socket)
            conf = tmux_dir / TMUX_CONF
            conf_mode = _lstat_mode(conf)
            if conf_mode is not None and stat.S_ISREG(conf_mode):  # pp3 writes a file there
                plan.tmux_files.append(conf)
    if bytecode:
        plan.bytecode = list(iter_bytecode(project))
    return plan


def _remove(path: Path) -> None:
    """Unlink a file or link, or remove a real folder without following any link inside."""
    mode = _lstat_mode(path)
    if mode is None:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def execute_clean(plan: CleanPlan) -> list[Path]:
    """Carry out ``plan``: stop pp3's tmux server, then remove each path. Returns what went."""
    if plan.tmux_server and plan.scratch_root is not None:
        tmux = shutil.which("tmux")
        if tmux is not None:
            subprocess.run(
                [tmux, "-S", str(tmux_socket(plan.scratch_root)), "kill-server"],
                capture_output=True,
                check=False,
            )
    removed = []
    for path in plan.paths():
        _remove(path)
        removed.append(path)
    return removed
