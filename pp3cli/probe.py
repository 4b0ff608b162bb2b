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
- Every comparator is first run eagerly and checked (selector T0 rows equal the greedy
  path of torch argmax, tokens in [0, V) then -1 padding, statuses OK). Then ``rounds``
  calls are captured in one CUDA graph (one graph per group of ``rounds`` input sets),
  replayed ``warmup`` times per graph, and ``replays`` replays are timed with CUDA events;
  a replay's time divided by ``rounds`` is one sample (µs per call). A comparator that
  cannot be captured is timed eagerly (``rounds`` calls between two events) and the
  receipt says so. After timing, the graph's outputs must equal the eager outputs.
- The eager torch reference costs milliseconds a call (~30 ms at B = 1, V = 129280 on the
  H200), so it is checked and timed on the first ``rounds`` input sets only (one graph),
  with at most one warm-up replay and ``slow_replays`` (default 3) timed replays; its
  receipt entry says how many samples it has. The kernels get the full method.
- Summary per comparator: median, p10, p90 of the samples (numpy linear percentiles).
- Floor: the bytes the selector must read (logits + drafts + q + per-request scalars)
  divided by the device-to-device copy bandwidth measured in the same run (bytes read +
  written per second).

The bookkeeping (statistics, checks, table, receipt data, recomputation) is plain
functions over plain data so that it is tested on CPU; CUDA graphs and events are only
touched in ``cuda_graph_capture`` and ``cuda_event_timer``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pp3cli.errors import EnvironmentProblem, UsageProblem
from pp3cli.verify import register_recomputer

DEFAULT_BATCHES = (1, 2, 3, 4, 16, 64)
DEFAULT_DEPTHS = (4, 5)
DEFAULT_VOCAB = 129280
DEFAULT_T0_SHARES = (0.0, 0.5, 1.0)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DRAFT_KINDS = ("point", "sparse", "dense")
COMPARATORS = ("selector", "argmax", "reference", "vllm")
LOGIT_SCALE = 4.0
POINT_DENOMINATOR = 1 << 16
SPARSE_COUNT = 1 << 10  # each of the S support ids gets this count; C = S * 1024
SUPPORT_STRIDE = 2003  # prime: ids (x + j * 2003) mod V are distinct for j < V when gcd = 1
MAX_INPUT_SETS = 64
NOMINAL_COPY_BANDWIDTH = 4.3e12  # bytes read + written per second, H200 (docs/probe.md)
SUMMARY_KEYS = ("n", "median", "p10", "p90", "min", "max")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ProbeConfig:
    """Everything that decides which cases run and how they are timed."""

    batches: tuple[int, ...] = DEFAULT_BATCHES
    depths: tuple[int, ...] = DEFAULT_DEPTHS
    vocab: int = DEFAULT_VOCAB
    dtype: str = "bf16"
    drafts: tuple[str, ...] = ("point",)
    t0_shares: tuple[float, ...] = DEFAULT_T0_SHARES
    support: int = 64
    rounds: int = 10
    warmup: int = 3
    replays: int = 100
    slow_replays: int = 3  # the eager torch reference (~30 ms a call at V = 129280)
    seed: int = 0
    rotate_inputs: bool = True
    require_vllm: bool = False

    def validate(self) -> None:
        """Raise ``UsageProblem`` naming the first bad value."""
        for name, values in (("--batch", self.batches), ("--depth", self.depths)):
            if not values or any(v < 1 for v in values):
                raise UsageProblem(f"{name} needs integers >= 1, got {list(values)}")
        if self.vocab < 2:
            raise UsageProblem(f"--vocab must be >= 2, got {self.vocab}")
        if self.dtype not in DTYPE_BYTES:
            raise UsageProblem(f"--dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        bad = [d for d in self.drafts if d not in DRAFT_KINDS]
        if not self.drafts or bad:
            raise UsageProblem(f"--draft takes {', '.join(DRAFT_KINDS)}; got {list(self.drafts)}")
        if not self.t0_shares or any(not 0.0 <= s <= 1.0 for s in self.t0_shares):
            raise UsageProblem(f"--t0-share needs values in [0, 1], got {list(self.t0_shares)}")
        needs_support = any(d != "point" for d in self.drafts)
        support_ok = 2 <= self.support <= 1 << 14 and self.support & (self.support - 1) == 0
        if needs_support and (not support_ok or self.support > self.vocab):
            raise UsageProblem(
                f"--support must be a power of two in [2, min(16384, V={self.vocab})], "
                f"got {self.support}"
            )
        if math.gcd(SUPPORT_STRIDE, self.vocab) != 1 and needs_support:
            raise UsageProblem(f"--vocab {self.vocab} shares a factor with {SUPPORT_STRIDE}")
        for name, value, low in (
            ("--rounds", self.rounds, 1),
            ("--warmup", self.warmup, 0),
            ("--replays", self.replays, 1),
            ("--slow-replays", self.slow_replays, 1),
        ):
            if value < low:
                raise UsageProblem(f"{name} must be >= {low}, got {value}")


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); ``UsageProblem`` naming the option and the bad item."""
    values = []
    for item in text.split(","):
        try:
            values.append(int(item.strip()))
        except ValueError:
            raise UsageProblem(f"{option}: {item.strip()!r} is not an integer ({text!r})") from None
    return tuple(values)


def parse_float_list(text: str, option: str) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> (0.0, 0.5, 1.0)."""
    values = []
    for item in text.split(","):
        try:
            values.append(float(item.strip()))
        except ValueError:
            raise UsageProblem(f"{option}: {item.strip()!r} is not a number ({text!r})") from None
    return tuple(values)


