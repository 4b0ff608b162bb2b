"""run_qualification on the smoke profile: the reference passes, every planted defect fails,
a wrong law / missing cell / impossible outcome fail, and tampered counts are detected."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from pp3cli.evidence.exact import fraction_from_text, fraction_text
from pp3cli.evidence.family import member_laws, plan_samples, recompute_qualification
from pp3cli.evidence.greedy import greedy_from_logits
from pp3cli.evidence.profiles import POWER, PROFILES
from pp3cli.evidence.qualify import (
    Battery,
    QualificationReport,
    as_target_form,
    count_members,
    run_qualification,
    target_inputs,
)
from pp3cli.evidence.stats import detectable_tv, g_test, holm, power_of
from pp3cli.evidence.targets import TARGETS, target_by_name
from pp3cli.evidence.verdict import battery_caught
from pp3cli.receipts.recompute import RECOMPUTERS
from pp3cli.run.scratch import repo_root
from pp3kernels import ChainInputs, ChainResult
from pp3kernels.reference import DEFECTS, reference_verify_chain

SMOKE = PROFILES["smoke"]
ALPHA = 1e-5


@pytest.fixture(scope="module")
def reference_report() -> QualificationReport:
    return run_qualification(
        SMOKE, verifier=reference_verify_chain, device="cpu", seed=3, alpha=ALPHA
    )


def _predicate(report: QualificationReport) -> dict[str, Any]:
    return {"data": report.to_json(), "parameters": {"alpha": ALPHA}, "verdict": report.verdict}


def test_reference_passes_smoke(reference_report: QualificationReport) -> None:
    assert reference_report.family.passed, reference_report.family.rejected
    assert reference_report.greedy.mismatches == 0, reference_report.greedy.examples
    assert all(e.passed for e in reference_report.edge), reference_report.edge
    assert reference_report.verdict == "PASS"
    assert len(reference_report.members) == sum(t.k + 3 for t in TARGETS)


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_fails_smoke(defect: str) -> None:
    """The control battery (stopping at its first failing part) catches every defect."""
    bad = functools.partial(reference_verify_chain, defect=defect)
    uncapped = tuple(t for t in TARGETS if not t.capped)  # as run_qualification runs controls
    battery = Battery(
        SMOKE.requests or 0, SMOKE.n_greedy, torch.device("cpu"), 3, SMOKE, ALPHA, uncapped
    )
    members, family, greedy, edge = battery.run(bad, stop_at_failure=True)
    caught = battery_caught(family.passed, greedy.mismatches, (e.passed for e in edge))
    assert caught, f"control {defect} passed the smoke battery"


def _run_with_a_correct_control() -> QualificationReport:
    """The smoke battery with one 'control' that is in fact the correct verifier."""
    return run_qualification(
        SMOKE,
        verifier=reference_verify_chain,
        device="cpu",
        seed=3,
        alpha=ALPHA,
        n_greedy=200,
        controls={"not_a_defect": reference_verify_chain},
    )


def test_a_passing_control_fails_the_run(reference_report: QualificationReport) -> None:
    """A 'control' that is in fact correct passes, so the run's verdict must be FAIL."""
    report = _run_with_a_correct_control()
    assert report.family.passed and not report.controls[0].caught
    assert report.verdict == "FAIL"
    verdict, problems = recompute_qualification(_predicate(report))
    assert verdict == "FAIL" and not problems


def _judge(entries: list[dict[str, Any]]) -> bool:
    results = [
        g_test(e["name"], e["observed"], [fraction_from_text(p) for p in e["exact"]])
        for e in entries
    ]
    return holm(results, ALPHA).passed


def test_wrong_law_fails(reference_report: QualificationReport) -> None:
    entries = [m.to_json() for m in reference_report.members]
    assert _judge(entries)
    target = next(e for e in entries if e["name"] == "point_mass_positions/slot1")
    probs = [fraction_from_text(p) for p in target["exact"]]
    probs[0], probs[1] = probs[1], probs[0]  # the law of a mixed-up position
    target["exact"] = [fraction_text(p) for p in probs]
    assert not _judge(entries)


