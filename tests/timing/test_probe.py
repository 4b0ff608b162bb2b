"""`pp3 probe` bookkeeping on CPU: cases, floors, statistics, checks, receipt data, recomputer.

CUDA graphs and events are only in pp3cli.timing.measure.cuda_graph_capture/cuda_event_timer;
here the same measurement code runs with an eager "graph" and a fake timer.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.evidence.greedy import greedy_path
from pp3cli.receipts.recompute import RECOMPUTERS
from pp3cli.run.errors import UsageProblem
from pp3cli.run.scratch import repo_root
from pp3cli.timing import cases as probe_cases
from pp3cli.timing import comparators as probe_comparators
from pp3cli.timing import measure, probe
from pp3cli.timing import summary as probe_summary
from pp3cli.timing.comparators import ProbeInputs
from pp3kernels import ChainInputs
from pp3kernels.runtime import is_interpreter


class FakeResult(NamedTuple):
    tokens: torch.Tensor
    accepted: torch.Tensor
    status: torch.Tensor


def greedy_verifier(logits: torch.Tensor, draft_tokens: torch.Tensor, *args: Any, **kw: Any) -> Any:
    """A verifier that follows the T0 law for every row (valid output for T1 rows too)."""
    tokens, accepted = greedy_path(torch.argmax(logits, dim=-1), draft_tokens)
    return FakeResult(tokens, accepted, torch.zeros(logits.shape[0], dtype=torch.int8))


def off_by_one_verifier(
    logits: torch.Tensor, draft_tokens: torch.Tensor, *args: Any, **kw: Any
) -> Any:
    """The greedy verifier with every emitted token moved up by one (V = 97): fails the checks."""
    result = greedy_verifier(logits, draft_tokens)
    tokens = torch.where(result.tokens >= 0, (result.tokens + 1) % 97, result.tokens)
    return result._replace(tokens=tokens)


def counting_timer(step_ms: float = 0.5) -> Callable[[Callable[[], object]], float]:
    """Runs the function and reports 0.5, 1.0, 1.5, ... ms: deterministic samples."""
    counter = itertools.count(1)

    def timer(fn: Callable[[], object]) -> float:
        fn()
        return next(counter) * step_ms

    return timer


TINY = probe_cases.ProbeConfig(
    batches=(2, 3),
    depths=(2,),
    vocab=97,
    dtype="bf16",
    drafts=("point", "sparse"),
    t0_shares=(0.0, 1.0),
    support=4,
    rounds=2,
    warmup=1,
    replays=5,
)


def tiny_data() -> dict[str, Any]:
    comparators = [
        probe_comparators.verifier_comparator("selector", greedy_verifier),
        probe_comparators.argmax_comparator(),
    ]
    return probe.run_probe(
        TINY,
        device=torch.device("cpu"),
        comparators=comparators,
        missing={"vllm": "not available: test"},
        timer=counting_timer(),
        capture=measure.eager_rounds,
        l2_bytes=4000,
        copy=None,
    )


def test_defaults_give_the_design_cases_and_floors() -> None:
    cases = probe_cases.build_cases(probe_cases.ProbeConfig())
    # 8 batches (1, 2, 3, 4, 16, 64, 256, 1024) x 2 depths x 3 shares, minus B=1 where
    # share 0.5 rounds to all-T0.

    assert sorted({c.batch for c in cases}) == [1, 2, 3, 4, 16, 64, 256, 1024]
    assert len(cases) == 8 * 2 * 3 - 2
    b4k5 = probe_cases.ProbeCase(4, 5, 129280, "bf16", "point", 0, 64)
    b64k5 = probe_cases.ProbeCase(64, 5, 129280, "bf16", "point", 0, 64)
    assert b4k5.logits_bytes() == 4 * 6 * 129280 * 2
    assert probe_cases.floor_us(b4k5.logits_bytes(), 4.3e12) == pytest.approx(1.4431, abs=1e-3)
    assert probe_cases.floor_us(b64k5.logits_bytes(), 4.3e12) == pytest.approx(23.090, abs=1e-2)
    assert b4k5.bytes_read() == b4k5.logits_bytes() + 4 * 20 + 8 * 20 + 20 * 4


def test_bad_options_name_the_value() -> None:
    with pytest.raises(UsageProblem, match="'x'"):
        probe_cases.parse_int_list("1,x", "--batch")
    with pytest.raises(UsageProblem, match="--dtype"):
        probe_cases.ProbeConfig(dtype="int8").validate()
    with pytest.raises(UsageProblem, match="--support"):
        probe_cases.ProbeConfig(drafts=("sparse",), support=48).validate()
    with pytest.raises(UsageProblem, match="--t0-share"):
        probe_cases.ProbeConfig(t0_shares=(1.5,)).validate()


def test_t0_rows_are_spread_and_rounded_half_up() -> None:
    assert probe_cases.t0_count(3, 0.5) == 2
    assert probe_cases.t0_count(1, 0.5) == 1
    assert probe_cases.t0_mask_list(4, 2) == [False, True, False, True]
    assert sum(probe_cases.t0_mask_list(64, 32)) == 32


def test_input_sets_cover_twice_l2_within_budget() -> None:
    assert probe_cases.input_set_count(1000, 60_000, rotate=True, budget_bytes=1 << 30) == 64
    assert probe_cases.input_set_count(50_000, 60_000, rotate=True, budget_bytes=1 << 30) == 3
    assert probe_cases.input_set_count(50_000, 60_000, rotate=False, budget_bytes=1 << 30) == 1
    assert probe_cases.input_set_count(50_000, 60_000, rotate=True, budget_bytes=100_000) == 2


def test_summary_statistics() -> None:
    summary = probe_summary.summarize([float(v) for v in range(1, 12)])
    assert summary == {"n": 11.0, "median": 6.0, "p10": 2.0, "p90": 10.0, "min": 1.0, "max": 11.0}


def test_time_replays_divides_by_rounds_and_rotates() -> None:
    calls: list[str] = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    samples = measure.time_replays(fns, rounds=10, warmup=2, replays=3, timer=counting_timer())
    assert samples == [50.0, 100.0, 150.0]  # ms * 1000 / rounds
    assert calls == ["a", "b", "a", "b", "a", "b", "a"]


def _zero_chain(drafts: torch.Tensor, temperature: float) -> ChainInputs:
    """Chain inputs around ``drafts`` [B, K]: zero logits over V = 10, one temperature."""
    b, k = drafts.shape
    zeros = torch.zeros(b, dtype=torch.int64)
    return ChainInputs(
        torch.zeros((b, k + 1, 10)), drafts, torch.full((b,), temperature), zeros, zeros
    )


def test_greedy_chain_and_checks_catch_a_wrong_token() -> None:
    argmax = torch.tensor([[3, 4, 5], [3, 4, 5]])
    drafts = torch.tensor([[3, 4], [3, 9]], dtype=torch.int32)
    tokens, accepted = greedy_path(argmax, drafts)
    assert tokens.tolist() == [[3, 4, 5], [3, 4, -1]]
    assert accepted.tolist() == [2, 1]
    inputs = ProbeInputs(_zero_chain(drafts, 0.0), torch.tensor([True, True]), tokens, accepted)
    good = probe_comparators.check_chain(inputs, tokens, accepted, torch.zeros(2, dtype=torch.int8))
    assert all(good.values())
    wrong = tokens.clone()
    wrong[1, 1] = 7
    flags = probe_comparators.check_chain(inputs, wrong, accepted, None)
    assert flags["t0_equals_greedy"] is False and flags["tokens_valid"] is True
    out_of_range = tokens.clone()
    out_of_range[0, 2] = 10
    assert (
        probe_comparators.check_chain(inputs, out_of_range, accepted, None)["tokens_valid"] is False
    )
    status = torch.tensor([0, 1], dtype=torch.int8)
    assert probe_comparators.check_chain(inputs, tokens, accepted, status)["status_ok"] is False


def measure_on_cpu(comparator: Any, sets: list[Any], **method: Any) -> dict[str, Any]:
    """``measure_comparator`` with the fake timer; ``method`` gives rounds, replays, ..."""
    arguments: dict[str, Any] = {"rounds": 2, "warmup": 1, "replays": 2}
    arguments.update(method)
    capture = arguments.pop("capture", measure.eager_rounds)
    return measure.measure_comparator(
        comparator, sets, timer=counting_timer(), capture=capture, **arguments
    )


def test_uncapturable_comparator_is_timed_eagerly_and_says_so() -> None:
    case = probe_cases.ProbeCase(2, 2, 97, "fp32", "point", 1, 4)
    sets = [
        probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=1, set_index=i)
        for i in range(3)
    ]

    def refuse(calls: Any) -> Any:
        raise RuntimeError("capture refused")

    comparator = probe_comparators.verifier_comparator("reference", greedy_verifier)
    entry = measure_on_cpu(comparator, sets, replays=4, capture=refuse)
    assert entry["graph"] is False
    assert "capture refused" in entry["note"] and "timed eagerly" in entry["note"]
    assert entry["groups"] == 2 and len(entry["times_us"]) == 4
    assert all(entry["checks"].values())


def test_wrong_verifier_fails_its_check_and_is_not_timed() -> None:
    case = probe_cases.ProbeCase(3, 2, 97, "bf16", "point", 3, 4)
    sets = [probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=2, set_index=0)]

    comparator = probe_comparators.verifier_comparator("selector", off_by_one_verifier)
    entry = measure_on_cpu(comparator, sets, warmup=0)
    assert entry["checks"]["t0_equals_greedy"] is False
    assert entry["times_us"] == [] and entry["summary"] is None


def test_run_probe_data_shape_and_recomputer_detects_tampering() -> None:
    data = tiny_data()
    assert data["checks_passed"] is True
    assert probe_summary.verdict_of(data) == "PASS"
    assert len(data["cases"]) == len(probe_cases.build_cases(TINY)) == 8
    first = data["cases"][0]
    assert set(first["comparators"]) == {"selector", "argmax", "vllm"}
    assert first["comparators"]["vllm"] == {"available": False, "reason": "not available: test"}
    selector = first["comparators"]["selector"]
    assert len(selector["times_us"]) == TINY.replays
    assert selector["checks"]["replay_equals_eager"] is True
    assert first["ratios"]["selector/vllm"] is None
    assert first["ratios"]["selector/argmax"] == pytest.approx(
        selector["summary"]["median"] / first["comparators"]["argmax"]["summary"]["median"]
    )
    predicate: dict[str, Any] = {"data": data, "verdict": "PASS"}
    assert probe_summary.recompute_probe(predicate) == "PASS"

    slower = copy.deepcopy(predicate)
    slower["data"]["cases"][1]["comparators"]["argmax"]["times_us"][0] += 1000.0
    assert probe_summary.recompute_probe_data(slower["data"])
    assert probe_summary.recompute_probe(slower) == "FAIL"

    flag = copy.deepcopy(predicate)
    flag["data"]["cases"][0]["comparators"]["selector"]["checks"]["status_ok"] = False
    assert probe_summary.recompute_probe(flag) == "FAIL"  # checks_passed no longer matches


def test_receipt_round_trip_through_verify(tmp_path: Path) -> None:
    from pp3cli.receipts.verify import verify_receipts
    from pp3cli.receipts.write import write_receipt

    assert RECOMPUTERS["probe"]({"data": tiny_data()}) == "PASS"
    root = repo_root()
    data = tiny_data()
    write_receipt(
        tmp_path,
        "probe",
        parameters={"rounds": TINY.rounds},
        environment={"cuda_available": False},
        data=data,
        verdict=probe_summary.verdict_of(data),
        root=root,
    )
    results = [r for r in verify_receipts(tmp_path, root=root) if r.file.startswith("probe-")]
    assert [r.status for r in results] in (["OK"], ["STALE"]), results


def test_cli_dry_run_lists_cases_and_runs_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--scratch", str(tmp_path), "probe", "--dry-run", "--batch", "4,64", "--depth", "5"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "B4K5 point T0 0/4" in result.output and "B64K5 point T0 64/64" in result.output
    assert "23.09" in result.output
    b64 = probe_cases.ProbeCase(64, 5, probe_cases.DEFAULT_VOCAB, "bf16", "point", 64, 64)
    assert f"{b64.bytes_read() / 1e6:.2f}" in result.output  # the MB read column


def test_cli_without_gpu_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pp3cli.run.errors import EnvironmentProblem

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runner = CliRunner()
    args = ["--scratch", str(tmp_path), "--receipts", str(tmp_path / "r"), "probe", "--batch", "1"]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, EnvironmentProblem), result.output
    assert result.exception.exit_code == 3
    assert "GPU" in str(result.exception)


def test_cli_rejects_a_bad_draft_kind(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--scratch", str(tmp_path), "probe", "--draft", "bogus"])
    assert isinstance(result.exception, UsageProblem)
    assert "bogus" in str(result.exception)


@pytest.mark.gpu
def test_probe_on_gpu_small_case(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    config = probe_cases.ProbeConfig(batches=(4,), depths=(5,), t0_shares=(0.5,), replays=5)
    comparators, missing = probe_comparators.load_comparators(None, require_vllm=False)
    data = probe.run_probe(
        config,
        device=torch.device("cuda"),
        comparators=comparators,
        missing=missing,
        timer=measure.cuda_event_timer,
        capture=measure.cuda_graph_capture,
        l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size,
        copy=None,
        synchronize=torch.cuda.synchronize,
    )
    assert data["checks_passed"], data
    assert data["cases"][0]["comparators"]["selector"]["graph"] is True


def test_real_selector_and_reference_pass_the_checks_in_the_interpreter() -> None:
    comparators, missing = probe_comparators.load_comparators(None, require_vllm=False)
    assert missing["vllm"].startswith("not available: no overlay")
    names = [c.name for c in comparators]
    assert names[:2] == ["selector", "argmax"]
    case = probe_cases.ProbeCase(3, 2, 97, "bf16", "sparse", 2, 4)
    sets = [probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=3, set_index=0)]
    for comparator in comparators:
        entry = measure_on_cpu(comparator, sets, rounds=1, warmup=0, replays=1)
        assert entry["checks"] and all(entry["checks"].values()), (comparator.name, entry)


def test_comparators_are_chosen_by_name_and_the_reference_is_opt_in() -> None:
    assert "reference" not in probe_cases.ProbeConfig().comparators
    comparators, missing = probe_comparators.load_comparators(
        None, require_vllm=False, names=("argmax", "selector")
    )
    assert [c.name for c in comparators] == ["selector", "argmax"] and missing == {}
    comparators, missing = probe_comparators.load_comparators(
        None, require_vllm=False, names=("reference",)
    )
    assert [c.name for c in comparators] == ["reference"] and missing == {}
    for bad in (("selector", "bogus"), (), ("argmax", "argmax")):
        with pytest.raises(UsageProblem, match="--comparators"):
            probe_cases.ProbeConfig(comparators=bad).validate()
    with pytest.raises(UsageProblem, match="--require-vllm"):
        probe_cases.ProbeConfig(comparators=("selector",), require_vllm=True).validate()


def test_peak_memory_wraps_the_first_checked_call_only() -> None:
    case = probe_cases.ProbeCase(2, 2, 97, "fp32", "point", 1, 4)
    sets = [
        probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=1, set_index=i)
        for i in range(3)
    ]
    wrapped: list[int] = []

    def fake_peak(fn: Any) -> int:
        fn()
        wrapped.append(1)
        return 12345

    selector = probe_comparators.selector_comparator()
    entry = measure_on_cpu(selector, sets, peak_memory=fake_peak)
    assert wrapped == [1] and entry["peak_extra_bytes"] == 12345
    assert all(entry["checks"].values())
    assert measure_on_cpu(selector, sets)["peak_extra_bytes"] is None


def test_each_case_names_the_selector_plan_it_was_timed_with() -> None:
    small = probe.selector_plan(probe_cases.ProbeCase(4, 5, 129280, "bf16", "point", 0, 64))
    large = probe.selector_plan(probe_cases.ProbeCase(64, 5, 129280, "bf16", "sparse", 0, 64))
    assert small == {
        "block_b": 1,
        "block_v": 512,  # two to five requests: [2, 4, 512] tiles at 4 warps (v5 steps 41-42)
        "nsplit": 64,
        "chunk": 2048,
        "num_warps": 4,
        "block_f": 2048,
        "flat_rows": 2,
        "groups": 4,
        "finish_warps": 8,
        "overlap": True,
        "tma": False,
        "kind_order": False,
        "support_tile": 0,  # S = 1 (point drafts): nothing to split (v5 steps 25-26)
        "support_warps": 0,
        "ticket": False,  # no split support: no ticketed finish (v5 step 28)
        "carveout": -1,  # point drafts: the driver splits shared memory (v5 step 33)
        "finish_carveout": 7,  # the finish's programs one a multiprocessor (v5 step 38)
        "finish_maxnreg": 128,  # in 128 registers (v5 step 38)
    }
    assert (large["block_v"], large["num_warps"], large["groups"]) == (128, 4, 4)
    assert large["tma"] is False and large["kind_order"] is False
    assert large["overlap"] is True  # sparse q of 64 slots overlaps its launches
    wide = probe_cases.ProbeCase(256, 5, 129280, "bf16", "point", 0, 64)
    # TMA boxes from 256 requests on, a pair of flat rows a program at one warp, with K+1
    # even (v5 step 47) and odd (step 48), and no kind order; chunks of 4096 tokens
    # from 64 on, drawn from as one tile below 256 (v5 step 21) and in tiles of 1024 from 256
    wide_plan = probe.selector_plan(wide)
    assert wide_plan["tma"] is True and wide_plan["kind_order"] is False
    assert (wide_plan["flat_rows"], wide_plan["num_warps"], wide_plan["block_v"]) == (2, 1, 128)
    odd = probe.selector_plan(probe_cases.ProbeCase(256, 4, 129280, "bf16", "point", 0, 64))
    assert odd == wide_plan
    assert (wide_plan["chunk"], wide_plan["nsplit"], wide_plan["block_f"]) == (4096, 32, 1024)
    assert (large["chunk"], large["nsplit"], large["block_f"]) == (4096, 32, 4096)
    # Given the device, what a call did there: on the CPU no overlap, and TMA boxes only in
    # Triton's interpreter (which runs that path too).
    cpu = probe.selector_plan(wide, torch.device("cpu"))
    assert cpu["overlap"] is False and cpu["tma"] is is_interpreter()


def test_require_vllm_refuses_without_an_overlay() -> None:
    from pp3cli.run.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="--require-vllm"):
        probe_comparators.load_comparators(None, require_vllm=True)


def test_vllm_comparator_checks_masked_outputs() -> None:
    """Garbage past num_sampled must neither fail the checks nor the replay comparison."""
    case = probe_cases.ProbeCase(3, 2, 97, "bf16", "point", 3, 4)
    sets = [probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=4, set_index=0)]
    garbage = itertools.count(1000)

    def fake_rejection_sample(**kwargs: Any) -> Any:
        k = kwargs["num_speculative_steps"]
        logits = kwargs["target_logits"].reshape(-1, k + 1, kwargs["target_logits"].shape[-1])
        drafts = kwargs["draft_sampled"].reshape(-1, k + 1)[:, 1:]
        tokens, accepted = greedy_path(torch.argmax(logits, dim=-1), drafts)
        sampled = torch.where(tokens >= 0, tokens, next(garbage)).to(torch.int64)
        return sampled, (accepted + 1).to(torch.int32)

    comparator = probe_comparators.vllm_comparator(fake_rejection_sample, note="fake")
    entry = measure_on_cpu(comparator, sets)
    assert all(entry["checks"].values()), entry["checks"]


def test_slow_comparator_gets_one_graph_of_sets_and_few_replays() -> None:
    calls: list[int] = []

    def counted(logits: torch.Tensor, draft_tokens: torch.Tensor, *args: Any, **kw: Any) -> Any:
        calls.append(1)
        return greedy_verifier(logits, draft_tokens)

    config = probe_cases.ProbeConfig(
        batches=(2,),
        depths=(2,),
        vocab=97,
        t0_shares=(0.0,),
        rounds=2,
        replays=9,
        slow_replays=2,
    )
    comparators = [
        probe_comparators.verifier_comparator("selector", greedy_verifier),
        probe_comparators.verifier_comparator("reference", counted, slow=True),
    ]
    data = probe.run_probe(
        config,
        device=torch.device("cpu"),
        comparators=comparators,
        missing={},
        timer=counting_timer(),
        capture=measure.eager_rounds,
        l2_bytes=4000,
        copy=None,
    )
    case = data["cases"][0]
    assert case["input_sets"] > config.rounds  # the kernels rotate over every set
    assert len(case["comparators"]["selector"]["times_us"]) == 9
    reference = case["comparators"]["reference"]
    assert len(reference["times_us"]) == 2 and reference["input_sets"] == config.rounds
    # eager check of 2 sets + 1 warm-up replay of 2 calls + 2 timed replays of 2 calls
    assert len(calls) == 2 + 2 + 4
    assert data["checks_passed"] is True


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/timing/summary.py against test_probe and test_verify_receipts)


def _with_copy_timing(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as if the probe had timed a copy of 1 MiB (median 11.5 µs): its bandwidth,
    and every case's floor and ratios from it."""
    times = [10.0, 12.0, 11.0, 13.0]
    copy_bytes = 1 << 20
    bandwidth = 2 * copy_bytes / (11.5 * 1e-6)
    data["copy"] = {
        "bytes": copy_bytes,
        "times_us": times,
        "summary": probe_summary.summarize(times),
        "bytes_per_s": bandwidth,
    }
    data["copy_bandwidth_bytes_per_s"] = bandwidth
    for case in data["cases"]:
        case["floor_us"] = probe_cases.floor_us(case["bytes_read"], bandwidth)
        medians = {n: probe_summary.median_or_none(e) for n, e in case["comparators"].items()}
        case["ratios"] = probe_summary.case_ratios(medians, case["floor_us"])
    return data


