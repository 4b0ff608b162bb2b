"""Tests that kill mutants a campaign over cli/qualify.py found surviving.

`pp3 qualify` is driven in-process with the heavy parts replaced: ``run_receipted`` (the
guard and the receipt) by a recorder whose ``work`` is then called with a fake guard record,
``run_qualification`` by a fake report, the planner's sizing by a fake ``requests_for``. What
stays real is what cli/qualify.py itself decides: option bounds, the plan's arithmetic, the
machine precheck, the profile and device choice, and the receipt's parameters and data.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from pp3cli.cli import qualify as qualify_cli
from pp3cli.cli.app import app
from pp3cli.cli.receipted import Finding
from pp3cli.evidence.profiles import ALPHA, PROFILES, Profile
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.verifiers.registry import ResolvedVerifier


def _documented_defects() -> list[str]:
    """docs/qualify.md's planted defects, in the order its "Negative controls" item lists
    them (the backquoted names between `pp3kernels.DEFECTS`: and "runs the same battery")."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "qualify.md").read_text()
    listed = text[text.index("`pp3kernels.DEFECTS`:") : text.index("runs the same battery")]
    names = re.findall(r"`([a-z_]+)`", listed)
    assert len(names) == 9, names  # the nine planted defects the docs describe
    return names


DEFECTS = _documented_defects()
# docs/qualify.md: the caps of the two capped targets (wide_support 256/512/2^20/2^20,
# split_vocab 128/256/2^20/2^20 in smoke/seed/strict/exhaustive).
CAPS = {"smoke": (256, 128), "seed": (512, 256)}
UNCAPPED_TARGETS = 5  # seven targets, two of them capped


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside torchrun, whatever the environment the tests run in."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Recorded:
    """What the qualify command handed the receipt skeleton (or the launcher)."""

    receipted: list[dict[str, Any]] = field(default_factory=list)
    launched: list[int] = field(default_factory=list)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    found = Recorded()

    def run_receipted(command: str, settings: Any, run: Any, work: Any, **kwargs: Any) -> None:
        found.receipted.append({"command": command, "run": run, "work": work, **kwargs})

    monkeypatch.setattr(qualify_cli, "run_receipted", run_receipted)
    monkeypatch.setattr(qualify_cli, "_launch", lambda gpus, *_: found.launched.append(gpus))
    return found


def _qualify(tmp_path: Path, *args: str) -> Any:
    base = ["--scratch", str(tmp_path / "s"), "--receipts", str(tmp_path / "r"), "qualify"]
    return CliRunner().invoke(app, [*base, *args], env={"COLUMNS": "300"})


# ---- option bounds


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--alpha", "0"], "--alpha 0.0: expected 0 < alpha < 1"),
        (["--alpha", "1"], "--alpha 1.0: expected 0 < alpha < 1"),
        (["--alpha", "0.5"], None),
        (["--alpha", "1e-300"], None),
        (["--tv", "0"], "--tv 0.0: expected 0 < tv <= 1"),
        (["--tv", "1.5"], "--tv 1.5: expected 0 < tv <= 1"),
        (["--tv", "1"], None),
        (["--tv", "0.5"], None),
        (["--n-greedy", "0"], "--n-greedy 0: expected at least 1"),
        (["--n-greedy", "1"], None),
        (["--profile", "bogus"], "--profile 'bogus': expected one of smoke, seed, strict, "),
        (["--profile", "exhaustive"], None),
        (["--gpus", "0"], "--gpus 0: expected at least 1"),
        (["--gpus", "1"], None),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else str(value),
)
def test_options_at_their_bounds(
    tmp_path: Path, recorded: Recorded, args: list[str], refusal: str | None
) -> None:
    """0 < --alpha < 1, 0 < --tv <= 1, --n-greedy >= 1, --gpus >= 1, --profile one of
    PROFILES: outside them exit 2 naming the value (before anything runs), inside them
    the run (or, with --gpus, the launcher) is reached."""
    outcome = _qualify(tmp_path, *args)
    if refusal is None:
        assert outcome.exception is None, outcome.output
        assert len(recorded.receipted) + len(recorded.launched) == 1
        assert recorded.launched == ([1] if args[0] == "--gpus" else [])
    else:
        assert isinstance(outcome.exception, UsageProblem), outcome.output
        assert str(outcome.exception).startswith(refusal), outcome.exception
        assert recorded.receipted == [] and recorded.launched == []


