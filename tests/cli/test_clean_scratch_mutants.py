"""`pp3 clean-scratch` output and options a mutation campaign over
``pp3cli/cli/clean_scratch.py`` found unpinned (2026-12-05)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import pp3cli.run.scratch as scratch_module
from pp3cli.cli.app import app
from pp3cli.run.scratch import ensure_scratch, new_run_dir
from pp3cli.run.settings import Settings


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in project tree holding bytecode, so --bytecode never touches the real one."""
    tree = tmp_path / "project"
    (tree / "pkg" / "__pycache__").mkdir(parents=True)
    (tree / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"x")
    (tree / "stray.pyc").write_bytes(b"x")
    monkeypatch.setattr(scratch_module, "repo_root", lambda: tree)
    return tree


def clean(scratch: Path, *options: str) -> str:
    result = CliRunner().invoke(app, ["--scratch", str(scratch), "clean-scratch", *options])
    assert result.exit_code == 0, result.output
    return result.output


def test_bytecode_goes_only_with_the_bytecode_option(tmp_path: Path, project: Path) -> None:
    settings = Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r")
    run = new_run_dir(settings, "probe")
    output = clean(settings.scratch)
    assert output.splitlines() == [f"removed: {run}"], output
    assert (project / "stray.pyc").exists() and (project / "pkg" / "__pycache__").is_dir()
    dry = clean(settings.scratch, "--bytecode", "--dry-run")
    assert f"would remove: {project / 'stray.pyc'}" in dry, dry
    assert (project / "stray.pyc").exists(), "--dry-run removes nothing"
    output = clean(settings.scratch, "--bytecode")
    assert f"removed: {project / 'stray.pyc'}" in output, output
    assert f"removed: {project / 'pkg' / '__pycache__'}" in output, output
    assert "nothing to clean" not in output, output
    assert not (project / "stray.pyc").exists()
    assert not (project / "pkg" / "__pycache__").exists()


def test_nothing_to_clean_is_said_only_when_nothing_went(tmp_path: Path, project: Path) -> None:
    settings = Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r")
    ensure_scratch(settings)
    assert clean(settings.scratch).splitlines() == ["nothing to clean"]
    run = new_run_dir(settings, "qualify")
    output = clean(settings.scratch)
    assert "nothing to clean" not in output and f"removed: {run}" in output, output
    missing = tmp_path / "never-made"
    with_bytecode = clean(missing, "--bytecode")
    assert "nothing to clean" not in with_bytecode, with_bytecode
    assert f"removed: {project / 'stray.pyc'}" in with_bytecode, with_bytecode
    assert not missing.exists(), "cleaning bytecode does not create a scratch root"