def test_ratio_is_none_only_when_a_side_is_missing_or_the_denominator_is_zero() -> None:
    assert probe_summary.ratio(3.0, 1.0) == 3.0
    assert probe_summary.ratio(3.0, 0.0) is None
    assert probe_summary.ratio(None, 2.0) is None and probe_summary.ratio(2.0, None) is None


def test_recomputer_binds_the_copy_timing_and_missing_ratios() -> None:
    """The copy's summary is recomputed from its raw times; a ratio stored as a number where
    a side is missing, or as None where both sides are timed, is a mismatch."""
    data = _with_copy_timing(tiny_data())
    assert probe_summary.recompute_probe_data(data) == []

    tampered = copy.deepcopy(data)
    tampered["copy"]["summary"]["median"] = 10.0
    assert probe_summary.recompute_probe_data(tampered) == [
        "copy: summary does not match the raw times"
    ]
    invented = copy.deepcopy(data)
    invented["cases"][0]["ratios"]["selector/vllm"] = 0.5  # vllm was not available
    assert probe_summary.recompute_probe_data(invented)
    dropped = copy.deepcopy(data)
    dropped["cases"][0]["ratios"]["selector/argmax"] = None  # both sides were timed
    assert probe_summary.recompute_probe_data(dropped)


def test_an_available_comparator_without_times_or_checks() -> None:
    """An available comparator with no raw times has no median (and no ratio), and one
    with no checks at all has not passed them."""
    data = tiny_data()
    argmax = data["cases"][0]["comparators"]["argmax"]
    argmax.update(times_us=[], summary=None)
    data["cases"][0]["ratios"]["selector/argmax"] = None
    assert probe_summary.recompute_probe_data(data) == []
    argmax["checks"] = {}
    assert probe_summary.all_checks_passed(data) is False


