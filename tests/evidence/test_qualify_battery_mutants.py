"""Qualification behaviour a mutation campaign over ``pp3cli/evidence/qualify.py`` found
unpinned (2026-12-05): the greedy pairing's batches and mismatch accounting, the battery's
stop-at-failure rule, the verdict's parts, run_qualification's wiring of the verifier and
the controls, and the distributed batteries' split.

Most tests stub the verifier or the battery's parts: they pin the plumbing the documented
contract (docs/qualify.md, pp3cli/evidence/verdict.py) asks for, without the interpreter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import torch

from pp3cli.evidence import qualify
from pp3cli.evidence.edge import EdgeResult
from pp3cli.evidence.family import MemberRecord, requests_for
from pp3cli.evidence.greedy import greedy_from_logits
from pp3cli.evidence.pairing import PairingReport
from pp3cli.evidence.profiles import PROFILES
from pp3cli.evidence.qualify import (
    GREEDY_VOCAB,
    Battery,
    BatteryResult,
    ControlReport,
    GreedyReport,
    QualificationReport,
    _greedy_batch,
    run_greedy_pairing,
    run_qualification,
)
from pp3cli.evidence.shares import VERIFIER, RankShare
from pp3cli.evidence.stats import FamilyVerdict
from pp3cli.evidence.targets import TARGETS, target_by_name
from pp3kernels import STATUS_OK, ChainResult
from pp3kernels.reference import reference_verify_chain

SMOKE = PROFILES["smoke"]
ALPHA = 1e-5
CPU = torch.device("cpu")

Call = dict[str, Any]


def _greedy_verifier(calls: list[Call] | None = None) -> Any:
    """A verifier that answers every row with the greedy path (enough for T0 rows) and
    records what it was given."""

    def verify(
        logits: torch.Tensor,
        drafts: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        position: torch.Tensor,
        **q: Any,
    ) -> ChainResult:
        if calls is not None:
            calls.append(
                {
                    "logits": logits,
                    "drafts": drafts,
                    "tau": temperature,
                    "seed": seed,
                    "position": position,
                    **q,
                }
            )
        tokens, accepted = greedy_from_logits(logits, drafts)
        status = torch.full((drafts.shape[0],), STATUS_OK, dtype=torch.int8)
        return ChainResult(tokens, accepted, status)

    return verify


def _corrupting_verifier(corrupt: Callable[[ChainResult, int], ChainResult]) -> Any:
    good = _greedy_verifier()

    def verify(*args: Any, **kwargs: Any) -> ChainResult:
        result = good(*args, **kwargs)
        return corrupt(
            ChainResult(result.tokens.clone(), result.accepted.clone(), result.status.clone()),
            int(args[1].shape[0]),
        )

    return verify


# ---------------------------------------------------------------------------- greedy pairing


def test_greedy_pairing_runs_the_documented_batches() -> None:
    """7 pairs at batch 3: calls of 3, 3 and 1 pairs (6, 6, 2 rows), K alternating 4, 5, 4,
    positions 8 r + (batch << 32) under the run seed, even rows T0, q a point mass on the
    draft; progress after each call; a greedy-exact verifier has no mismatch."""
    calls: list[Call] = []
    seen: list[tuple[str, int, int]] = []
    report = run_greedy_pairing(
        7,
        verifier=_greedy_verifier(calls),
        device=CPU,
        seed=11,
        batch=3,
        progress=lambda task, done, total: seen.append((task, done, total)),
    )
    assert report == GreedyReport(7, 0, ())
    assert [c["drafts"].shape for c in calls] == [(6, 4), (6, 5), (2, 4)]
    assert seen == [("greedy pairing", 3, 7), ("greedy pairing", 6, 7), ("greedy pairing", 7, 7)]
    for number, c in enumerate(calls):
        b = c["drafts"].shape[0]
        assert c["logits"].shape == (b, c["drafts"].shape[1] + 1, GREEDY_VOCAB)
        assert c["position"].tolist() == [8 * r + (number << 32) for r in range(b)]
        assert c["seed"].tolist() == [11] * b
        assert (c["tau"][0::2] == 0).all() and (c["tau"][1::2] > 0).all()
        valid = c["drafts"] >= 0
        assert torch.equal(c["q_ids"][..., 0][valid], c["drafts"][valid].to(c["q_ids"].dtype))


def test_one_pair_more_than_the_batch_holds_is_a_call_of_its_own() -> None:
    """2 pairs with batch 100: one call of 4 rows (the call never exceeds the pairs asked)."""
    calls: list[Call] = []
    report = run_greedy_pairing(2, verifier=_greedy_verifier(calls), device=CPU, seed=0, batch=100)
    assert report.n == 2 and report.mismatches == 0
    assert [c["drafts"].shape[0] for c in calls] == [4]


def _flip_t0(result: ChainResult, b: int) -> ChainResult:
    """Row 0 of every pair: a wrong token; row 2: a wrong accepted length; row 4: a bad
    status; every odd (T1) row scrambled (they are not compared)."""
    result.tokens[0, 0] = (result.tokens[0, 0] + 1) % GREEDY_VOCAB
    if b > 2:
        result.accepted[2] += 1
    if b > 4:
        result.status[4] = STATUS_OK + 1
    result.tokens[1::2] = 0
    result.accepted[1::2] = 0
    result.status[1::2] = STATUS_OK + 1
    return result


def test_a_wrong_token_accepted_length_or_status_on_a_t0_row_is_a_mismatch() -> None:
    """Each of the three ways a T0 row can differ counts once, with its request number,
    call, drafts and what was expected and got; T1 rows are never compared."""
    calls: list[Call] = []
    recording = _greedy_verifier(calls)

    def verifier(*args: Any, **kwargs: Any) -> ChainResult:
        result = recording(*args, **kwargs)
        fixed = ChainResult(result.tokens.clone(), result.accepted.clone(), result.status.clone())
        return _flip_t0(fixed, int(args[1].shape[0]))

    report = run_greedy_pairing(3, verifier=verifier, device=CPU, seed=5, batch=3)
    assert report.n == 3 and report.mismatches == 3
    assert [e["request"] for e in report.examples] == [0, 1, 2]
    assert {e["batch"] for e in report.examples} == {0}
    drafts = calls[0]["drafts"]
    want_tokens, want_acc = greedy_from_logits(calls[0]["logits"], drafts)
    for e in report.examples:
        row = 2 * e["request"]
        assert e["drafts"] == drafts[row].tolist()
        assert e["expected_tokens"] == want_tokens[row].tolist()
        assert e["expected_accepted"] == int(want_acc[row])
    first, second, third = report.examples
    assert first["got_tokens"] != first["expected_tokens"]
    assert second["got_accepted"] == second["expected_accepted"] + 1
    assert third["status"] == STATUS_OK + 1 and third["got_tokens"] == third["expected_tokens"]


def _all_t0_wrong(result: ChainResult, b: int) -> ChainResult:
    result.status[0::2] = STATUS_OK + 1
    return result


@pytest.mark.parametrize(
    ("max_examples", "requests", "batches"),
    [(4, [0, 1, 2, 3], [0, 0, 0, 1]), (3, [0, 1, 2], [0, 0, 0]), (10, list(range(6)), None)],
)
def test_examples_stop_at_max_examples_and_number_requests_across_calls(
    max_examples: int, requests: list[int], batches: list[int] | None
) -> None:
    """6 bad T0 rows over two calls of 3: every one is counted, the first ``max_examples``
    are listed, numbered by request over the whole run (call 1 starts at request 3)."""
    report = run_greedy_pairing(
        6,
        verifier=_corrupting_verifier(_all_t0_wrong),
        device=CPU,
        seed=0,
        batch=3,
        max_examples=max_examples,
    )
    assert report.mismatches == 6
    assert [e["request"] for e in report.examples] == requests
    if batches is not None:
        assert [e["batch"] for e in report.examples] == batches


def test_at_most_ten_examples_by_default() -> None:
    """The receipt lists at most 10 mismatches (the default) however many there are."""
    report = run_greedy_pairing(
        12, verifier=_corrupting_verifier(_all_t0_wrong), device=CPU, seed=0, batch=12
    )
    assert report.mismatches == 12 and len(report.examples) == 10


def test_greedy_batches_have_the_documented_mix() -> None:
    """Integer logits in [-3, 3], about half of the zeros negative, 15 % of the non-kept
    entries masked (one entry per row is always kept), 4 % invalidated drafts and the
    non-greedy drafts spread over the whole vocabulary (token 0 included)."""
    rng = np.random.default_rng(21)
    b, k = 8000, 5
    logits, drafts, _ = _greedy_batch(rng, b, k)
    finite = logits[np.isfinite(logits)]
    assert set(finite.tolist()) == {-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0}
    zeros = finite[finite == 0]
    assert abs(zeros.size / finite.size - 1 / 7) < 0.01
    assert 0.45 < np.signbit(zeros).mean() < 0.55
    # each of the 15 non-kept entries of a row is masked with probability 0.15
    masked = np.isneginf(logits).reshape(-1, GREEDY_VOCAB).mean(axis=0)
    assert (abs(masked - 0.15 * 15 / 16) < 0.006).all(), masked  # the kept id is any id
    assert abs((drafts == -1).mean() - 0.04) < 0.008
    y = np.argmax(logits, axis=-1)[:, :k]
    assert ((drafts == 0) & (y != 0)).any()


# ---------------------------------------------------------------------------- the battery


def _family(passed: bool) -> FamilyVerdict:
    return FamilyVerdict(ALPHA, passed, () if passed else ("t/accepted",), {})


def _edge(passed: bool, name: str = "equal_q") -> EdgeResult:
    return EdgeResult(name, passed, "")


SMALL = Battery(64, 5, CPU, 3, SMOKE, ALPHA, (target_by_name("sparse_tails"),))


@pytest.mark.parametrize(
    ("stop", "family_passed", "mismatches", "greedy_runs", "edge_runs"),
    [
        (True, False, 0, False, False),
        (True, True, 2, True, False),
        (True, True, 0, True, True),
        (False, False, 2, True, True),
    ],
)
def test_later_parts_stop_only_for_a_control_that_was_caught(
    monkeypatch: pytest.MonkeyPatch,
    stop: bool,
    family_passed: bool,
    mismatches: int,
    greedy_runs: bool,
    edge_runs: bool,
) -> None:
    """With ``stop_at_failure`` a part runs only while nothing failed before it (greedy
    recorded as n = 0, edge as []); without it every part runs whatever failed."""
    ran: list[str] = []

    def greedy(n: int, **kwargs: Any) -> GreedyReport:
        ran.append("greedy")
        assert (n, kwargs["seed"], kwargs["batch"]) == (5, 3, SMOKE.batch)
        return GreedyReport(n, mismatches, ())

    def edge(verifier: Any, **kwargs: Any) -> list[EdgeResult]:
        ran.append("edge")
        return [_edge(True)]

    monkeypatch.setattr(qualify, "run_greedy_pairing", greedy)
    monkeypatch.setattr(qualify, "run_edge_battery", edge)
    got_greedy, got_edge = SMALL.later_parts(
        reference_verify_chain, family_passed, stop_at_failure=stop
    )
    assert ran == ["greedy"] * greedy_runs + ["edge"] * edge_runs
    if not greedy_runs:
        assert got_greedy == GreedyReport(0, 0, ())
    assert got_edge == ([_edge(True)] if edge_runs else [])


def test_the_verifiers_battery_runs_every_part_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` and ``later_parts`` default to running every part: the verifier under test is
    judged on all of them even after its family failed."""
    monkeypatch.setattr(Battery, "family", lambda self, *a, **k: ([], _family(False)))
    monkeypatch.setattr(qualify, "run_greedy_pairing", lambda n, **k: GreedyReport(n, 0, ()))
    monkeypatch.setattr(qualify, "run_edge_battery", lambda v, **k: [_edge(True)])
    result = SMALL.run(reference_verify_chain)
    assert result.greedy.n == 5 and result.edge == [_edge(True)]
    assert SMALL.later_parts(reference_verify_chain, False)[0].n == 5