@pytest.mark.parametrize(
    ("args", "environment", "refusal"),
    [
        (["--via-proxy", "--gpus", "2"], {}, "--via-proxy with several ranks"),
        (["--via-proxy"], {"RANK": "0"}, "--via-proxy with several ranks"),
        (["--pair-with", "reference", "--gpus", "2"], {}, "--pair-with reference with several"),
        (["--pair-with", "reference"], {"RANK": "1"}, "--pair-with reference with several"),
        (["--gpus", "2"], {"RANK": "1"}, "--gpus 2 inside a torchrun worker (rank 1)"),
        (["--pair-with", "selector"], {}, "--pair-with selector: expected a verifier other"),
        (["--verifier", "x:y", "--pair-with", "x:y"], {}, "--pair-with x:y: expected a"),
    ],
)
def test_combinations_refused_before_anything_runs(
    tmp_path: Path,
    recorded: Recorded,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    environment: dict[str, str],
    refusal: str,
) -> None:
    """--via-proxy and --pair-with are single-process (refused with --gpus or inside a
    torchrun worker), --gpus is refused inside a worker, and a verifier is not paired with
    itself: each exit 2 before the launcher or the guard is reached."""
    if environment:
        place = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
        for name, value in (place | environment).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("LOCAL_RANK", environment["RANK"])
    outcome = _qualify(tmp_path, *args)
    assert isinstance(outcome.exception, UsageProblem), outcome.output
    assert str(outcome.exception).startswith(refusal), outcome.exception
    assert recorded.receipted == [] and recorded.launched == []


def test_a_different_pair_and_a_single_proxy_run_are_accepted(
    tmp_path: Path, recorded: Recorded
) -> None:
    """The refusals above are of the combinations only: each option alone runs."""
    for args in (["--pair-with", "reference"], ["--via-proxy"], ["--verifier", "reference"]):
        outcome = _qualify(tmp_path, *args)
        assert outcome.exception is None, (args, outcome.output)
    assert [r["command"] for r in recorded.receipted] == ["qualify"] * 3
    assert all(r["kind"] == "qualification" for r in recorded.receipted)
    assert all(r["require_gpu"] is False and r["device"] is None for r in recorded.receipted)


# ---- --plan


@dataclass
class Sizing:
    """A fake planner: n = round(1 / tv), each (tv, alpha) asked recorded."""

    asked: list[tuple[float, float]] = field(default_factory=list)
    rates: list[Path] = field(default_factory=list)
    rate: Any = None


@pytest.fixture
def sizing(monkeypatch: pytest.MonkeyPatch) -> Sizing:
    from pp3cli.evidence import family
    from pp3cli.receipts import rates

    found = Sizing()

    def requests_for(profile: Profile, alpha: float, tv: float | None = None) -> int:
        assert tv is not None  # the planner always sizes from a TV
        found.asked.append((tv, alpha))
        return round(1 / tv)

    def plan_samples(tv: float, alpha: float) -> list[family.PlanRow]:
        return [family.PlanRow("sparse_tails/accepted", 6, 5, round(1 / tv))]

    def newest_rate(receipts: Path, root: Path) -> Any:
        found.rates.append(receipts)
        return found.rate

    monkeypatch.setattr(family, "requests_for", requests_for)
    monkeypatch.setattr(family, "plan_samples", plan_samples)
    monkeypatch.setattr(rates, "newest_rate", newest_rate)
    return found


def _plan(tmp_path: Path, *args: str) -> dict[str, Any]:
    outcome = _qualify(tmp_path, "--plan", "--json", *args)
    assert outcome.exit_code == 0, outcome.output
    payload: dict[str, Any] = orjson.loads(outcome.output)
    return payload


@pytest.mark.parametrize(
    ("args", "tv", "alpha"),
    [
        ([], 1e-3, ALPHA),
        (["--profile", "smoke"], 1e-3, ALPHA),
        (["--profile", "exhaustive"], 3e-4, ALPHA),
        (["--profile", "exhaustive", "--tv", "0.25"], 0.25, ALPHA),
        (["--tv", "0.125", "--alpha", "0.01"], 0.125, 0.01),
    ],
)
def test_a_plan_sizes_for_the_given_tv_then_the_profiles_then_1e_3(
    tmp_path: Path, sizing: Sizing, args: list[str], tv: float, alpha: float
) -> None:
    """docs/qualify.md: `--plan --tv` sizes for that TV; without --tv a profile's own TV
    (exhaustive 3e-4); a profile without one (smoke) and no profile plan strict's 1e-3.
    Without --gpus no rate is looked up and the JSON holds the samples table only."""
    payload = _plan(tmp_path, *args)
    assert payload == {
        "tv": tv,
        "alpha": alpha,
        "members": [
            {"member": "sparse_tails/accepted", "outcomes": 6, "df": 5, "n_needed": round(1 / tv)}
        ],
        "requests_per_target": round(1 / tv),
    }
    assert sizing.rates == []  # no --gpus: no receipt is verified to measure a rate