# ---- Tests that kill mutants a campaign over timing/cases.py found surviving (2026-12-05)


def test_the_documented_options_are_the_configs_defaults() -> None:
    docs = (repo_root() / "docs" / "probe.md").read_text()
    default = probe_cases.ProbeConfig()
    shown = {
        "--batch": ",".join(map(str, default.batches)),
        "--depth": ",".join(map(str, default.depths)),
        "--vocab": str(default.vocab),
        "--support": str(default.support),
        "--t0-share": ",".join(f"{s:g}" for s in default.t0_shares),
        "--rounds": str(default.rounds),
        "--warmup": str(default.warmup),
        "--replays": str(default.replays),
        "--seed": str(default.seed),
        "--comparators": ",".join(default.comparators),
    }
    for option, value in shown.items():
        assert f"`{option} {value}`" in docs, option
    assert f"`--slow-replays` (default {default.slow_replays})" in docs
    assert default.drafts == ("point",) and "(default point)" in docs
    assert (default.dtype, default.rotate_inputs, default.require_vllm) == ("bf16", True, False)
    # the method's constants, as docs/probe.md states them
    assert f"`randn * {probe_cases.LOGIT_SCALE:g}`" in docs
    assert probe_cases.POINT_DENOMINATOR == 1 << 16 and "count = C = 2^16" in docs
    assert (
        f"(x + {probe_cases.SUPPORT_STRIDE} j) mod V), each count {probe_cases.SPARSE_COUNT},"
        in (" ".join(docs.split()))
    )
    assert f"at most {probe_cases.MAX_INPUT_SETS}," in docs


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"batches": ()}, "--batch needs integers >= 1, got []"),
        ({"batches": (4, 0)}, "--batch needs integers >= 1, got [4, 0]"),
        ({"depths": (0,)}, "--depth needs integers >= 1, got [0]"),
        ({"vocab": 1}, "--vocab must be >= 2, got 1"),
        ({"drafts": ()}, "--draft takes point, sparse, dense; got []"),
        ({"t0_shares": ()}, "--t0-share needs values in [0, 1], got []"),
        ({"t0_shares": (-0.1,)}, "--t0-share needs values in [0, 1], got [-0.1]"),
        ({"drafts": ("sparse",), "support": 1}, "got 1"),
        ({"drafts": ("dense",), "support": 1 << 15}, "got 32768"),
        ({"drafts": ("sparse",), "vocab": 64, "support": 128}, "min(16384, V=64)], got 128"),
        ({"drafts": ("sparse",), "vocab": 4006}, "--vocab 4006 shares a factor with 2003"),
        ({"comparators": ()}, "--comparators takes distinct names"),
        ({"comparators": ("selector", "selector")}, "--comparators takes distinct names"),
        ({"comparators": ("selector", "eager")}, "got ['selector', 'eager']"),
        ({"require_vllm": True, "comparators": ("selector",)}, "--require-vllm needs vllm"),
        ({"rounds": 0}, "--rounds must be >= 1, got 0"),
        ({"warmup": -1}, "--warmup must be >= 0, got -1"),
        ({"replays": 0}, "--replays must be >= 1, got 0"),
        ({"slow_replays": 0}, "--slow-replays must be >= 1, got 0"),
    ],
    ids=str,
)
def test_each_bad_probe_option_is_refused_by_name(changes: dict[str, Any], fragment: str) -> None:
    config = probe_cases.ProbeConfig(**changes)
    with pytest.raises(UsageProblem) as caught:
        config.validate()
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"batches": (1,), "depths": (1,), "vocab": 2},  # the smallest of each
        {"t0_shares": (0.0, 1.0)},
        {"drafts": ("sparse",), "support": 2},
        {"drafts": ("sparse", "dense"), "support": 1 << 14},
        {"drafts": ("sparse",), "vocab": 64, "support": 64},  # S = V
        {"drafts": ("point",), "vocab": 4006, "support": 3},  # point drafts: no support used
        {"comparators": ("selector",)},  # no vLLM, not required
        {"require_vllm": True},
        {"rounds": 1, "warmup": 0, "replays": 1, "slow_replays": 1},
    ],
    ids=str,
)
def test_probe_options_at_their_bounds_are_accepted(changes: dict[str, Any]) -> None:
    probe_cases.ProbeConfig(**changes).validate()


