"""`pp3 probe`: the selector's cost against torch argmax, the eager torch reference, vLLM
MRV2 ``rejection_sample`` and the memory-bandwidth floor, on identical inputs.

Method (per case: B requests, K drafts, vocabulary V, logits dtype, draft kind, T0 share):

- Inputs are synthetic already-conditioned logits ``randn * LOGIT_SCALE`` cast to the
  dtype, generated on the device with a seeded generator, fresh for every case. When one
  input set is smaller than twice the L2 cache, several sets are made (at least 2 x L2
  bytes together, at most ``MAX_INPUT_SETS``) and the timed calls rotate through them, so
  that logits come from HBM rather than L2, as in a real decode step.
- Drafts equal each row's argmax except in every third request, whose draft at position
  b mod K is off by one: greedy rows accept all K drafts or stop at that mismatch.
  Point drafts are a point mass (S = 1, count = C); sparse drafts spread q evenly over S
  ids (the draft and S - 1 others); dense drafts are the same law as a [B, K, V] fp32 q.
- Comparators: ``config.comparators`` (default selector, argmax, vLLM; the eager torch
  reference only when asked for). Every comparator is first run eagerly and checked
  (selector T0 rows equal the greedy path of torch argmax, tokens in [0, V) then -1 padding,
  statuses OK). Then ``rounds`` calls are captured in one CUDA graph (one graph per group of
  ``rounds`` input sets), replayed ``warmup`` times per graph, and ``replays`` replays are
  timed with CUDA events; a replay's time divided by ``rounds`` is one sample (µs per call).
  A comparator that cannot be captured is timed eagerly (``rounds`` calls between two
  events) and the receipt says so. After timing, the graph's outputs must equal the eager
  outputs.
- The eager torch reference costs milliseconds a call (~30 ms at B = 1, V = 129280 on the
  H200), so it is checked and timed on the first ``rounds`` input sets only (one graph),
  with at most one warm-up replay and ``slow_replays`` (default 3) timed replays; its
  receipt entry says how many samples it has. The kernels get the full method.
- Summary per comparator: median, p10, p90 of the samples (numpy linear percentiles), and
  the device memory its first checked call needed beyond what was allocated before it
  (``peak_extra_bytes``: validation, partials, outputs). Each case records the selector's
  launch plan (``selector_plan``).
- Floor: the bytes the selector must read (logits + drafts + q + per-request scalars)
  divided by the device-to-device copy bandwidth measured in the same run (bytes read +
  written per second).

The bookkeeping (statistics, checks, table, receipt data, recomputation) is plain
functions over plain data so that it is tested on CPU; CUDA graphs and events are only
touched in ``cuda_graph_capture`` and ``cuda_event_timer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pp3cli.timing.cases import (
    LOGIT_SCALE,
    NOMINAL_COPY_BANDWIDTH,
    ProbeCase,
    ProbeConfig,
    build_cases,
    floor_us,
    input_set_count,
)
from pp3cli.timing.comparators import DTYPES, Comparator, load_comparators, make_inputs
from pp3cli.timing.measure import (
    Capture,
    copy_bandwidth,
    cuda_event_timer,
    cuda_graph_capture,
    cuda_peak_extra_bytes,
    measure_comparator,
)
from pp3cli.timing.summary import all_checks_passed, case_ratios, median_or_none

if TYPE_CHECKING:
    import torch

    from pp3kernels.selector import LaunchPlan


def run_probe(
    config: ProbeConfig,
    *,
    device: Any,
    comparators: Sequence[Comparator],
    missing: Mapping[str, str],
    timer: Callable[[Callable[[], object]], float],
    capture: Capture | None,
    l2_bytes: int,
    copy: Mapping[str, Any] | None,
    memory_budget: int = 8 << 30,
    synchronize: Callable[[], None] = lambda: None,
    peak_memory: Callable[[Callable[[], object]], int] | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Run every case; return the receipt's ``data`` (see docs/probe.md)."""
    bandwidth = float(copy["bytes_per_s"]) if copy else NOMINAL_COPY_BANDWIDTH
    results = []
    for number, case in enumerate(build_cases(config), start=1):
        progress(f"[{number}] {case.name}")
        sets = input_set_count(
            case.bytes_read(), l2_bytes, rotate=config.rotate_inputs, budget_bytes=memory_budget
        )
        input_sets = [
            make_inputs(case, device=device, seed=config.seed, set_index=i) for i in range(sets)
        ]
        entries: dict[str, Any] = {
            name: {"available": False, "reason": reason} for name, reason in missing.items()
        }
        for comparator in comparators:
            began = time.monotonic()
            sets_used = input_sets[: config.rounds] if comparator.slow else input_sets
            entry = measure_comparator(
                comparator,
                sets_used,
                rounds=config.rounds,
                warmup=min(config.warmup, 1) if comparator.slow else config.warmup,
                replays=config.slow_replays if comparator.slow else config.replays,
                timer=timer,
                capture=capture,
                synchronize=synchronize,
                peak_memory=peak_memory,
            )
            # Wall time of check + capture + timing (JIT compiles included): not a result.
            entry["wall_s"] = round(time.monotonic() - began, 3)
            entries[comparator.name] = entry
            median = median_or_none(entry)
            progress(
                f"    {comparator.name}: median {'-' if median is None else f'{median:.2f}'} µs"
                f" ({entry['wall_s']:.1f} s wall, {len(sets_used)} input sets)"
            )
        del input_sets
        floor = floor_us(case.bytes_read(), bandwidth)
        medians = {name: median_or_none(entry) for name, entry in entries.items()}
        results.append(
            {
                "case": asdict(case),
                "name": case.name,
                "bytes_read": case.bytes_read(),
                "floor_us": floor,
                "input_sets": sets,
                "comparators": entries,
                "ratios": case_ratios(medians, floor),
            }
        )
    data = {
        "cases": results,
        "copy": dict(copy) if copy else None,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "l2_bytes": l2_bytes,
        "method": {
            "logit_scale": LOGIT_SCALE,
            "rounds_per_graph": config.rounds,
            "sample": "elapsed of one replay / rounds, in microseconds",
            "percentiles": "numpy linear",
        },
    }
    data["checks_passed"] = all_checks_passed(data)
    return data


