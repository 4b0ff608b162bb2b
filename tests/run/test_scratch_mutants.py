"""Scratch behaviour a mutation campaign over ``pp3cli/run/scratch.py`` found unpinned.

(2026-12-05, second pass: the first pass's tests are at the end of
``test_clean_scratch.py``.)
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

import pp3cli.run.scratch as scratch_module
from pp3cli.run.errors import UsageProblem
from pp3cli.run.scratch import (
    MARKER_NAME,
    ROOT_TAG,
    _marker_being_written,
    ensure_scratch,
    plan_clean,
)
from pp3cli.run.settings import Settings


class FakeClock:
    """``time.monotonic``/``time.sleep`` for scratch.py: sleeping moves the clock at once,
    and ``then`` runs once the clock has moved ``at`` seconds."""

    def __init__(self, *, at: float = float("inf"), then: Path | None = None) -> None:
        self.start = self.now = 1000.0
        self.at, self.then = at, then

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.then is not None and self.now - self.start >= self.at:
            self.then.write_bytes(orjson.dumps({"tag": ROOT_TAG, "pid": 0}) + b"\n")
            self.then = None

    @property
    def waited(self) -> float:
        return self.now - self.start


def _half_made_root(tmp_path: Path) -> Path:
    """A root whose only entry is a marker another rank created (O_EXCL) but has not written."""
    root = tmp_path / "root"
    root.mkdir()
    (root / MARKER_NAME).write_bytes(b"")
    return root


def test_a_rank_waits_five_seconds_for_another_ranks_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _half_made_root(tmp_path)
    clock = FakeClock()
    monkeypatch.setattr(scratch_module, "time", clock)
    assert not _marker_being_written(root), "a marker never finished is not waited for forever"
    assert 5.0 <= clock.waited < 5.5, clock.waited
    settings = Settings(scratch=root, receipts=tmp_path / "r")
    clock.now = clock.start
    with pytest.raises(UsageProblem, match="has no .pp3-owned marker"):
        ensure_scratch(settings)  # after the wait the half-made root is not pp3's
    assert 5.0 <= clock.waited < 5.5, clock.waited
    late = FakeClock(at=4.9, then=root / MARKER_NAME)
    monkeypatch.setattr(scratch_module, "time", late)
    assert ensure_scratch(settings) == root.resolve(), "finished within the wait: adopted"
    assert late.waited < 5.0


def test_a_rank_adopts_a_root_whose_marker_finished_before_its_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank reads the marker half-written; before it lists the root, the marker's
    writer finishes and another rank makes its runs folder. The marker is then complete:
    the root is pp3's, whatever else the listing shows (CI, 2026-12-07)."""
    root = _half_made_root(tmp_path)
    real = scratch_module.has_marker
    calls: list[bool] = []

    def finishing_after_the_first_read(folder: Path, tag: str) -> bool:
        seen = real(folder, tag)
        if not calls:  # the other ranks act between this read and the listing
            (root / MARKER_NAME).write_bytes(orjson.dumps({"tag": ROOT_TAG, "pid": 0}) + b"\n")
            (root / "runs").mkdir()
        calls.append(seen)
        return seen

    monkeypatch.setattr(scratch_module, "has_marker", finishing_after_the_first_read)
    monkeypatch.setattr(scratch_module, "time", FakeClock())
    assert _marker_being_written(root)
    assert calls[0] is False  # the first read did see a half-written marker
    (root / MARKER_NAME).write_bytes(b"{}\n")  # a foreign marker and another entry: refused
    assert not _marker_being_written(root)


def test_planning_a_clean_leaves_bytecode_alone_unless_asked(tmp_path: Path) -> None:
    """Bytecode is removed only "(on request)" (module docstring; ``--bytecode``)."""
    project = tmp_path / "project"
    (project / "pkg" / "__pycache__").mkdir(parents=True)
    (project / "stray.pyc").write_bytes(b"x")
    root = ensure_scratch(Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "r"))
    plan = plan_clean(root, project_root=project)
    assert plan.bytecode == [] and plan.paths() == []
    asked = plan_clean(root, bytecode=True, project_root=project)
    assert sorted(asked.bytecode) == [project / "pkg" / "__pycache__", project / "stray.pyc"]