def test_missing_cell_fails(reference_report: QualificationReport) -> None:
    entries = [m.to_json() for m in reference_report.members]
    target = next(e for e in entries if e["name"] == "sparse_tails/slot0")
    counts = target["observed"]
    heaviest = int(np.argmax(counts))
    counts[heaviest + 1] += counts[heaviest]  # one pooled cell never observed
    counts[heaviest] = 0
    assert not _judge(entries)


def test_impossible_outcome_fails(reference_report: QualificationReport) -> None:
    entries = [m.to_json() for m in reference_report.members]
    target = next(e for e in entries if e["name"] == "point_mass_positions/joint")
    impossible = next(i for i, p in enumerate(target["exact"]) if p == "0/1")
    donor = int(np.argmax(target["observed"]))
    target["observed"][donor] -= 1
    target["observed"][impossible] += 1
    assert not _judge(entries)


def test_recomputer_accepts_the_receipt_and_detects_tampering(
    reference_report: QualificationReport,
) -> None:
    """The smoke report ran no controls, so it is judged as a library caller's report (the
    family recomputer's verdict); as a receipt, whose parameters must name its controls, it
    FAILs."""
    predicate = _predicate(reference_report)
    assert RECOMPUTERS["qualification"](predicate) == "FAIL"  # a receipt without controls

    def recompute(candidate: dict[str, Any]) -> str:
        return recompute_qualification(candidate)[0]

    assert recompute(predicate) == "PASS"
    tampered = copy.deepcopy(predicate)
    member = tampered["data"]["members"][4]
    donor = int(np.argmax(member["observed"]))
    member["observed"][donor] -= 1  # one count moved: n unchanged, statistic changed
    member["observed"][(donor + 1) % (len(member["observed"]) - 1)] += 1
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any("statistic" in p for p in problems), problems
    assert recompute(tampered) == "FAIL"
    flipped = copy.deepcopy(predicate)
    flipped["data"]["greedy"]["mismatches"] = 1
    assert recompute(flipped) == "FAIL"
    negative = copy.deepcopy(predicate)
    negative["data"]["members"][0]["observed"][0] = -1
    assert recompute(negative) == "FAIL"


def test_the_power_statement_is_per_target_and_recomputed(
    reference_report: QualificationReport,
) -> None:
    """A capped target states its own (weaker) detectable TV; verify-receipts recomputes it."""
    predicate = _predicate(reference_report)
    stated = {entry["name"]: entry for entry in predicate["data"]["targets"]}
    assert set(stated) == {t.name for t in TARGETS}
    wide = stated["wide_support"]
    assert wide["requests"] == 256 < stated["sparse_tails"]["requests"] == SMOKE.requests
    assert wide["tv"] > stated["sparse_tails"]["tv"] > 0
    overstated = copy.deepcopy(predicate)
    overstated["data"]["targets"][-1]["tv"] /= 2  # claims more power than the counts give
    verdict, problems = recompute_qualification(overstated)
    assert verdict == "FAIL" and any("detecting TV" in p for p in problems), problems
    assert not any("wide_support" in c["members"][0]["name"] for c in
                   predicate["data"]["controls"])  # fmt: skip


def test_dense_targets_reach_the_verifier_as_dense_q() -> None:
    target = next(t for t in TARGETS if t.q_form == "dense")
    index = torch.arange(6, dtype=torch.int64)
    sparse = target_inputs(target, index, seed=1, target_index=2)
    dense = as_target_form(target, sparse)
    assert dense.q_ids is None and dense.q_counts is None and dense.denominator is None
    assert dense.q_dense is not None
    assert torch.equal(dense.q_dense, target.q_dense().expand(6, -1, -1))
    assert torch.equal(dense.draft_tokens, sparse.draft_tokens)
    plain = next(t for t in TARGETS if t.q_form == "sparse")
    assert as_target_form(plain, sparse) is sparse


