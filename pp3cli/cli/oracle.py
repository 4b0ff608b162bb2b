"""`pp3 oracle`: GPU samples against the exact rational law of the integer draft counts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pp3cli.cli.options import RunOptions, settings_of, with_run_options
from pp3cli.cli.receipted import Finding, run_receipted
from pp3cli.evidence.profiles import ALPHA, ORACLE_REQUESTS_CPU, ORACLE_REQUESTS_GPU
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.verifiers.registry import VerifierName

if TYPE_CHECKING:
    from rich.table import Table

    from pp3cli.run.guard import GuardRecord

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def resolve_device(device: str, cuda_available: bool) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda'/'cuda:N'/'cpu' as given."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise UsageProblem(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise EnvironmentProblem(f"--device {device}: torch sees no CUDA GPU")
    return device


def results_table(result: dict[str, Any]) -> Table:
    """One line per policy: identity, outcomes, impossible hits, G, df, p, Holm-adjusted p."""
    from rich.table import Table

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


@with_run_options
def oracle_command(
    ctx: typer.Context,
    *,
    run: RunOptions,
    n: Annotated[
        int | None,
        typer.Option(
            "--n",
            help=f"Requests per policy (default {ORACLE_REQUESTS_GPU} on a GPU, "
            f"{ORACLE_REQUESTS_CPU} on a CPU).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Philox seed of the run.")] = 0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    verifier: Annotated[
        VerifierName,
        typer.Option("--verifier", help="selector (the Triton kernel) or reference (torch)."),
    ] = VerifierName.selector,
    alpha: Annotated[
        float, typer.Option("--alpha", help="Family-wise alpha (Holm over the policies).")
    ] = ALPHA,
) -> None:
    """Prove the draft counts lossless exactly, then test the verifier's samples.

    Exit codes: 0 PASS, 1 FAIL (the receipt is still written), 2 bad options,
    3 no GPU where asked / lock held / power limit not as expected.
    """
    settings = settings_of(ctx)
    if n is not None and n < 1:
        raise UsageProblem(f"--n {n}: expected at least 1 request per policy")
    if not 0 < alpha < 1:
        raise UsageProblem(f"--alpha {alpha}: expected 0 < alpha < 1")
    if seed < 0 or seed >= 1 << 60:
        raise UsageProblem(f"--seed {seed}: expected 0 <= seed < 2^60")
    if not DEVICE_PATTERN.fullmatch(device):
        raise UsageProblem(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")

    def work(record: GuardRecord) -> Finding:
        from pp3cli.evidence.oracle import run_oracle
        from pp3cli.verifiers.registry import resolve_verifier

        resolved = resolve_device(device, record.cuda_available)
        default_n = ORACLE_REQUESTS_GPU if resolved.startswith("cuda") else ORACLE_REQUESTS_CPU
        result = run_oracle(
            resolved,
            n if n is not None else default_n,
            seed,
            resolve_verifier(verifier.value),
            label=verifier.value,
            alpha=alpha,
            progress=lambda message: typer.echo(message, err=True),
        )
        return Finding(
            result["parameters"], result["data"], result["verdict"], results_table(result)
        )

    # --device cuda without a GPU exits 3 in the guard, before anything is created.
    require_gpu = device.startswith("cuda")
    run_receipted("oracle", settings, run, work, kind="oracle", require_gpu=require_gpu)
