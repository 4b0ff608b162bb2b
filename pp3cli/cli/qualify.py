"""`pp3 qualify`: G-test family + greedy pairing + edge battery + negative controls."""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pp3cli.cli.options import RunOptions, settings_of, with_run_options
from pp3cli.cli.ranked import rank_run_options, run_as_rank
from pp3cli.cli.receipted import Finding, run_receipted
from pp3cli.evidence.profiles import ALPHA, PROFILES, Profile
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from pp3cli.evidence.qualify import QualificationReport
    from pp3cli.evidence.shares import RankShare
    from pp3cli.run.guard import GuardRecord
    from pp3cli.verifiers.registry import ResolvedVerifier


# Verifiers whose kernels are Triton: on a CPU machine they need TRITON_INTERPRET=1.
TRITON_VERIFIERS = ("selector", "vllm-mrv2")


def _plan_output(
    tv: float,
    alpha: float,
    json_output: bool,
    ranks: int | None,
    receipts: Path,
    control_tv: float | None,
    profile_name: str = "strict",
) -> None:
    """The samples table; with ``ranks`` (--gpus N) also the expected wall time on N GPUs.

    n requests per target (a capped target its cap under ``profile_name``); the controls
    run n per uncapped target too, or fewer with a ``control_tv`` (exhaustive).
    """
    import orjson
    from rich.console import Console
    from rich.table import Table

    from pp3cli.evidence.family import plan_samples, requests_for
    from pp3cli.evidence.targets import TARGETS
    from pp3cli.receipts.rates import expected_wall_s, newest_rate
    from pp3cli.run.scratch import repo_root
    from pp3cli.verifiers.registry import planted_defect_controls

    rows = plan_samples(tv, alpha)
    sizing = PROFILES[profile_name]
    n = requests_for(sizing, alpha, tv)
    n_controls = n
    if control_tv is not None:
        n_controls = min(n, requests_for(sizing, alpha, control_tv))
    rate = newest_rate(receipts, repo_root()) if ranks and receipts.is_dir() else None
    controls = len(planted_defect_controls())
    uncapped = sum(1 for target in TARGETS if not target.capped)
    requests = sum(target.requests(profile_name, n) for target in TARGETS)
    requests += controls * uncapped * n_controls
    wall = None
    if rate is not None and ranks is not None:
        wall = expected_wall_s(rate, requests, ranks)
    if json_output:
        payload: dict[str, Any] = {
            "tv": tv,
            "alpha": alpha,
            "members": [r.__dict__ for r in rows],
            "requests_per_target": n,
        }
        if ranks is not None:
            payload |= {
                "control_requests_per_target": n_controls,
                "family_requests": requests,
                "gpus": ranks,
                "rate": None if rate is None else rate.to_json(),
                "expected_wall_s": wall,
            }
        typer.echo(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode())
        return
    table = Table(title=f"samples per member: TV {tv:g}, power 0.99, family alpha {alpha:g}")
    for column in ("member", "outcomes", "df (pooled)", "samples"):
        table.add_column(column, justify="left" if column == "member" else "right")
    for row in rows:
        table.add_row(row.member, str(row.outcomes), str(row.df), f"{row.n_needed:,}")
    Console().print(table)
    typer.echo(f"requests per target: {n:,}")
    if ranks is None:
        return
    if rate is None or wall is None:
        typer.echo(
            f"expected wall time: unknown (no verified single-GPU H200 strict qualification "
            f"receipt in {receipts} to measure a rate from)"
        )
        return
    typer.echo(
        f"expected wall time on {ranks} GPU(s): {wall:,.0f} s ({wall / 60:.1f} min) for "
        f"{requests:,} family requests (verifier {n:,} and {controls} controls {n_controls:,} "
        f"per uncapped target); rate {rate.requests_per_s:,.0f} requests/s per GPU from "
        f"{rate.receipt} "
        f"({rate.status}, {rate.gpu_name}: {rate.requests:,} requests in {rate.elapsed_s:g} s); "
        "start-up and the unsplit greedy pairings not included"
    )


