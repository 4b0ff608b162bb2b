"""`pp3 clean-scratch`: remove what pp3 owns in its scratch root, and nothing else."""

from __future__ import annotations

from typing import Annotated

import typer

from pp3cli.cli.options import settings_of


def clean_scratch_command(
    ctx: typer.Context,
    *,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    bytecode: Annotated[
        bool,
        typer.Option(
            "--bytecode", help="Also remove `__pycache__` and `*.pyc` in the project tree."
        ),
    ] = False,
) -> None:
    """Remove pp3's run folders, its private tmux server and (--bytecode) project bytecode.

    Only folders carrying pp3's ownership marker go; links are unlinked, never followed.
    Refuses (exit 2) a scratch root that is /, a home folder, the repository root or lacks
    pp3's marker; exit 3 while a pp3 run uses this scratch root.
    """
    from pp3cli.run.locks import hold_scratch
    from pp3cli.run.scratch import execute_clean, plan_clean

    settings = settings_of(ctx)
    plan = plan_clean(settings.scratch, bytecode=bytecode)
    if plan.scratch_root is None and not plan.bytecode:
        typer.echo(f"nothing to clean: scratch root {settings.scratch} does not exist")
        return
    if dry_run:
        if plan.tmux_server:
            typer.echo("would stop: pp3's tmux server")
        for path in plan.paths():
            typer.echo(f"would remove: {path}")
        return
    if plan.scratch_root is None:
        removed = execute_clean(plan)
    else:
        with hold_scratch(plan.scratch_root, "clean-scratch", exclusive=True):
            plan = plan_clean(settings.scratch, bytecode=bytecode)  # again, under the lock
            removed = execute_clean(plan)
    if plan.tmux_server:
        typer.echo("stopped: pp3's tmux server")
    for path in removed:
        typer.echo(f"removed: {path}")
    if not removed and not plan.tmux_server:
        typer.echo("nothing to clean")