def test_sample_adds_up_every_call_of_a_target() -> None:
    """64 requests in calls of 8 (smoke's 8 repeats): each member's counts sum to 64, and
    progress reports the target's requests done."""
    seen: list[tuple[str, int, int]] = []
    counts = SMALL.sample(reference_verify_chain, 0, None, lambda *a: seen.append(a))
    target = SMALL.targets[0]
    assert {name: int(v.sum()) for name, v in counts.items()} == {
        name: 64 for name in counts
    } and len(counts) == target.k + 3
    assert seen[-1] == (target.name, 64, 64) and len(seen) == 8


# ---------------------------------------------------------------------------- the verdict


@pytest.fixture(scope="module")
def small_family() -> tuple[list[MemberRecord], FamilyVerdict]:
    return SMALL.family(reference_verify_chain)


def _report(
    small_family: tuple[list[MemberRecord], FamilyVerdict], **changes: Any
) -> QualificationReport:
    members, family = small_family
    base = QualificationReport(
        "smoke", 64, 8, ALPHA, 3, tuple(members), family, GreedyReport(5, 0, ()), (_edge(True),)
    )
    return dataclasses.replace(base, **changes)


def _control(caught: bool) -> ControlReport:
    return ControlReport("d", (), _family(not caught), GreedyReport(0, 0, ()), ())


