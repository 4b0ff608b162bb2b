"""`pp3 qualify`: G-test family + greedy pairing + edge battery + negative controls."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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
from pp3cli.qualify import (
    PROFILES,
    ProxyTransport,
    QualificationReport,
    Verifier,
    plan_samples,
    requests_for,
    run_qualification,
)
from pp3cli.receipts import supersede_entries, write_receipt
from pp3cli.settings import Settings


def register(app: typer.Typer) -> None:
    """Add the command to ``app``."""
    app.command("qualify")(qualify_command)


def _plan(tv: float, alpha: float, json_output: bool) -> None:
    rows = plan_samples(tv, alpha)
    if json_output:
        payload = {"tv": tv, "alpha": alpha, "members": [r.__dict__ for r in rows]}
        typer.echo(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode())
        return
    table = Table(title=f"samples per member: TV {tv:g}, power 0.99, family alpha {alpha:g}")
    for column in ("member", "outcomes", "df (pooled)", "samples"):
        table.add_column(column, justify="left" if column == "member" else "right")
    for row in rows:
        table.add_row(row.member, str(row.outcomes), str(row.df), f"{row.n_needed:,}")
    Console().print(table)
    typer.echo(f"requests per target: {max(r.n_needed for r in rows):,}")


def _summary(report: QualificationReport) -> None:
    console = Console()
    table = Table(title=f"qualify ({report.profile}, n = {report.requests_per_target:,}/target)")
    for column in ("member", "n", "df", "G", "p", "Holm adj.", "impossible", "result"):
        table.add_column(column, justify="left" if column == "member" else "right")
    rejected = set(report.family.rejected)
    for record in report.members:
        r = record.result
        table.add_row(
            r.name,
            f"{r.n:,}",
            str(r.df),
            f"{r.statistic:.2f}",
            f"{r.p_value:.3g}",
            f"{report.family.adjusted[r.name]:.3g}",
            str(r.impossible_hits),
            "[red]FAIL[/red]" if r.name in rejected else "ok",
        )
    console.print(table)
    console.print(
        f"greedy pairing: {report.greedy.mismatches} mismatches in {report.greedy.n:,} T0 requests"
    )
    for example in report.greedy.examples:
        console.print(f"  mismatch {example}")
    for edge in report.edge:
        mark = "ok  " if edge.passed else "FAIL"
        console.print(f"edge {mark} {edge.name}: {edge.detail}", highlight=False)
    for control in report.controls:
        mark = "failed as required" if control.failed else "[red]PASSED (not evidence)[/red]"
        console.print(
            f"control {control.defect}: {mark} (rejected {len(control.family.rejected)} "
            + (
                f"members, greedy mismatches {control.greedy.mismatches})"
                if control.greedy.n
                else "members; later parts skipped)"
            )
        )
    console.print(f"verdict: {report.verdict}")


def _verifier(name: str) -> Verifier:
    kernels = importlib.import_module("pp3kernels")
    if name == "selector":
        selector: Verifier = (
            getattr(kernels, "verify_chain", None)
            or importlib.import_module("pp3kernels.selector").verify_chain
        )
        return selector
    if name == "reference":
        reference: Verifier = kernels.reference_verify_chain
        return reference
    raise UsageProblem(f"--verifier {name!r}: expected 'selector' or 'reference'")


def qualify_command(
    ctx: typer.Context,
    *,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="smoke | seed | strict. Default: strict on a GPU, seed on a CPU machine.",
        ),
    ] = None,
    plan: Annotated[
        bool, typer.Option("--plan", help="Print the samples each member needs; run nothing.")
    ] = False,
    tv: Annotated[
        float | None,
        typer.Option("--tv", help="Size the run to detect this total variation (power 0.99)."),
    ] = None,
    alpha: Annotated[float, typer.Option("--alpha", help="Family-wise alpha (Holm).")] = 1e-5,
    seed: Annotated[int, typer.Option("--seed", help="The run's one Philox seed.")] = 0,
    n_greedy: Annotated[
        int | None,
        typer.Option(
            "--n-greedy", help="Paired T0 requests (default: the profile's; seed 100000)."
        ),
    ] = None,
    verifier: Annotated[
        str,
        typer.Option("--verifier", help="selector (the Triton kernel) or reference (torch)."),
    ] = "selector",
    full_controls: Annotated[
        bool,
        typer.Option(
            "--full-controls",
            help="Run every control through every part even after it has already failed.",
        ),
    ] = False,
    via_proxy: Annotated[
        bool,
        typer.Option("--via-proxy", help="Send every draft through the real drafter proxy."),
    ] = False,
    supersedes: SupersedesOption = None,
    supersede_reason: SupersedeReasonOption = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the receipt data as JSON.")
    ] = False,
    cpus: CpusOption = None,
    nice: NiceOption = 19,
    threads: ThreadsOption = 8,
    expect_power_limit: ExpectPowerOption = None,
    detach: DetachOption = False,
) -> None:
    """Qualify a verifier: exact-law G-tests (Holm), greedy pairing, edge battery, controls.

    Exit 0 on PASS, 1 on FAIL (a member rejected, a greedy mismatch, an edge check failed,
    or a negative control that passed), 2 on bad options, 3 on an unfit machine.
    """
    settings: Settings = ctx.obj
    if not 0 < alpha < 1:
        raise UsageProblem(f"--alpha {alpha}: expected 0 < alpha < 1")
    if tv is not None and not 0 < tv <= 1:
        raise UsageProblem(f"--tv {tv}: expected 0 < tv <= 1")
    if n_greedy is not None and n_greedy < 1:
        raise UsageProblem(f"--n-greedy {n_greedy}: expected at least 1")
    if profile is not None and profile not in PROFILES:
        raise UsageProblem(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}")
    if plan:
        _plan(tv if tv is not None else 1e-3, alpha, json_output)
        return
    options = guard_options(cpus, nice, threads, expect_power_limit, detach)
    if maybe_detach("qualify", settings, options, sys.argv[1:]):
        return
    import torch

    cuda = bool(torch.cuda.is_available())
    if not cuda and verifier == "selector" and os.environ.get("TRITON_INTERPRET") != "1":
        raise EnvironmentProblem(
            "no GPU and TRITON_INTERPRET is not 1: on a CPU machine the Triton selector runs "
            "in Triton's interpreter; run `TRITON_INTERPRET=1 pp3 qualify` (or `make qualify`)"
        )
    chosen = PROFILES[profile or ("strict" if cuda else "seed")]
    under_test = _verifier(verifier)
    reference_module = importlib.import_module("pp3kernels.reference")
    defects: tuple[str, ...] = tuple(reference_module.DEFECTS)
    controls: dict[str, Verifier] = {
        defect: functools.partial(reference_module.reference_verify_chain, defect=defect)
        for defect in defects
    }
    device = "cuda" if cuda else "cpu"
    n = requests_for(chosen, alpha, tv)
    started = time.monotonic()
    superseded = supersede_entries(settings.receipts, supersedes or [], supersede_reason)
    transport = ProxyTransport() if via_proxy else None
    with guarded("qualify", settings, options, require_gpu=False) as record:
        console = Console(stderr=True)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as bars:
            tasks: dict[str, Any] = {}

            def progress(task: str, done: int, total: int) -> None:
                if task not in tasks:
                    tasks[task] = bars.add_task(task, total=total)
                    if not console.is_terminal:  # a log file gets one line per task
                        console.print(f"{time.monotonic() - started:8.1f}s start {task}")
                bars.update(tasks[task], completed=done)
                if done >= total and not console.is_terminal:
                    console.print(f"{time.monotonic() - started:8.1f}s done  {task} {done}/{total}")

            report = run_qualification(
                chosen,
                verifier=under_test,
                device=device,
                alpha=alpha,
                seed=seed,
                tv=tv,
                n_greedy=n_greedy,
                controls=controls,
                full_controls=full_controls,
                transport=transport,
                progress=progress,
            )
        environment = record.environment()
    elapsed = time.monotonic() - started
    parameters = {
        "profile": chosen.name,
        "requests_per_target": n,
        "tv": tv if tv is not None else chosen.tv,
        "alpha": alpha,
        "seed": seed,
        "n_greedy": report.greedy.n,
        "verifier": verifier,
        "device": device,
        "controls": list(defects),
        "full_controls": full_controls,
        "via_proxy": via_proxy,
        "batch": chosen.batch,
        "repeats": chosen.repeats,
    }
    data = report.to_json()
    data["elapsed_s"] = round(elapsed, 3)
    if transport is not None:
        data["proxy"] = transport.summary()
    path = write_receipt(
        settings.receipts,
        "qualification",
        parameters=parameters,
        environment=environment,
        data=data,
        verdict=report.verdict,
        supersedes=superseded,
    )
    if json_output:
        payload = {"receipt": str(path), "verdict": report.verdict, "data": data}
        typer.echo(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode())
    else:
        _summary(report)
        typer.echo(f"receipt: {path} ({elapsed:.1f} s)")
    if report.verdict != "PASS":
        raise CheckFailed(f"qualification FAILED (receipt {path})")