def test_member_laws_known_values() -> None:
    target = target_by_name("point_mass_positions")  # beta_i = 3/4, no invalidation
    laws = {law.name.split("/")[1]: law.probs for law in member_laws(target, 10)}
    quarter = Fraction(1, 4)
    assert laws["accepted"][:5] == (
        quarter,
        Fraction(3, 4) * quarter,
        Fraction(9, 16) * quarter,
        Fraction(27, 64) * quarter,
        Fraction(81, 256),
    )
    # rejecting a point-mass draft never emits the drafted token
    assert laws["joint"][0] == 0 and laws["joint"][5 + 1] == 0
    mixed = {
        law.name.split("/")[1]: law.probs
        for law in member_laws(target_by_name("invalidated_proposals"), 3)
    }
    # 2 valid, 1 invalidated request: P(accepted >= 2) only from the valid ones
    assert sum(mixed["accepted"][2:]) < sum(mixed["accepted"][1:])


def test_count_members_flags_malformed_rows() -> None:
    target = target_by_name("point_mass_positions")
    tokens = torch.tensor([[0, 1, 4, -1, -1], [2, -1, -1, -1, -1], [0, 3, -1, 2, -1]])
    accepted = torch.tensor([2, 0, 1])
    status = torch.tensor([0, 1, 0], dtype=torch.int8)
    counts = count_members(target, ChainResult(tokens, accepted, status))
    assert counts["point_mass_positions/accepted"].tolist() == [0, 0, 1, 0, 0, 2]
    assert counts["point_mass_positions/slot0"][-1] == 2  # status NAN row, bad padding row
    assert counts["point_mass_positions/joint"][2 * 5 + 4] == 1


def test_greedy_reference_lowest_id_and_signed_zero() -> None:
    logits = torch.tensor([[[-0.0, 0.0, -1.0], [1.0, 2.0, 2.0]]], dtype=torch.float32)
    tokens, accepted = greedy_from_logits(logits, torch.tensor([[0]], dtype=torch.int32))
    assert tokens.tolist() == [[0, 1]] and accepted.tolist() == [1]
    tokens, accepted = greedy_from_logits(logits, torch.tensor([[1]], dtype=torch.int32))
    assert tokens.tolist() == [[0, -1]] and accepted.tolist() == [0]


def test_plan_reaches_the_stated_power() -> None:
    rows = plan_samples(1e-2, ALPHA)
    assert len(rows) == sum(t.k + 3 for t in TARGETS)
    member_alpha = ALPHA / len(rows)
    for row in rows:
        assert power_of(row.n_needed, 1e-2, row.df, member_alpha) >= 0.99
    assert max(r.n_needed for r in plan_samples(1e-3, ALPHA)) > 50 * max(r.n_needed for r in rows)