def parse_name_list(text: str) -> tuple[str, ...]:
    """``"point,sparse"`` -> ("point", "sparse")."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True)
class ProbeCase:
    """One timed configuration."""

    batch: int
    depth: int
    vocab: int
    dtype: str
    draft: str
    t0_rows: int
    support: int

    @property
    def name(self) -> str:
        return f"B{self.batch}K{self.depth} {self.draft} T0 {self.t0_rows}/{self.batch}"

    @property
    def support_size(self) -> int:
        """S: ids per draft in the sparse q (1 for point drafts, V for dense)."""
        return {"point": 1, "sparse": self.support, "dense": self.vocab}[self.draft]

    def logits_bytes(self) -> int:
        return self.batch * (self.depth + 1) * self.vocab * DTYPE_BYTES[self.dtype]

    def bytes_read(self) -> int:
        """Bytes the selector must read: logits, drafts, q, temperature/seed/position.

        logits B(K+1)V*itemsize; drafts 4BK; q: point/sparse ids + counts 8BKS, dense
        4BKV (fp32); per request 4 (temperature) + 8 (seed) + 8 (position).
        """
        b, k = self.batch, self.depth
        q_bytes = 4 * b * k * self.vocab if self.draft == "dense" else 8 * b * k * self.support_size
        return self.logits_bytes() + 4 * b * k + q_bytes + 20 * b


def t0_count(batch: int, share: float) -> int:
    """Rows at temperature 0: round half up of share * B."""
    return min(batch, math.floor(share * batch + 0.5))


def t0_mask_list(batch: int, t0_rows: int) -> list[bool]:
    """Which requests are T0: spread evenly (request b is T0 iff floor((b+1)t/B) > floor(bt/B))."""
    return [(b + 1) * t0_rows // batch > b * t0_rows // batch for b in range(batch)]


def build_cases(config: ProbeConfig) -> list[ProbeCase]:
    """Cases in (draft, depth, batch, T0 share) order; equal T0 row counts run once."""
    config.validate()
    cases: list[ProbeCase] = []
    for draft in config.drafts:
        for depth in config.depths:
            for batch in config.batches:
                for share in config.t0_shares:
                    case = ProbeCase(
                        batch=batch,
                        depth=depth,
                        vocab=config.vocab,
                        dtype=config.dtype,
                        draft=draft,
                        t0_rows=t0_count(batch, share),
                        support=config.support,
                    )
                    if case not in cases:
                        cases.append(case)
    return cases


def floor_us(bytes_read: int, copy_bandwidth: float) -> float:
    """Time to stream ``bytes_read`` at the copy bandwidth (bytes/s), in µs."""
    return bytes_read / copy_bandwidth * 1e6


def input_set_count(case_bytes: int, l2_bytes: int, *, rotate: bool, budget_bytes: int) -> int:
    """Input sets so that the rotation touches >= 2 x L2 bytes (1 when rotation is off)."""
    if not rotate or case_bytes <= 0:
        return 1
    wanted = math.ceil(2 * l2_bytes / case_bytes)
    affordable = max(1, budget_bytes // case_bytes)
    return max(1, min(wanted, MAX_INPUT_SETS, affordable))


# --------------------------------------------------------------------------- statistics


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """n, median, p10, p90, min, max of the per-call samples (numpy linear percentiles)."""
    if not samples_us:
        raise ValueError("no timing samples to summarise")
    values = np.asarray(samples_us, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10.0, 50.0, 90.0])
    return {
        "n": float(values.size),
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "min": float(values.min()),
        "max": float(values.max()),
    }


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


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def case_ratios(medians: Mapping[str, float | None], floor: float) -> dict[str, float | None]:
    """selector/argmax, selector/vllm, selector/reference and selector/floor of the medians."""
    selector = medians.get("selector")
    return {
        "selector/argmax": ratio(selector, medians.get("argmax")),
        "selector/vllm": ratio(selector, medians.get("vllm")),
        "selector/reference": ratio(selector, medians.get("reference")),
        "selector/floor": ratio(selector, floor),
    }


# --------------------------------------------------------------------------- checks


def greedy_chain(argmax: Any, draft_tokens: Any) -> tuple[Any, Any]:
    """The T0 law from the target argmax y [B, K+1] and drafts x [B, K].

    accepted a = number of leading i with x_i == y_i; tokens = x_0..x_{a-1}, y_a, then -1.
    """
    import torch

    batch, rows = argmax.shape
    depth = rows - 1
    matches = (draft_tokens.to(torch.int64) == argmax[:, :depth].to(torch.int64)).to(torch.int64)
    accepted = matches.cumprod(dim=1).sum(dim=1)
    columns = torch.arange(rows, device=argmax.device)[None, :]
    tokens = torch.full((batch, rows), -1, dtype=torch.int64, device=argmax.device)
    tokens = torch.where(columns <= accepted[:, None], argmax.to(torch.int64), tokens)
    return tokens.to(torch.int32), accepted.to(torch.int32)


def check_chain(
    tokens: Any,
    accepted: Any,
    status: Any | None,
    *,
    vocab: int,
    draft_tokens: Any,
    t0_mask: Any,
    greedy_tokens: Any,
    greedy_accepted: Any,
) -> dict[str, bool]:
    """Correctness flags of one verifier's outputs (all must be True).

    - ``status_ok``: every status is OK (0); vacuously True when the verifier has none.
    - ``accepted_in_range``: 0 <= accepted <= K.
    - ``tokens_valid``: the first accepted + 1 tokens are in [0, V), the rest are -1.
    - ``accepted_prefix_is_drafts``: tokens before the stop equal the drafts.
    - ``t0_equals_greedy``: T0 rows equal the greedy path of torch argmax, bit for bit.
    """
    import torch

    tokens = tokens.to(torch.int64).cpu()
    accepted = accepted.to(torch.int64).cpu()
    drafts = draft_tokens.to(torch.int64).cpu()
    mask = t0_mask.to(torch.bool).cpu()
    depth = drafts.shape[1]
    columns = torch.arange(depth + 1)[None, :]
    emitted = columns <= accepted[:, None]
    in_vocab = (tokens >= 0) & (tokens < vocab)
    before_stop = columns[:, :depth] < accepted[:, None]
    return {
        "status_ok": True if status is None else bool((status.cpu() == 0).all()),
        "accepted_in_range": bool(((accepted >= 0) & (accepted <= depth)).all()),
        "tokens_valid": bool(torch.where(emitted, in_vocab, tokens == -1).all()),
        "accepted_prefix_is_drafts": bool(
            torch.where(before_stop, tokens[:, :depth] == drafts, True).all()
        ),
        "t0_equals_greedy": bool(
            (tokens[mask] == greedy_tokens.to(torch.int64).cpu()[mask]).all()
            and (accepted[mask] == greedy_accepted.to(torch.int64).cpu()[mask]).all()
        ),
    }


def outputs_equal(first: Any, second: Any) -> bool:
    """Bitwise equality of two outputs (tensors, or tuples of tensors)."""
    import torch

    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and bool(torch.equal(first, second))
    if isinstance(first, tuple | list) and isinstance(second, tuple | list):
        return len(first) == len(second) and all(
            outputs_equal(a, b) for a, b in zip(first, second, strict=True)
        )
    return bool(first == second)


# --------------------------------------------------------------------------- inputs


@dataclass
class ChainInputs:
    """One input set, in the selector's layout (plus vLLM's arguments, built once)."""

    logits: Any
    draft_tokens: Any
    temperature: Any
    seed: Any
    position: Any
    q_ids: Any | None
    q_counts: Any | None
    denominator: int | None
    q_dense: Any | None
    t0_mask: Any
    greedy_tokens: Any
    greedy_accepted: Any
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)


def make_inputs(case: ProbeCase, *, device: Any, seed: int, set_index: int) -> ChainInputs:
    """Synthetic already-conditioned inputs for ``case`` (see the module docstring)."""
    import torch

    from pp3cli.overlay import vllm_inputs_from_chain

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    b, k, v = case.batch, case.depth, case.vocab
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1_000_003 + set_index)
    logits = (torch.randn(b, k + 1, v, generator=generator, device=device) * LOGIT_SCALE).to(dtype)
    argmax = torch.argmax(logits, dim=-1)
    drafts = argmax[:, :k].clone()
    for request in range(1, b, 3):
        step = request % k
        drafts[request, step] = (drafts[request, step] + 1) % v
    drafts = drafts.to(torch.int32)
    t0_mask = torch.tensor(t0_mask_list(b, case.t0_rows), device=device)
    temperature = torch.where(
        t0_mask, torch.zeros((), device=device), torch.ones((), device=device)
    ).to(torch.float32)
    seeds = torch.arange(b, dtype=torch.int64, device=device) + (seed << 20) + set_index * b
    position = 1000 + 7 * torch.arange(b, dtype=torch.int64, device=device)
    greedy_tokens, greedy_accepted = greedy_chain(argmax, drafts)

    q_ids = q_counts = q_dense = None
    denominator: int | None = None
    draft_logits = None
    if case.draft == "point":
        q_ids = drafts[:, :, None].contiguous()
        denominator = POINT_DENOMINATOR
        q_counts = torch.full_like(q_ids, POINT_DENOMINATOR)
    else:
        s = case.support
        offsets = torch.arange(s, dtype=torch.int64, device=device) * SUPPORT_STRIDE
        ids = (drafts.to(torch.int64)[:, :, None] + offsets) % v
        if case.draft == "sparse":
            q_ids = ids.to(torch.int32)
            denominator = s * SPARSE_COUNT
            q_counts = torch.full_like(q_ids, SPARSE_COUNT)
        dense = torch.zeros(b, k, v, dtype=torch.float32, device=device)
        dense.scatter_(2, ids, 1.0 / s)
        if case.draft == "dense":
            q_dense = dense
        draft_logits = torch.log(dense)  # vLLM reads q as draft logits (-inf off support)
    vllm_kwargs = vllm_inputs_from_chain(
        logits, drafts, temperature, seeds, position, draft_logits=draft_logits
    )
    return ChainInputs(
        logits=logits,
        draft_tokens=drafts,
        temperature=temperature,
        seed=seeds,
        position=position,
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=denominator,
        q_dense=q_dense,
        t0_mask=t0_mask,
        greedy_tokens=greedy_tokens,
        greedy_accepted=greedy_accepted,
        vllm_kwargs=vllm_kwargs,
    )


# --------------------------------------------------------------------------- comparators


@dataclass
class Comparator:
    """A timed verifier: ``call(inputs)`` launches it; ``check`` judges its outputs."""

    name: str
    call: Callable[[ChainInputs], Any]
    eager_call: Callable[[ChainInputs], Any]
    check: Callable[[ChainInputs, Any], dict[str, bool]]
    note: str = ""
    normalise: Callable[[Any], Any] = lambda output: output  # before equality checks
    slow: bool = False  # milliseconds a call: one graph of input sets, ``slow_replays`` replays


def _accepts(function: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def chain_verifier_comparator(
    name: str, function: Callable[..., Any], *, note: str = "", slow: bool = False
) -> Comparator:
    """Wrap a function with the selector's signature (verify_chain, reference_verify_chain)."""
    has_validate = _accepts(function, "validate")

    def invoke(inputs: ChainInputs, validate: bool) -> Any:
        extra = {"validate": validate} if has_validate else {}
        return function(
            inputs.logits,
            inputs.draft_tokens,
            inputs.temperature,
            inputs.seed,
            inputs.position,
            q_ids=inputs.q_ids,
            q_counts=inputs.q_counts,
            denominator=inputs.denominator,
            q_dense=inputs.q_dense,
            **extra,
        )

    def check(inputs: ChainInputs, result: Any) -> dict[str, bool]:
        return check_chain(
            result.tokens,
            result.accepted,
            result.status,
            vocab=inputs.logits.shape[-1],
            draft_tokens=inputs.draft_tokens,
            t0_mask=inputs.t0_mask,
            greedy_tokens=inputs.greedy_tokens,
            greedy_accepted=inputs.greedy_accepted,
        )

    return Comparator(
        name=name,
        call=lambda inputs: invoke(inputs, False),
        eager_call=lambda inputs: invoke(inputs, True),
        check=check,
        note=note,
        slow=slow,
    )