def test_bytes_read_count_every_input_once_by_draft_kind() -> None:
    def case(draft: str) -> probe_cases.ProbeCase:
        return probe_cases.ProbeCase(3, 2, 10, "fp32", draft, 1, 4)

    logits, drafts, per_request = 3 * 3 * 10 * 4, 4 * 3 * 2, 20 * 3
    assert case("point").bytes_read() == logits + drafts + 8 * 3 * 2 * 1 + per_request
    assert case("sparse").bytes_read() == logits + drafts + 8 * 3 * 2 * 4 + per_request
    assert case("dense").bytes_read() == logits + drafts + 4 * 3 * 2 * 10 + per_request
    assert [case(d).support_size for d in ("point", "sparse", "dense")] == [1, 4, 10]
    for half in ("bf16", "fp16"):
        assert probe_cases.ProbeCase(3, 2, 10, half, "point", 1, 4).logits_bytes() == logits // 2


def test_t0_shares_round_half_up_and_never_past_the_batch() -> None:
    assert probe_cases.t0_count(1, 0.25) == 0
    assert probe_cases.t0_count(4, 0.125) == 1  # exactly half a row: up
    assert probe_cases.t0_count(8, 0.1) == 1 and probe_cases.t0_count(8, 0.05) == 0
    assert probe_cases.t0_count(5, 1.0) == 5


def test_input_sets_at_their_edges() -> None:
    assert probe_cases.input_set_count(0, 60_000, rotate=True, budget_bytes=1 << 30) == 1
    assert probe_cases.input_set_count(1, 4, rotate=True, budget_bytes=100) == 8
    assert probe_cases.input_set_count(100, 1000, rotate=True, budget_bytes=50) == 1
    assert probe_cases.input_set_count(100, 10, rotate=True, budget_bytes=1 << 30) == 1


# ---- Tests that kill mutants a campaign over timing/probe.py found surviving (2026-12-05)


def test_the_probe_reports_each_case_numbered_with_its_medians_and_wall_time() -> None:
    said: list[str] = []

    wrong = probe_comparators.verifier_comparator("wrong", off_by_one_verifier)  # untimed
    comparators = [probe_comparators.verifier_comparator("selector", greedy_verifier), wrong]
    data = probe.run_probe(
        TINY, device=torch.device("cpu"), comparators=comparators, missing={},
        timer=counting_timer(), capture=measure.eager_rounds, l2_bytes=4000, copy=None,
        progress=said.append,
    )  # fmt: skip
    cases = probe_cases.build_cases(TINY)
    headers = [line for line in said if not line.startswith(" ")]
    assert headers == [f"[{i}] {case.name}" for i, case in enumerate(cases, start=1)]
    selector_lines = [line for line in said if line.startswith("    selector: median ")]
    medians = [c["comparators"]["selector"]["summary"]["median"] for c in data["cases"]]
    assert [line.split(" µs")[0] for line in selector_lines] == [
        f"    selector: median {m:.2f}" for m in medians
    ]
    assert all(line.startswith("    wrong: median - µs (") for line in said if "wrong" in line)
    for case in data["cases"]:
        for entry in case["comparators"].values():
            assert 0.0 <= entry["wall_s"] < 600.0