def test_cli_refuses_cpu_without_interpreter(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PP3_SCRATCH=str(tmp_path / "s"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pp3cli",
            "--receipts",
            str(tmp_path / "r"),
            "qualify",
            "--profile",
            "smoke",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "TRITON_INTERPRET" in proc.stderr


def test_cli_plan_prints_samples(tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pp3cli", "qualify", "--plan", "--tv", "1e-2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"n_needed"' in proc.stdout and "sparse_tails/joint" in proc.stdout


def test_proxy_transport_delivers_every_draft_and_counts_the_frames() -> None:
    """--via-proxy: drafts cross a real drafter process unchanged and the frames are counted."""
    from pp3cli.evidence.qualify import target_inputs
    from pp3cli.wire.proxy import ProxyDraftTransport

    target = TARGETS[0]
    n, k = 48, target.k
    index = torch.arange(n, dtype=torch.int64)
    sent = target_inputs(target, index, seed=11, target_index=0)
    transport = ProxyDraftTransport()
    back = transport(sent, index, 0, target.vocab)
    assert isinstance(back, ChainInputs) and back.logits is sent.logits
    assert torch.equal(back.draft_tokens, sent.draft_tokens)
    assert sent.q_ids is not None and sent.q_counts is not None
    assert back.q_ids is not None and back.q_counts is not None
    # the same law per row: (id, count) pairs with positive count, whatever the slot order
    for row in range(n):
        for i in range(k):
            pairs = zip(sent.q_ids[row, i], sent.q_counts[row, i], strict=True)
            want = sorted((int(a), int(c)) for a, c in pairs if c > 0)
            pairs = zip(back.q_ids[row, i], back.q_counts[row, i], strict=True)
            got = sorted((int(a), int(c)) for a, c in pairs if c > 0)
            assert got == want, (row, i, want, got)
    summary = transport.summary()
    assert summary["calls"] == 1
    assert summary["frames_accepted"] == n, summary
    assert summary["frames_refused"] == 0 and summary["fallbacks"] == 0, summary


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-01)


@pytest.mark.parametrize(
    ("field", "edit", "fragment"),
    [
        ("n", lambda r: r.__setitem__("n", r["n"] + 1), "receipt says n="),
        ("cells", lambda r: r.__setitem__("cells", r["cells"] + 1), "stored cells"),
        ("df", lambda r: r.__setitem__("df", r["df"] + 1), "stored df"),
    ],
)
def test_recomputer_notices_a_tampered_member_result_field(
    reference_report: QualificationReport,
    field: str,
    edit: object,
    fragment: str,
) -> None:
    """Member 4 is not its target's last member, so the per-target power statement does not
    see its n: only the member's own check can."""
    predicate = _predicate(reference_report)
    tampered = copy.deepcopy(predicate)
    edit(tampered["data"]["members"][4]["result"])  # type: ignore[operator]
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any(fragment in p for p in problems), (field, problems)


def test_recomputer_notices_tampered_pooled_groups(
    reference_report: QualificationReport,
) -> None:
    predicate = _predicate(reference_report)
    tampered = copy.deepcopy(predicate)
    groups = tampered["data"]["members"][4]["pooled"]["groups"]
    assert len(groups) >= 2
    groups[-2:] = [groups[-2] + groups[-1]]  # two cells merged after the fact
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any("pooled groups" in p for p in problems), problems


def test_recomputer_notices_a_control_flag_that_contradicts_its_battery() -> None:
    """A 'control' that is the correct verifier is not caught; a receipt that claims it
    failed as required must be flagged (its verdict happens to be FAIL either way)."""
    report = _run_with_a_correct_control()
    tampered = copy.deepcopy(_predicate(report))
    control = tampered["data"]["controls"][0]
    assert control["failed_as_required"] is False
    control["failed_as_required"] = True
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any("stored failed flag is wrong" in p for p in problems), problems


def test_recomputer_notices_a_power_statement_that_drops_a_target(
    reference_report: QualificationReport,
) -> None:
    tampered = copy.deepcopy(_predicate(reference_report))
    dropped = tampered["data"]["targets"].pop()
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any("power statement names others" in p for p in problems), (
        dropped,
        problems,
    )


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/evidence/family.py against test_stats, test_targets, test_qualify,
# test_verifiers and test_verify_receipts)


def test_plan_sizes_between_the_pooled_and_the_unpooled_df() -> None:
    """Each member's n reaches the power at its pooled df and never exceeds what its
    unpooled df (possible outcomes - 1) needs, both at alpha / m."""
    from pp3cli.evidence.profiles import POWER
    from pp3cli.evidence.stats import samples_for_tv

    rows = plan_samples(1e-2, ALPHA)
    laws = {law.name: law for target in TARGETS for law in member_laws(target, 2)}
    member_alpha = ALPHA / len(rows)
    for row in rows:
        possible = sum(1 for p in laws[row.member].probs if p > 0)
        pooled = samples_for_tv(1e-2, row.df, member_alpha, POWER)
        unpooled = samples_for_tv(1e-2, max(1, possible - 1), member_alpha, POWER)
        assert pooled <= row.n_needed <= unpooled, row


def test_requests_follow_the_given_tv_then_the_profile() -> None:
    """An explicit TV sizes the run whatever the profile says; without one a profile's TV
    does, else its fixed count; capped targets do not size it."""
    from dataclasses import replace

    from pp3cli.evidence.family import requests_for

    strict, seed = PROFILES["strict"], PROFILES["seed"]
    coarse = requests_for(replace(strict, tv=1e-2), ALPHA)
    assert requests_for(strict, ALPHA, tv=1e-2) == coarse < requests_for(strict, ALPHA)
    assert requests_for(seed, ALPHA) == seed.requests
    assert requests_for(seed, ALPHA, tv=1e-2) == coarse
    # a capped target with the family's largest member does not size it
    small, large = target_by_name("equal_q_ties"), target_by_name("sparse_tails")
    pair = (small, replace(large, requests_cap=(("strict", 100),)))
    rows = plan_samples(1e-2, ALPHA, targets=pair)
    sized = max(r.n_needed for r in rows if r.member.startswith(f"{small.name}/"))
    assert sized < max(r.n_needed for r in rows)
    assert requests_for(strict, ALPHA, tv=1e-2, targets=pair) == sized
    with pytest.raises(ValueError, match="neither requests nor tv"):
        requests_for(replace(seed, requests=None), ALPHA)


def test_stated_target_power_is_recomputed_from_the_members() -> None:
    """Each target's requests and detectable TV (its weakest member's, at alpha / m with
    the pairing tests in m) are recomputed from the stored members: an honest statement
    holds, an edited TV or request count does not, nor a statement that drops a target."""
    from pp3cli.evidence.family import _recompute_target_power, judge_members, target_power

    laws = [law for target in TARGETS[:2] for law in member_laws(target, 4000)]
    counts = {law.name: [round(4000 * float(p)) for p in law.probs] for law in laws}
    for law in laws:  # rounding: put the difference on the likeliest outcome
        top = max(range(len(law.probs)), key=lambda i: law.probs[i])
        counts[law.name][top] += 4000 - sum(counts[law.name])
    records, _verdict = judge_members(laws, counts, ALPHA)
    stored = [record.to_json() for record in records]
    for extra in (0, 3):
        claimed = target_power(records, ALPHA, extra_members=extra)
        assert _recompute_target_power(stored, claimed, ALPHA, extra_members=extra) == []
        assert _recompute_target_power(stored, claimed, ALPHA, extra_members=extra + 1)
    claimed = target_power(records, ALPHA)
    assert _recompute_target_power(stored, claimed, ALPHA) == []  # no pairing tests
    assert all(0.0 < entry["tv"] < 1.0 for entry in claimed)
    for edit in ({"tv": claimed[0]["tv"] * 1.01}, {"requests": claimed[0]["requests"] + 1}):
        edited = copy.deepcopy(claimed)
        edited[0].update(edit)
        assert _recompute_target_power(stored, edited, ALPHA), edit
    assert _recompute_target_power(stored, claimed[1:], ALPHA)


# ---- A receipt's controls are the ones its parameters name (found by a campaign, 2026-12-05)


def _committed_qualification() -> dict[str, Any]:
    """The smallest committed qualification receipt's predicate (every one ran controls)."""
    folder = repo_root() / "receipts"
    smallest = min(folder.glob("qualification-*.json"), key=lambda p: p.stat().st_size)
    predicate: dict[str, Any] = orjson.loads(smallest.read_bytes())["predicate"]
    return predicate


def test_a_receipts_recorded_controls_must_be_the_ones_its_parameters_name() -> None:
    from pp3cli.receipts.recompute import recompute_qualification as receipt_verdict

    predicate = _committed_qualification()
    named = [str(c["defect"]) for c in predicate["data"]["controls"]]
    assert len(named) >= 2 and predicate["parameters"]["controls"] == named
    assert recompute_qualification(predicate) == (predicate["verdict"], [])
    dropped = copy.deepcopy(predicate)
    dropped["data"]["controls"].pop()  # a control that was not caught, left out
    verdict, problems = recompute_qualification(dropped)
    assert verdict == "FAIL" and any("but the parameters list" in p for p in problems)
    swapped = copy.deepcopy(predicate)
    swapped["parameters"]["controls"] = named[::-1]
    assert recompute_qualification(swapped)[0] == "FAIL"
    none = copy.deepcopy(predicate)
    none["data"]["controls"], none["parameters"]["controls"] = [], []
    verdict, problems = recompute_qualification(none)
    assert verdict == "FAIL" and any("no negative control" in p for p in problems)
    unnamed = copy.deepcopy(predicate)
    del unnamed["parameters"]["controls"]
    assert recompute_qualification(unnamed)[0] == predicate["verdict"]  # a library caller
    verdict, problems = recompute_qualification(unnamed, require_controls=True)
    assert verdict == "FAIL" and problems == ["the parameters name no negative controls"]
    assert recompute_qualification(predicate, require_controls=True) == ("PASS", [])
    assert receipt_verdict(unnamed) == "FAIL" and receipt_verdict(predicate) == "PASS"


# ---- Tests that kill mutants a campaign over evidence/family.py's recomputer found surviving


def test_a_target_whose_weakest_member_has_one_degree_of_freedom_is_recomputed_on_it(
    reference_report: QualificationReport,
) -> None:
    """The detectable TV is computed on each member's own pooled df, 1 included: a
    one-member family whose only member has df = 1 states detectable_tv(n, 1, alpha, POWER),
    and a statement computed on df = 2 is found."""
    predicate = _predicate(reference_report)
    member = next(m for m in predicate["data"]["members"] if m["result"]["df"] == 1)
    n = int(member["result"]["n"])
    predicate["data"]["members"] = [member]

    def stated(df: int) -> list[dict[str, Any]]:
        return [{"name": member["target"], "requests": n, "tv": detectable_tv(n, df, ALPHA, POWER)}]

    predicate["data"]["targets"] = stated(1)
    _, problems = recompute_qualification(predicate)
    assert not any("detecting TV" in p for p in problems), problems
    predicate["data"]["targets"] = stated(2)
    _, problems = recompute_qualification(predicate)
    assert any("detecting TV" in p for p in problems), problems
    for scale, flagged in ((1 + 0.75e-9, False), (1 + 1.25e-9, True)):  # held to 1e-9 too
        predicate["data"]["targets"] = stated(1)
        predicate["data"]["targets"][0]["tv"] *= scale
        _, problems = recompute_qualification(predicate)
        assert any("detecting TV" in p for p in problems) is flagged, (scale, problems)


def test_a_receipt_without_edge_decides_is_judged_with_its_edge_checks(
    reference_report: QualificationReport,
) -> None:
    """Receipts written before peers were qualified have no ``edge_decides``: a failed edge
    check there makes the verdict FAIL, as for pp3's own selector."""
    predicate = _predicate(reference_report)
    del predicate["data"]["edge_decides"]
    predicate["data"]["edge"][0]["passed"] = False
    predicate["verdict"] = "FAIL"
    assert recompute_qualification(predicate) == ("FAIL", [])
    predicate["data"]["edge_decides"] = False  # a peer's: the edge checks are reported only
    verdict, problems = recompute_qualification(predicate)
    assert verdict == "PASS" and any("stored verdict FAIL" in p for p in problems), problems


@pytest.mark.parametrize("key", ["statistic", "p_value"])
def test_stored_statistics_are_held_to_a_relative_1e_9(
    reference_report: QualificationReport, key: str
) -> None:
    """docs/receipts.md: a stored G statistic or p-value more than a relative 1e-9 from the
    recomputed one is a problem; one within it is float noise."""
    predicate = _predicate(reference_report)
    member = next(m for m in predicate["data"]["members"] if m["result"][key] > 1e-6)
    value = float(member["result"][key])
    for scale, flagged in ((1 + 0.75e-9, False), (1 + 1.25e-9, True)):
        tampered = copy.deepcopy(predicate)
        target = next(m for m in tampered["data"]["members"] if m["name"] == member["name"])
        target["result"][key] = value * scale
        _, problems = recompute_qualification(tampered)
        assert any(f"stored {key}" in p for p in problems) is flagged, (scale, problems)
