"""pp3 oracle: exact law of the quantised draft counts vs sampled verifier outputs."""

from __future__ import annotations

import copy
import functools
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from typer.testing import CliRunner

import pp3kernels
from pp3cli.cli.app import app
from pp3cli.evidence.exact import chain_law, lossless_identity
from pp3cli.evidence.oracle import (
    DENOMINATOR,
    MALFORMED,
    POLICIES,
    judge,
    recompute_oracle,
    run_oracle,
    targets,
)
from pp3cli.evidence.profiles import ALPHA
from pp3cli.run.errors import UsageProblem

N_CPU = 1500


def test_targets_and_policies_are_well_formed() -> None:
    rows = targets()
    assert all(sum(row) == 1 for row in rows)
    assert all(p.denominator <= 64 for row in rows for p in row)  # dyadic, multiples of 1/64
    assert len(POLICIES) == 4 and len({p.name for p in POLICIES}) == 4
    k, vocab = len(rows) - 1, len(rows[0])
    for policy in POLICIES:
        assert len(policy.rows) == k and len(policy.invalidated) == k
        for row in policy.rows:
            assert len(row) == vocab and abs(sum(row) - 1) < 1e-12 and min(row) >= 0
    off = next(p for p in POLICIES if p.name == "off-support")
    assert any(off.rows[i][v] > 0 and rows[i][v] == 0 for i in range(k) for v in range(vocab))
    point = next(p for p in POLICIES if p.name == "point-mass")
    assert all(sorted(row)[-1] == 1.0 for row in point.rows)


@pytest.fixture(scope="module")
def reference_run() -> dict[str, Any]:
    return run_oracle("cpu", N_CPU, 11, pp3kernels.reference_verify_chain, label="reference")


def _predicate(result: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(json.dumps(result)))  # as stored: plain JSON types only


def test_reference_verifier_passes(reference_run: dict[str, Any]) -> None:
    assert reference_run["verdict"] == "PASS", reference_run["data"]["family"]
    assert reference_run["parameters"]["verifier"] == "reference"
    for member in reference_run["data"]["policies"]:
        assert member["identity"], member["identity_violations"]
        assert member["malformed"] == 0
        assert member["member"]["impossible_hits"] == 0
        assert sum(member["counts"].values()) == N_CPU
        assert member["status_counts"] == {"0": N_CPU}
        assert member["member"]["df"] >= 10
    # the invalidated row of flattened-truncated is never passed: a <= 2
    flat = next(m for m in reference_run["data"]["policies"] if m["name"] == "flattened-truncated")
    assert max(int(key.split("|")[0]) for key in flat["law"]) == 2


def test_exact_law_matches_the_quantised_counts(reference_run: dict[str, Any]) -> None:
    """The stored law is the exact law of the GPU-emitted integer counts, and it is lossless."""
    for member, policy in zip(reference_run["data"]["policies"], POLICIES, strict=True):
        probs = torch.tensor(policy.rows, dtype=torch.float32)
        ids, counts = pp3kernels.quantise_q(probs, DENOMINATOR)
        assert member["q_ids"] == ids.tolist() and member["q_counts"] == counts.tolist()
        assert all(sum(row) == DENOMINATOR for row in member["q_counts"])
        law = {key: Fraction(v) for key, v in member["law"].items()}
        assert sum(law.values()) == 1


def test_recomputer_agrees_and_ignores_stored_statistics(reference_run: dict[str, Any]) -> None:
    predicate = _predicate(reference_run)
    assert recompute_oracle(predicate) == "PASS"
    fake = copy.deepcopy(predicate)
    for member in fake["data"]["policies"]:
        member["member"]["p_value"] = 0.0
        member["member"]["failed_outright"] = True
    fake["data"]["family"]["passed"] = False
    assert recompute_oracle(fake) == "PASS"  # only raw counts and the exact law count