def probe_on_cuda(
    config: ProbeConfig,
    *,
    overlay_dir: Path | None,
    scratch: Path,
    copy_mib: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Everything that touches CUDA: comparators, copy bandwidth, the cases; receipt data.

    The vLLM comparator comes from ``overlay_dir``, else from the first default overlay
    location that holds one (``pp3cli.verifiers.overlay``); the receipt's ``vllm_overlay``
    block names it and its pinned files.
    """
    import torch

    from pp3cli.verifiers.overlay import default_overlay_candidates, find_overlay, read_manifest

    device = torch.device("cuda", torch.cuda.current_device())
    properties = torch.cuda.get_device_properties(device)
    l2_bytes = int(getattr(properties, "L2_cache_size", 50 << 20))
    found = overlay_dir or find_overlay(default_overlay_candidates(scratch))
    comparators, missing = load_comparators(
        found, require_vllm=config.require_vllm, names=config.comparators
    )
    overlay_info: dict[str, Any] = {"path": None if found is None else str(found)}
    if found is not None and "vllm" not in missing:
        manifest = read_manifest(found)
        overlay_info.update(version=manifest.get("version"), files=manifest.get("files"))
    for name, reason in missing.items():
        progress(f"{name}: {reason}")
    progress(f"copy bandwidth over {copy_mib} MiB ...")
    copy = copy_bandwidth(device=device, nbytes=copy_mib << 20, replays=20, timer=cuda_event_timer)
    free, _total = torch.cuda.mem_get_info(device)
    data = run_probe(
        config,
        device=device,
        comparators=comparators,
        missing=missing,
        timer=cuda_event_timer,
        capture=cuda_graph_capture,
        l2_bytes=l2_bytes,
        copy=copy,
        memory_budget=min(8 << 30, free // 4),
        synchronize=torch.cuda.synchronize,
        peak_memory=cuda_peak_extra_bytes,
        progress=progress,
    )
    data["vllm_overlay"] = overlay_info
    for case in data["cases"]:
        case["selector_plan"] = selector_plan(ProbeCase(**case["case"]), device)
    return data


def case_launch_plan(case: ProbeCase, *, interpreter: bool = False) -> LaunchPlan:
    """The ``LaunchPlan`` that ``verify_chain`` picks for ``case``'s inputs: ``plan_launch``
    given q's slots S for sparse drafts (1 otherwise) and whether q is dense. Imported when
    called, so that a caller that put another ``pp3kernels`` first on the path (the bench's
    A/B workers) gets that package's plan."""
    from pp3kernels import plan_launch

    return plan_launch(
        case.batch,
        case.depth + 1,
        case.vocab,
        interpreter=interpreter,
        support=case.support if case.draft == "sparse" else 1,
        dense=case.draft == "dense",
    )


def selector_plan(case: ProbeCase, device: torch.device | None = None) -> dict[str, int | bool]:
    """The launch shape ``pp3kernels.plan_launch`` picks for ``case`` on a GPU (recorded per
    case, so that a receipt says which measured plan produced its times). Given the
    ``device`` the case ran on, ``overlap`` says whether the launches did overlap there
    (``pp3kernels.selector.overlaps``: sm_90 and up) and ``tma`` whether phase 1 read
    through TMA boxes there (``pp3kernels.selector.reads_by_tma``, for the probe's
    contiguous logits: one request of the case's shape decides it), not only whether the
    plan asks to."""
    from pp3kernels.selector import overlaps, reads_by_tma

    plan = case_launch_plan(case)
    shape: dict[str, int | bool] = asdict(plan)
    if device is not None:
        import torch

        shape["overlap"] = overlaps(plan, device)
        one = torch.empty((1, case.depth + 1, case.vocab), dtype=DTYPES[case.dtype], device=device)
        shape["tma"] = reads_by_tma(plan, one)
    return shape