def test_a_plan_for_gpus_counts_the_family_requests(tmp_path: Path, sizing: Sizing) -> None:
    """--plan --gpus N: targets x n (a capped target its cap under the profile) plus nine
    controls x n per uncapped target; the controls at the profile's control_tv when it has
    one. With no receipts folder the rate and wall time are unknown (None)."""
    n = 1000  # tv 1e-3 (smoke has no TV of its own)
    payload = _plan(tmp_path, "--profile", "smoke", "--gpus", "3")
    wide, split = CAPS["smoke"]
    family = UNCAPPED_TARGETS * n + wide + split + len(DEFECTS) * UNCAPPED_TARGETS * n
    assert payload["requests_per_target"] == n
    assert payload["control_requests_per_target"] == n
    assert payload["family_requests"] == family
    assert payload["gpus"] == 3 and payload["rate"] is None and payload["expected_wall_s"] is None
    assert sizing.rates == []  # the receipts folder does not exist: nothing to look up
    payload = _plan(tmp_path, "--profile", "seed", "--tv", "0.001", "--gpus", "1")
    wide, split = CAPS["seed"]
    assert payload["family_requests"] == 5 * n + wide + split + 9 * 5 * n
    payload = _plan(tmp_path, "--profile", "seed", "--tv", "0.004", "--gpus", "1")
    assert payload["family_requests"] == 7 * 250 + 9 * 5 * 250  # 250 below both caps
    # No --profile: strict's caps (2^20), which bind once n exceeds them.
    payload = _plan(tmp_path, "--tv", "5e-7", "--gpus", "1")
    n = 2_000_000
    assert payload["family_requests"] == 5 * n + 2 * (1 << 20) + 9 * 5 * n