def test_the_verdict_needs_a_clean_battery_and_every_control_caught(
    small_family: tuple[list[MemberRecord], FamilyVerdict],
) -> None:
    """PASS only when the family passed, no greedy or paired T0 mismatch, every deciding
    edge check passed and every control was caught (verdict.py's rule)."""
    assert small_family[1].passed
    assert _report(small_family).verdict == "PASS"
    assert _report(small_family, family=_family(False)).verdict == "FAIL"
    assert _report(small_family, greedy=GreedyReport(5, 1, ())).verdict == "FAIL"
    assert _report(small_family, edge=(_edge(True), _edge(False, "x"))).verdict == "FAIL"
    assert _report(small_family, controls=(_control(True),)).verdict == "PASS"
    assert _report(small_family, controls=(_control(True), _control(False))).verdict == "FAIL"
    paired = PairingReport("other", 5, 1, (), ())
    assert _report(small_family, pairing=paired).verdict == "FAIL"
    both = {"pairing": paired, "greedy": GreedyReport(5, 1, ())}
    assert _report(small_family, **both).verdict == "FAIL"
    clean_pair = PairingReport("other", 5, 0, (), ())
    assert _report(small_family, pairing=clean_pair).verdict == "PASS"


def test_edge_checks_decide_only_with_edge_decides(
    small_family: tuple[list[MemberRecord], FamilyVerdict],
) -> None:
    """A peer's failed edge check is recorded ("differs") without deciding; with
    ``edge_decides`` it fails the run."""
    edge = (_edge(True, "a"), _edge(False, "b"))
    peer = _report(small_family, edge=edge, edge_decides=False)
    assert peer.verdict == "PASS"
    assert peer.edge_summary() == {"meets": ["a"], "differs": ["b"]}
    assert _report(small_family, edge_decides=False).verdict == "PASS"
    assert _report(small_family, edge=edge).verdict == "FAIL"


