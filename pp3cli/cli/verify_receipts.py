"""`pp3 verify-receipts`: one OK / STALE / ORPHAN / FAIL line per receipt; exit 1 on any FAIL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pp3cli.cli.options import JsonOption, settings_of
from pp3cli.run.errors import CheckFailed


def verify_receipts_command(
    ctx: typer.Context,
    *,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Treat STALE (sources moved on) and ORPHAN (no manifest line) as FAIL."
        ),
    ] = False,
    json_output: JsonOption = False,
    source_root: Annotated[
        Path | None,
        typer.Option(
            "--source-root",
            help="Source tree to compare the receipts' hashes with (default: this pp3's tree).",
        ),
    ] = None,
) -> None:
    """Re-check every receipt: bytes, manifest chain, schema, sources and recomputed verdict.

    OK: all checks pass. STALE: all pass but the sources changed since. ORPHAN: a receipt
    whose manifest line never came (its writer was killed), or a leftover temp file: not
    evidence, not a failure. FAIL: a check failed. Exit 1 if any line is FAIL (STALE and
    ORPHAN count as FAIL under --strict). Needs neither torch nor a GPU.
    """
    import orjson

    from pp3cli.receipts.verify import FAIL, OK, ORPHAN, STALE, STATUSES, verify_receipts
    from pp3cli.run.scratch import repo_root

    settings = settings_of(ctx)
    results = verify_receipts(settings.receipts, root=(source_root or repo_root()), strict=strict)
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    if json_output:
        payload = {
            "receipts": str(settings.receipts),
            "strict": strict,
            "counts": counts,
            "results": [result.as_dict() for result in results],
        }
        typer.echo(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode())
    elif not results:
        typer.echo(f"no receipts in {settings.receipts}")
    else:
        for result in results:
            typer.echo(result.line())
        typer.echo(
            f"{counts[OK]} OK, {counts[STALE]} STALE, {counts[ORPHAN]} ORPHAN, {counts[FAIL]} FAIL",
            err=True,
        )
    if counts[FAIL]:
        raise CheckFailed(f"{counts[FAIL]} of {len(results)} failed verification")
