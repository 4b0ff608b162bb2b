"""clean-scratch removes what pp3 owns and nothing else; links are never followed."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.scratch import (
    MARKER_NAME,
    ROOT_TAG,
    RUN_TAG,
    CleanPlan,
    _marker_being_written,
    _tmux_sessions,
    _write_marker,
    ensure_scratch,
    execute_clean,
    has_marker,
    iter_bytecode,
    new_run_dir,
    plan_clean,
    repo_root,
    tmux_socket,
)
from pp3cli.run.settings import Settings


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, Path]:
    """A scratch root with two pp3 runs, and foreign things inside and outside it."""
    settings = Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "receipts")
    root = ensure_scratch(settings)
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.txt"
    precious.write_text("not pp3's")
    decoy = tmp_path / "decoy-run"  # a folder elsewhere that claims to be a pp3 run
    decoy.mkdir()
    _write_marker(decoy, RUN_TAG, command="decoy")
    (decoy / "data.bin").write_bytes(b"keep")
    run_a = new_run_dir(settings, "probe")
    run_b = new_run_dir(settings, "qualify")
    (run_a / "log").write_text("pp3 output")
    escape = run_a / "escape"
    escape.symlink_to(outside, target_is_directory=True)
    (run_b / "nested").mkdir()
    (run_b / "nested" / "to-file").symlink_to(precious)
    foreign_file = root / "notes.txt"
    foreign_file.write_text("someone's notes")
    foreign_dir = root / "runs" / "someone-elses"
    foreign_dir.mkdir()
    (foreign_dir / "data.txt").write_text("theirs")
    linked_run = root / "runs" / "linked"
    linked_run.symlink_to(decoy, target_is_directory=True)
    return {
        "root": root, "outside": outside, "precious": precious, "decoy": decoy,
        "run_a": run_a, "run_b": run_b, "escape": escape, "foreign_file": foreign_file,
        "foreign_dir": foreign_dir, "linked_run": linked_run,
    }  # fmt: skip


def assert_foreign_intact(planted: dict[str, Path]) -> None:
    assert planted["precious"].read_text() == "not pp3's"
    assert (planted["decoy"] / "data.bin").read_bytes() == b"keep"
    assert has_marker(planted["decoy"], RUN_TAG)
    assert planted["foreign_file"].read_text() == "someone's notes"
    assert (planted["foreign_dir"] / "data.txt").read_text() == "theirs"
    assert planted["linked_run"].is_symlink(), "a link pp3 did not make must stay"
    assert has_marker(planted["root"], ROOT_TAG), "the scratch root keeps its marker"


def test_dry_run_lists_only_pp3s_runs_and_removes_nothing(planted: dict[str, Path]) -> None:
    plan = plan_clean(planted["root"])
    assert plan.run_dirs == sorted([planted["run_a"], planted["run_b"]])
    result = CliRunner().invoke(
        app, ["--scratch", str(planted["root"]), "clean-scratch", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert f"would remove: {planted['run_a']}" in result.output, result.output
    assert str(planted["foreign_dir"]) not in result.output, result.output
    assert str(planted["linked_run"]) not in result.output, result.output
    assert planted["run_a"].is_dir() and planted["escape"].is_symlink()
    assert_foreign_intact(planted)


def test_clean_removes_runs_and_links_but_never_their_targets(planted: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["--scratch", str(planted["root"]), "clean-scratch"])
    assert result.exit_code == 0, result.output
    assert f"removed: {planted['run_a']}" in result.output, result.output
    assert not os.path.lexists(planted["run_a"]) and not os.path.lexists(planted["run_b"])
    assert not os.path.lexists(planted["escape"]), "the escaping link itself goes"
    assert planted["outside"].is_dir()
    assert_foreign_intact(planted)
    again = CliRunner().invoke(app, ["--scratch", str(planted["root"]), "clean-scratch"])
    assert again.exit_code == 0 and "nothing to clean" in again.output, again.output


def test_refuses_roots_pp3_does_not_own(tmp_path: Path) -> None:
    unmarked = tmp_path / "unmarked"
    unmarked.mkdir()
    (unmarked / "runs").mkdir()
    for root, fragment in [
        (Path("/"), "filesystem root"),
        (Path.home(), "home folder"),
        (repo_root(), "repository root"),
        (unmarked, "has no pp3 marker"),
    ]:
        with pytest.raises(UsageProblem) as err:
            plan_clean(root)
        assert err.value.exit_code == 2 and fragment in str(err.value), str(err.value)
    assert (unmarked / "runs").is_dir()


def test_a_link_to_a_pp3_root_is_judged_by_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link-to-home"
    link.symlink_to(Path.home(), target_is_directory=True)
    with pytest.raises(UsageProblem, match="home folder"):
        plan_clean(link)


def test_missing_root_is_nothing_to_clean(tmp_path: Path) -> None:
    plan = plan_clean(tmp_path / "never-made")
    assert plan.scratch_root is None and plan.paths() == []
    result = CliRunner().invoke(app, ["--scratch", str(tmp_path / "never-made"), "clean-scratch"])
    assert result.exit_code == 0 and "nothing to clean" in result.output, result.output


def test_bytecode_in_the_project_tree_only(tmp_path: Path) -> None:
    project = tmp_path / "project"
    outside = tmp_path / "outside"
    (outside / "__pycache__").mkdir(parents=True)
    (outside / "__pycache__" / "keep.pyc").write_bytes(b"keep")
    (outside / "keep.pyc").write_bytes(b"keep")
    (project / "pp3cli" / "__pycache__").mkdir(parents=True)
    (project / "pp3cli" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"x")
    (project / "stray.pyc").write_bytes(b"x")
    (project / ".venv" / "lib" / "__pycache__").mkdir(parents=True)
    (project / ".venv" / "lib" / "__pycache__" / "site.pyc").write_bytes(b"venv")
    (project / "kernels").mkdir()
    (project / "kernels" / "__pycache__").symlink_to(outside / "__pycache__")
    (project / "linked-tree").symlink_to(outside, target_is_directory=True)
    (project / "source.py").write_text("# keep\n")
    found = sorted(iter_bytecode(project))
    assert found == sorted(
        [
            project / "pp3cli" / "__pycache__",
            project / "stray.pyc",
            project / "kernels" / "__pycache__",
        ]
    )
    scratch = tmp_path / "no-scratch"
    dry = plan_clean(scratch, bytecode=True, project_root=project)
    assert dry.bytecode == list(iter_bytecode(project)) and project.joinpath("stray.pyc").exists()
    execute_clean(dry)
    assert not os.path.lexists(project / "pp3cli" / "__pycache__")
    assert not os.path.lexists(project / "kernels" / "__pycache__")
    assert not os.path.lexists(project / "stray.pyc")
    assert (outside / "__pycache__" / "keep.pyc").read_bytes() == b"keep"
    assert (outside / "keep.pyc").read_bytes() == b"keep"
    assert (project / ".venv" / "lib" / "__pycache__" / "site.pyc").exists()
    assert (project / "source.py").exists()


def test_a_running_pp3_tmux_session_is_not_killed(planted: dict[str, Path]) -> None:
    tmux = shutil.which("tmux")
    assert tmux is not None, "tmux is missing: run `bash .ci/install-system.sh` (it installs tmux)"
    socket = tmux_socket(planted["root"])
    socket.parent.mkdir()
    command = [tmux, "-S", str(socket), "new-session", "-d", "-s", "pp3-live", "cat"]
    subprocess.run(command, check=True)
    try:
        with pytest.raises(EnvironmentProblem) as err:
            plan_clean(planted["root"])
        assert err.value.exit_code == 3 and "pp3-live" in str(err.value), str(err.value)
        assert planted["run_a"].is_dir()
    finally:
        subprocess.run([tmux, "-S", str(socket), "kill-server"], capture_output=True, check=False)


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-05)


def _fake_tmux(tmp_path: Path, panes: str = "", code: int = 0) -> tuple[Path, Path]:
    """A stand-in for tmux: logs its arguments, prints ``panes`` (and a line on kill-server,
    which pp3 must capture), exits with ``code``."""
    log = tmp_path / "tmux.log"
    script = tmp_path / "fake-tmux"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'case "$*" in *kill-server*) echo "fake tmux: server killed";; esac\n'
        f"printf '{panes}'\n"
        f"exit {code}\n"
    )
    script.chmod(0o755)
    return script, log


def _use_tmux(monkeypatch: pytest.MonkeyPatch, tmux: Path | None) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: str(tmux) if tmux else None)


def test_repo_root_is_the_folder_holding_pp3cli() -> None:
    assert (repo_root() / "pp3cli" / "run" / "scratch.py").is_file()


def test_a_marker_counts_only_as_a_regular_file_with_the_asked_tag(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _write_marker(root, ROOT_TAG)
    assert has_marker(root, ROOT_TAG) and not has_marker(root, RUN_TAG)
    for name, payload in [("list", b'["pp3-run"]'), ("text", b'"pp3-run"'), ("bad", b"{")]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / MARKER_NAME).write_bytes(payload)
        assert not has_marker(folder, RUN_TAG), name
    linked_marker = tmp_path / "linked-marker"
    linked_marker.mkdir()
    (linked_marker / MARKER_NAME).symlink_to(root / MARKER_NAME)
    assert not has_marker(linked_marker, ROOT_TAG), "a marker that is a link does not count"
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    assert not has_marker(link, ROOT_TAG), "a folder reached through a link does not count"
    assert not has_marker(root / MARKER_NAME, ROOT_TAG), "a file is not a folder"


def test_scratch_and_run_folders_are_private_and_named_by_command_time_and_hex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        settings = Settings(scratch=tmp_path / "a" / "b" / "scratch", receipts=tmp_path / "r")
        root = ensure_scratch(settings)  # parents made too
        assert ensure_scratch(settings) == root, "a marked root is adopted again"
        run = new_run_dir(settings, "probe")
    finally:
        os.umask(old)
    for folder in (root, root / "runs", run):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700, folder
    assert stat.S_IMODE(os.lstat(run / MARKER_NAME).st_mode) == 0o644
    assert re.fullmatch(r"probe-\d{8}T\d{12}Z-[0-9a-f]{6}", run.name), run.name
    marker = orjson.loads((run / MARKER_NAME).read_bytes())
    assert marker["tag"] == RUN_TAG and marker["command"] == "probe"
    assert marker["run_id"] == run.name and marker["pid"] == os.getpid()
    empty = tmp_path / "empty"
    empty.mkdir()
    adopted = ensure_scratch(Settings(scratch=empty, receipts=tmp_path / "r"))
    assert adopted == empty.resolve() and has_marker(empty, ROOT_TAG), "an empty folder is adopted"


def test_a_scratch_root_that_is_a_file_and_a_runs_link_are_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("someone's")
    with pytest.raises(UsageProblem, match="is not a folder"):
        ensure_scratch(Settings(scratch=a_file, receipts=tmp_path / "r"))
    assert a_file.read_text() == "someone's"
    settings = Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r")
    root = ensure_scratch(settings)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "runs").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(EnvironmentProblem, match="not a real folder"):
        new_run_dir(settings, "qualify")
    assert list(elsewhere.iterdir()) == [], "nothing is written through the link"


def test_a_root_marker_being_written_is_waited_for(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    marker = root / MARKER_NAME
    marker.write_bytes(b"")  # created (O_EXCL) by another rank, not yet written
    started = time.monotonic()
    assert not _marker_being_written(root, wait_s=0.05), "an unfinished marker times out"
    assert time.monotonic() - started >= 0.05
    payload = orjson.dumps({"tag": ROOT_TAG, "pid": 0}) + b"\n"
    writer = threading.Timer(0.1, marker.write_bytes, args=(payload,))
    writer.start()
    try:  # the other rank finishes its marker: this one adopts the root instead of refusing
        assert ensure_scratch(Settings(scratch=root, receipts=tmp_path / "r")) == root.resolve()
    finally:
        writer.join()
    assert _marker_being_written(root, wait_s=0.0), "a finished marker needs no wait"
    marker.write_bytes(b"")
    (root / "other").write_text("x")
    started = time.monotonic()
    assert not _marker_being_written(root, wait_s=5.0), "another entry: not a rank's root"
    assert time.monotonic() - started < 1.0, "and no wait for it"


def test_a_runs_file_and_a_socket_that_is_a_file_are_not_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmux, log = _fake_tmux(tmp_path)
    _use_tmux(monkeypatch, tmux)
    root = ensure_scratch(Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r"))
    (root / "runs").write_text("not a folder")
    (root / "tmux").mkdir()
    tmux_socket(root).write_text("not a socket")
    plan = plan_clean(root)
    assert plan.run_dirs == [] and plan.tmux_files == [] and not plan.tmux_server
    conf = root / "tmux" / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")
    plan = plan_clean(root)
    assert plan.tmux_files == [conf] and not plan.tmux_server
    execute_clean(plan)
    assert not conf.exists() and tmux_socket(root).read_text() == "not a socket"
    assert not log.exists(), "no tmux server to stop: tmux is not run"


def test_a_tmux_conf_that_is_not_a_file_is_not_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pp3 writes tmux.conf as a file: a folder (or a link) by that name is not pp3's, and
    cleaning leaves it and everything in it."""
    tmux, log = _fake_tmux(tmp_path)
    _use_tmux(monkeypatch, tmux)
    root = ensure_scratch(Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r"))
    (root / "tmux").mkdir()
    conf = root / "tmux" / "tmux.conf"
    conf.mkdir()
    (conf / "someones-data.txt").write_text("not pp3's")
    plan = plan_clean(root)
    assert plan.tmux_files == [] and not plan.tmux_server
    execute_clean(plan)
    assert (conf / "someones-data.txt").read_text() == "not pp3's"
    conf.joinpath("someones-data.txt").unlink()
    conf.rmdir()
    target = tmp_path / "elsewhere.conf"
    target.write_text("not pp3's")
    conf.symlink_to(target)
    assert plan_clean(root).tmux_files == []
    assert not log.exists(), "no tmux server to stop: tmux is not run"


def test_a_dead_pp3_tmux_server_is_stopped_and_its_files_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    tmux, log = _fake_tmux(tmp_path, panes="pp3-old 1\\n", code=1)
    root = ensure_scratch(Settings(scratch=tmp_path / "s", receipts=tmp_path / "r"))
    (root / "tmux").mkdir()
    socket_path = tmux_socket(root)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(socket_path))
    conf = root / "tmux" / "tmux.conf"
    conf.write_text("")
    try:
        _use_tmux(monkeypatch, tmux)
        # list-panes fails (exit 1): no server behind the socket, nothing live
        plan = plan_clean(root)
        assert plan.tmux_server and plan.tmux_files == [socket_path, conf]
        capfd.readouterr()
        assert execute_clean(plan) == [socket_path, conf]
        assert capfd.readouterr().out == "", "tmux's output is captured"
    finally:
        listener.close()
    assert f"-S {socket_path} kill-server" in log.read_text()
    assert not os.path.lexists(socket_path) and not conf.exists()


def test_tmux_panes_are_read_from_pp3s_private_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_path = tmp_path / "sock"
    tmux, log = _fake_tmux(tmp_path, panes="pp3-a 0\\npp3 b 1\\n")
    _use_tmux(monkeypatch, tmux)
    assert _tmux_sessions(socket_path) == [("pp3-a", False), ("pp3 b", True)]
    assert f"-S {socket_path} list-panes -a" in log.read_text()
    (tmp_path / "failing").mkdir()
    failing, _ = _fake_tmux(tmp_path / "failing", panes="pp3-a 0\\n", code=1)
    _use_tmux(monkeypatch, failing)
    assert _tmux_sessions(socket_path) == [], "no server behind the socket"
    _use_tmux(monkeypatch, None)
    assert _tmux_sessions(socket_path) == [], "no tmux at all"
    plan = CleanPlan(scratch_root=tmp_path, tmux_server=False)
    _use_tmux(monkeypatch, tmux)
    before = log.read_text()
    execute_clean(plan)
    assert log.read_text() == before, "no server in the plan: none is stopped"