def test_a_control_is_caught_by_any_failing_part() -> None:
    """A control counts as caught by a rejected member, a greedy mismatch or a failed edge
    check, and only then; its receipt entry says so."""
    clean = ControlReport("d", (), _family(True), GreedyReport(5, 0, ()), (_edge(True),))
    assert not clean.caught and clean.to_json()["failed_as_required"] is False
    assert dataclasses.replace(clean, family=_family(False)).caught
    assert dataclasses.replace(clean, greedy=GreedyReport(5, 1, ())).caught
    caught = dataclasses.replace(clean, edge=(_edge(False),))
    assert caught.caught and caught.to_json()["failed_as_required"] is True


def test_receipt_data_states_control_size_and_pairing_only_when_present(
    small_family: tuple[list[MemberRecord], FamilyVerdict],
) -> None:
    """``control_requests_per_target`` appears only when the controls ran fewer requests;
    ``pairing`` is null without a paired run; the stored verdict is the report's."""
    plain = _report(small_family).to_json()
    assert "control_requests_per_target" not in plain
    assert plain["pairing"] is None and plain["verdict"] == "PASS"
    assert plain["controls"] == [] and plain["edge_summary"] == {
        "meets": ["equal_q"],
        "differs": [],
    }
    assert [t["requests"] for t in plain["targets"]] == [64]
    sized = _report(
        small_family,
        control_requests_per_target=32,
        pairing=PairingReport("other", 5, 0, (), ()),
        controls=(_control(False),),
    ).to_json()
    assert sized["control_requests_per_target"] == 32
    assert sized["pairing"]["with"] == "other" and sized["verdict"] == "FAIL"
    assert sized["controls"][0]["failed_as_required"] is False


