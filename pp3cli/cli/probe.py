"""`pp3 probe`: time the selector against torch argmax, the torch reference and vLLM MRV2."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pp3cli.cli.options import RunOptions, settings_of, with_run_options
from pp3cli.cli.receipted import Finding, run_receipted
from pp3cli.run.errors import UsageProblem
from pp3cli.timing.cases import (
    COMPARATORS,
    DEFAULT_BATCHES,
    DEFAULT_COMPARATORS,
    DEFAULT_VOCAB,
    NOMINAL_COPY_BANDWIDTH,
    ProbeCase,
    ProbeConfig,
    build_cases,
    floor_us,
    parse_float_list,
    parse_int_list,
    parse_name_list,
)

if TYPE_CHECKING:
    from rich.table import Table

    from pp3cli.run.guard import GuardRecord


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def case_list_table(cases: list[ProbeCase], bandwidth: float) -> Table:
    """The --dry-run listing: one line per case with its bytes and floor."""
    from rich.table import Table

    table = Table(title=f"pp3 probe: {len(cases)} cases (dry run)")
    for column in ("case", "dtype", "V", "MB read", "floor µs"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in cases:
        table.add_row(
            case.name,
            case.dtype,
            str(case.vocab),
            f"{case.bytes_read() / 1e6:.2f}",
            f"{floor_us(case.bytes_read(), bandwidth):.2f}",
        )
    return table


def results_table(data: dict[str, Any]) -> Table:
    """Cases x comparators: medians (µs per call) and the selector's ratios."""
    from rich.table import Table

    from pp3cli.timing.summary import median_or_none

    names = COMPARATORS
    bandwidth = data["copy_bandwidth_bytes_per_s"] / 1e12
    table = Table(title=f"pp3 probe: median µs per call (copy {bandwidth:.2f} TB/s)")
    table.add_column("case")
    for column in (*names, "floor", "sel/argmax", "sel/vllm", "sel/floor", "sel TB/s", "sel MiB"):
        table.add_column(column, justify="right")
    for case in data["cases"]:
        medians = [median_or_none(case["comparators"].get(name, {})) for name in names]
        selector = medians[0]
        achieved = None if not selector else case["bytes_read"] / (selector * 1e-6) / 1e12
        peak = case["comparators"].get("selector", {}).get("peak_extra_bytes")
        ratios = case["ratios"]
        table.add_row(
            case["name"],
            *(_fmt(m) for m in medians),
            _fmt(case["floor_us"], 2),
            _fmt(ratios["selector/argmax"], 2),
            _fmt(ratios["selector/vllm"], 2),
            _fmt(ratios["selector/floor"], 2),
            _fmt(achieved, 2),
            _fmt(None if peak is None else peak / (1 << 20), 1),
        )
    return table


@with_run_options
def probe_command(
    ctx: typer.Context,
    *,
    run: RunOptions,
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes B.")] = ",".join(
        map(str, DEFAULT_BATCHES)
    ),
    depth: Annotated[str, typer.Option("--depth", help="Draft depths K.")] = "4,5",
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary V.")] = DEFAULT_VOCAB,
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
    comparators: Annotated[
        str,
        typer.Option(
            "--comparators",
            help="Which comparators run: selector, argmax, vllm, reference (the eager torch "
            "reference costs tens of seconds per case).",
        ),
    ] = ",".join(DEFAULT_COMPARATORS),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and list the cases; run nothing.")
    ] = False,
) -> None:
    """Time the selector against torch argmax, vLLM MRV2 and (asked for) the torch reference.

    Exit codes: 0 every correctness check passed, 1 one failed (the receipt is still
    written), 2 bad options, 3 no GPU / lock held / power limit not as expected.
    """
    settings = settings_of(ctx)
    config = ProbeConfig(
        batches=parse_int_list(batch, "--batch"),
        depths=parse_int_list(depth, "--depth"),
        vocab=vocab,
        dtype=dtype,
        drafts=parse_name_list(draft),
        t0_shares=parse_float_list(t0_share, "--t0-share"),
        support=support,
        rounds=rounds,
        warmup=warmup,
        replays=replays,
        slow_replays=slow_replays,
        seed=seed,
        rotate_inputs=rotate,
        require_vllm=require_vllm,
        comparators=parse_name_list(comparators),
    )
    cases = build_cases(config)
    if copy_mib < 1:
        raise UsageProblem(f"--copy-mib must be >= 1, got {copy_mib}")
    if dry_run:
        _list_cases(cases, run.json_output)
        return

    def work(record: GuardRecord) -> Finding:
        from pp3cli.timing.probe import probe_on_cuda
        from pp3cli.timing.summary import verdict_of

        data = probe_on_cuda(
            config,
            overlay_dir=overlay_dir,
            scratch=settings.scratch,
            copy_mib=copy_mib,
            progress=lambda message: typer.echo(message, err=True),
        )
        parameters = {**asdict(config), "copy_mib": copy_mib}
        return Finding(parameters, data, verdict_of(data), results_table(data))

    run_receipted("probe", settings, run, work, kind="probe", require_gpu=True)


def _list_cases(cases: list[ProbeCase], json_output: bool) -> None:
    """``--dry-run``: the cases with their bytes and floors, as a table or JSON."""
    if json_output:
        import orjson

        listing = [{**asdict(c), "name": c.name, "bytes_read": c.bytes_read()} for c in cases]
        typer.echo(orjson.dumps(listing, option=orjson.OPT_INDENT_2).decode())
    else:
        from rich.console import Console

        Console().print(case_list_table(cases, NOMINAL_COPY_BANDWIDTH))