def test_recomputer_catches_tampering(reference_run: dict[str, Any]) -> None:
    base = _predicate(reference_run)

    impossible = copy.deepcopy(base)
    impossible["data"]["policies"][1]["counts"]["0|7"] = 1  # p_0(7) = 0
    impossible["data"]["policies"][1]["n"] = N_CPU + 1
    impossible["parameters"]["n_per_policy"] = N_CPU + 1
    assert recompute_oracle(impossible) == "FAIL"

    malformed = copy.deepcopy(base)
    malformed["data"]["policies"][0]["malformed"] = 1
    assert recompute_oracle(malformed) == "FAIL"  # counts no longer add up to n

    law = copy.deepcopy(base)
    key = next(iter(law["data"]["policies"][2]["law"]))
    law["data"]["policies"][2]["law"][key] = "1/3"
    assert recompute_oracle(law) == "FAIL"

    counts = copy.deepcopy(base)
    sharpened = counts["data"]["policies"][1]
    assert sharpened["name"] == "sharpened" and sharpened["q_ids"][0][4] == 4
    # token 4 has q < p, so one count more changes min(p, q) and the law
    sharpened["q_counts"][0][0] -= 1
    sharpened["q_counts"][0][4] += 1
    assert recompute_oracle(counts) == "FAIL"  # law hash no longer matches the counts

    skewed = copy.deepcopy(base)
    member = skewed["data"]["policies"][3]
    top = max(member["counts"], key=member["counts"].get)
    moved = member["counts"][top] // 2
    member["counts"][top] -= moved
    low = min(member["counts"], key=member["counts"].get)
    member["counts"][low] += moved
    assert recompute_oracle(skewed) == "FAIL"


def _fitted_point_member(rows: list[list[Fraction]]) -> dict[str, Any]:
    """A member of point drafts on tokens 1, 2, 5 whose counts are 100,000 x its exact law
    under ``rows`` (rounded): they fit that law almost perfectly."""
    law = chain_law(rows, [_point(1), _point(2), _point(5)])
    counts = {_key(k): round(p * 100_000) for k, p in law.items() if round(p * 100_000)}
    return {
        "name": "point",
        "q_ids": [[1], [2], [5]],
        "q_counts": [[DENOMINATOR], [DENOMINATOR], [DENOMINATOR]],
        "denominator": DENOMINATOR,
        "invalidated": [False, False, False],
        "counts": counts,
        "malformed": 0,
        "n": sum(counts.values()),
    }


def test_judge_uses_the_stored_target() -> None:
    """Counts that fit the true law perfectly fail when judged against another target."""
    rows = targets()
    assert lossless_identity(chain_law(rows[-1:], []), rows[-1:])  # K = 0: just p_K
    member = _fitted_point_member(rows)
    results, violations, family, verdict = judge(rows, [member], 1e-5)
    assert verdict == "PASS" and not violations[0] and results[0].p_value > 0.99
    wrong_target = [rows[0], rows[1], rows[2], rows[2]]  # bonus row replaced by row 2
    results, violations, family, verdict = judge(wrong_target, [member], 1e-5)
    assert verdict == "FAIL" and not violations[0]
    assert results[0].failed_outright  # row 2 puts 0 on token 3, where p_3 has mass
    assert family["rejected"] == ["point"]


def _point(token: int) -> Any:
    from pp3cli.evidence.exact import DraftRow

    return DraftRow((token,), (DENOMINATOR,), DENOMINATOR)


def _key(key: tuple[int, ...]) -> str:
    from pp3cli.evidence.exact import outcome_key

    return outcome_key(key)


@pytest.mark.parametrize("defect", ["accept_ge", "unclipped_residual", "bonus_wrong_row"])
def test_planted_defects_fail(defect: str) -> None:
    verifier = functools.partial(pp3kernels.reference_verify_chain, defect=defect)
    result = run_oracle("cpu", 1200, 5, verifier, label=defect)
    assert result["verdict"] == "FAIL"
    assert result["data"]["family"]["rejected"]


def test_selector_in_interpreter_passes() -> None:
    from pp3kernels.selector import verify_chain

    result = run_oracle("cpu", 600, 3, verify_chain, label="selector")
    assert result["verdict"] == "PASS", result["data"]["family"]
    assert all(m["malformed"] == 0 for m in result["data"]["policies"])


def test_malformed_rows_are_impossible() -> None:
    """A verifier that emits an accepted token different from its draft fails outright."""

    def swaps_prefix(*args: Any, **kwargs: Any) -> Any:
        result = pp3kernels.reference_verify_chain(*args, **kwargs)
        tokens = result.tokens.clone()
        hit = result.accepted >= 1
        tokens[hit, 0] = (tokens[hit, 0] + 1) % 8
        return result._replace(tokens=tokens)

    result = run_oracle("cpu", 500, 2, swaps_prefix, label="swaps_prefix")
    assert result["verdict"] == "FAIL"
    policies = result["data"]["policies"]
    assert sum(m["malformed"] for m in policies) > 0
    assert any(m["member"]["failed_outright"] for m in policies)
    assert MALFORMED == "malformed"