# ---------------------------------------------------------------------------- run_qualification


def _verifier(name: str) -> Any:
    def verify(*args: Any, **kwargs: Any) -> ChainResult:
        raise AssertionError(f"{name} must not be called: the battery is stubbed")

    verify.__name__ = name
    return verify


GOOD, BAD, CORRECT = _verifier("good"), _verifier("bad"), _verifier("correct")


class FakeRuns:
    """Stands in for ``Battery.run``: records each call; ``BAD`` fails its family."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(
        self,
        battery: Battery,
        verifier: Any,
        *,
        progress: Any = None,
        stop_at_failure: bool = False,
        transport: Any = None,
    ) -> BatteryResult:
        self.calls.append(
            {
                "verifier": verifier,
                "n": battery.n,
                "n_greedy": battery.n_greedy,
                "targets": tuple(battery.targets),
                "stop": stop_at_failure,
                "transport": transport,
                "seed": battery.seed,
            }
        )
        if progress is not None:
            progress("task", 1, 2)
        passed = verifier is not BAD
        return BatteryResult(
            [], _family(passed), GreedyReport(battery.n_greedy, 0, ()), [_edge(True)]
        )


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> FakeRuns:
    runs = FakeRuns()
    monkeypatch.setattr(Battery, "run", lambda self, *a, **k: runs(self, *a, **k))
    return runs


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, 1.5])
def test_alpha_outside_the_open_unit_interval_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        run_qualification(SMOKE, verifier=GOOD, device="cpu", alpha=alpha)


def test_no_greedy_pairs_is_refused_and_one_is_enough(fake_runs: FakeRuns) -> None:
    """n_greedy must be at least 1 (a qualification without its greedy pairing is not one)."""
    with pytest.raises(ValueError, match="n_greedy"):
        run_qualification(SMOKE, verifier=GOOD, device="cpu", alpha=ALPHA, n_greedy=0)
    report = run_qualification(SMOKE, verifier=GOOD, device="cpu", alpha=ALPHA, n_greedy=1)
    assert [c["n_greedy"] for c in fake_runs.calls] == [1]
    assert report.greedy.n == 1


def test_the_verifier_and_each_control_get_the_documented_batteries(
    fake_runs: FakeRuns,
) -> None:
    """The verifier: the profile's n and n_greedy on every target, through the transport,
    every part run; each control: the same size without the capped targets, stopping at its
    first failing part, progress tagged with its defect. A caught control lets a clean
    verifier PASS."""
    seen: list[str] = []
    transport = cast(qualify.DraftTransport, object())
    report = run_qualification(
        SMOKE,
        verifier=GOOD,
        device="cpu",
        alpha=ALPHA,
        controls={"planted": BAD},
        transport=transport,
        progress=lambda task, done, total: seen.append(task),
    )
    verifier_run, control_run = fake_runs.calls
    assert verifier_run["verifier"] is GOOD and control_run["verifier"] is BAD
    assert (verifier_run["n"], verifier_run["n_greedy"]) == (2000, SMOKE.n_greedy)
    assert (control_run["n"], control_run["n_greedy"]) == (2000, SMOKE.n_greedy)
    assert verifier_run["targets"] == tuple(TARGETS)
    assert control_run["targets"] == tuple(t for t in TARGETS if not t.capped)
    assert len(control_run["targets"]) == len(TARGETS) - 2
    assert verifier_run["stop"] is False and control_run["stop"] is True
    assert verifier_run["transport"] is transport and control_run["transport"] is None
    assert seen == ["task", "control planted: task"]
    assert verifier_run["seed"] == 0 and report.seed == 0
    assert report.requests_per_target == 2000 and report.call_size == 250  # ceil(2000 / 8)
    assert report.control_requests_per_target is None and report.edge_decides is True
    assert [c.defect for c in report.controls] == ["planted"] and report.controls[0].caught
    assert report.family.passed and report.verdict == "PASS"


def test_a_control_that_passes_fails_the_run_and_full_controls_runs_every_part(
    fake_runs: FakeRuns,
) -> None:
    """A 'control' that is correct is not caught, so the verdict is FAIL; with
    ``full_controls`` the control battery does not stop at its first failure."""
    report = run_qualification(
        SMOKE,
        verifier=GOOD,
        device="cpu",
        alpha=ALPHA,
        controls={"not_a_defect": CORRECT},
        full_controls=True,
    )
    assert fake_runs.calls[1]["stop"] is False
    assert not report.controls[0].caught and report.verdict == "FAIL"


def test_without_controls_none_run(fake_runs: FakeRuns) -> None:
    report = run_qualification(SMOKE, verifier=GOOD, device="cpu", alpha=ALPHA)
    assert len(fake_runs.calls) == 1 and report.controls == () and report.verdict == "PASS"


def test_a_control_tv_sizes_the_controls_alone(fake_runs: FakeRuns) -> None:
    """A profile with a ``control_tv`` runs its controls at that TV's size (fewer requests)
    and the receipt states it; the verifier keeps the profile's size."""
    profile = dataclasses.replace(SMOKE, control_tv=0.2)
    controls_n = requests_for(profile, ALPHA, 0.2)
    assert controls_n < 2000
    report = run_qualification(
        profile, verifier=GOOD, device="cpu", alpha=ALPHA, controls={"planted": BAD}
    )
    assert [c["n"] for c in fake_runs.calls] == [2000, controls_n]
    assert report.requests_per_target == 2000
    assert report.control_requests_per_target == controls_n


