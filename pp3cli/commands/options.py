"""Options shared by the commands that write receipts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SupersedesOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--supersedes",
        help="An earlier receipt (in the receipts folder) that this run replaces; repeatable.",
    ),
]
SupersedeReasonOption = Annotated[
    str | None,
    typer.Option("--supersede-reason", help="Why the superseded receipts are replaced."),
]
