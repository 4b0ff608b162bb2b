"""Tests that kill mutants of pp3cli/evidence/oracle.py and pp3cli/cli/oracle.py that
test_oracle.py (and tests/cli) let survive: a campaign of 2026-12-05, one AST mutation at a
time, plus hand mutants of what the tool cannot change (messages, exception types)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import pp3kernels
from pp3cli.cli.app import app
from pp3cli.evidence import oracle as oracle_module
from pp3cli.evidence.oracle import POLICIES, Policy, run_oracle


def _recording_verifier(calls: list[tuple[Any, ...]]) -> Callable[..., Any]:
    """The reference verifier, each call's positional arguments appended to ``calls``
    (verify_with passes (logits, draft_tokens, temperature, seed, position, ...))."""

    def verifier(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return pp3kernels.reference_verify_chain(*args, **kwargs)

    return verifier


def test_a_policy_quantised_onto_q_equal_p_is_refused_before_sampling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """method.md: "A policy whose counts give q(x) = p(x) exactly on a draft token is refused
    before sampling". Row 1 of the target has p(3) = 16/64 = 1/4; a draft uniform on tokens
    1..4 quantises to 16384 / 2^16 = 1/4 on each (C - 4 = 65532 splits evenly), so q(3) = p(3)
    exactly. The run raises naming the policy, row, token and value, and the verifier is
    never called."""
    point = next(p for p in POLICIES if p.name == "point-mass")
    uniform = tuple(0.25 if 1 <= v <= 4 else 0.0 for v in range(8))
    tied = Policy("tied", "row 1 uniform on 1..4", (point.rows[0], uniform, point.rows[2]),
                  (False, False, False))  # fmt: skip
    monkeypatch.setattr(oracle_module, "POLICIES", (tied,))
    calls: list[tuple[Any, ...]] = []
    with pytest.raises(
        ValueError, match="draft quantisation put q\\(x\\) = p\\(x\\) exactly"
    ) as err:
        run_oracle("cpu", 10, 0, _recording_verifier(calls), label="tied")
    assert "tied: row 1 token 3: q = p = 1/4" in str(err.value)
    assert "row 0" not in str(err.value) and "row 2" not in str(err.value)
    assert calls == []


def _recorded_keys(seed: int, n: int, chunk: int | None) -> list[tuple[list[int], list[int]]]:
    """(seeds, positions) of every verifier call of one CPU run, in call order."""
    calls: list[tuple[Any, ...]] = []
    run_oracle("cpu", n, seed, _recording_verifier(calls), label="recording", chunk=chunk)
    return [(args[3].tolist(), args[4].tolist()) for args in calls]


def test_each_policy_has_its_own_philox_key_and_each_request_its_own_counters() -> None:
    """method.md: "each request has its own Philox counters (seed per policy, position =
    request index x (K+1))". n = 5 in chunks of 2 (calls of 2, 2, 1 per policy): each policy
    runs under one key, the four keys differ (shared keys would make the members replay the
    same coins), the keys of --seed 0 and --seed 1 are disjoint, and request i's counters
    start at position 4 i across chunks, so no two requests share a counter."""
    keys: dict[int, list[int]] = {}
    for seed in (0, 1):
        calls = _recorded_keys(seed, 5, 2)
        assert [len(s) for s, _ in calls] == [2, 2, 1] * len(POLICIES)
        per_policy = [calls[3 * i : 3 * i + 3] for i in range(len(POLICIES))]
        keys[seed] = []
        for policy_calls in per_policy:
            seeds = [s for call_seeds, _ in policy_calls for s in call_seeds]
            positions = [p for _, call_positions in policy_calls for p in call_positions]
            assert len(set(seeds)) == 1, seeds
            keys[seed].append(seeds[0])
            assert positions == [4 * i for i in range(5)]
        assert len(set(keys[seed])) == len(POLICIES), keys
    assert not set(keys[0]) & set(keys[1]), keys


def test_a_failing_verifier_exits_1_after_its_receipt_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pp3 oracle`'s docstring and exit-codes.md: "1 FAIL (the receipt is still written)".
    The reference verifier with its bonus drawn from the wrong row (the planted defect that
    test_oracle's test_planted_defects_fail sees fail at n = 1200, seed 5) stands in for the
    named verifier: exit 1, one receipt whose stored verdict is FAIL and recomputes to FAIL,
    and the receipt line on stderr."""
    from pp3cli.evidence.oracle import recompute_oracle
    from pp3cli.run.errors import CheckFailed
    from pp3cli.verifiers import registry

    defective = functools.partial(pp3kernels.reference_verify_chain, defect="bonus_wrong_row")
    monkeypatch.setattr(registry, "resolve_verifier", lambda name: defective)
    receipts = tmp_path / "receipts"
    args = ["--scratch", str(tmp_path / "scratch"), "--receipts", str(receipts), "oracle"]
    args += ["--n", "1200", "--seed", "5", "--device", "cpu", "--verifier", "reference"]
    outcome = CliRunner().invoke(app, args)
    assert isinstance(outcome.exception, CheckFailed), outcome.output
    assert outcome.exception.exit_code == 1
    written = sorted(receipts.glob("oracle-*.json"))
    assert len(written) == 1
    predicate = json.loads(written[0].read_bytes())["predicate"]
    assert predicate["verdict"] == "FAIL" and predicate["data"]["family"]["rejected"]
    assert recompute_oracle(predicate) == "FAIL"
    assert f"receipt: {written[0]}  verdict: FAIL" in outcome.stderr