def test_a_paired_run_joins_the_verdict(
    fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pair_with``: the paired T0 run gets n_greedy requests at the profile's batch, and
    a paired T0 mismatch fails the run though the verifier's own battery is clean."""
    asked: list[tuple[Any, Any, int, int]] = []

    def pair_t0(first: Any, second: Any, n: int, **kwargs: Any) -> tuple[int, tuple[()]]:
        asked.append((first, second, n, kwargs["batch"]))
        return 2, ()

    monkeypatch.setattr(qualify, "pair_t0", pair_t0)
    monkeypatch.setattr(qualify, "pair_sampled", lambda *a, **k: [])
    report = run_qualification(
        SMOKE, verifier=GOOD, device="cpu", alpha=ALPHA, n_greedy=9, pair_with=("o", CORRECT)
    )
    assert asked == [(GOOD, CORRECT, 9, SMOKE.batch)]
    assert report.pairing is not None and report.pairing.t0_mismatches == 2
    assert report.family.passed and report.greedy.mismatches == 0
    assert report.verdict == "FAIL"


# ---------------------------------------------------------------------------- on ranks


class FakeGroup:
    """Rank 0 of 2: owns the even work items; the other rank sends its later parts."""

    def __init__(self, other: dict[int, tuple[GreedyReport, list[EdgeResult]]]) -> None:
        self.other = other

    def owns(self, item: int) -> bool:
        return item % 2 == 0

    def gather_objects(self, value: Any) -> list[Any]:
        return [value, self.other]


class FakeShare:
    def __init__(self, group: FakeGroup) -> None:
        self.group = group
        self.taken = 0

    def take(self) -> list[dict[str, Any]]:
        self.taken += 1
        return [{"m": [[self.taken]]}]


def test_batteries_on_ranks_split_the_later_parts_and_keep_the_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every family on every rank (the transport for the verifier only); battery i's later
    parts on rank i mod 2, stopping early for controls only; the other rank's parts are
    gathered; the report is the verifier's, the controls follow in order."""
    families: list[tuple[Any, int, int, Any]] = []
    later: list[tuple[Any, bool, int, Any]] = []

    def family(
        self: Battery, verifier: Any, transport: Any = None, progress: Any = None
    ) -> tuple[list[MemberRecord], FamilyVerdict]:
        families.append((verifier, self.n, len(self.targets), transport))
        if progress is not None:
            progress("fam", 1, 1)
        return [], _family(verifier is not BAD)

    def later_parts(
        self: Battery,
        verifier: Any,
        family_passed: bool,
        *,
        progress: Any = None,
        stop_at_failure: bool = False,
    ) -> tuple[GreedyReport, list[EdgeResult]]:
        later.append((verifier, stop_at_failure, len(self.targets), family_passed))
        return GreedyReport(self.n_greedy, 0, ()), [_edge(True)]

    monkeypatch.setattr(Battery, "family", family)
    monkeypatch.setattr(Battery, "later_parts", later_parts)
    from_other = {1: (GreedyReport(7, 0, ()), [_edge(False, "from rank 1")])}
    share = cast(RankShare, FakeShare(FakeGroup(from_other)))
    seen: list[str] = []
    transport = cast(qualify.DraftTransport, object())
    report = run_qualification(
        SMOKE,
        verifier=GOOD,
        device="cpu",
        alpha=ALPHA,
        controls={"planted": BAD, "passes": CORRECT},
        share=share,
        transport=transport,
        progress=lambda task, done, total: seen.append(task),
    )
    uncapped = len(TARGETS) - 2
    assert families == [
        (GOOD, 2000, len(TARGETS), transport),
        (BAD, 2000, uncapped, None),
        (CORRECT, 2000, uncapped, None),
    ]
    assert later == [(GOOD, False, len(TARGETS), True), (CORRECT, True, uncapped, True)]
    assert seen == ["fam", "control planted: fam", "control passes: fam"]
    assert report.family.passed and report.greedy.n == SMOKE.n_greedy
    assert [c.defect for c in report.controls] == ["planted", "passes"]
    assert report.controls[0].edge == (_edge(False, "from rank 1"),)
    assert report.controls[0].greedy.n == 7 and not report.controls[1].caught
    assert report.rank_counts == {
        VERIFIER: {"m": [[1]]},
        "planted": {"m": [[2]]},
        "passes": {"m": [[3]]},
    }
    assert report.verdict == "FAIL"


def test_full_controls_on_ranks_do_not_stop_early(monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[bool] = []
    monkeypatch.setattr(Battery, "family", lambda self, *a: ([], _family(True)))

    def later_parts(self: Battery, v: Any, p: bool, **kwargs: Any) -> Any:
        stops.append(kwargs["stop_at_failure"])
        return GreedyReport(1, 0, ()), []

    monkeypatch.setattr(Battery, "later_parts", later_parts)
    share = cast(RankShare, FakeShare(FakeGroup({1: (GreedyReport(1, 0, ()), [])})))
    controls = {"a": BAD, "b": CORRECT}
    run_qualification(
        SMOKE,
        verifier=GOOD,
        device="cpu",
        alpha=ALPHA,
        controls=controls,
        share=share,
        full_controls=True,
    )
    assert stops == [False, False]


def test_a_paired_run_on_ranks_is_refused() -> None:
    share = cast(RankShare, FakeShare(FakeGroup({})))
    with pytest.raises(ValueError, match="pair_with"):
        run_qualification(
            SMOKE, verifier=GOOD, device="cpu", alpha=ALPHA, share=share, pair_with=("o", GOOD)
        )


# ---------------------------------------------------------------------------- crashes


def _crashing(*args: Any, **kwargs: Any) -> ChainResult:
    raise RuntimeError("verifier crashed")


def test_a_crashing_verifier_is_an_error_not_a_verdict() -> None:
    """A verifier that raises ends the run with its exception: no report, so no PASS and no
    FAIL that could be mistaken for a judgement (docs/qualify.md: a failed run has no
    receipt)."""
    with pytest.raises(RuntimeError, match="verifier crashed"):
        run_qualification(
            SMOKE, verifier=_crashing, device="cpu", alpha=ALPHA, targets=SMALL.targets
        )
    with pytest.raises(RuntimeError, match="verifier crashed"):
        run_greedy_pairing(2, verifier=_crashing, device=CPU, seed=0, batch=2)


def test_a_crashing_control_is_an_error_not_a_caught_control(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A control that crashes has not been caught by the battery: the run ends with the
    exception instead of counting the crash as the control failing as required."""
    real_run = Battery.run

    def run(self: Battery, verifier: Any, **kwargs: Any) -> BatteryResult:
        if verifier is GOOD:
            return BatteryResult([], _family(True), GreedyReport(1, 0, ()), [])
        return real_run(self, verifier, **kwargs)

    monkeypatch.setattr(Battery, "run", run)
    with pytest.raises(RuntimeError, match="verifier crashed"):
        run_qualification(
            SMOKE,
            verifier=GOOD,
            device="cpu",
            alpha=ALPHA,
            targets=SMALL.targets,
            controls={"crash": _crashing},
        )