@pytest.mark.parametrize("draft", ["point", "sparse", "dense"])
def test_a_case_is_timed_with_the_plan_verify_chain_picks_for_its_inputs(draft: str) -> None:
    from pp3kernels import plan_launch

    case = probe_cases.ProbeCase(4, 5, 129280, "bf16", draft, 0, 4096)
    expected = plan_launch(
        4,
        6,
        129280,
        interpreter=False,
        support=4096 if draft == "sparse" else 1,
        dense=draft == "dense",
    )
    assert probe.case_launch_plan(case) == expected
    wide = probe.case_launch_plan(probe_cases.ProbeCase(4, 5, 129280, "bf16", "sparse", 0, 4096))
    if draft != "sparse":
        assert probe.case_launch_plan(case) != wide  # a wide support changes the plan


# ---- Tests that kill mutants a campaign over timing/measure.py found surviving (2026-12-05)


def test_outputs_are_equal_only_bit_for_bit_and_shape_for_shape() -> None:
    a = torch.tensor([1, 2, 3])
    equal = measure.outputs_equal
    assert equal(a, a.clone()) and not equal(a, torch.tensor([1, 2, 4]))
    assert not equal(a, [1, 2, 3]) and not equal([1, 2, 3], a)
    assert equal((a, [a, 5]), [a.clone(), (a, 5)])  # tuples and lists alike, nested
    assert not equal((a, a), (a,)) and not equal((a, a), (a, a + 1))
    assert not equal((a,), a) and not equal(5, (5,))
    assert equal(5, 5) and not equal(5, 6) and equal(None, None)


def test_input_sets_are_grouped_into_graphs_of_rounds_in_rotation() -> None:
    case = probe_cases.ProbeCase(2, 2, 97, "fp32", "point", 1, 4)
    sets = [
        probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=1, set_index=i)
        for i in range(5)
    ]
    captured: list[list[int]] = []

    def capture(calls: Any) -> tuple[Callable[[], object], list[Any]]:
        captured.append(
            [next(i for i, s in enumerate(sets) if s is call.args[0]) for call in calls]
        )
        return measure.eager_rounds(calls)

    comparator = probe_comparators.argmax_comparator()
    entry = measure_on_cpu(comparator, sets, rounds=2, capture=capture)
    assert captured == [[0, 1], [2, 3], [4, 0]]
    assert (entry["available"], entry["graph"], entry["groups"], entry["input_sets"]) == (
        True, True, 3, 5,
    )  # fmt: skip
    eager = measure_on_cpu(comparator, sets, rounds=5, capture=None)
    assert (eager["graph"], eager["groups"], eager["note"]) == (False, 1, comparator.note)


def test_a_failed_check_leaves_no_graph_and_no_times() -> None:
    case = probe_cases.ProbeCase(3, 2, 97, "bf16", "point", 3, 4)
    sets = [probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=2, set_index=0)]

    entry = measure_on_cpu(probe_comparators.verifier_comparator("x", off_by_one_verifier), sets)
    assert entry["available"] is True and entry["graph"] is False
    assert entry["skipped"] == "a correctness check failed"


def test_copy_bandwidth_counts_bytes_read_and_written_per_second_of_the_median() -> None:
    result = measure.copy_bandwidth(
        device=torch.device("cpu"), nbytes=1000, replays=3, timer=counting_timer(step_ms=0.5)
    )
    assert result["times_us"] == [500.0, 1000.0, 1500.0]  # ms from the timer, in µs
    assert result["summary"]["median"] == 1000.0 and result["bytes"] == 1000
    assert result["bytes_per_s"] == pytest.approx(2 * 1000 / 1e-3)


def test_recomputer_binds_the_floors_to_the_geometry_and_the_copy_bandwidth() -> None:
    """The floors that the targets are judged against come from each case's stored geometry
    (bytes read) and the copy timing (2 x bytes / median; the nominal bandwidth without
    one): a floor, a byte count or a bandwidth edited alone is found."""
    data = _with_copy_timing(tiny_data())
    bandwidth = data["copy_bandwidth_bytes_per_s"]
    assert probe_summary.recompute_probe_data(data) == []
    name = data["cases"][1]["name"]
    edits: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda d: d["cases"][1].update(floor_us=d["cases"][1]["floor_us"] * 2), "floor_us"),
        (lambda d: d["cases"][1].update(bytes_read=d["cases"][1]["bytes_read"] + 1), "bytes_read"),
        (lambda d: d["cases"][1]["case"].update(batch=d["cases"][1]["case"]["batch"] + 1), name),
        (lambda d: d["copy"].update(bytes_per_s=bandwidth / 2), "copy: bytes_per_s"),
        (lambda d: d.update(copy_bandwidth_bytes_per_s=bandwidth / 2), "copy_bandwidth"),
        (lambda d: d.update(copy=None), "copy_bandwidth"),
    ]
    for edit, fragment in edits:
        tampered = copy.deepcopy(data)
        edit(tampered)
        problems = probe_summary.recompute_probe_data(tampered)
        assert any(fragment in problem for problem in problems), (fragment, problems)


# ---- Tests that kill mutants a campaign over timing/comparators.py found surviving


def _case(draft: str, *, batch: int = 7, depth: int = 3, vocab: int = 50, support: int = 4) -> Any:
    return probe_cases.ProbeCase(batch, depth, vocab, "fp32", draft, 2, support)


def test_probe_inputs_follow_the_documented_method() -> None:
    """docs/probe.md's inputs, rebuilt independently: randn * LOGIT_SCALE from a generator
    seeded with seed * 1,000,003 + set index; drafts the rows' argmax except in every third
    request (b = 1, 4, ...), whose draft at position b mod K is argmax + 1 mod V; per-request
    seeds distinct across requests and input sets; positions 1000 + 7 b."""
    case = _case("point")
    device = torch.device("cpu")
    got = probe_comparators.make_inputs(case, device=device, seed=5, set_index=2)
    generator = torch.Generator(device=device).manual_seed(5 * 1_000_003 + 2)
    logits = torch.randn(7, 4, 50, generator=generator) * probe_cases.LOGIT_SCALE
    assert torch.equal(got.chain.logits, logits)
    argmax = logits.argmax(-1)
    want = argmax[:, :3].clone()
    for b in (1, 4):
        want[b, b % 3] = (want[b, b % 3] + 1) % 50
    assert torch.equal(got.chain.draft_tokens, want.to(torch.int32))
    assert got.chain.position.tolist() == [1000 + 7 * b for b in range(7)]
    assert got.chain.temperature.tolist() == [0.0 if t0 else 1.0 for t0 in got.t0_mask.tolist()]
    seeds = {
        s
        for index in range(3)
        for s in probe_comparators.make_inputs(
            case, device=device, seed=5, set_index=index
        ).chain.seed.tolist()
    }
    assert len(seeds) == 3 * 7  # no two requests of a case's input sets share a stream
    other = probe_comparators.make_inputs(case, device=device, seed=6, set_index=0)
    assert not seeds & set(other.chain.seed.tolist())  # nor do two probe seeds
    tokens, accepted = greedy_path(argmax, want)
    assert torch.equal(got.greedy_tokens, tokens) and torch.equal(got.greedy_accepted, accepted)


def test_the_off_by_one_draft_wraps_at_the_vocabulary_end() -> None:
    """A draft at V - 1 moved by one is token 0, not V (which would be out of range)."""
    case = _case("point", batch=2, depth=1, vocab=2)
    for seed in range(20):
        inputs = probe_comparators.make_inputs(
            case, device=torch.device("cpu"), seed=seed, set_index=0
        )
        argmax = int(inputs.chain.logits[1, 0].argmax())
        assert int(inputs.chain.draft_tokens[1, 0]) == (argmax + 1) % 2


