"""The toy targets: consistency, coverage of the issue's cases, fp32 margins."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

from pp3cli.evidence.family import member_laws
from pp3cli.evidence.targets import TARGETS, ToyTarget, rounding_gap, target_by_name


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_target_is_consistent(target: ToyTarget) -> None:
    target.validate()
    if target.capped:  # the costly wide target: few rows, a large vocabulary and support
        assert target.k >= 1 and target.vocab >= 256
    else:
        assert 5 <= target.vocab <= 16
        assert target.k in (4, 5)
    assert target.purpose and target.draft_policy


def test_targets_cover_every_input_form() -> None:
    """Finding 8: dense q, a temperature that is not a power of two, a support S >= 256."""
    assert any(t.q_form == "dense" for t in TARGETS) and any(t.q_form == "sparse" for t in TARGETS)
    assert any(math.log2(t.tau) != round(math.log2(t.tau)) for t in TARGETS)
    wide = [t for t in TARGETS if t.support >= 256]
    assert wide and all(t.requests("seed", 20_000) < 20_000 for t in wide)
    assert all(t.requests("strict", 1 << 30) >= 1 << 20 for t in wide)
    # a real vocabulary size, so that the GPU takes the split-vocabulary launch
    large = [t for t in TARGETS if t.vocab >= 32768]
    assert large and all(t.requests("strict", 1 << 30) >= 1 << 20 for t in large)


def test_targets_cover_the_required_cases() -> None:
    assert len(TARGETS) == 7
    assert {t.k for t in TARGETS if not t.capped} == {4, 5}
    assert any(t.tau < 1 for t in TARGETS) and any(t.tau > 1 for t in TARGETS)
    assert any(t.invalid_row is not None for t in TARGETS)
    assert any(t.support == 1 for t in TARGETS)  # point-mass drafts
    # sparse full-target tails: a full-support row with a token of probability <= 2^-12
    assert any(
        all(w > 0 for w in t.weights[i]) and min(t.p(i)) <= Fraction(1, 4096)
        for t in TARGETS
        for i in range(t.k + 1)
    )
    # disjoint support: a draft token with q > 0 where p = 0
    assert any(
        t.q(i)[v] > 0 and t.p(i)[v] == 0
        for t in TARGETS
        for i in range(t.k)
        for v in range(t.vocab)
    )
    # q equal to p on a whole row
    assert any(t.q(i) == t.p(i) for t in TARGETS for i in range(t.k))
    # tied logits written with both signed zeros
    signed = [
        t
        for t in TARGETS
        if any(
            (row == 0).sum() > 1
            and torch.signbit(row[row == 0]).any()
            and (~torch.signbit(row[row == 0])).any()
            for row in t.logits()
        )
    ]
    assert signed


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_positions_have_different_targets(target: ToyTarget) -> None:
    rows = [target.p(i) for i in range(target.k + 1)]
    assert rows[-1] != rows[-2], "bonus row must differ from the last draft row"
    assert len(set(rows)) >= target.k


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_fp32_softmax_keeps_every_exact_comparison(target: ToyTarget) -> None:
    """sign(p_fp32(v) - q(v)) == sign(p(v) - q(v)) on every draft support token, and
    p = 0 stays exactly 0: so rounding cannot reach an outcome of exact probability 0."""
    logits = target.logits() / target.tau
    e = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    p32 = e / e.sum(dim=-1, keepdim=True)
    for i in range(target.k + 1):
        p_exact = target.p(i)
        zero = torch.tensor([p == 0 for p in p_exact])
        assert bool((p32[i][zero] == 0.0).all())
        if i == target.k:
            continue
        for v, count in target.draft[i]:
            exact = p_exact[v] - Fraction(count, target.denominator)
            got = Fraction(p32[i, v].item()) - Fraction(count, target.denominator)
            assert (exact > 0) == (got > 0) and (exact == 0) == (got == 0), (target.name, i, v)
            if exact != 0:
                assert abs(float(exact)) > 1e-4


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_rounding_gap_is_tiny(target: ToyTarget) -> None:
    assert rounding_gap(target) < 1e-6


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_laws_sum_to_one_and_slots_are_lossless(target: ToyTarget) -> None:
    laws = {law.name.split("/")[1]: law.probs for law in member_laws(target, 1000)}
    for probs in laws.values():
        assert sum(probs) == 1 and probs[-1] == 0
    # the accepted-length law and the joint law agree on P(accepted = i)
    for i in range(target.k + 1):
        joint = sum(laws["joint"][i * target.vocab : (i + 1) * target.vocab])
        assert joint == laws["accepted"][i]
    # slot j emits p_j with probability P(accepted >= j): losslessness
    for j in range(target.k + 1):
        reach = sum(laws["accepted"][j : target.k + 1])
        assert list(laws[f"slot{j}"][: target.vocab]) == [reach * p for p in target.p(j)]


def test_logits_are_finite_or_minus_inf() -> None:
    for target in TARGETS:
        for value in target.logits().flatten().tolist():
            assert math.isfinite(value) or value == -math.inf


def test_target_by_name() -> None:
    assert target_by_name("sparse_tails") is TARGETS[0]
    with pytest.raises(ValueError, match="unknown target 'nope'"):
        target_by_name("nope")


GOOD = ToyTarget(
    name="good",
    purpose="x",
    draft_policy="x",
    tau=1.0,
    bits=2,
    weights=((1, 1, 1, 1), (1, 1, 1, 1)),
    draft=(((0, 2), (3, 2)),),
    denominator=4,
)


def test_validate_names_the_problem() -> None:
    bad = replace(GOOD, name="bad", weights=((1, 1, 1, 0), (1, 1, 1, 1)), draft=(((0, 4),),))
    with pytest.raises(ValueError, match="row 0 weights"):
        bad.validate()


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/evidence/targets.py and family.py)


def test_valid_edge_targets_pass() -> None:
    """The first row may be the invalidated one, and C = 1 is a power of two."""
    GOOD.validate()
    replace(GOOD, invalid_row=0).validate()
    replace(GOOD, denominator=1, draft=(((2, 1),),)).validate()


def test_an_invalid_request_drops_only_its_invalid_row_draft() -> None:
    """steps(invalid=True): the invalid_row's step is a certain stop emitting p (no draft),
    every other row's is the drafted one of a valid request."""
    target = target_by_name("invalidated_proposals")
    assert target.invalid_row is not None
    valid, invalid = target.steps(invalid=False), target.steps(invalid=True)
    for i, (a, b) in enumerate(zip(valid, invalid, strict=True)):
        if i == target.invalid_row:
            assert b.stop == target.p(i) and not any(b.accept)
            assert a != b
        else:
            assert a == b


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tau": 0.0}, "must be positive and finite"),
        ({"tau": -1.0}, "must be positive and finite"),
        ({"tau": math.inf}, "must be positive and finite"),
        ({"tau": math.nan}, "must be positive and finite"),
        ({"denominator": 6, "draft": (((0, 3), (3, 3)),)}, "not a power of two"),
        ({"draft": (((0, 2), (0, 2)),)}, "needs S distinct ids"),
        (
            {"weights": ((1, 1, 1, 1),) * 3, "draft": (((0, 2), (3, 2)), ((1, 4),))},
            "draft row 1 ((1, 4),) needs S distinct ids",
        ),
        ({"draft": (((0, 2), (4, 2)),)}, "has a bad id or count"),
        ({"draft": (((0, 4), (3, 0)),)}, "has a bad id or count"),
        ({"draft": (((0, 2), (3, 1)),)}, "mass != 4"),
        ({"invalid_row": 1}, "invalid_row 1 outside [0, 1)"),
        ({"q_form": "dense "}, "is not 'sparse' or 'dense'"),
        ({"weights": ((1, 1, 1, 1),)}, "1 target rows, expected K+1=2"),
    ],
)
def test_validate_refuses_each_inconsistency(change: dict[str, object], fragment: str) -> None:
    bad = replace(GOOD, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(fragment)):
        bad.validate()


def test_member_kinds_name_slots_and_the_two_chain_laws() -> None:
    kinds = {law.name.split("/")[1]: law.kind for law in member_laws(TARGETS[0], 10)}
    assert kinds["accepted"] == "accepted" and kinds["joint"] == "joint"
    assert all(kind == "slot" for key, kind in kinds.items() if key.startswith("slot"))
    assert sum(key.startswith("slot") for key in kinds) == TARGETS[0].k + 1


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_rounding_gap_is_the_largest_row_total_variation(target: ToyTarget) -> None:
    """rounding_gap = max over rows of (1/2) sum_v |softmax32(l / tau) - p|, the fp32
    softmax as the contract computes it (torch's exp, as the module uses)."""
    scaled = target.logits() / target.tau
    e = torch.exp(scaled - scaled.amax(dim=1, keepdim=True))
    p32 = (e / e.sum(dim=1, keepdim=True)).double().numpy()
    exact = np.array([[float(x) for x in target.p(i)] for i in range(target.k + 1)])
    want = float((0.5 * np.abs(p32 - exact).sum(axis=1)).max())
    assert rounding_gap(target) == pytest.approx(want, rel=1e-6, abs=1e-12)
