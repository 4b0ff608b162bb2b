"""`pp3 overlay`: fetch and check the pinned vLLM sampler overlay that `pp3 probe` uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pp3cli.cli.options import settings_of
from pp3cli.run.settings import Settings


def _overlay_dir(settings: Settings, path: Path | None, dest: Path | None) -> Path:
    from pp3cli.verifiers import overlay

    if path is not None:
        return path
    return overlay.overlay_root(settings.scratch, dest) / overlay.OVERLAY_NAME


def overlay_fetch_command(
    ctx: typer.Context,
    *,
    dest: Annotated[
        Path | None,
        typer.Option(
            "--dest",
            help="Folder for overlays (e.g. .overlay to carry it to a GPU machine); "
            "default `<scratch>/overlay`.",
        ),
    ] = None,
    wheel: Annotated[
        Path | None,
        typer.Option("--wheel", help="Use this vllm-0.33.0 wheel instead of pip download."),
    ] = None,
    force_new: Annotated[
        bool,
        typer.Option("--force-new", help="If an overlay exists, create the next numbered one."),
    ] = False,
) -> None:
    """Download vllm==0.33.0, check the pinned files, and write the overlay."""
    from pp3cli.verifiers import overlay

    settings = settings_of(ctx)
    typer.echo(f"fetching vllm=={overlay.VLLM_VERSION} (about 336 MB) ...", err=True)
    target = overlay.fetch_overlay(settings.scratch, dest=dest, wheel=wheel, force_new=force_new)
    for path in sorted(overlay.VLLM_PINS):
        typer.echo(f"OK: {path}", err=True)
    typer.echo(str(target))


def overlay_verify_command(
    ctx: typer.Context,
    path: Annotated[
        Path | None,
        typer.Argument(help="Overlay folder (default `<scratch>/overlay/vllm-0.33.0`)."),
    ] = None,
    *,
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Folder for overlays, as given to fetch.")
    ] = None,
    signature: Annotated[
        bool,
        typer.Option("--signature", help="Also import it and print rejection_sample's signature."),
    ] = False,
) -> None:
    """Re-hash an overlay's files against the pins (exit 1 naming the first mismatch)."""
    from pp3cli.verifiers import overlay

    target = _overlay_dir(settings_of(ctx), path, dest)
    overlay.verify_overlay(target)
    typer.echo(f"OK: {target}")
    if signature:
        typer.echo(overlay.describe_signature(overlay.load_vllm_rejection_sample(target)))
