"""Global settings a mutation campaign over ``pp3cli/run/settings.py`` found unpinned
(2026-12-05): where the scratch root defaults to, and that parsed settings cannot change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pp3cli.run.settings import Settings, default_scratch


def test_the_scratch_root_is_pp3_scratch_else_the_xdg_cache_else_home_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README: ``--scratch`` or ``PP3_SCRATCH``, default ``$XDG_CACHE_HOME/pp3/scratch``, i.e.
    ``~/.cache/pp3/scratch``. Each step of the fallback taken where the one before is unset
    (an empty variable counts as unset)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PP3_SCRATCH", str(tmp_path / "mine"))
    assert default_scratch() == tmp_path / "mine"
    monkeypatch.setenv("PP3_SCRATCH", "")
    assert default_scratch() == tmp_path / "xdg" / "pp3" / "scratch"
    monkeypatch.delenv("PP3_SCRATCH")
    assert default_scratch() == tmp_path / "xdg" / "pp3" / "scratch"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_scratch() == tmp_path / "home" / ".cache" / "pp3" / "scratch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_scratch() == tmp_path / "home" / ".cache" / "pp3" / "scratch"


def test_settings_are_frozen(tmp_path: Path) -> None:
    """Commands read the settings the top-level callback parsed from ``ctx.obj``; none may
    change them for the commands after it."""
    settings = Settings(scratch=tmp_path / "s", receipts=tmp_path / "r")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.scratch = tmp_path  # type: ignore[misc]
    assert settings == Settings(scratch=tmp_path / "s", receipts=tmp_path / "r")