def _summary(report: QualificationReport) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

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
    lines = [
        f"greedy pairing: {report.greedy.mismatches} mismatches in {report.greedy.n:,} T0 requests"
    ]
    lines += [f"  mismatch {example}" for example in report.greedy.examples]
    for edge in report.edge:
        if report.edge_decides:
            mark = "ok  " if edge.passed else "FAIL"
        else:
            mark = "meets pp3's contract" if edge.passed else "differs"
        lines.append(f"edge {mark} {edge.name}: {edge.detail}")
    if not report.edge_decides:
        summary = report.edge_summary()
        lines.append(
            f"edge battery (recorded, not deciding): {len(summary['meets'])} meet pp3's "
            f"contract, {len(summary['differs'])} differ"
        )
    if report.pairing is not None:
        pairing = report.pairing
        lines.append(
            f"paired with {pairing.with_}: {pairing.t0_mismatches} T0 mismatches in "
            f"{pairing.t0:,} requests"
        )
        lines += [f"  mismatch {example}" for example in pairing.examples]
        for test in pairing.tests:
            r = test.result
            mark = "FAIL" if r.name in rejected else "ok"
            lines.append(
                f"  {r.name}: G {r.statistic:.2f}, df {r.df}, p {r.p_value:.3g}, "
                f"Holm adj. {report.family.adjusted[r.name]:.3g} {mark}"
            )
    for control in report.controls:
        mark = "failed as required" if control.caught else "PASSED (not evidence)"
        later = (
            f"members, greedy mismatches {control.greedy.mismatches})"
            if control.greedy.n
            else "members; later parts skipped)"
        )
        lines.append(
            f"control {control.defect}: {mark} (rejected {len(control.family.rejected)} {later}"
        )
    lines.append(f"verdict: {report.verdict}")
    return Group(table, *(Text(line) for line in lines))


