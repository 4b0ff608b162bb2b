"""Timing on the device: CUDA graphs, CUDA events, and the check-then-time of one comparator.

CUDA is touched only in ``cuda_event_timer``, ``cuda_graph_capture`` and ``copy_bandwidth``;
everything else takes the timer and the capture function as arguments, so the bookkeeping
runs (and is tested) on a CPU with a fake clock.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pp3cli.timing.summary import summarize

if TYPE_CHECKING:
    from pp3cli.timing.comparators import Comparator, ProbeInputs


def time_replays(
    replay_fns: Sequence[Callable[[], object]],
    *,
    rounds: int,
    warmup: int,
    replays: int,
    timer: Callable[[Callable[[], object]], float],
) -> list[float]:
    """Per-call samples in µs: ``replays`` timed replays rotating over ``replay_fns``.

    Each replay function runs ``rounds`` calls (a captured graph, or an eager loop);
    ``timer(fn)`` returns its elapsed milliseconds. Every function is first run
    ``warmup`` times untimed. Sample = elapsed_ms * 1000 / rounds.
    """
    if not replay_fns:
        raise ValueError("nothing to time")
    for _ in range(warmup):
        for fn in replay_fns:
            fn()
    samples = []
    for index in range(replays):
        elapsed_ms = timer(replay_fns[index % len(replay_fns)])
        samples.append(elapsed_ms * 1000.0 / rounds)
    return samples


def cuda_event_timer(fn: Callable[[], object]) -> float:
    """Milliseconds between two CUDA events around ``fn()``."""
    import torch

    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def cuda_graph_capture(
    calls: Sequence[Callable[[], Any]],
) -> tuple[Callable[[], object], list[Any]]:
    """Capture ``calls`` in order into one CUDA graph; return (replay, captured outputs)."""
    import torch

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [call() for call in calls]
    torch.cuda.synchronize()
    return graph.replay, outputs


def eager_rounds(calls: Sequence[Callable[[], Any]]) -> tuple[Callable[[], object], list[Any]]:
    """The eager equivalent of a graph: run the calls in order, keep the last outputs."""
    outputs: list[Any] = [None] * len(calls)

    def run() -> None:
        for index, call in enumerate(calls):
            outputs[index] = call()

    return run, outputs


Capture = Callable[[Sequence[Callable[[], Any]]], tuple[Callable[[], object], list[Any]]]


def outputs_equal(first: object, second: object) -> bool:
    """Bitwise equality of two outputs (tensors, or tuples of tensors)."""
    import torch

    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and bool(torch.equal(first, second))
    if isinstance(first, tuple | list) and isinstance(second, tuple | list):
        return len(first) == len(second) and all(
            outputs_equal(a, b) for a, b in zip(first, second, strict=True)
        )
    return bool(first == second)


def _rounds(
    comparator: Comparator,
    input_sets: Sequence[ProbeInputs],
    groups: Sequence[Sequence[int]],
    capture: Capture | None,
) -> tuple[list[tuple[Callable[[], object], list[Any]]], str]:
    """One replay function (and its outputs) per group of input-set indices.

    Each group is captured in one CUDA graph (when ``capture`` is given); if the comparator
    cannot be captured, every group is run eagerly instead and the returned note says so.
    """

    def calls(group: Sequence[int]) -> list[Callable[[], Any]]:
        return [functools.partial(comparator.call, input_sets[index]) for index in group]

    if capture is not None:
        try:
            return [capture(calls(group)) for group in groups], ""
        except Exception as err:  # not capturable: time it eagerly, and say so
            note = f"not captured in a CUDA graph ({type(err).__name__}: {err}); timed eagerly"
            return [eager_rounds(calls(group)) for group in groups], note
    return [eager_rounds(calls(group)) for group in groups], ""


def measure_comparator(
    comparator: Comparator,
    input_sets: Sequence[ProbeInputs],
    *,
    rounds: int,
    warmup: int,
    replays: int,
    timer: Callable[[Callable[[], object]], float],
    capture: Capture | None,
    synchronize: Callable[[], None] = lambda: None,
    peak_memory: Callable[[Callable[[], object]], int] | None = None,
) -> dict[str, Any]:
    """Check, then time one comparator on one case; the receipt's entry for it.

    Returns {available, graph, note, checks, peak_extra_bytes, times_us, summary,
    input_sets, groups}. Correctness is checked on every input set before timing (timing
    is skipped when a check fails); after timing, every captured output must equal the
    eager output. ``peak_memory(fn)`` (when given) returns the device memory ``fn`` needed
    beyond what was allocated before it; it wraps the first eager (checked) call, host
    validation included, and the entry records it as ``peak_extra_bytes``.
    """
    first: list[Any] = []

    def first_call() -> None:
        first.append(comparator.eager_call(input_sets[0]))

    peak: int | None = None
    if peak_memory is not None:
        peak = peak_memory(first_call)
    else:
        first_call()
    eager_outputs = first + [comparator.eager_call(inputs) for inputs in input_sets[1:]]
    synchronize()
    checks: dict[str, bool] = {}
    for inputs, output in zip(input_sets, eager_outputs, strict=True):
        for key, value in comparator.check(inputs, output).items():
            checks[key] = checks.get(key, True) and value
    entry: dict[str, Any] = {
        "available": True,
        "note": comparator.note,
        "checks": checks,
        "peak_extra_bytes": peak,
    }
    if not all(checks.values()):
        entry.update(graph=False, times_us=[], summary=None, skipped="a correctness check failed")
        return entry

    count = math.ceil(len(input_sets) / rounds) if len(input_sets) > rounds else 1
    groups = [[(g * rounds + r) % len(input_sets) for r in range(rounds)] for g in range(count)]
    built, capture_note = _rounds(comparator, input_sets, groups, capture)
    samples = time_replays(
        [replay for replay, _ in built], rounds=rounds, warmup=warmup, replays=replays, timer=timer
    )
    synchronize()
    checks["replay_equals_eager"] = all(
        outputs_equal(comparator.normalise(output), comparator.normalise(eager_outputs[index]))
        for group, (_, outputs) in zip(groups, built, strict=True)
        for index, output in zip(group, outputs, strict=True)
    )
    entry.update(
        graph=capture is not None and not capture_note,
        note="; ".join(note for note in (comparator.note, capture_note) if note),
        times_us=samples,
        summary=summarize(samples),
        input_sets=len(input_sets),
        groups=len(built),
    )
    return entry


def cuda_peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Bytes of device memory ``fn()`` allocated at its peak beyond what was allocated before
    (torch's caching allocator: ``max_memory_allocated`` after a reset, minus the start)."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated()) - before


def copy_bandwidth(
    *, device: Any, nbytes: int, replays: int, timer: Callable[[Callable[[], object]], float]
) -> dict[str, Any]:
    """Device-to-device copy of ``nbytes``: samples in µs and bytes (read + written) per s."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    source.fill_(1)
    for _ in range(3):
        target.copy_(source)
    samples = [timer(lambda: target.copy_(source)) * 1000.0 for _ in range(replays)]
    summary = summarize(samples)
    return {
        "bytes": nbytes,
        "times_us": samples,
        "summary": summary,
        "bytes_per_s": 2 * nbytes / (summary["median"] * 1e-6),
    }