@pytest.mark.parametrize("draft", ["point", "sparse", "dense"])
def test_probe_draft_laws_spread_q_evenly_over_the_stride(draft: str) -> None:
    """Point: one id, the draft, count C = 2^16. Sparse: ids (x + 2003 j) mod V, j < S, each
    count SPARSE_COUNT over C = S * SPARSE_COUNT. Dense: the same law as a [B, K, V] fp32 q
    (1/S at those ids); vLLM's draft logits are its log."""
    case = _case(draft, vocab=4001, support=5)
    inputs = probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=1, set_index=0)
    chain, drafts = inputs.chain, inputs.chain.draft_tokens.to(torch.int64)
    offsets = torch.arange(5) * probe_cases.SUPPORT_STRIDE
    ids = (drafts[:, :, None] + offsets) % 4001
    if draft == "point":
        assert chain.q_ids is not None and chain.q_counts is not None
        assert torch.equal(chain.q_ids, drafts[:, :, None].to(torch.int32))
        assert bool((chain.q_counts == probe_cases.POINT_DENOMINATOR).all())
        assert chain.denominator == probe_cases.POINT_DENOMINATOR
        return
    law = torch.zeros(7, 3, 4001).scatter_(2, ids, 0.2)
    if draft == "sparse":
        assert chain.q_ids is not None and chain.q_counts is not None and chain.q_dense is None
        assert torch.equal(chain.q_ids.to(torch.int64), ids)
        assert bool((chain.q_counts == probe_cases.SPARSE_COUNT).all())
        assert chain.denominator == 5 * probe_cases.SPARSE_COUNT
    else:
        assert chain.q_dense is not None and chain.q_ids is None
        assert torch.equal(chain.q_dense, law)
    draft_logits = inputs.vllm_kwargs["draft_logits"]
    assert torch.equal(draft_logits.reshape(law.shape), torch.log(law))


def test_check_chain_accepts_token_zero_and_rejects_accepted_past_k() -> None:
    """Token 0 is a valid token; accepted must lie in [0, K], K + 1 included as a failure."""
    chain = _zero_chain(torch.tensor([[0, 0]], dtype=torch.int32), 1.0)
    tokens, accepted = torch.tensor([[0, 0, 0]]), torch.tensor([2])
    inputs = ProbeInputs(chain, torch.tensor([False]), tokens, accepted)
    assert all(probe_comparators.check_chain(inputs, tokens, accepted, None).values())
    flags = probe_comparators.check_chain(inputs, tokens, torch.tensor([3]), None)
    assert flags["accepted_in_range"] is False
    flags = probe_comparators.check_chain(inputs, tokens, torch.tensor([-1]), None)
    assert flags["accepted_in_range"] is False


def test_argmax_check_needs_both_the_greedy_tokens_and_the_accepted_count() -> None:
    case = _case("point")
    inputs = probe_comparators.make_inputs(case, device=torch.device("cpu"), seed=2, set_index=0)
    comparator = probe_comparators.argmax_comparator()
    output = comparator.call(inputs)
    assert comparator.check(inputs, output) == {"greedy_path_matches": True}
    wrong_count = copy.copy(inputs)
    wrong_count.greedy_accepted = inputs.greedy_accepted + 1
    assert comparator.check(wrong_count, output) == {"greedy_path_matches": False}
    wrong_tokens = copy.copy(inputs)
    wrong_tokens.greedy_tokens = inputs.greedy_tokens.flip(0)
    assert comparator.check(wrong_tokens, output) == {"greedy_path_matches": False}


def test_pp3s_verifiers_are_checked_validated_and_timed_unvalidated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The selector and the reference run with host validation when checked and with
    ``validate=False`` in graphs; only the reference is slow. A plain comparator is not."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def recorder(name: str) -> Callable[..., Any]:
        def verify(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, kwargs))
            return None

        return verify

    monkeypatch.setattr(probe_comparators, "verify_chain", recorder("selector"))
    monkeypatch.setattr(probe_comparators, "reference_verify_chain", recorder("reference"))
    inputs = probe_comparators.make_inputs(
        _case("point"), device=torch.device("cpu"), seed=0, set_index=0
    )
    for maker, slow in (
        (probe_comparators.selector_comparator, False),
        (probe_comparators.reference_comparator, True),
    ):
        comparator = maker()
        assert comparator.slow is slow
        calls.clear()
        comparator.eager_call(inputs)
        comparator.call(inputs)
        assert [kwargs.get("validate", True) for _, kwargs in calls] == [True, False]
        assert {name for name, _ in calls} == {comparator.name}
    assert probe_comparators.argmax_comparator().slow is False
    assert probe_comparators.vllm_comparator(lambda **kw: None, "n").slow is False


# ---- Tests that kill mutants a campaign over cli/probe.py found surviving


