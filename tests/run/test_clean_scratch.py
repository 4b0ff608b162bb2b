"""clean-scratch removes what pp3 owns and nothing else; links are never followed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.scratch import (
    ROOT_TAG,
    RUN_TAG,
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
