"""`pp3 oracle`: GPU samples against the exact rational law of the integer draft counts."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from pp3cli import oracle
from pp3cli.commands.options import SupersedeReasonOption, SupersedesOption
from pp3cli.errors import CheckFailed, EnvironmentProblem, UsageProblem
from pp3cli.guard import (
    CpusOption,
    DetachOption,
    ExpectPowerOption,
    NiceOption,
    ThreadsOption,
    guard_options,
    guarded,
    maybe_detach,
)
from pp3cli.receipts import supersede_entries, write_receipt
from pp3cli.settings import Settings

DEFAULT_N_GPU = 200_000
DEFAULT_N_CPU = 20_000


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda'/'cuda:N'/'cpu' as given."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" or device.startswith("cuda"):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EnvironmentProblem(f"--device {device}: torch sees no CUDA GPU")
        return device
    raise UsageProblem(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")


def results_table(result: dict[str, Any]) -> Table:
    """One line per policy: identity, outcomes, impossible hits, G, df, p, Holm-adjusted p."""
    data = result["data"]
    adjusted = data["family"]["adjusted"]
    table = Table(
        title=f"pp3 oracle: {result['parameters']['verifier']}, verdict {result['verdict']}"
    )
    for column in ("policy", "identity", "outcomes", "impossible", "G", "df", "p", "Holm p"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for member in data["policies"]:
        stats = member["member"]
        table.add_row(
            member["name"],
            "exact" if member["identity"] else "BROKEN",
            str(len(member["law"])),
            str(stats["impossible_hits"]),
            f"{stats['statistic']:.2f}",
            str(stats["df"]),
            f"{stats['p_value']:.4g}",
            f"{adjusted[member['name']]:.4g}",
        )
    return table


def register(app: typer.Typer) -> None:
    """Add `pp3 oracle` to the root app."""

    @app.command("oracle")
    def oracle_command(
        ctx: typer.Context,
        *,
        n: Annotated[
            int | None,
            typer.Option(
                "--n",
                help=f"Requests per policy (default {DEFAULT_N_GPU} on a GPU, "
                f"{DEFAULT_N_CPU} on CPU).",
            ),
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="Philox seed of the run.")] = 0,
        device: Annotated[
            str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")
        ] = "auto",
        verifier: Annotated[
            str,
            typer.Option(
                "--verifier",
                help="selector (the Triton verify_chain), reference (torch), or auto "
                "(selector when available).",
            ),
        ] = "auto",
        alpha: Annotated[
            float, typer.Option("--alpha", help="Family-wise alpha (Holm over the policies).")
        ] = oracle.ALPHA,
        json_output: Annotated[
            bool, typer.Option("--json", help="Print the receipt data as JSON on stdout.")
        ] = False,
        supersedes: SupersedesOption = None,
        supersede_reason: SupersedeReasonOption = None,
        cpus: CpusOption = None,
        nice: NiceOption = 19,
        threads: ThreadsOption = 8,
        expect_power_limit: ExpectPowerOption = None,
        detach: DetachOption = False,
    ) -> None:
        """Prove the draft counts lossless exactly, then test the verifier's samples.

        Exit codes: 0 PASS, 1 FAIL (the receipt is still written), 2 bad options,
        3 no GPU where asked / lock held / power limit not as expected.
        """
        settings: Settings = ctx.obj
        if n is not None and n < 1:
            raise UsageProblem(f"--n {n}: expected at least 1 request per policy")
        if not 0 < alpha < 1:
            raise UsageProblem(f"--alpha {alpha}: expected 0 < alpha < 1")
        if seed < 0 or seed >= 1 << 60:
            raise UsageProblem(f"--seed {seed}: expected 0 <= seed < 2^60")
        if verifier not in ("auto", "selector", "reference"):
            raise UsageProblem(f"--verifier {verifier!r}: expected auto, selector or reference")
        options = guard_options(cpus, nice, threads, expect_power_limit, detach)
        if maybe_detach("oracle", settings, options, sys.argv[1:]):
            return
        superseded = supersede_entries(settings.receipts, supersedes or [], supersede_reason)
        progress = Console(stderr=True)
        with guarded("oracle", settings, options, require_gpu=False) as record:
            resolved = resolve_device(device)
            requests = (
                n
                if n is not None
                else (DEFAULT_N_GPU if resolved.startswith("cuda") else DEFAULT_N_CPU)
            )
            result = oracle.run_oracle(
                resolved,
                requests,
                seed,
                verifier,
                alpha=alpha,
                progress=lambda message: progress.print(message),
            )
            environment = record.environment()
        path = write_receipt(
            settings.receipts,
            "oracle",
            parameters=result["parameters"],
            environment=environment,
            data=result["data"],
            verdict=result["verdict"],
            supersedes=superseded,
        )
        if json_output:
            typer.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        else:
            Console().print(results_table(result))
        progress.print(f"receipt: {path}  verdict: {result['verdict']}")
        if result["verdict"] != "PASS":
            raise CheckFailed(f"the oracle failed; see {path}")