def argmax_comparator() -> Comparator:
    """torch.argmax over [B, K+1, V] (the seed's comparator); checked against the path."""
    import torch

    def call(inputs: ChainInputs) -> Any:
        return torch.argmax(inputs.logits, dim=-1)

    def check(inputs: ChainInputs, argmax: Any) -> dict[str, bool]:
        tokens, accepted = greedy_chain(argmax, inputs.draft_tokens)
        return {
            "greedy_path_matches": bool(
                torch.equal(tokens.cpu(), inputs.greedy_tokens.cpu())
                and torch.equal(accepted.cpu(), inputs.greedy_accepted.cpu())
            )
        }

    return Comparator("argmax", call, call, check)


def vllm_comparator(rejection_sample: Callable[..., Any], note: str) -> Comparator:
    """vLLM MRV2 rejection_sample on ``inputs.vllm_kwargs``; no status output.

    Only ``rejection_sample`` itself is timed. Its ``sampled`` entries past ``num_sampled``
    are uninitialised, so outputs go through ``chain_from_vllm`` (tokens with -1 padding,
    accepted) before any check or comparison.
    """
    from pp3cli.overlay import chain_from_vllm

    def call(inputs: ChainInputs) -> Any:
        return rejection_sample(**inputs.vllm_kwargs)

    def check(inputs: ChainInputs, result: Any) -> dict[str, bool]:
        tokens, accepted = chain_from_vllm(*result)
        return check_chain(
            tokens,
            accepted,
            None,
            vocab=inputs.logits.shape[-1],
            draft_tokens=inputs.draft_tokens,
            t0_mask=inputs.t0_mask,
            greedy_tokens=inputs.greedy_tokens,
            greedy_accepted=inputs.greedy_accepted,
        )

    return Comparator(
        "vllm", call, call, check, note, normalise=lambda result: chain_from_vllm(*result)
    )