def test_the_results_table_has_one_row_per_policy_with_its_statistics() -> None:
    """results_table: "One line per policy: identity, outcomes, impossible hits, G, df, p,
    Holm-adjusted p", the policy column left-justified and the numbers right-justified (as in
    qualify's summary). Two synthetic members whose every number differs, so a column that
    reads the wrong field, or the other member's Holm p, shows."""
    from rich.console import Console

    from pp3cli.cli.oracle import results_table

    def member(name: str, identity: bool, outcomes: int, stats: dict[str, Any]) -> dict[str, Any]:
        law = {f"0|{t}": "1/1" for t in range(outcomes)}
        return {"name": name, "identity": identity, "law": law, "member": stats}

    result = {
        "parameters": {"verifier": "planted"},
        "verdict": "FAIL",
        "data": {
            "family": {"adjusted": {"alpha-pol": 0.25, "beta-pol": 0.0003125}},
            "policies": [
                member("alpha-pol", True, 3,
                       {"impossible_hits": 0, "statistic": 1.234, "df": 7, "p_value": 0.0625}),
                member("beta-pol", False, 5,
                       {"impossible_hits": 9, "statistic": 45.678, "df": 11, "p_value": 7.8e-5}),
            ],
        },
    }  # fmt: skip
    console = Console(width=200, record=True)
    console.print(results_table(result))
    text = console.export_text()
    assert "pp3 oracle: planted, verdict FAIL" in text
    rows = [line for line in text.splitlines() if "-pol" in line]
    cells = [[cell for cell in row.split("│")[1:-1]] for row in rows]
    assert [[c.strip() for c in row] for row in cells] == [
        ["alpha-pol", "exact", "3", "0", "1.23", "7", "0.0625", "0.25"],
        ["beta-pol", "BROKEN", "5", "9", "45.68", "11", "7.8e-05", "0.0003125"],
    ]
    # one space of padding on the justified side, the rest on the other: the shorter name
    # is padded on the right, every shorter number on the left
    assert cells[1][0] == " beta-pol  " and cells[0][0] == " alpha-pol "
    assert all(not c.endswith("  ") for row in cells for c in row[1:])
    assert cells[0][1] == "    exact " and cells[1][4] == " 45.68 "


