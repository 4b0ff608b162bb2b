"""The one skeleton of every receipt-writing command (qualify, oracle, probe).

    supersede checks -> optional detach -> guarded work -> receipt -> output -> exit code

1. ``--supersedes`` files are checked (UsageProblem, exit 2) before anything starts.
2. ``--detach`` re-runs the command in pp3's tmux server and returns (exit 0).
3. The work runs under the guard (lock, affinity, nice, threads, power limit read before
   and after); it returns a ``Finding``: the receipt's parameters, data and verdict (None:
   a distributed rank other than 0, which writes no receipt and prints nothing).
4. The receipt is written (an in-toto Statement, never overwritten, hash-chained).
5. Output: with ``--json`` the stored receipt itself on stdout, else the finding's summary;
   the ``receipt: PATH  verdict: V`` line always goes to stderr.
6. Exit 0 on PASS; a FAIL raises CheckFailed (exit 1) after the receipt exists.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pp3cli.cli.options import RunOptions
from pp3cli.run.errors import CheckFailed
from pp3cli.run.settings import Settings

if TYPE_CHECKING:
    from rich.console import RenderableType

    from pp3cli.run.guard import GuardRecord


@dataclass(frozen=True)
class Finding:
    """What a command's work found: the receipt's content and a summary for people."""

    parameters: Mapping[str, Any]
    data: Mapping[str, Any]
    verdict: str
    summary: RenderableType | None = None
    # Files outside pp3's sources that can change the verdict (a peer's pinned files, a
    # user's verifier module), by receipt name: hashed into the receipt and its subject.
    sources: Mapping[str, Path] = field(default_factory=dict)


def run_receipted(
    command: str,
    settings: Settings,
    run: RunOptions,
    work: Callable[[GuardRecord], Finding | None],
    *,
    kind: str,
    require_gpu: bool,
    precheck: Callable[[bool], None] | None = None,
    device: int | str | None = None,
) -> None:
    """Run ``work`` as the module docstring says; ``kind`` names the receipt's kind.

    ``precheck(cuda_available)`` checks the machine for this command before the guard
    creates anything, and ``device`` is the GPU whose lock the guard takes (default torch's
    current device; a distributed rank passes its own): ``pp3cli.run.guard.guarded``.
    """
    from rich.console import Console

    from pp3cli.evidence.verdict import PASS
    from pp3cli.receipts.write import supersede_entries, write_receipt
    from pp3cli.run.detach import start_detached
    from pp3cli.run.guard import guarded

    superseded = supersede_entries(settings.receipts, run.supersedes, run.supersede_reason)
    if run.guard.detach:
        typer.echo(start_detached(command, settings, sys.argv[1:]))
        return
    with guarded(
        command, settings, run.guard, require_gpu=require_gpu, precheck=precheck, device=device
    ) as record:
        finding = work(record)
        if finding is None:  # a distributed rank other than 0: rank 0 writes the receipt
            return
        environment = record.environment()
    path = write_receipt(
        settings.receipts,
        kind,
        parameters=finding.parameters,
        environment=environment,
        data=finding.data,
        verdict=finding.verdict,
        supersedes=superseded,
        extra_sources=finding.sources,
    )
    if run.json_output:
        typer.echo(path.read_text(encoding="utf-8").rstrip("\n"))
    elif finding.summary is not None:
        Console().print(finding.summary)
    typer.echo(f"receipt: {path}  verdict: {finding.verdict}", err=True)
    if finding.verdict != PASS:
        raise CheckFailed(f"{command}: verdict {finding.verdict}; see {path}")
