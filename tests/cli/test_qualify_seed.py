"""`pp3 qualify --seed` outside 0 <= seed < 2^60 (oracle's bounds) is a usage error (exit 2)
before anything is created. Before the fix a negative seed ran the whole family and then
crashed in the greedy pairing (numpy refuses it: exit 4, no receipt), and a seed >= 2^63
crashed in the first verifier call (torch's int64), each after the run folder was made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pp3cli.cli import qualify as qualify_cli
from pp3cli.cli.app import app
from pp3cli.run.errors import UsageProblem


@pytest.mark.parametrize(
    ("seed", "accepted"),
    [
        ("-1", False),
        ("0", True),
        (str((1 << 60) - 1), True),
        (str(1 << 60), False),
        (str(1 << 64), False),
    ],
)
def test_a_seed_outside_0_to_2_60_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: str, accepted: bool
) -> None:
    reached: list[str] = []

    def run_receipted(command: str, *args: Any, **kwargs: Any) -> None:
        reached.append(command)

    monkeypatch.setattr(qualify_cli, "run_receipted", run_receipted)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    scratch = tmp_path / "scratch"
    outcome = CliRunner().invoke(app, ["--scratch", str(scratch), "qualify", "--seed", seed])
    if accepted:
        assert outcome.exception is None and reached == ["qualify"], outcome.output
    else:
        assert isinstance(outcome.exception, UsageProblem), outcome.output
        assert str(outcome.exception) == f"--seed {seed}: expected 0 <= seed < 2^60"
        assert reached == [] and not scratch.exists()