def load_comparators(
    overlay_dir: Any | None, *, require_vllm: bool
) -> tuple[list[Comparator], dict[str, str]]:
    """Available comparators and, for the others, why not ("not available: <reason>")."""
    missing: dict[str, str] = {}
    try:
        kernels = importlib.import_module("pp3kernels")
        verify_chain = getattr(kernels, "verify_chain", None)
        if verify_chain is None:  # not re-exported yet: the selector module itself
            verify_chain = importlib.import_module("pp3kernels.selector").verify_chain
    except (ImportError, AttributeError) as err:
        raise EnvironmentProblem(f"pp3kernels.verify_chain cannot be imported: {err}") from err
    comparators = [chain_verifier_comparator("selector", verify_chain), argmax_comparator()]
    reference = getattr(kernels, "reference_verify_chain", None)
    if reference is None:
        missing["reference"] = "not available: pp3kernels has no reference_verify_chain"
    else:
        comparators.append(chain_verifier_comparator("reference", reference, slow=True))
    if overlay_dir is None:
        missing["vllm"] = "not available: no overlay (run `pp3 overlay fetch`)"
    else:
        try:
            from pp3cli.overlay import load_vllm_rejection_sample

            function = load_vllm_rejection_sample(overlay_dir)
            comparators.append(vllm_comparator(function, note=f"overlay {overlay_dir}"))
        except Exception as err:  # any import/pin failure is reported, not fatal
            missing["vllm"] = f"not available: {err}"
    if require_vllm and "vllm" in missing:
        raise EnvironmentProblem(f"--require-vllm: vLLM comparator {missing['vllm']}")
    return comparators, missing


