"""`pp3 probe`: time the selector against torch argmax, the torch reference and vLLM MRV2."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from pp3cli import probe
from pp3cli.commands.options import SupersedeReasonOption, SupersedesOption
from pp3cli.errors import CheckFailed, UsageProblem
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


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def case_list_table(cases: list[probe.ProbeCase], bandwidth: float) -> Table:
    """The --dry-run listing: one line per case with its bytes and floor."""
    table = Table(title=f"pp3 probe: {len(cases)} cases (dry run)")
    for column in ("case", "dtype", "V", "MB read", "floor µs"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in cases:
        table.add_row(
            case.name,
            case.dtype,
            str(case.vocab),
            f"{case.bytes_read() / 1e6:.2f}",
            f"{probe.floor_us(case.bytes_read(), bandwidth):.2f}",
        )
    return table


def results_table(data: dict[str, Any]) -> Table:
    """Cases x comparators: medians (µs per call) and the selector's ratios."""
    names = ("selector", "argmax", "reference", "vllm")
    bandwidth = data["copy_bandwidth_bytes_per_s"] / 1e12
    table = Table(title=f"pp3 probe: median µs per call (copy {bandwidth:.2f} TB/s)")
    table.add_column("case")
    for column in (*names, "floor", "sel/argmax", "sel/vllm", "sel/floor", "sel TB/s"):
        table.add_column(column, justify="right")
    for case in data["cases"]:
        medians = [probe.median_or_none(case["comparators"].get(name, {})) for name in names]
        selector = medians[0]
        achieved = None if not selector else case["bytes_read"] / (selector * 1e-6) / 1e12
        ratios = case["ratios"]
        table.add_row(
            case["name"],
            *(_fmt(m) for m in medians),
            _fmt(case["floor_us"], 2),
            _fmt(ratios["selector/argmax"], 2),
            _fmt(ratios["selector/vllm"], 2),
            _fmt(ratios["selector/floor"], 2),
            _fmt(achieved, 2),
        )
    return table