def test_pp3_probe_without_options_runs_the_configs_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pp3 probe` alone times ProbeConfig()'s cases with its method (docs/probe.md's
    defaults, which another test pins to the config) and a 1024 MiB copy; the finding
    records both, and its verdict and table come from the probe's data."""
    from pp3cli.cli import probe as probe_cli
    from pp3cli.timing import probe as probe_module

    seen: dict[str, Any] = {}
    data = tiny_data()

    def probe_on_cuda(config: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(config=config, **kwargs)
        kwargs["progress"]("[1] a progress line")
        return data

    def run_receipted(name: str, settings: Any, run: Any, work: Any, **kwargs: Any) -> None:
        seen["finding"] = work(None)
        seen["kind"] = kwargs["kind"], kwargs["require_gpu"]

    monkeypatch.setattr(probe_module, "probe_on_cuda", probe_on_cuda)
    monkeypatch.setattr(probe_cli, "run_receipted", run_receipted)
    result = CliRunner().invoke(app, ["--scratch", str(tmp_path), "probe"])
    assert result.exit_code == 0, result.output
    assert "a progress line" in result.stderr and "a progress line" not in result.stdout
    assert seen["config"] == probe_cases.ProbeConfig()
    assert seen["copy_mib"] == 1024 and seen["overlay_dir"] is None
    assert seen["kind"] == ("probe", True)
    finding = seen["finding"]
    assert finding.parameters == {**asdict(probe_cases.ProbeConfig()), "copy_mib": 1024}
    assert finding.data is data and finding.verdict == probe_summary.verdict_of(data)
    for bad in ("0", "-3"):
        refused = CliRunner().invoke(app, ["--scratch", str(tmp_path), "probe", "--copy-mib", bad])
        assert isinstance(refused.exception, UsageProblem)  # exit 2 through pp3's main
        assert f"--copy-mib must be >= 1, got {bad}" in str(refused.exception)
    accepted = CliRunner().invoke(app, ["--scratch", str(tmp_path), "probe", "--copy-mib", "1"])
    assert accepted.exit_code == 0 and seen["copy_mib"] == 1


def _results_table(data: dict[str, Any]) -> tuple[str, dict[str, list[str]]]:
    """`pp3 probe`'s human table of ``data`` as text, and each case's row as its stripped
    cells, by case name."""
    from rich.console import Console

    from pp3cli.cli.probe import results_table

    console = Console(width=400, record=True)
    console.print(results_table(data))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "│" in line]
    cells = [[cell.strip() for cell in row.split("│")[1:-1]] for row in rows]
    return text, {row[0]: row for row in cells}


def test_results_table_shows_medians_ratios_bandwidth_and_memory() -> None:
    """The human table: the copy rate in TB/s in its title; per case each comparator's
    median (or "-" where it did not run), the floor, the selector's ratios, the selector's
    achieved TB/s (bytes read over its median) and its extra memory in MiB."""
    data = copy.deepcopy(tiny_data())
    data["copy_bandwidth_bytes_per_s"] = 3.25e12
    case = data["cases"][0]
    case["comparators"]["selector"]["peak_extra_bytes"] = 3 << 20
    case["comparators"]["argmax"]["summary"]["median"] = 2345.678
    case["bytes_read"] = 2_500_000_000  # the table reads it as stored
    case["ratios"] = {"selector/argmax": 0.123456, "selector/vllm": 0.5678, "selector/floor": 7.891}
    selector = probe_summary.median_or_none(case["comparators"]["selector"])
    assert selector is not None and selector != 2345.678
    text, rows = _results_table(data)
    assert "copy 3.25 TB/s" in text
    cells = rows[case["name"]]
    achieved = 2_500_000_000 / (selector * 1e-6) / 1e12
    assert 0.01 < achieved < 1e3  # a value that shows in two decimals
    # case | selector argmax reference vllm | floor | 3 ratios | sel TB/s | sel MiB
    assert cells[1:5] == [f"{selector:.1f}", "2345.7", "-", "-"]
    assert cells[5:9] == [f"{case['floor_us']:.2f}", "0.12", "0.57", "7.89"]
    assert cells[9:] == [f"{achieved:.2f}", "3.0"]


# ---- Tests that kill mutants a campaign over timing/summary.py, timing/comparators.py and
# cli/probe.py found surviving (camp9: one AST mutation at a time, plus hand mutants)


def test_summarize_refuses_no_samples_by_name() -> None:
    """No samples is a caller's bug, said as such (a ValueError naming it), not numpy's
    IndexError from an empty percentile: verify-receipts prints the message of a recomputer
    that raises."""
    with pytest.raises(ValueError, match="no timing samples to summarise"):
        probe_summary.summarize([])
    assert probe_summary.summarize([7.0]) == dict.fromkeys(probe_summary.SUMMARY_KEYS, 7.0) | {
        "n": 1.0
    }


def test_a_probe_without_cases_has_not_passed() -> None:
    """PASS needs every check of every case: a probe that timed no case (or whose receipt
    lost its cases) proves nothing, so its verdict and the recomputed one are FAIL."""
    assert probe_summary.all_checks_passed({"cases": []}) is False
    assert probe_summary.all_checks_passed({}) is False
    assert probe_summary.verdict_of({"cases": []}) == "FAIL"
    data = tiny_data()
    emptied = copy.deepcopy(data)
    emptied["cases"] = []
    assert probe_summary.recompute_probe({"data": emptied}) == "FAIL"
    assert probe_summary.all_checks_passed(data) is True  # the same data with its cases


def test_an_unavailable_comparator_may_not_carry_a_summary() -> None:
    """A comparator that did not run (or left no raw times) has no median; a summary stored
    for it anyway cannot be recomputed from anything and is named as such."""
    data = tiny_data()
    vllm = data["cases"][0]["comparators"]["vllm"]
    vllm["summary"] = probe_summary.summarize([1.0, 2.0])
    name = data["cases"][0]["name"]
    assert probe_summary.recompute_probe_data(data) == [f"{name} vllm: summary without raw times"]
    assert probe_summary.recompute_probe({"data": data}) == "FAIL"


def test_a_stored_summary_key_missing_or_off_is_named() -> None:
    """Every summary key is compared with its recomputed value: a key dropped (None) or off
    by a little (beyond 1e-12 relative) is named with both numbers; a last-digit rounding
    difference is not a mismatch."""
    data = tiny_data()
    name = data["cases"][0]["name"]
    selector = data["cases"][0]["comparators"]["selector"]
    recomputed = probe_summary.summarize(selector["times_us"])
    for key in probe_summary.SUMMARY_KEYS:
        dropped = copy.deepcopy(data)
        dropped["cases"][0]["comparators"]["selector"]["summary"][key] = None
        assert probe_summary.recompute_probe_data(dropped) == [
            f"{name} selector: {key} None != recomputed {recomputed[key]}"
        ]
        off = copy.deepcopy(data)
        off["cases"][0]["comparators"]["selector"]["summary"][key] = recomputed[key] * (1 + 1e-9)
        assert len(probe_summary.recompute_probe_data(off)) == 1, key
    # A median of tens of ms (the eager reference's) stored one ulp off: that ulp is far above
    # 1e-12 µs, so the relative tolerance is what accepts it.
    slow = copy.deepcopy(data)
    case = slow["cases"][0]
    entry = case["comparators"]["selector"]
    entry["times_us"] = [t * 100.0 + 30_000.0 for t in entry["times_us"]]
    entry["summary"] = probe_summary.summarize(entry["times_us"])
    medians = {n: probe_summary.median_or_none(e) for n, e in case["comparators"].items()}
    case["ratios"] = probe_summary.case_ratios(medians, case["floor_us"])
    assert probe_summary.recompute_probe_data(slow) == []
    median = entry["summary"]["median"]
    entry["summary"]["median"] = math.nextafter(median, math.inf)
    assert entry["summary"]["median"] - median > 1e-12
    assert probe_summary.recompute_probe_data(slow) == []


def test_median_or_none_reads_the_stored_median() -> None:
    assert probe_summary.median_or_none({"summary": {"median": 3}}) == 3.0
    assert probe_summary.median_or_none({"summary": None}) is None
    assert probe_summary.median_or_none({}) is None


def test_a_failed_check_makes_all_checks_passed_false_not_none() -> None:
    """``checks_passed`` is stored in the receipt as a JSON boolean: a failed flag gives
    False (not a falsy None, which would be written as null)."""
    data = tiny_data()
    data["cases"][-1]["comparators"]["argmax"]["checks"]["greedy_path_matches"] = False
    assert probe_summary.all_checks_passed(data) is False
    unavailable = tiny_data()
    unavailable["cases"][0]["comparators"]["selector"] = {"available": False, "reason": "x"}
    assert probe_summary.all_checks_passed(unavailable) is True  # only available ones count


def test_point_drafts_reach_vllm_as_one_hot_drafts() -> None:
    """docs/probe.md: vLLM gets one-hot drafts (``draft_logits=None``) for point q, and its
    arguments are ``vllm_arguments`` of the very chain the other comparators get."""
    from pp3cli.verifiers.vllm_mrv2 import vllm_arguments

    inputs = probe_comparators.make_inputs(
        _case("point"), device=torch.device("cpu"), seed=3, set_index=1
    )
    assert inputs.vllm_kwargs["draft_logits"] is None
    expected = vllm_arguments(inputs.chain)
    assert set(inputs.vllm_kwargs) == set(expected)
    for key, value in expected.items():
        assert measure.outputs_equal(inputs.vllm_kwargs[key], value), key


def test_the_vllm_comparator_is_handed_its_arguments_and_judged_on_masked_outputs() -> None:
    """vLLM's comparator calls ``rejection_sample(**inputs.vllm_kwargs)`` (checked and timed
    alike), keeps the loader's note, and checks and compares (``normalise``) the chain
    ``chain_from_vllm`` makes of its outputs: tokens past ``num_sampled`` are -1."""
    inputs = probe_comparators.make_inputs(
        _case("point", batch=3, depth=2), device=torch.device("cpu"), seed=4, set_index=0
    )
    handed: list[dict[str, Any]] = []
    tokens, accepted = inputs.greedy_tokens, inputs.greedy_accepted
    sampled = torch.where(tokens >= 0, tokens, 12345).to(torch.int64)  # garbage past the stop

    def rejection_sample(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        handed.append(kwargs)
        return sampled, (accepted + 1).to(torch.int32)

    comparator = probe_comparators.vllm_comparator(rejection_sample, note="overlay X")
    assert (comparator.name, comparator.note) == ("vllm", "overlay X")
    for call in (comparator.call, comparator.eager_call):
        output = call(inputs)
        kwargs = handed.pop()
        assert kwargs.keys() == inputs.vllm_kwargs.keys()
        assert all(kwargs[key] is value for key, value in inputs.vllm_kwargs.items())
        assert measure.outputs_equal(output, (sampled, (accepted + 1).to(torch.int32)))
    normalised = comparator.normalise(output)
    assert torch.equal(normalised[0], tokens.to(torch.int32))
    assert torch.equal(normalised[1], accepted.to(torch.int32))
    assert all(comparator.check(inputs, output).values())
    wrong = (torch.where(tokens >= 0, (tokens + 1) % 50, 0).to(torch.int64), output[1])
    assert comparator.check(inputs, wrong)["t0_equals_greedy"] is False


def test_an_overlay_gives_the_vllm_comparator_last_and_a_failing_one_a_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With an overlay, vLLM's ``rejection_sample`` loaded from it is the last comparator
    (COMPARATORS' order), noted with the overlay's path; a load that fails for any reason
    is recorded as "not available: <reason>", and is fatal only under --require-vllm
    (EnvironmentProblem, exit 3, naming the reason). vLLM not asked for is not loaded."""
    from pp3cli.run.errors import EnvironmentProblem
    from pp3cli.verifiers import overlay as overlay_module

    loaded: list[Path] = []

    def load(path: Path) -> Callable[..., Any]:
        loaded.append(path)
        return lambda **kwargs: ("called", kwargs)

    monkeypatch.setattr(overlay_module, "load_vllm_rejection_sample", load)
    names = ("vllm", "reference", "argmax", "selector")
    for require in (False, True):
        comparators, missing = probe_comparators.load_comparators(
            tmp_path, require_vllm=require, names=names
        )
        assert [c.name for c in comparators] == list(probe_cases.COMPARATORS) and missing == {}
        vllm = comparators[-1]
        assert vllm.note == f"overlay {tmp_path}" and loaded.pop() == tmp_path
    assert vllm.call(copy.copy(_vllm_probe_inputs())) == ("called", {"a": 1})
    comparators, missing = probe_comparators.load_comparators(
        tmp_path, require_vllm=False, names=("selector",)
    )
    assert [c.name for c in comparators] == ["selector"] and missing == {} and loaded == []

    def refuse(path: Path) -> Callable[..., Any]:
        raise RuntimeError("digest differs")

    monkeypatch.setattr(overlay_module, "load_vllm_rejection_sample", refuse)
    defaults = probe_cases.DEFAULT_COMPARATORS
    comparators, missing = probe_comparators.load_comparators(
        tmp_path, require_vllm=False, names=defaults
    )
    assert [c.name for c in comparators] == ["selector", "argmax"]
    assert missing == {"vllm": "not available: digest differs"}
    with pytest.raises(EnvironmentProblem) as caught:
        probe_comparators.load_comparators(tmp_path, require_vllm=True, names=defaults)
    assert str(caught.value) == "--require-vllm: vLLM comparator not available: digest differs"
    assert caught.value.exit_code == 3
    with pytest.raises(EnvironmentProblem, match="no overlay"):
        probe_comparators.load_comparators(None, require_vllm=True)


def _vllm_probe_inputs() -> ProbeInputs:
    """Inputs whose vLLM arguments are a marker: what the comparator passes on is visible."""
    inputs = probe_comparators.make_inputs(
        _case("point"), device=torch.device("cpu"), seed=0, set_index=0
    )
    inputs.vllm_kwargs = {"a": 1}
    return inputs


def _probe_cli_recorded(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> tuple[Any, dict[str, Any]]:
    """`pp3 probe ARGS` with ``probe_on_cuda`` and the receipt skeleton replaced by recorders:
    the CLI result and what the probe was handed (config, overlay_dir, copy_mib, finding)."""
    from pp3cli.cli import probe as probe_cli
    from pp3cli.timing import probe as probe_module

    seen: dict[str, Any] = {}

    def probe_on_cuda(config: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(config=config, **kwargs)
        return tiny_data()

    def run_receipted(name: str, settings: Any, run: Any, work: Any, **kwargs: Any) -> None:
        seen["finding"] = work(None)

    monkeypatch.setattr(probe_module, "probe_on_cuda", probe_on_cuda)
    monkeypatch.setattr(probe_cli, "run_receipted", run_receipted)
    return CliRunner().invoke(app, args), seen


def test_every_probe_option_reaches_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of `pp3 probe`'s options (docs/probe.md) sets its own field of the ProbeConfig
    the probe runs, and --overlay and --copy-mib reach the probe itself."""
    args = [
        "--scratch", str(tmp_path), "probe", "--batch", "3,5", "--depth", "2", "--vocab", "4001",
        "--dtype", "fp16", "--draft", "sparse,dense", "--support", "8", "--t0-share", "0.25",
        "--rounds", "4", "--warmup", "2", "--replays", "7", "--slow-replays", "5", "--seed", "9",
        "--no-rotate", "--copy-mib", "16", "--overlay", str(tmp_path / "ov"), "--require-vllm",
        "--comparators", "vllm,selector",
    ]  # fmt: skip
    result, seen = _probe_cli_recorded(monkeypatch, args)
    assert result.exit_code == 0, result.output
    assert seen["config"] == probe_cases.ProbeConfig(
        batches=(3, 5), depths=(2,), vocab=4001, dtype="fp16", drafts=("sparse", "dense"),
        t0_shares=(0.25,), support=8, rounds=4, warmup=2, replays=7, slow_replays=5, seed=9,
        rotate_inputs=False, require_vllm=True, comparators=("vllm", "selector"),
    )  # fmt: skip
    assert seen["overlay_dir"] == tmp_path / "ov" and seen["copy_mib"] == 16
    assert seen["scratch"] == tmp_path
    assert seen["finding"].parameters == {**asdict(seen["config"]), "copy_mib": 16}


def test_a_dry_run_validates_lists_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dry-run lists the cases (table, or JSON with --json: each case's fields, name and
    bytes read) and neither probes nor writes a receipt; bad options are still refused, a
    bad --copy-mib included."""
    args = ["--scratch", str(tmp_path), "probe", "--dry-run", "--batch", "2", "--depth", "3"]
    result, seen = _probe_cli_recorded(monkeypatch, [*args, "--json"])
    assert result.exit_code == 0 and seen == {}, result.output
    listing = json.loads(result.stdout)
    cases = probe_cases.build_cases(probe_cases.ProbeConfig(batches=(2,), depths=(3,)))
    assert listing == [{**asdict(c), "name": c.name, "bytes_read": c.bytes_read()} for c in cases]
    table, seen = _probe_cli_recorded(monkeypatch, args)
    assert table.exit_code == 0 and seen == {}
    assert f"pp3 probe: {len(cases)} cases (dry run)" in table.stdout
    for case in cases:
        floor = probe_cases.floor_us(case.bytes_read(), probe_cases.NOMINAL_COPY_BANDWIDTH)
        row = next(line for line in table.stdout.splitlines() if case.name in line)
        assert f"{floor:.2f}" in row and str(case.vocab) in row and case.dtype in row
    refused, seen = _probe_cli_recorded(monkeypatch, [*args, "--copy-mib", "0"])
    assert isinstance(refused.exception, UsageProblem) and seen == {}
    refused, seen = _probe_cli_recorded(monkeypatch, [*args, "--rounds", "0"])
    assert isinstance(refused.exception, UsageProblem) and seen == {}


def test_the_table_shows_the_selectors_extra_memory_in_fractional_mib() -> None:
    """`sel MiB` is peak_extra_bytes / 2^20 to one decimal (1.5 MiB is not 1 MiB), and "-"
    where no peak was measured (off the GPU)."""
    data = tiny_data()
    data["cases"][0]["comparators"]["selector"]["peak_extra_bytes"] = 3 << 19
    _text, by_name = _results_table(data)
    assert by_name[data["cases"][0]["name"]][-1] == "1.5"
    assert by_name[data["cases"][1]["name"]][-1] == "-"
