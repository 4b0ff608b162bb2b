"""Shared test setup: device locks go to a per-test folder, never the system one."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_lock_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """PP3_LOCK_DIR for this test (and the processes it starts): tests never contend with a
    real pp3 run, or with each other, for /tmp/pp3-locks."""
    folder = tmp_path_factory.mktemp("locks")
    monkeypatch.setenv("PP3_LOCK_DIR", str(folder))
    return folder