def test_oracle_command_writes_a_verifiable_receipt(tmp_path: Path) -> None:
    receipts = tmp_path / "receipts"
    runner = CliRunner()
    outcome = runner.invoke(
        app,
        [
            "--scratch",
            str(tmp_path / "scratch"),
            "--receipts",
            str(receipts),
            "oracle",
            "--n",
            "300",
            "--device",
            "cpu",
            "--verifier",
            "reference",
            "--json",
            "--threads",
            "2",
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    written = sorted(receipts.glob("oracle-*.json"))
    assert len(written) == 1
    statement = json.loads(written[0].read_bytes())
    assert statement["predicate"]["verdict"] == "PASS"
    # --json: stdout is the stored receipt itself; the receipt line goes to stderr
    assert outcome.stdout == written[0].read_text(), outcome.stdout[:200]
    assert f"receipt: {written[0]}  verdict: PASS" in outcome.stderr
    assert recompute_oracle(statement["predicate"]) == "PASS"


def test_oracle_command_rejects_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    outcome = runner.invoke(
        app, ["--scratch", str(tmp_path), "oracle", "--n", "0", "--device", "cpu"]
    )
    assert isinstance(outcome.exception, UsageProblem), outcome.output
    assert outcome.exception.exit_code == 2
    assert "--n 0" in str(outcome.exception)


@pytest.mark.gpu
def test_selector_on_gpu_passes_full_size() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    result = run_oracle("cuda", 200_000, 0, pp3kernels.verify_chain, label="selector")
    assert result["verdict"] == "PASS", result["data"]["family"]


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/evidence/oracle.py against test_oracle)


@pytest.mark.parametrize(
    "corruption",
    ["status", "accepted_high", "accepted_low", "token_high", "token_negative", "padding"],
)
def test_each_kind_of_malformed_output_is_counted(corruption: str) -> None:
    """Every fifth request's output is made malformed one way (a non-OK status, an accepted
    length outside [0, K], an emitted token outside [0, V), a slot past the stop that is
    not -1): the oracle counts exactly those requests as malformed, and fails."""
    corrupted = [0]

    def corrupt(*args: Any, **kwargs: Any) -> Any:
        result = pp3kernels.reference_verify_chain(*args, **kwargs)
        tokens, accepted = result.tokens.clone(), result.accepted.clone()
        status = result.status.clone()
        k, vocab = tokens.shape[1] - 1, len(targets()[0])
        pick = torch.arange(tokens.shape[0]) % 5 == 0
        if corruption == "status":
            status[pick] = 1
        elif corruption == "accepted_high":
            accepted[pick] = k + 1
        elif corruption == "accepted_low":
            accepted[pick] = -1
        elif corruption == "token_high":
            tokens[pick, 0] = vocab  # slot 0 is always emitted
        elif corruption == "token_negative":
            tokens[pick, 0] = -1
        else:
            pick &= accepted < k  # slot K is not emitted: it must hold -1
            tokens[pick, k] = 0
        corrupted[0] += int(pick.sum())
        return result._replace(tokens=tokens, accepted=accepted, status=status)

    result = run_oracle("cpu", 200, 4, corrupt, label=corruption)
    assert sum(m["malformed"] for m in result["data"]["policies"]) == corrupted[0] > 0
    assert result["verdict"] == "FAIL"


def test_one_request_per_policy_is_a_run() -> None:
    result = run_oracle("cpu", 1, 4, pp3kernels.reference_verify_chain, label="one")
    assert all(m["n"] == 1 for m in result["data"]["policies"])
    assert (result["parameters"]["k"], result["parameters"]["vocab"]) == (3, 8)
    with pytest.raises(ValueError, match="at least one request per policy"):
        run_oracle("cpu", 0, 4, pp3kernels.reference_verify_chain, label="none")


def test_counts_that_do_not_add_up_to_n_fail_alone() -> None:
    """A member whose stored n differs from its counts fails even where its counts fit
    the law perfectly; a receipt missing a policy fails its recomputation."""
    rows = targets()
    member = _fitted_point_member(rows)
    assert judge(rows, [member], 1e-5)[3] == "PASS"
    assert judge(rows, [{**member, "n": member["n"] + 1}], 1e-5)[3] == "FAIL"


def test_a_receipt_missing_a_policy_fails(reference_run: dict[str, Any]) -> None:
    fewer = _predicate(reference_run)
    fewer["data"]["policies"] = fewer["data"]["policies"][:-1]
    assert recompute_oracle(fewer) == "FAIL"
    assert recompute_oracle(_predicate(reference_run)) == "PASS"


def test_power_statements_follow_each_members_df(reference_run: dict[str, Any]) -> None:
    """Per member, at Holm's strictest level alpha / m: its power against TV 0.01 and the TV
    it detects with power 0.99, from its n and pooled df."""
    from pp3cli.evidence.stats import detectable_tv, power_of

    members = reference_run["data"]["policies"]
    alpha = reference_run["parameters"]["alpha"] / len(members)
    for member in members:
        df, power = member["member"]["df"], member["power"]
        assert df >= 1 and power["member_alpha"] == alpha
        assert power["power_at_tv_0.01"] == pytest.approx(power_of(N_CPU, 1e-2, df, alpha))
        assert power["tv_at_power_0.99"] == pytest.approx(detectable_tv(N_CPU, df, alpha, 0.99))


def test_chunks_cover_exactly_n_requests() -> None:
    """n = 50 in chunks of 16 (16, 16, 16, 2): every policy's counts add up to 50, and the
    same counts as one chunk (the counters are positions, not chunk slots)."""
    chunked = run_oracle("cpu", 50, 9, pp3kernels.reference_verify_chain, label="c", chunk=16)
    whole = run_oracle("cpu", 50, 9, pp3kernels.reference_verify_chain, label="c")
    for member, one in zip(chunked["data"]["policies"], whole["data"]["policies"], strict=True):
        assert sum(member["counts"].values()) + member["malformed"] == member["n"] == 50
        assert member["counts"] == one["counts"]


# ---- Tests that kill mutants a campaign over evidence/oracle.py found surviving


def test_power_statement_of_a_member_with_and_without_degrees_of_freedom() -> None:
    """A member with df >= 1 (one included) states its power at TV 0.01 and the TV it
    detects with power 0.99 at Holm's strictest level; one with df = 0 (a single possible
    outcome) can detect nothing: power 0, TV 1."""
    from pp3cli.evidence.oracle import _power_statement
    from pp3cli.evidence.stats import g_test, noncentrality_for_power, power_of

    half = Fraction(1, 2)
    two = g_test("two", [500, 500, 0], [half, half, Fraction(0)], 5)
    assert two.df == 1
    stated = _power_statement(two, 1000, 1e-6)
    lam = noncentrality_for_power(1, 1e-6, 0.99)
    assert stated == {
        "member_alpha": 1e-6,
        "power_at_tv_0.01": power_of(1000, 1e-2, 1, 1e-6),
        "tv_at_power_0.99": (lam / 4000) ** 0.5,
    }
    assert 0.0 < stated["tv_at_power_0.99"] < 1.0
    one = g_test("one", [1000, 0], [Fraction(1), Fraction(0)], 5)
    assert one.df == 0
    assert _power_statement(one, 1000, 1e-6) == {
        "member_alpha": 1e-6,
        "power_at_tv_0.01": 0.0,
        "tv_at_power_0.99": 1.0,
    }


def test_each_draft_policy_is_what_its_description_says() -> None:
    """The oracle's four policies, rebuilt from the target rows p_0..p_2 as their receipts'
    descriptions state them."""
    from pp3cli.evidence.oracle import POLICIES, TARGET_WEIGHTS

    by_name = {policy.name: policy for policy in POLICIES}
    assert list(by_name) == ["point-mass", "sharpened", "flattened-truncated", "off-support"]
    rows = [[w / 64 for w in row] for row in TARGET_WEIGHTS[:3]]

    def normalised(values: list[float]) -> list[float]:
        return [v / sum(values) for v in values]

    point = by_name["point-mass"]
    assert [row.index(1.0) for row in point.rows] == [1, 2, 5]
    assert all(sum(row) == 1.0 for row in point.rows)
    assert [rows[i][t] for i, t in enumerate((1, 2, 5))] == [12 / 64, 25 / 64, 2 / 64]
    expected: dict[str, list[list[float]]] = {
        "sharpened": [normalised([p * p for p in row]) for row in rows],
        "flattened-truncated": [],
        "off-support": [],
    }
    for row in rows:
        top = sorted(range(8), key=lambda v: (-row[v], v))[:4]  # ties: the lower id first
        expected["flattened-truncated"].append(
            normalised([p**0.5 if v in top else 0.0 for v, p in enumerate(row)])
        )
        holes = [v for v, p in enumerate(row) if p == 0]
        expected["off-support"].append([p / 2 + (0.5 / len(holes) if p == 0 else 0.0) for p in row])
    for name, want in expected.items():
        got = by_name[name].rows
        assert [list(row) for row in got] == [pytest.approx(row) for row in want], name
    assert by_name["flattened-truncated"].invalidated == (False, False, True)
    assert all(not any(by_name[n].invalidated) for n in ("point-mass", "sharpened", "off-support"))
    flat = by_name["flattened-truncated"].rows
    assert [sum(1 for q in row if q > 0) for row in flat] == [4, 4, 4]


# ---- Tests that kill mutants a campaign over cli/oracle.py found surviving


def test_resolve_device_maps_auto_and_refuses_cuda_without_a_gpu() -> None:
    from pp3cli.cli.oracle import resolve_device
    from pp3cli.run.errors import EnvironmentProblem

    assert resolve_device("auto", True) == "cuda" and resolve_device("auto", False) == "cpu"
    assert resolve_device("cpu", True) == "cpu" and resolve_device("cpu", False) == "cpu"
    assert resolve_device("cuda", True) == "cuda" and resolve_device("cuda:1", True) == "cuda:1"
    for asked in ("cuda", "cuda:0"):
        with pytest.raises(EnvironmentProblem, match=f"--device {asked}: torch sees no CUDA"):
            resolve_device(asked, False)
    with pytest.raises(UsageProblem, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("gpu", True)


@pytest.mark.parametrize(
    ("option", "value", "accepted"),
    [
        ("--n", "0", False),
        ("--n", "1", True),
        ("--alpha", "0", False),
        ("--alpha", "1", False),
        ("--alpha", "0.5", True),
        ("--seed", "-1", False),
        ("--seed", str((1 << 60) - 1), True),
        ("--seed", str(1 << 60), False),
        ("--device", "tpu", False),
    ],
    ids=str,
)
def test_oracle_options_at_their_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str, accepted: bool
) -> None:
    """--n >= 1, 0 < --alpha < 1, 0 <= --seed < 2^60: the bounds refused before anything
    runs (exit 2, naming the value), the values inside them reaching the run."""
    from pp3cli.cli import oracle as oracle_cli

    reached: list[str] = []
    monkeypatch.setattr(oracle_cli, "run_receipted", lambda name, *a, **k: reached.append(name))
    outcome = CliRunner().invoke(app, ["--scratch", str(tmp_path), "oracle", option, value])
    if accepted:
        assert outcome.exit_code == 0 and reached == ["oracle"], outcome.output
    else:
        assert isinstance(outcome.exception, UsageProblem), outcome.output
        message = str(outcome.exception)
        assert option in message and value in message and reached == []


@pytest.mark.parametrize(
    ("cuda_available", "n_option", "want_device", "want_n"),
    [(False, [], "cpu", 20_000), (True, [], "cuda", 200_000), (False, ["--n", "7"], "cpu", 7)],
    ids=["cpu-default-n", "gpu-default-n", "given-n"],
)
def test_oracle_runs_on_the_resolved_device_with_its_default_n(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cuda_available: bool,
    n_option: list[str],
    want_device: str,
    want_n: int,
) -> None:
    """--device auto (the default) runs on the GPU when the guard saw one, else on the CPU,
    with ORACLE_REQUESTS_GPU / _CPU requests per policy unless --n says otherwise; the
    finding's table marks each policy's identity exact or BROKEN."""
    from rich.console import Console

    from pp3cli.cli import oracle as oracle_cli
    from pp3cli.evidence import oracle as oracle_module

    calls: list[tuple[str, int, int, float]] = []
    result = run_oracle("cpu", 50, 0, pp3kernels.reference_verify_chain, label="reference")
    result["data"]["policies"][1]["identity"] = False

    def fake_run_oracle(
        device: str, n: int, seed: int, *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        calls.append((device, n, seed, kwargs["alpha"]))
        return result

    record = SimpleNamespace(cuda_available=cuda_available)  # the guard's record
    findings: list[Any] = []

    def run_receipted(name: str, settings: Any, run: Any, work: Any, **kwargs: Any) -> None:
        assert kwargs["require_gpu"] is False  # auto never requires one
        findings.append(work(record))

    monkeypatch.setattr(oracle_module, "run_oracle", fake_run_oracle)
    monkeypatch.setattr(oracle_cli, "run_receipted", run_receipted)
    outcome = CliRunner().invoke(app, ["--scratch", str(tmp_path), "oracle", *n_option])
    assert outcome.exit_code == 0, outcome.output
    assert calls == [(want_device, want_n, 0, ALPHA)]  # seed 0 and alpha 1e-5 by default
    console = Console(width=300, record=True)
    console.print(findings[0].summary)
    lines = [line for line in console.export_text().splitlines() if "│" in line]
    names = [policy["name"] for policy in result["data"]["policies"]]
    marks = {n: next(line for line in lines if n in line) for n in names}
    assert "BROKEN" in marks[names[1]] and "exact" not in marks[names[1]]
    assert all("exact" in marks[n] for n in names if n != names[1])