def test_a_plan_sizes_the_controls_by_the_profiles_control_tv(
    tmp_path: Path, sizing: Sizing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile with a control_tv plans its controls for that TV (fewer requests), never
    more than the verifier's n; without one the controls run n."""
    monkeypatch.setitem(
        PROFILES, "tiny", Profile("tiny", None, tv=0.01, batch=64, n_greedy=8, control_tv=0.1)
    )
    payload = _plan(tmp_path, "--profile", "tiny", "--gpus", "2")
    assert payload["requests_per_target"] == 100 and payload["control_requests_per_target"] == 10
    assert payload["family_requests"] == 7 * 100 + 9 * 5 * 10
    assert sizing.asked[-2:] == [(0.01, ALPHA), (0.1, ALPHA)]
    payload = _plan(tmp_path, "--profile", "tiny", "--tv", "0.5", "--gpus", "2")
    assert payload["requests_per_target"] == 2 and payload["control_requests_per_target"] == 2


@pytest.fixture
def measured(tmp_path: Path, sizing: Sizing) -> Any:
    """A measured rate of 1.5 family requests/s per GPU, and a receipts folder to find it in."""
    from pp3cli.receipts.rates import MeasuredRate

    (tmp_path / "r").mkdir()
    sizing.rate = MeasuredRate(1.5, "qualification-x.json", "OK", "NVIDIA H200", 9, 6.0)
    return sizing.rate


def test_a_plan_for_gpus_predicts_the_wall_time_from_the_measured_rate(
    tmp_path: Path, sizing: Sizing, measured: Any
) -> None:
    """docs/qualify.md "Planning": family requests over N times the per-GPU rate, and the
    rate's receipt named; the JSON and the text say the same."""
    family = 5 * 1000 + 256 + 128 + 9 * 5 * 1000  # smoke at TV 1e-3
    payload = _plan(tmp_path, "--profile", "smoke", "--gpus", "4")
    assert sizing.rates == [tmp_path / "r"]
    assert payload["expected_wall_s"] == pytest.approx(family / (4 * 1.5), rel=1e-12)
    assert payload["rate"] == measured.to_json()
    outcome = _qualify(tmp_path, "--plan", "--profile", "smoke", "--gpus", "4")
    assert outcome.exit_code == 0, outcome.output
    text = " ".join(outcome.output.split())
    assert "expected wall time on 4 GPU(s): 8,397 s (140.0 min) for " in text  # 50,384 / 6
    assert f"for {family:,} family requests (verifier 1,000 and 9 controls 1,000 per " in text
    assert "rate 2 requests/s per GPU from qualification-x.json (OK, NVIDIA H200: " in text
    assert "9 requests in 6 s)" in text and "requests per target: 1,000" in text


def test_a_plan_names_the_folder_when_no_rate_is_found(
    tmp_path: Path, sizing: Sizing, measured: Any
) -> None:
    """--gpus with no usable receipt: the wall time is "unknown", naming the folder; without
    --gpus no wall-time line at all (and no receipt is verified for it)."""
    sizing.rate = None
    outcome = _qualify(tmp_path, "--plan", "--gpus", "2")
    assert outcome.exit_code == 0, outcome.output
    flat = " ".join(outcome.output.split())
    assert "expected wall time: unknown (no verified single-GPU H200 strict" in flat
    assert f"receipt in {tmp_path / 'r'} to measure a rate from)" in flat
    sizing.rate = measured
    outcome = _qualify(tmp_path, "--plan")
    assert outcome.exit_code == 0 and "expected wall time" not in outcome.output
    assert "requests per target: 1,000" in outcome.output
    assert sizing.rates == [tmp_path / "r"]  # the --gpus run only


def test_the_plan_table_has_one_row_per_member(tmp_path: Path, sizing: Sizing) -> None:
    """The text plan: a samples table (member left, numbers right-aligned), TV and alpha in
    its title."""
    outcome = _qualify(tmp_path, "--plan", "--tv", "0.0625")
    assert outcome.exit_code == 0, outcome.output
    title = "samples per member: TV 0.0625, power 0.99, family alpha 1e-05"
    assert title in " ".join(outcome.output.split())  # the title may wrap
    row = next(line for line in outcome.output.splitlines() if "sparse_tails" in line)
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells == ["sparse_tails/accepted", "6", "5", "16"]
    header = next(line for line in outcome.output.splitlines() if "outcomes" in line)
    member_cell = re.split("[│┃]", header)[1]
    assert member_cell.startswith(" member ")  # left-justified
    number = row.split("│")[4]
    assert number.endswith(" 16 ") and number.startswith("   ")  # right-justified


# ---- the work: precheck, profile, device, parameters


def _resolved(spec: str) -> ResolvedVerifier:
    def verifier(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fake run never calls a verifier")

    return ResolvedVerifier(
        spec,
        verifier,
        own=spec in ("selector", "reference"),
        sources={f"{spec}.py": Path(f"/{spec}.py")},
        details={"kind": f"kind-{spec}"},
    )


def _report(verdict: str = "PASS", control_n: int | None = None) -> Any:
    """A qualification report as the summary and the receipt read it."""
    return SimpleNamespace(
        profile="seed",
        requests_per_target=321,
        control_requests_per_target=control_n,
        members=(),
        family=SimpleNamespace(rejected=(), adjusted={}),
        greedy=SimpleNamespace(mismatches=0, n=77, examples=()),
        edge=(),
        edge_decides=True,
        pairing=None,
        controls=(),
        verdict=verdict,
        to_json=lambda: {"verdict": verdict},
    )


@dataclass
class Harness:
    """Runs qualify's guarded work with a fake guard record and a fake run_qualification."""

    recorded: Recorded
    resolved: list[tuple[str, Path | None]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    report: Any = field(default_factory=_report)
    interpreter: bool = True
    blocker: str | None = None

    def start(self, tmp_path: Path, *args: str) -> dict[str, Any]:
        outcome = _qualify(tmp_path, *args)
        assert outcome.exception is None, outcome.output
        [call] = self.recorded.receipted[-1:]
        return call

    def finding(self, tmp_path: Path, *args: str, cuda: bool = False) -> Finding:
        call = self.start(tmp_path, *args)
        call["precheck"](cuda)
        found = call["work"](SimpleNamespace(cuda_available=cuda))
        assert isinstance(found, Finding)
        return found


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch, recorded: Recorded) -> Harness:
    import pp3kernels.runtime
    from pp3cli.evidence import qualify as evidence
    from pp3cli.verifiers import registry, vllm_mrv2

    found = Harness(recorded)

    def resolve_spec(spec: str, *, root: Path, overlay_dir: Path | None, **_: Any) -> Any:
        found.resolved.append((spec, overlay_dir))
        return _resolved(spec)

    def run_qualification(profile: Profile, **kwargs: Any) -> Any:
        found.runs.append({"profile": profile, **kwargs})
        if kwargs["progress"] is not None:
            kwargs["progress"]("family", 1, 1)
        return found.report

    monkeypatch.setattr(registry, "resolve_spec", resolve_spec)
    monkeypatch.setattr(evidence, "run_qualification", run_qualification)
    monkeypatch.setattr(pp3kernels.runtime, "is_interpreter", lambda: found.interpreter)
    monkeypatch.setattr(vllm_mrv2, "interpreter_blocker", lambda: found.blocker)
    return found


@pytest.mark.parametrize(
    ("args", "cuda", "interpreter", "blocker", "refusal"),
    [
        ([], False, False, None, "no GPU and TRITON_INTERPRET is not 1: on a CPU machine selector"),
        (["--verifier", "reference", "--pair-with", "vllm-mrv2"], False, False, None, "vllm-mrv2"),
        (["--verifier", "flashinfer"], False, True, None, "--verifier flashinfer needs a CUDA"),
        (["--verifier", "vllm-mrv2"], False, True, "numpy >= 2.4", "numpy >= 2.4"),
        (["--verifier", "reference", "--pair-with", "vllm-mrv2"], False, True, "np", "np"),
        ([], False, True, None, None),
        ([], True, False, None, None),
        (["--verifier", "reference"], False, False, None, None),
        (["--verifier", "flashinfer"], True, False, None, None),
        (["--verifier", "vllm-mrv2"], True, False, "never asked on a GPU", None),
        (["--verifier", "vllm-mrv2"], False, True, None, None),
        (["--verifier", "reference"], False, True, "vllm-mrv2's only", None),
    ],
)
def test_the_precheck_refuses_an_unfit_machine_and_resolves_otherwise(
    tmp_path: Path,
    harness: Harness,
    args: list[str],
    cuda: bool,
    interpreter: bool,
    blocker: str | None,
    refusal: str | None,
) -> None:
    """Exit 3 before anything is created: a Triton verifier (selector, vllm-mrv2) on a CPU
    without TRITON_INTERPRET=1, flashinfer without a GPU, vllm-mrv2 in an interpreter that
    cannot run it (a blocker of vLLM's alone); otherwise the verifier (and its partner)
    are resolved, in that order."""
    harness.interpreter, harness.blocker = interpreter, blocker
    call = harness.start(tmp_path, *args)
    if refusal is not None:
        with pytest.raises(EnvironmentProblem) as refused:
            call["precheck"](cuda)
        assert refusal in str(refused.value)
        assert harness.resolved == []
    else:
        call["precheck"](cuda)
        verifier = args[args.index("--verifier") + 1] if "--verifier" in args else "selector"
        assert harness.resolved == [(verifier, None)]


def test_the_overlay_and_the_partner_reach_the_resolver(tmp_path: Path, harness: Harness) -> None:
    call = harness.start(
        tmp_path, "--verifier", "reference", "--pair-with", "x:y", "--overlay", "/ov"
    )
    call["precheck"](True)
    assert harness.resolved == [("reference", Path("/ov")), ("x:y", Path("/ov"))]


@pytest.mark.parametrize(
    ("args", "cuda", "profile", "device"),
    [
        ([], False, "seed", "cpu"),
        ([], True, "strict", "cuda"),
        (["--profile", "smoke"], True, "smoke", "cuda"),
        (["--profile", "exhaustive"], False, "exhaustive", "cpu"),
    ],
)
def test_the_profile_defaults_to_the_machine_and_the_parameters_record_the_run(
    tmp_path: Path,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    cuda: bool,
    profile: str,
    device: str,
) -> None:
    """docs/qualify.md: strict on a GPU, seed on a CPU machine unless --profile says; the
    run and the receipt's parameters get the defaults (alpha 1e-5, seed 0, the profile's
    TV, the nine controls, one process) and the report's sizes; data.elapsed_s is the
    run's wall time in seconds to the millisecond."""
    ticks: list[float] = []

    def monotonic() -> float:  # the start, then 1.23456 s later
        ticks.append(100.0 if not ticks else 101.23456)
        return ticks[-1]

    monkeypatch.setattr(qualify_cli, "time", SimpleNamespace(monotonic=monotonic))
    found = harness.finding(tmp_path, *args, cuda=cuda)
    [run] = harness.runs
    chosen = PROFILES[profile]
    assert run["profile"] == chosen and run["device"] == device
    assert run["alpha"] == ALPHA and run["seed"] == 0 and run["tv"] is None
    assert run["n_greedy"] is None and run["full_controls"] is False
    assert run["transport"] is None and run["share"] is None and run["pair_with"] is None
    assert run["edge_decides"] is True and run["progress"] is not None
    assert list(run["controls"]) == DEFECTS
    assert dict(found.parameters) == {
        "profile": profile,
        "requests_per_target": 321,
        "control_requests_per_target": 321,
        "tv": chosen.tv,
        "alpha": ALPHA,
        "seed": 0,
        "n_greedy": 77,
        "verifier": "selector",
        "pair_with": None,
        "device": device,
        "controls": DEFECTS,
        "full_controls": False,
        "via_proxy": False,
        "batch": chosen.batch,
        "repeats": chosen.repeats,
        "world_size": 1,
    }
    assert found.verdict == "PASS"
    assert set(found.data) == {"verdict", "elapsed_s", "verifier"}
    assert found.data["verifier"] == {"name": "selector", "kind": "kind-selector"}
    assert found.data["elapsed_s"] == 1.235
    assert found.sources == {"selector.py": Path("/selector.py")}


def test_given_options_reach_the_run_and_the_receipt(
    tmp_path: Path,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--tv, --alpha, --seed, --n-greedy, --full-controls, --pair-with and --via-proxy pass
    through; a peer's edge checks do not decide; the partner's description and files and
    the proxy's summary join the receipt; the controls' own n is recorded when it differs.
    Progress goes to stderr (stdout carries results: docs/exit-codes.md)."""
    from pp3cli.wire import proxy

    class Transport:
        def summary(self) -> dict[str, int]:
            return {"frames": 3}

    monkeypatch.setattr(proxy, "ProxyDraftTransport", Transport)
    harness.report = _report("FAIL", control_n=12)
    found = harness.finding(
        tmp_path,
        *("--verifier", "vllm-mrv2", "--pair-with", "reference", "--tv", "0.25"),
        *("--alpha", "0.001", "--seed", "9", "--n-greedy", "5", "--full-controls", "--via-proxy"),
        cuda=True,
    )
    printed = capsys.readouterr()
    assert "done  family 1/1" in printed.err and "family" not in printed.out
    [run] = harness.runs
    assert run["tv"] == 0.25 and run["alpha"] == 0.001 and run["seed"] == 9
    assert run["n_greedy"] == 5 and run["full_controls"] is True
    assert isinstance(run["transport"], Transport) and run["edge_decides"] is False
    assert run["pair_with"][0] == "reference"
    parameters = found.parameters
    assert parameters["tv"] == 0.25 and parameters["alpha"] == 0.001 and parameters["seed"] == 9
    assert parameters["control_requests_per_target"] == 12
    assert parameters["verifier"] == "vllm-mrv2" and parameters["pair_with"] == "reference"
    assert parameters["full_controls"] is True and parameters["via_proxy"] is True
    assert found.verdict == "FAIL"
    assert found.data["pair_with"] == {"name": "reference", "kind": "kind-reference"}
    assert found.data["proxy"] == {"frames": 3}
    assert found.sources == {
        "vllm-mrv2.py": Path("/vllm-mrv2.py"),
        "reference.py": Path("/reference.py"),
    }


@pytest.mark.parametrize(("rank", "gpu"), [(0, False), (1, True)])
def test_a_torchrun_rank_locks_its_own_gpu_and_only_rank_0_reports(
    tmp_path: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch, rank: int, gpu: bool
) -> None:
    """Inside torchrun: a GPU rank takes its local GPU's lock (a CPU rank no device), only
    rank 0 shows progress, a rank without the distributed block returns nothing (rank 0
    writes the receipt), and the receipt records the world size and that block."""
    import torch

    place = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
    for name, value in (place | {"LOCAL_WORLD_SIZE": "2"}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    shares: list[Any] = []

    def run_as_rank(place: Any, record: Any, started: float, qualification: Any) -> Any:
        share = SimpleNamespace(rank=place.rank)
        shares.append(qualification(share, f"on-{place.rank}"))
        return shares[-1], ({"world_size": 2} if place.rank == 0 else None)

    monkeypatch.setattr(qualify_cli, "run_as_rank", run_as_rank)
    call = harness.start(tmp_path)
    assert call["device"] == (rank if gpu else None)
    call["precheck"](False)
    found = call["work"](SimpleNamespace(cuda_available=False))
    [run] = harness.runs
    assert run["share"].rank == rank and run["device"] == f"on-{rank}"
    assert (run["progress"] is None) == (rank != 0)
    if rank == 0:
        assert isinstance(found, Finding) and found.parameters["world_size"] == 2
        assert found.data["distributed"] == {"world_size": 2}
    else:
        assert found is None


def test_on_a_terminal_the_run_shows_progress_bars(
    tmp_path: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single-process run on a terminal draws rich's bars around the qualification (and
    no per-part log lines)."""
    import rich.console

    screen = io.StringIO()

    def terminal(**_: Any) -> Console:
        return Console(file=screen, force_terminal=True, width=100)

    call = harness.start(tmp_path)
    call["precheck"](False)
    monkeypatch.setattr(rich.console, "Console", terminal)
    call["work"](SimpleNamespace(cuda_available=False))
    drawn = screen.getvalue()
    assert "family" in drawn and "1/1" in drawn and "start family" not in drawn


# ---- progress and the summary


def _lines(console: Console) -> list[str]:
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue().splitlines()


def test_progress_in_a_log_is_one_line_per_part_start_and_end() -> None:
    """docs/qualify.md: off a terminal, one line when a part starts and one when it ends,
    each with the seconds since the start; on a terminal only the bars, which stay."""
    log = Console(file=io.StringIO(), force_terminal=False, width=200)
    started = time.monotonic() - 2.0
    bars, progress = qualify_cli._progress_printer(log, started)
    progress("family", 0, 3)
    progress("family", 2, 3)
    progress("greedy", 5, 5)
    progress("family", 3, 3)
    lines = _lines(log)
    shape = re.compile(r"^ +\d+\.\ds (start|done ) ")
    assert all(shape.match(line) for line in lines), lines
    assert [line[10:] for line in lines] == [
        "start family",
        "start greedy",
        "done  greedy 5/5",
        "done  family 3/3",
    ]
    assert all(2.0 <= float(line[:8]) < 30 for line in lines)
    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    bars, progress = qualify_cli._progress_printer(terminal, started)
    progress("family", 3, 3)
    assert _lines(terminal) == [] and bars.live.transient is False


def _summary_text(report: Any) -> list[str]:
    console = Console(file=io.StringIO(), width=300, force_terminal=False)
    console.print(qualify_cli._summary(report))
    return _lines(console)


def _member(name: str) -> Any:
    return SimpleNamespace(
        result=SimpleNamespace(
            name=name, n=1234, df=3, statistic=1.5, p_value=0.25, impossible_hits=0
        )
    )


def test_the_summary_marks_what_failed() -> None:
    """A rejected member is FAIL in the table and the others ok; greedy mismatches are
    listed; an own verifier's edge checks read ok/FAIL; a control that failed "failed as
    required", one that passed "PASSED (not evidence)", with what it ran."""
    control_caught = SimpleNamespace(
        defect="accept_ge",
        caught=True,
        family=SimpleNamespace(rejected=("a", "b")),
        greedy=SimpleNamespace(n=0, mismatches=0),
    )
    control_passed = SimpleNamespace(
        defect="reused_coin",
        caught=False,
        family=SimpleNamespace(rejected=()),
        greedy=SimpleNamespace(n=10, mismatches=4),
    )
    report = _report("FAIL")
    report.members = (_member("t/bad"), _member("t/good"))
    report.family = SimpleNamespace(rejected=("t/bad",), adjusted={"t/bad": 0.5, "t/good": 1.0})
    report.greedy = SimpleNamespace(mismatches=1, n=8, examples=("request 3: x",))
    report.edge = (
        SimpleNamespace(name="id_ties", passed=True, detail="d1"),
        SimpleNamespace(name="nan_logits", passed=False, detail="d2"),
    )
    report.controls = (control_caught, control_passed)
    lines = _summary_text(report)
    rows = {line.split("│")[1].strip(): line for line in lines if "│ t/" in line}
    assert rows["t/bad"].rstrip(" │").endswith("FAIL") and "ok" not in rows["t/bad"]
    assert rows["t/good"].rstrip(" │").endswith("ok")
    cells = rows["t/bad"].split("│")
    assert cells[1] == " t/bad  "  # the member column is left-justified ...
    assert cells[7] == "          0 "  # ... the numbers right-justified ("impossible")
    tail = lines[lines.index(next(x for x in lines if x.startswith("greedy pairing"))) :]
    assert tail == [
        "greedy pairing: 1 mismatches in 8 T0 requests",
        "  mismatch request 3: x",
        "edge ok   id_ties: d1",
        "edge FAIL nan_logits: d2",
        "control accept_ge: failed as required (rejected 2 members; later parts skipped)",
        "control reused_coin: PASSED (not evidence) (rejected 0 members, greedy mismatches 4)",
        "verdict: FAIL",
    ]


def test_the_summary_of_a_peer_records_its_edge_checks_and_its_pairing() -> None:
    """A peer's edge checks read "meets pp3's contract" / "differs" (counted, not deciding);
    --pair-with's T0 mismatches and tests are listed, a rejected test FAIL."""
    report = _report()
    report.edge_decides = False
    report.edge = (
        SimpleNamespace(name="id_ties", passed=True, detail="d1"),
        SimpleNamespace(name="nan_logits", passed=False, detail="d2"),
    )
    report.edge_summary = lambda: {"meets": ["id_ties"], "differs": ["nan_logits"]}
    tests = [
        SimpleNamespace(result=SimpleNamespace(name=n, statistic=2.0, df=1, p_value=0.5))
        for n in ("pair/a/final", "pair/b/final")
    ]
    report.pairing = SimpleNamespace(
        with_="selector", t0_mismatches=2, t0=4000, examples=("request 9",), tests=tests
    )
    report.family = SimpleNamespace(
        rejected=("pair/b/final",), adjusted={"pair/a/final": 1.0, "pair/b/final": 0.001}
    )
    lines = _summary_text(report)
    tail = lines[lines.index(next(x for x in lines if x.startswith("greedy pairing"))) + 1 :]
    assert tail == [
        "edge meets pp3's contract id_ties: d1",
        "edge differs nan_logits: d2",
        "edge battery (recorded, not deciding): 1 meet pp3's contract, 1 differ",
        "paired with selector: 2 T0 mismatches in 4,000 requests",
        "  mismatch request 9",
        "  pair/a/final: G 2.00, df 1, p 0.5, Holm adj. 1 ok",
        "  pair/b/final: G 2.00, df 1, p 0.5, Holm adj. 0.001 FAIL",
        "verdict: PASS",
    ]


# ---- --gpus N: the launcher


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, list[str]]]]:
    from pp3cli.run import ranks

    launched: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(ranks, "launch", lambda n, args: launched.append((n, list(args))))
    yield launched


