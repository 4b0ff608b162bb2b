"""The pp3 command line: a thin Typer app; each command lives in pp3cli/commands/."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from pp3cli import __version__
from pp3cli.errors import EXIT_USAGE, Pp3Error
from pp3cli.settings import DEFAULT_RECEIPTS, Settings, default_scratch

app = typer.Typer(
    name="pp3",
    help="Prove a speculative-decoding verifier exactly lossless, and time it.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# Each module defines ``register(app)``; adding a command is one line here.
COMMAND_MODULES = (
    "pp3cli.commands.verify_receipts",
    "pp3cli.commands.clean_scratch",
    "pp3cli.commands.probe",
    "pp3cli.commands.overlay",
    "pp3cli.commands.oracle",
    "pp3cli.commands.qualify",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pp3 {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    *,
    scratch: Annotated[
        Path | None,
        typer.Option(
            "--scratch",
            envvar="PP3_SCRATCH",
            help="Scratch root that pp3 owns (default ~/.cache/pp3/scratch).",
        ),
    ] = None,
    receipts: Annotated[
        Path,
        typer.Option("--receipts", envvar="PP3_RECEIPTS", help="Receipts folder."),
    ] = DEFAULT_RECEIPTS,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """pp3: qualify, oracle, probe, verify-receipts, clean-scratch."""
    ctx.obj = Settings(scratch=scratch or default_scratch(), receipts=receipts)


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """Console entry point: Typer handles usage errors (exit 2); Pp3Error maps to its code."""
    try:
        app()
    except Pp3Error as err:
        typer.echo(f"pp3: {err}", err=True)
        sys.exit(err.exit_code)
    except ValueError as err:  # contract violations raised by pp3kernels validation
        typer.echo(f"pp3: {err}", err=True)
        sys.exit(EXIT_USAGE)