def register(app: typer.Typer) -> None:
    """Add `pp3 probe` to the root app."""

    @app.command("probe")
    def probe_command(
        ctx: typer.Context,
        *,
        batch: Annotated[str, typer.Option("--batch", help="Batch sizes B.")] = "1,2,3,4,16,64",
        depth: Annotated[str, typer.Option("--depth", help="Draft depths K.")] = "4,5",
        vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary V.")] = probe.DEFAULT_VOCAB,
        dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32 logits.")] = "bf16",
        draft: Annotated[
            str, typer.Option("--draft", help="Draft q kinds: point, sparse, dense.")
        ] = "point",
        support: Annotated[
            int, typer.Option("--support", help="S: ids per sparse/dense draft q.")
        ] = 64,
        t0_share: Annotated[
            str, typer.Option("--t0-share", help="Shares of T0 (greedy) requests per case.")
        ] = "0,0.5,1",
        rounds: Annotated[int, typer.Option("--rounds", help="Calls per CUDA graph.")] = 10,
        warmup: Annotated[int, typer.Option("--warmup", help="Untimed replays per graph.")] = 3,
        replays: Annotated[int, typer.Option("--replays", help="Timed replays per case.")] = 100,
        slow_replays: Annotated[
            int,
            typer.Option("--slow-replays", help="Timed replays of the eager torch reference."),
        ] = 3,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the synthetic inputs.")] = 0,
        rotate: Annotated[
            bool,
            typer.Option(
                "--rotate/--no-rotate", help="Rotate input sets so logits come from HBM, not L2."
            ),
        ] = True,
        copy_mib: Annotated[
            int, typer.Option("--copy-mib", help="Buffer size of the bandwidth copy (MiB).")
        ] = 1024,
        overlay_dir: Annotated[
            Path | None,
            typer.Option(
                "--overlay",
                help="vLLM overlay folder (default <scratch>/overlay/vllm-0.33.0, "
                "then .overlay/vllm-0.33.0).",
            ),
        ] = None,
        require_vllm: Annotated[
            bool, typer.Option("--require-vllm", help="Exit 3 if the vLLM comparator is missing.")
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Validate and list the cases; run nothing.")
        ] = False,
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
        """Time the selector against torch argmax, the torch reference and vLLM MRV2.

        Exit codes: 0 every correctness check passed, 1 one failed (the receipt is still
        written), 2 bad options, 3 no GPU / lock held / power limit not as expected.
        """
        settings: Settings = ctx.obj
        config = probe.ProbeConfig(
            batches=probe.parse_int_list(batch, "--batch"),
            depths=probe.parse_int_list(depth, "--depth"),
            vocab=vocab,
            dtype=dtype,
            drafts=probe.parse_name_list(draft),
            t0_shares=probe.parse_float_list(t0_share, "--t0-share"),
            support=support,
            rounds=rounds,
            warmup=warmup,
            replays=replays,
            slow_replays=slow_replays,
            seed=seed,
            rotate_inputs=rotate,
            require_vllm=require_vllm,
        )
        cases = probe.build_cases(config)
        if copy_mib < 1:
            raise UsageProblem(f"--copy-mib must be >= 1, got {copy_mib}")
        if dry_run:
            if json_output:
                listing = [
                    {**asdict(c), "name": c.name, "bytes_read": c.bytes_read()} for c in cases
                ]
                typer.echo(orjson.dumps(listing, option=orjson.OPT_INDENT_2).decode())
            else:
                Console().print(case_list_table(cases, probe.NOMINAL_COPY_BANDWIDTH))
            return
        superseded = supersede_entries(settings.receipts, supersedes or [], supersede_reason)
        options = guard_options(cpus, nice, threads, expect_power_limit, detach)
        if maybe_detach("probe", settings, options, sys.argv[1:]):
            return
        progress = Console(stderr=True)
        with guarded("probe", settings, options, require_gpu=True) as record:
            data, overlay_info = _run_on_gpu(config, overlay_dir, settings, copy_mib, progress)
        data["vllm_overlay"] = overlay_info
        verdict = probe.verdict_of(data)
        parameters = {**asdict(config), "copy_mib": copy_mib}
        path = write_receipt(
            settings.receipts,
            "probe",
            parameters=parameters,
            environment=record.environment(),
            data=data,
            verdict=verdict,
            supersedes=superseded,
        )
        if json_output:
            typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        else:
            Console().print(results_table(data))
        progress.print(f"receipt: {path}  verdict: {verdict}")
        if verdict != "PASS":
            raise CheckFailed(f"a correctness check failed; see {path}")


def _run_on_gpu(
    config: probe.ProbeConfig,
    overlay_dir: Path | None,
    settings: Settings,
    copy_mib: int,
    console: Console,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Everything that touches CUDA: comparators, copy bandwidth, the cases."""
    import torch

    from pp3cli import overlay

    device = torch.device("cuda", torch.cuda.current_device())
    properties = torch.cuda.get_device_properties(device)
    l2_bytes = int(getattr(properties, "L2_cache_size", 50 << 20))
    found = overlay_dir or overlay.find_overlay(
        overlay.default_overlay_candidates(settings.scratch)
    )
    comparators, missing = probe.load_comparators(found, require_vllm=config.require_vllm)
    overlay_info: dict[str, Any] = {"path": None if found is None else str(found)}
    if found is not None and "vllm" not in missing:
        manifest = overlay.read_manifest(found)
        overlay_info.update(version=manifest.get("version"), files=manifest.get("files"))
    for name, reason in missing.items():
        console.print(f"{name}: {reason}")
    console.print(f"copy bandwidth over {copy_mib} MiB ...")
    copy = probe.copy_bandwidth(
        device=device, nbytes=copy_mib << 20, replays=20, timer=probe.cuda_event_timer
    )
    free, _total = torch.cuda.mem_get_info(device)
    data = probe.run_probe(
        config,
        device=device,
        comparators=comparators,
        missing=missing,
        timer=probe.cuda_event_timer,
        capture=probe.cuda_graph_capture,
        l2_bytes=l2_bytes,
        copy=copy,
        memory_budget=min(8 << 30, free // 4),
        synchronize=torch.cuda.synchronize,
        progress=lambda message: console.print(message),
    )
    return data, overlay_info
