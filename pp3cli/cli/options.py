"""What commands share, declared once: the global settings and the run options.

Every receipt-writing command (qualify, oracle, probe) takes the same run options: the
guard's (``--cpus``, ``--nice``, ``--threads``, ``--expect-power-limit``), ``--detach``,
``--supersedes``/``--supersede-reason`` and ``--json``. Typer has no option groups, so
``with_run_options`` appends them to a command's signature (what Typer reads) and hands the
command one ``RunOptions`` instead of eight arguments.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pp3cli.run.settings import Settings

if TYPE_CHECKING:
    from pp3cli.run.guard import GuardOptions

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (the receipt itself).")
]


def settings_of(ctx: typer.Context) -> Settings:
    """The global settings (scratch root, receipts folder) the root callback parsed."""
    settings = ctx.find_root().obj
    if not isinstance(settings, Settings):
        raise TypeError("pp3 commands run under the root app, whose callback sets ctx.obj")
    return settings


@dataclass(frozen=True)
class RunOptions:
    """How a receipt-writing command runs: its guard, what it supersedes, its output form."""

    guard: GuardOptions
    supersedes: tuple[Path, ...]
    supersede_reason: str | None
    json_output: bool


def _keyword(name: str, annotation: Any, default: object) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


RUN_PARAMETERS = (
    _keyword(
        "cpus",
        Annotated[
            str | None,
            typer.Option(
                "--cpus",
                help="Pin to these CPUs (taskset list syntax, e.g. 12-15,28-31); "
                "default: as inherited.",
            ),
        ],
        None,
    ),
    _keyword(
        "nice",
        Annotated[
            int, typer.Option("--nice", help="Raise the niceness to this (-20..19; never lowered).")
        ],
        19,
    ),
    _keyword(
        "threads",
        Annotated[
            int,
            typer.Option(
                "--threads", help="CPU threads: OMP/MKL/OPENBLAS_NUM_THREADS and torch's."
            ),
        ],
        8,
    ),
    _keyword(
        "expect_power_limit",
        Annotated[
            float | None,
            typer.Option(
                "--expect-power-limit",
                help="Watts the GPU's enforced power limit must be, else exit 3 before any "
                "work; pp3 never changes it.",
            ),
        ],
        None,
    ),
    _keyword(
        "detach",
        Annotated[
            bool,
            typer.Option(
                "--detach", help="Run in pp3's private tmux server and return at once (see log)."
            ),
        ],
        False,
    ),
    _keyword(
        "supersedes",
        Annotated[
            list[Path] | None,
            typer.Option(
                "--supersedes",
                metavar="RECEIPT",
                help="An earlier receipt (in the receipts folder) this run replaces; repeatable.",
            ),
        ],
        None,
    ),
    _keyword(
        "supersede_reason",
        Annotated[
            str | None,
            typer.Option("--supersede-reason", help="Why the superseded receipts are replaced."),
        ],
        None,
    ),
    _keyword("json_output", JsonOption, False),
)


def _run_options(
    *,
    cpus: str | None,
    nice: int,
    threads: int,
    expect_power_limit: float | None,
    detach: bool,
    supersedes: list[Path] | None,
    supersede_reason: str | None,
    json_output: bool,
) -> RunOptions:
    """Validate the shared options (UsageProblem naming the bad value) and bundle them."""
    from pp3cli.run.guard import guard_options

    return RunOptions(
        guard=guard_options(cpus, nice, threads, expect_power_limit, detach),
        supersedes=tuple(supersedes or ()),
        supersede_reason=supersede_reason,
        json_output=json_output,
    )


def with_run_options(body: Callable[..., None]) -> Callable[..., None]:
    """A command that takes ``body``'s own options plus the shared run options.

    ``body`` declares its options and a keyword-only ``run: RunOptions``; the returned
    command's signature lists the body's options, then ``RUN_PARAMETERS``, and calls
    ``body(run=RunOptions(...), **own options)``.
    """
    signature = inspect.signature(body, eval_str=True)
    own = [parameter for name, parameter in signature.parameters.items() if name != "run"]
    shared = [parameter.name for parameter in RUN_PARAMETERS]

    @functools.wraps(body)
    def command(**arguments: Any) -> None:
        run = _run_options(**{name: arguments.pop(name) for name in shared})
        body(run=run, **arguments)

    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*own, *RUN_PARAMETERS]
    )
    return command