def test_the_run_is_at_temperature_1_and_its_parameters_say_so() -> None:
    """The module docstring: "one verifier call ... at tau = 1". Every request reaches the
    verifier with temperature 1, and the receipt's parameters state the run as it was made:
    tau 1, K = 3, V = 8, C = 2^16, the exact targets as "num/den", the four policies, and the
    asked n, seed, alpha, verifier label and device."""
    from pp3cli.evidence.exact import fraction_text
    from pp3cli.evidence.oracle import DENOMINATOR, targets
    from pp3cli.evidence.profiles import MIN_EXPECTED

    calls: list[tuple[Any, ...]] = []
    result = run_oracle("cpu", 3, 7, _recording_verifier(calls), label="rec", alpha=0.01)
    temperatures = [tau for args in calls for tau in args[2].tolist()]
    assert temperatures == [1.0] * 3 * len(POLICIES)
    assert result["parameters"] == {
        "n_per_policy": 3,
        "seed": 7,
        "alpha": 0.01,
        "verifier": "rec",
        "device": "cpu",
        "temperature": 1.0,
        "k": 3,
        "vocab": 8,
        "denominator": DENOMINATOR,
        "min_expected": MIN_EXPECTED,
        "targets": [[fraction_text(p) for p in row] for row in targets()],
        "policies": [policy.name for policy in POLICIES],
    }
    assert DENOMINATOR == 1 << 16


def test_the_largest_seed_the_cli_accepts_keeps_its_keys_apart() -> None:
    """--seed < 2^60 is what keeps the four keys seed * 8 + policy below 2^63 (one int64)
    without wrapping: the largest accepted seed runs, and its keys collide with those of no
    smaller seed (here 2^59 - 1, whose keys a wrap at 2^62 would reproduce)."""
    top = _recorded_keys((1 << 60) - 1, 1, 1)
    lower = _recorded_keys((1 << 59) - 1, 1, 1)
    top_keys = {s for seeds, _ in top for s in seeds}
    lower_keys = {s for seeds, _ in lower for s in seeds}
    assert len(top_keys) == len(lower_keys) == len(POLICIES)
    assert not top_keys & lower_keys, (top_keys, lower_keys)
    assert all(0 <= key < 1 << 63 for key in top_keys | lower_keys)


def test_a_cpu_run_uses_the_cpu_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit chunk, a CPU run goes in CHUNK_CPU requests per call (the small
    one: a GPU-sized batch of 2^17 requests would be one huge interpreter launch)."""
    monkeypatch.setattr(oracle_module, "CHUNK_CPU", 2)
    monkeypatch.setattr(oracle_module, "CHUNK_GPU", 4)
    calls = _recorded_keys(0, 5, None)
    assert [len(seeds) for seeds, _ in calls] == [2, 2, 1] * len(POLICIES)


def test_an_accepted_length_past_k_is_malformed_even_with_valid_tokens() -> None:
    """A row reporting a = K + 1 is malformed (method.md: "a outside [0, K]"), also where
    every slot holds an in-range token and the first K equal the drafts, so that nothing
    else about the row is wrong. Every request is rewritten so: each policy's n requests
    are all malformed (flattened-truncated's invalidated row already carries a -1 draft)."""

    def past_k(*args: Any, **kwargs: Any) -> Any:
        result = pp3kernels.reference_verify_chain(*args, **kwargs)
        drafts = args[1]  # (logits, draft_tokens, ...)
        k = drafts.shape[1]
        tokens = result.tokens.clone()
        tokens[:, :k] = drafts.clamp(min=0).to(tokens.dtype)
        tokens[:, k] = 0
        return result._replace(tokens=tokens, accepted=torch.full_like(result.accepted, k + 1))

    result = run_oracle("cpu", 20, 1, past_k, label="past_k")
    for member in result["data"]["policies"]:
        assert member["malformed"] == 20 and member["counts"] == {}, member["name"]
    assert result["verdict"] == "FAIL"


def test_status_codes_are_counted_as_bytes_and_a_negative_one_is_a_fail() -> None:
    """status is int8 (kernels' contract): the receipt's status_counts record each request's
    status as an unsigned byte, so a verifier writing 1 (NAN) or -1 (no code at all) on some
    rows gives those counts ("1", "255") and malformed rows, a FAIL, not a crash of pp3."""

    def bad_status(*args: Any, **kwargs: Any) -> Any:
        result = pp3kernels.reference_verify_chain(*args, **kwargs)
        status = result.status.clone()
        status[0::3] = -1
        status[1::3] = 1
        return result._replace(status=status)

    result = run_oracle("cpu", 9, 2, bad_status, label="bad_status")
    for member in result["data"]["policies"]:
        assert member["status_counts"] == {"0": 3, "1": 3, "255": 3}, member["name"]
        assert member["malformed"] == 6
    assert result["verdict"] == "FAIL"
