"""The pp3 command line: the Typer app, its global options, and the exit-code mapping.

Commands register here, all the same way. Their modules import only light things at the
top (typer and pp3's own option and error types), and torch, Triton, scipy and numpy
inside the command, so that ``pp3 --help``, usage errors and ``pp3 verify-receipts`` start
in a fraction of a second and run where torch is not installed.
"""

from __future__ import annotations

import difflib
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from pp3cli import __version__
from pp3cli.cli.clean_scratch import clean_scratch_command
from pp3cli.cli.oracle import oracle_command
from pp3cli.cli.overlay import overlay_fetch_command, overlay_verify_command
from pp3cli.cli.probe import probe_command
from pp3cli.cli.qualify import qualify_command
from pp3cli.cli.verify_receipts import verify_receipts_command
from pp3cli.run.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, Pp3Error
from pp3cli.run.settings import DEFAULT_RECEIPTS, Settings, default_scratch


def _bare_flags(params: list[Any]) -> list[Any]:
    """Help lists a yes/no flag bare (``--json``), not as ``--json <bool>``."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


def unknown_option_hint(option: str, command: str, own: list[str], top_level: list[str]) -> str:
    """What to say about an unknown ``option`` of ``command`` (exit 2).

    A top-level option given after the command is named as such; otherwise a suggestion
    only when it is really close (difflib ratio >= 0.75 between the names without their
    dashes, so ``--bogus`` is offered neither ``--cpus`` nor ``--gpus``, while ``--cpu``
    is offered ``--cpus``), else a pointer to the command's help.
    """
    name = option.split("=", 1)[0]
    if name in top_level:
        return (
            f"No such option: {name} — {name} is an option of pp3 itself: give it before the "
            f"command, e.g. pp3 {name} VALUE {command}"
        )
    bare = {option.lstrip("-"): option for option in own}
    close = [
        bare[match]
        for match in difflib.get_close_matches(name.lstrip("-"), list(bare), n=3, cutoff=0.75)
    ]
    if close:
        return f"No such option: {name}. Did you mean {' or '.join(close)}?"
    return f"No such option: {name}. See pp3 {command} -h for the options."


class Pp3Command(TyperCommand):
    """A pp3 command: yes/no flags show no type placeholder; unknown options get a sane hint."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except Exception as err:  # the vendored click's NoSuchOption, which typer does not export
            option = getattr(err, "option_name", None)
            if not isinstance(option, str) or not hasattr(err, "possibilities"):
                raise
            own = [name for param in self.get_params(ctx) for name in param.opts]
            root = ctx.find_root()
            top = [name for param in root.command.get_params(root) for name in param.opts]
            err.possibilities = None
            usage: Any = err
            usage.message = unknown_option_hint(option, ctx.info_name or "", own, top)
            raise


class Pp3Group(TyperGroup):
    """pp3 and its command groups: yes/no flags show no type placeholder in help."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


app = typer.Typer(
    name="pp3",
    cls=Pp3Group,
    help="Prove a speculative-decoding verifier exactly lossless, and time it.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Markdown joins a docstring paragraph's lines, so help text reflows to the terminal
    # instead of breaking wherever the source line ended.
    rich_markup_mode="markdown",
)


# The settings the root callback parsed in this process, for main()'s crash report.
_parsed: list[Settings] = []


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
    _parsed.append(ctx.obj)


app.command("qualify", cls=Pp3Command)(qualify_command)
app.command("oracle", cls=Pp3Command)(oracle_command)
app.command("probe", cls=Pp3Command)(probe_command)
app.command("verify-receipts", cls=Pp3Command)(verify_receipts_command)
app.command("clean-scratch", cls=Pp3Command)(clean_scratch_command)

overlay_app = typer.Typer(
    name="overlay",
    cls=Pp3Group,
    help="The pinned vLLM 0.33.0 rejection-sampler overlay (the probe's peer comparator).",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
overlay_app.command("fetch", cls=Pp3Command)(overlay_fetch_command)
overlay_app.command("verify", cls=Pp3Command)(overlay_verify_command)
app.add_typer(overlay_app)


def save_traceback(text: str) -> Path:
    """Write a crash's traceback under the scratch root and return its path.

    It goes into a new marked run folder ``<scratch>/runs/crash-<stamp>-<hex>/traceback.txt``
    (so ``clean-scratch`` removes it); when the scratch root itself is unusable, into a
    fresh ``pp3-crash-*.txt`` in the system's temporary folder.
    """
    import tempfile

    from pp3cli.run.scratch import new_run_dir

    settings = _parsed[-1] if _parsed else Settings(default_scratch(), DEFAULT_RECEIPTS)
    try:
        path = new_run_dir(settings, "crash") / "traceback.txt"
        path.write_text(text, encoding="utf-8")
    except (Pp3Error, OSError):
        handle, name = tempfile.mkstemp(prefix="pp3-crash-", suffix=".txt")
        with open(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        path = Path(name)
    return path


def main() -> None:
    """Console entry point: every outcome leaves with its documented exit code.

    Typer reports usage errors (2) and turns Ctrl-C into 130; ``Pp3Error`` maps to its own
    code (1 check failed, 2 usage, 3 environment); any other exception is a bug in pp3: its
    traceback is saved under the scratch root and the process exits 4 (never 1, which
    would read as a failed check).
    """
    try:
        app()
    except Pp3Error as err:
        typer.echo(f"pp3: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # raised outside Typer's own handler (e.g. while importing)
        typer.echo("pp3: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit as exited:
        if exited.code == EXIT_INTERRUPTED:
            typer.echo("pp3: interrupted", err=True)
        raise
    except Exception as err:
        path = save_traceback(traceback.format_exc())
        typer.echo(
            f"pp3: internal error (a bug in pp3, not a failed check): "
            f"{type(err).__name__}: {err}\npp3: traceback saved to {path}",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)