def _progress_printer(console: Console, started: float) -> Any:
    """A rich progress display; on a non-terminal (a log) one line per task start and end."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def progress(task: str, done: int, total: int) -> None:
        if task not in tasks:
            tasks[task] = bars.add_task(task, total=total)
            if not console.is_terminal:
                console.print(f"{time.monotonic() - started:8.1f}s start {task}")
        bars.update(tasks[task], completed=done)
        if done >= total and not console.is_terminal:
            console.print(f"{time.monotonic() - started:8.1f}s done  {task} {done}/{total}")

    return bars, progress


@with_run_options
def qualify_command(
    ctx: typer.Context,
    *,
    run: RunOptions,
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
    alpha: Annotated[float, typer.Option("--alpha", help="Family-wise alpha (Holm).")] = ALPHA,
    seed: Annotated[
        int, typer.Option("--seed", help="The run's one Philox seed (0 <= seed < 2^60).")
    ] = 0,
    n_greedy: Annotated[
        int | None,
        typer.Option("--n-greedy", help="Paired T0 requests (default: the profile's)."),
    ] = None,
    verifier: Annotated[
        str,
        typer.Option(
            "--verifier",
            help="selector (the Triton kernel), reference (torch), vllm-mrv2 (the pinned "
            "overlay), flashinfer, or MODULE:FUNCTION (docs/verifiers.md).",
        ),
    ] = "selector",
    pair_with: Annotated[
        str | None,
        typer.Option(
            "--pair-with",
            help="Also run VERIFIER on identical inputs: T0 tokens must be equal, sampled "
            "laws two-sample G-tested (in the same Holm family).",
        ),
    ] = None,
    overlay: Annotated[
        Path | None,
        typer.Option(
            "--overlay",
            help="The vLLM overlay folder (default: <scratch>/overlay/vllm-0.33.0, then "
            "./.overlay/vllm-0.33.0).",
        ),
    ] = None,
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
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            help="Run on N GPUs (N CPU processes on a CPU machine): launches `torchrun "
            "--nproc-per-node N -m pp3cli qualify ...`; with --plan, the N to plan for.",
        ),
    ] = None,
) -> None:
    """Qualify a verifier: exact-law G-tests (Holm), greedy pairing, edge battery, controls.

    Exit 0 on PASS, 1 on FAIL (a member rejected, a greedy or --pair-with T0 mismatch, an
    edge check failed for pp3's own verifiers, or a negative control that passed; the
    receipt is still written), 2 on bad options or an unknown verifier, 3 on an unfit
    machine (no GPU for flashinfer, no overlay for vllm-mrv2, an unimportable module).
    """
    settings = settings_of(ctx)
    if not 0 < alpha < 1:
        raise UsageProblem(f"--alpha {alpha}: expected 0 < alpha < 1")
    if tv is not None and not 0 < tv <= 1:
        raise UsageProblem(f"--tv {tv}: expected 0 < tv <= 1")
    if seed < 0 or seed >= 1 << 60:  # as oracle's; numpy refuses a negative seed, torch >= 2^63
        raise UsageProblem(f"--seed {seed}: expected 0 <= seed < 2^60")
    if n_greedy is not None and n_greedy < 1:
        raise UsageProblem(f"--n-greedy {n_greedy}: expected at least 1")
    if profile is not None and profile not in PROFILES:
        raise UsageProblem(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}")
    if gpus is not None and gpus < 1:
        raise UsageProblem(f"--gpus {gpus}: expected at least 1")
    if plan:
        profile_tv = PROFILES[profile].tv if profile is not None else None
        planned_tv = tv if tv is not None else profile_tv if profile_tv is not None else 1e-3
        control_tv = PROFILES[profile].control_tv if profile is not None else None
        _plan_output(
            planned_tv,
            alpha,
            run.json_output,
            gpus,
            settings.receipts,
            control_tv,
            profile if profile is not None else "strict",
        )
        return
    from pp3cli.run.ranks import RankPlace

    place = RankPlace.from_environment()
    if via_proxy and (gpus is not None or place is not None):
        raise UsageProblem(
            "--via-proxy with several ranks: the drafter proxy's frame summary is per process "
            "and is not merged across ranks yet; run --via-proxy without --gpus or torchrun"
        )
    if pair_with is not None and (gpus is not None or place is not None):
        raise UsageProblem(
            f"--pair-with {pair_with} with several ranks: the paired run is single-process for "
            "now; run --pair-with without --gpus or torchrun"
        )
    if gpus is not None:
        if place is not None:
            raise UsageProblem(
                f"--gpus {gpus} inside a torchrun worker (rank {place.rank}): torchrun already "
                "started the ranks; drop --gpus"
            )
        _launch(gpus, settings, run)
        return

    if pair_with is not None and pair_with == verifier:
        raise UsageProblem(f"--pair-with {pair_with}: expected a verifier other than --verifier")

    def resolve(cuda: bool) -> tuple[ResolvedVerifier, ResolvedVerifier | None]:
        """The guard's precheck, before it creates anything: exit 3 when a verifier cannot
        run here, then (verifier, pair_with or None) resolved (a bad MODULE:FUNCTION is
        exit 2, one that won't import 3)."""
        from pp3cli.run.scratch import repo_root
        from pp3cli.verifiers.overlay import default_overlay_candidates
        from pp3cli.verifiers.registry import resolve_spec
        from pp3kernels.runtime import is_interpreter

        for name in (verifier, pair_with):
            if name in TRITON_VERIFIERS and not cuda and not is_interpreter():
                raise EnvironmentProblem(
                    f"no GPU and TRITON_INTERPRET is not 1: on a CPU machine {name}'s Triton "
                    "kernels run in Triton's interpreter; run `TRITON_INTERPRET=1 pp3 qualify` "
                    "(or `make qualify`)"
                )
            if name == "flashinfer" and not cuda:
                raise EnvironmentProblem("--verifier flashinfer needs a CUDA GPU (none seen)")
            if name == "vllm-mrv2" and not cuda:
                from pp3cli.verifiers.vllm_mrv2 import interpreter_blocker

                blocker = interpreter_blocker()
                if blocker is not None:
                    raise EnvironmentProblem(blocker)
        root = repo_root()
        candidates = default_overlay_candidates(settings.scratch)

        def one(spec: str) -> ResolvedVerifier:
            return resolve_spec(spec, root=root, overlay_dir=overlay, overlay_candidates=candidates)

        return one(verifier), None if pair_with is None else one(pair_with)

    # What resolve returned when the guard ran it, for work (the guard discards the result).
    resolved: list[tuple[ResolvedVerifier, ResolvedVerifier | None]] = []

    def work(record: GuardRecord) -> Finding | None:
        """The guarded work: pick the profile for this machine, run, and shape the receipt."""
        from rich.console import Console

        from pp3cli.evidence.qualify import run_qualification
        from pp3cli.verifiers.registry import planted_defect_controls
        from pp3cli.wire.proxy import ProxyDraftTransport

        cuda = record.cuda_available
        [(judged, partner)] = resolved
        chosen: Profile = PROFILES[profile or ("strict" if cuda else "seed")]
        controls = planted_defect_controls()
        device = "cuda" if cuda else "cpu"
        transport = ProxyDraftTransport() if via_proxy else None
        started = time.monotonic()
        console = Console(stderr=True)
        bars, progress = _progress_printer(console, started)

        def qualification(share: RankShare | None, on: str) -> QualificationReport:
            quiet = share is not None and share.rank != 0  # rank 0 alone shows progress
            with nullcontext() if quiet else bars:
                return run_qualification(
                    chosen,
                    verifier=judged.verifier,
                    device=on,
                    alpha=alpha,
                    seed=seed,
                    tv=tv,
                    n_greedy=n_greedy,
                    controls=controls,
                    full_controls=full_controls,
                    transport=transport,
                    progress=None if quiet else progress,
                    edge_decides=judged.own,
                    pair_with=None if partner is None else (partner.spec, partner.verifier),
                    share=share,
                )

        distributed = None
        if place is None:
            report = qualification(None, device)
        else:
            report, distributed = run_as_rank(place, record, started, qualification)
            if distributed is None:
                return None  # rank 0 writes the receipt
        data = report.to_json()
        data["elapsed_s"] = round(time.monotonic() - started, 3)
        data["verifier"] = {"name": judged.spec, **judged.details}
        if partner is not None:
            data["pair_with"] = {"name": partner.spec, **partner.details}
        if distributed is not None:
            data["distributed"] = distributed
        if transport is not None:
            data["proxy"] = transport.summary()
        parameters = {
            "profile": chosen.name,
            "requests_per_target": report.requests_per_target,
            "control_requests_per_target": report.control_requests_per_target
            or report.requests_per_target,
            "tv": tv if tv is not None else chosen.tv,
            "alpha": alpha,
            "seed": seed,
            "n_greedy": report.greedy.n,
            "verifier": judged.spec,
            "pair_with": pair_with,
            "device": device,
            "controls": list(controls),
            "full_controls": full_controls,
            "via_proxy": via_proxy,
            "batch": chosen.batch,
            "repeats": chosen.repeats,
            "world_size": 1 if place is None else place.world_size,
        }
        sources = {**judged.sources, **(partner.sources if partner is not None else {})}
        return Finding(parameters, data, report.verdict, summary=_summary(report), sources=sources)

    device: int | None = None
    if place is not None:
        run = rank_run_options(place, run)
        device = place.local_rank if place.uses_gpu() else None  # each rank locks its own GPU
    run_receipted(
        "qualify",
        settings,
        run,
        work,
        kind="qualification",
        require_gpu=False,
        precheck=lambda cuda: resolved.append(resolve(cuda)),
        device=device,
    )


def _launch(gpus: int, settings: Settings, run: RunOptions) -> None:
    """``pp3 qualify --gpus N``: torchrun's launcher, or the same in tmux with --detach."""
    import torch

    from pp3cli.run.ranks import launch, strip_option

    if torch.cuda.is_available() and gpus > torch.cuda.device_count():
        raise UsageProblem(
            f"--gpus {gpus}: torch sees {torch.cuda.device_count()} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    if run.guard.detach:
        from pp3cli.run.detach import start_detached

        typer.echo(start_detached("qualify", settings, sys.argv[1:]))
        return
    launch(gpus, strip_option(sys.argv[1:], "--gpus"))