def _with_gpus(monkeypatch: pytest.MonkeyPatch, available: bool, count: int) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("available", "count", "gpus", "refused"),
    [(True, 2, 3, True), (True, 2, 2, False), (False, 0, 4, False)],
)
def test_gpus_launches_torchrun_without_its_own_option(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    launcher: list[tuple[int, list[str]]],
    available: bool,
    count: int,
    gpus: int,
    refused: bool,
) -> None:
    """--gpus N: more GPUs than torch sees is exit 2 (naming the count); otherwise
    torchrun starts N workers with the command line less --gpus N (N CPU processes on a
    CPU machine)."""
    _with_gpus(monkeypatch, available, count)
    args = ["--scratch", str(tmp_path), "qualify", "--gpus", str(gpus), "--profile", "seed"]
    monkeypatch.setattr(sys, "argv", ["pp3", *args])
    outcome = CliRunner().invoke(app, args)
    if refused:
        assert isinstance(outcome.exception, UsageProblem), outcome.output
        assert str(outcome.exception).startswith(f"--gpus {gpus}: torch sees {count} GPU(s)")
        assert launcher == []
    else:
        assert outcome.exception is None, outcome.output
        assert launcher == [(gpus, ["--scratch", str(tmp_path), "qualify", "--profile", "seed"])]


def test_gpus_with_detach_starts_the_launcher_in_tmux(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: list[tuple[int, list[str]]]
) -> None:
    """`pp3 qualify --gpus N --detach`: the whole command line (--gpus kept) is re-run
    detached, and nothing is launched here."""
    from pp3cli.run import detach

    _with_gpus(monkeypatch, False, 0)
    detached: list[tuple[str, list[str]]] = []

    def start(command: str, settings: Any, args: list[str]) -> str:
        detached.append((command, list(args)))
        return "started in tmux"

    monkeypatch.setattr(detach, "start_detached", start)
    args = ["--scratch", str(tmp_path), "qualify", "--gpus", "2", "--detach"]
    monkeypatch.setattr(sys, "argv", ["pp3", *args])
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0 and "started in tmux" in outcome.output, outcome.output
    assert detached == [("qualify", args)] and launcher == []