# --------------------------------------------------------------------------- timing (device)


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


def measure_comparator(
    comparator: Comparator,
    input_sets: Sequence[ChainInputs],
    *,
    rounds: int,
    warmup: int,
    replays: int,
    timer: Callable[[Callable[[], object]], float],
    capture: Capture | None,
    synchronize: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Check, then time one comparator on one case; the receipt's entry for it.

    Returns {available, graph, note, checks, times_us, summary}. Correctness is checked
    on every input set before timing; timing is skipped when a check fails.
    """
    eager_outputs = [comparator.eager_call(inputs) for inputs in input_sets]
    synchronize()
    checks: dict[str, bool] = {}
    for inputs, output in zip(input_sets, eager_outputs, strict=True):
        for key, value in comparator.check(inputs, output).items():
            checks[key] = checks.get(key, True) and value
    entry: dict[str, Any] = {"available": True, "note": comparator.note, "checks": checks}
    if not all(checks.values()):
        entry.update(graph=False, times_us=[], summary=None, skipped="a correctness check failed")
        return entry

    groups = math.ceil(len(input_sets) / rounds) if len(input_sets) > rounds else 1
    replay_fns: list[Callable[[], object]] = []
    captured: list[tuple[list[int], list[Any]]] = []
    use_graph = capture is not None
    notes = [comparator.note] if comparator.note else []
    for group in range(groups):
        indices = [(group * rounds + r) % len(input_sets) for r in range(rounds)]
        calls = [_bind(comparator.call, input_sets[i]) for i in indices]
        if use_graph and capture is not None:
            try:
                fn, outputs = capture(calls)
            except Exception as err:  # not capturable: time it eagerly, and say so
                use_graph = False
                notes.append(
                    f"not captured in a CUDA graph ({type(err).__name__}: {err}); timed eagerly"
                )
                replay_fns.clear()
                captured.clear()
                for earlier in range(group + 1):
                    idx = [(earlier * rounds + r) % len(input_sets) for r in range(rounds)]
                    fn, outputs = eager_rounds([_bind(comparator.call, input_sets[i]) for i in idx])
                    replay_fns.append(fn)
                    captured.append((idx, outputs))
                continue
        else:
            fn, outputs = eager_rounds(calls)
        replay_fns.append(fn)
        captured.append((indices, outputs))

    samples = time_replays(replay_fns, rounds=rounds, warmup=warmup, replays=replays, timer=timer)
    synchronize()
    replay_equal = all(
        outputs_equal(
            _normal(comparator.normalise(output)),
            _normal(comparator.normalise(eager_outputs[index])),
        )
        for indices, outputs in captured
        for index, output in zip(indices, outputs, strict=True)
    )
    checks["replay_equals_eager"] = replay_equal
    entry.update(
        graph=use_graph,
        note="; ".join(notes),
        times_us=samples,
        summary=summarize(samples),
        input_sets=len(input_sets),
        groups=len(replay_fns),
    )
    return entry


def _bind(call: Callable[[ChainInputs], Any], inputs: ChainInputs) -> Callable[[], Any]:
    return lambda: call(inputs)


def _normal(output: Any) -> Any:
    """Tuples/NamedTuples of tensors as plain tuples, for equality."""
    if isinstance(output, tuple):
        return tuple(output)
    return output


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


# --------------------------------------------------------------------------- the run


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
            )
            # Wall time of check + capture + timing (JIT compiles included): not a result.
            entry["wall_s"] = round(time.monotonic() - began, 3)
            entries[comparator.name] = entry
            median = entry["summary"]["median"] if entry.get("summary") else None
            progress(
                f"    {comparator.name}: median {'-' if median is None else f'{median:.2f}'} µs"
                f" ({entry['wall_s']:.1f} s wall, {len(sets_used)} input sets)"
            )
        del input_sets
        floor = floor_us(case.bytes_read(), bandwidth)
        medians = {
            name: (entry["summary"]["median"] if entry.get("summary") else None)
            for name, entry in entries.items()
        }
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


def all_checks_passed(data: Mapping[str, Any]) -> bool:
    """True when every available comparator of every case passed every check."""
    for case in data.get("cases", []):
        for entry in case["comparators"].values():
            if entry.get("available") and not all(entry.get("checks", {}).values()):
                return False
            if entry.get("available") and not entry.get("checks"):
                return False
    return bool(data.get("cases"))


def verdict_of(data: Mapping[str, Any]) -> str:
    """PASS when every correctness check passed (speed targets are reported, not judged)."""
    return "PASS" if all_checks_passed(data) else "FAIL"


# --------------------------------------------------------------------------- recomputation


def recompute_probe_data(data: Mapping[str, Any]) -> list[str]:
    """Problems found when recomputing a probe receipt's data; empty when it holds.

    Recomputes every summary from the stored raw samples, every ratio from the
    recomputed medians, ``checks_passed`` from the stored flags.
    """
    problems: list[str] = []

    def same(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-12)

    copy = data.get("copy")
    if copy:
        summary = summarize(copy["times_us"])
        if any(not same(summary[k], copy["summary"].get(k)) for k in SUMMARY_KEYS):
            problems.append("copy: summary does not match the raw times")
    for case in data.get("cases", []):
        name = case.get("name", "?")
        medians: dict[str, float | None] = {}
        for comparator, entry in case["comparators"].items():
            if not entry.get("available") or not entry.get("times_us"):
                medians[comparator] = None
                if entry.get("summary"):
                    problems.append(f"{name} {comparator}: summary without raw times")
                continue
            summary = summarize(entry["times_us"])
            stored = entry.get("summary") or {}
            for key in SUMMARY_KEYS:
                if not same(summary[key], stored.get(key)):
                    problems.append(
                        f"{name} {comparator}: {key} {stored.get(key)} != recomputed {summary[key]}"
                    )
            medians[comparator] = summary["median"]
        for key, value in case_ratios(medians, case["floor_us"]).items():
            if not same(value, case["ratios"].get(key)):
                problems.append(f"{name}: ratio {key} does not match the medians")
    if bool(data.get("checks_passed")) != all_checks_passed(data):
        problems.append("checks_passed does not match the stored check flags")
    return problems


@register_recomputer("probe")
def recompute_probe(predicate: Mapping[str, Any]) -> str:
    """Recomputer for receipts of kind "probe": PASS when the data holds and checks passed."""
    data = predicate["data"]
    if recompute_probe_data(data):
        return "FAIL"
    return verdict_of(data)


def median_or_none(entry: Mapping[str, Any]) -> float | None:
    """The stored median of a comparator entry, if timed."""
    summary = entry.get("summary")
    return float(summary["median"]) if summary else None
