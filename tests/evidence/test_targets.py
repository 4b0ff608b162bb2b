"""The toy targets: consistency, coverage of the issue's cases, fp32 margins."""

from __future__ import annotations

import math
import re
from dataclasses import FrozenInstanceError, replace
from fractions import Fraction
from pathlib import Path

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


# ---- A second campaign (2026-12-05, pp3cli/evidence/targets.py alone): each target against
# its documented definition (docs/method.md "Targets", docs/qualify.md, the module's text).

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _method_table() -> dict[str, list[str]]:
    """docs/method.md's rounding-gap table: name -> [V, K, tau, S / C, invalid row, gap]."""
    lines = (DOCS / "method.md").read_text().splitlines()
    start = lines.index(
        "| target | V | K | tau | S / C | invalid row (odd requests) | rounding gap (TV) |"
    )
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _min(p: tuple[Fraction, ...], q: tuple[Fraction, ...]) -> Fraction:
    return sum((min(a, b) for a, b in zip(p, q, strict=True)), Fraction(0))


def _residual(p: tuple[Fraction, ...], q: tuple[Fraction, ...]) -> list[int]:
    """Token ids where (p - q)+ > 0."""
    return [v for v, (a, b) in enumerate(zip(p, q, strict=True)) if a > b]


def test_targets_match_the_method_table() -> None:
    """V, K, tau, S / C and the invalid row of every target are the ones docs/method.md
    states, in that order, its rounding gap is below 1e-7 and exactly 0 where the table says
    0 (rows of powers of two); only equal_q_ties is dense."""
    table = _method_table()
    assert list(table) == [t.name for t in TARGETS]
    for target in TARGETS:
        vocab, k, tau, s_c, invalid, gap = table[target.name]
        assert (target.vocab, target.k) == (int(vocab), int(k)), target.name
        assert target.tau == float(tau), target.name
        support, denominator = (int(x) for x in s_c.split("/"))
        assert (target.support, target.denominator) == (support, denominator), target.name
        assert target.invalid_row == (None if invalid == "-" else int(invalid)), target.name
        # the stated gap's digits depend on the libm's fp32 exp (torch's and numpy's differ
        # on invalidated_proposals: 5.4e-08 and 4.8e-08); its bound and its zeros do not
        assert rounding_gap(target) < 1e-7, target.name
        assert (rounding_gap(target) == 0) == (float(gap) == 0), target.name
        assert target.q_form == ("dense" if target.name == "equal_q_ties" else "sparse")
        assert len(target.weights) == target.k + 1
        assert all(len(pairs) == target.support for pairs in target.draft)


def test_family_has_45_members() -> None:
    """docs/qualify.md: Holm over all 45 members, K + 1 slots, accepted and joint per target."""
    assert sum(t.k + 3 for t in TARGETS) == 45
    assert sum(len(member_laws(t, 10)) for t in TARGETS if not t.capped) == sum(
        t.k + 3 for t in TARGETS if not t.capped
    )


def test_request_caps_are_the_documented_ones() -> None:
    """docs/qualify.md: wide_support 256/512/2^20/2^20, split_vocab 128/256/2^20/2^20 in the
    smoke/seed/strict/exhaustive profiles; the other targets are not capped."""
    caps = {
        "wide_support": (256, 512, 1 << 20, 1 << 20),
        "split_vocab": (128, 256, 1 << 20, 1 << 20),
    }
    profiles = ("smoke", "seed", "strict", "exhaustive")
    for target in TARGETS:
        assert target.capped == (target.name in caps), target.name
        for j, profile in enumerate(profiles):
            cap = caps[target.name][j] if target.name in caps else None
            assert target.requests(profile, 1 << 40) == (1 << 40 if cap is None else cap)
            assert target.requests(profile, 7) == 7  # below the cap: all requests
            if cap is not None:
                assert target.requests(profile, cap) == cap
                assert target.requests(profile, cap + 1) == cap
        assert target.requests("no-such-profile", 123_456) == 123_456


def test_sparse_tails_rows_and_drafts() -> None:
    """Full-support rows with tails at p = 2^-12; q = 1/2 on the heaviest token, 1/4 on the
    second, 1/4 on the row's lightest (highest-id lightest) token; q > p on all three."""
    target = target_by_name("sparse_tails")
    assert target.bits == 12
    for i in range(target.k + 1):
        p = target.p(i)
        assert all(x > 0 for x in p) and min(p) == Fraction(1, 4096)
        assert sum(p) == 1
    for i in range(target.k):
        p, q = target.p(i), target.q(i)
        heavy = sorted(range(target.vocab), key=lambda v: (-p[v], v))
        lightest = max(v for v in range(target.vocab) if p[v] == min(p))
        assert [t for t, _ in target.draft[i]] == [heavy[0], heavy[1], lightest]
        assert p[heavy[0]] > p[heavy[1]]
        assert (q[heavy[0]], q[heavy[1]], q[lightest]) == (
            Fraction(1, 2),
            Fraction(1, 4),
            Fraction(1, 4),
        )
        assert all(q[v] > p[v] for v, _ in target.draft[i])


def test_disjoint_support_acceptance_is_the_documented_one() -> None:
    """One id inside and one outside the row's support (row 4: both inside, q > p on one), so the
    acceptance sum_v min(p, q) is 1/2, 1/2, 5/8, 3/4, 3/8; p = 0 entries are -inf logits."""
    target = target_by_name("disjoint_support")
    want = [Fraction(1, 2), Fraction(1, 2), Fraction(5, 8), Fraction(3, 4), Fraction(3, 8)]
    assert [_min(target.p(i), target.q(i)) for i in range(target.k)] == want
    for i in range(target.k):
        p = target.p(i)
        inside = [p[v] > 0 for v, _ in target.draft[i]]
        # both inside: then q > p on one of them (row 4: q = 7/8 on 7 where p = 1/4; the
        # other, 3, has q = 1/8 < p = 1/4, so "both inside with q > p" holds for one only)
        over = [target.q(i)[v] > p[v] for v, _ in target.draft[i]]
        assert inside.count(False) == 1 or (all(inside) and any(over)), i
    logits = target.logits()
    for i in range(target.k + 1):
        assert any(w == 0 for w in target.weights[i])  # every row is masked somewhere
        for v, w in enumerate(target.weights[i]):
            assert (logits[i, v].item() == -math.inf) == (w == 0)


def test_equal_q_ties_rows() -> None:
    """Rows 0 and 3 have q = p exactly; row 1 has q = p on two tokens and q > p on the other
    two (docs/method.md; the target's purpose string says "one token" until the pending patch
    bench/pending/targets-descriptions.patch lands); row 2 has q > p on every proposed token;
    C = 8, dense q."""
    target = target_by_name("equal_q_ties")
    p, q = [target.p(i) for i in range(target.k)], [target.q(i) for i in range(target.k)]
    assert p[0] == q[0] and p[3] == q[3]
    assert p[1] != q[1] and p[2] != q[2]
    # q = p on two of row 1's four proposed tokens (the residual is exactly 0 on all four)
    equal = [v for v, _ in target.draft[1] if q[1][v] == p[1][v]]
    assert len(equal) == 2 and target.support == 4
    assert all(q[1][v] > p[1][v] for v, _ in target.draft[1] if v not in equal)
    assert all(q[2][v] > p[2][v] for v, _ in target.draft[2])
    # uniform on the row's support where q = p: those rows are exact (tied) rows
    for i in (0, 3):
        assert target.exact_row(i)
        assert len({x for x in q[i] if x > 0}) == 1
    assert _min(p[0], q[0]) == 1 and _min(p[3], q[3]) == 1


def test_invalidated_proposals_draft_the_four_heaviest_tokens() -> None:
    """K = 5, rows over 64; q on the row's four heaviest tokens with counts 360/260/220/184
    of 1024 in decreasing order of p, q > p on each; row 1 is the invalidated one."""
    target = target_by_name("invalidated_proposals")
    assert target.bits == 6 and target.invalid_row == 1
    for i in range(target.k):
        p = target.p(i)
        order = sorted(range(target.vocab), key=lambda v: (-p[v], v))
        assert list(target.draft[i]) == list(zip(order[:4], (360, 260, 220, 184), strict=True))
        assert p[order[3]] > p[order[4]]  # the four heaviest are unambiguous
        assert all(target.q(i)[v] > p[v] for v in order[:4])


def test_point_mass_positions_propose_token_i_with_p_three_quarters() -> None:
    """S = 1, count = C = 2^16: row i always proposes token i, where p_i = 3/4; every row
    (the bonus row too) has a different heavy token."""
    target = target_by_name("point_mass_positions")
    assert target.denominator == 1 << 16
    for i in range(target.k):
        assert target.draft[i] == ((i, 1 << 16),)
        assert target.p(i)[i] == Fraction(3, 4)
        assert target.q(i)[i] == 1
    heavy = [max(range(target.vocab), key=lambda v: target.p(i)[v]) for i in range(target.k + 1)]
    assert heavy == list(range(target.k + 1))
    assert math.log2(target.tau) != round(math.log2(target.tau))


def test_wide_support_rows() -> None:
    """q = 1/256 on ids 44..299 (C = 2^16); row 0: 8 tokens outside q's support, 8 with
    p > q, 48 with p < q, 200 support ids with p = 0, so the residual lives on 16 tokens;
    the bonus row is 16 tied tokens, written as signed zeros."""
    target = target_by_name("wide_support")
    assert target.draft == (tuple((v, 256) for v in range(44, 300)),)
    p, q = target.p(0), target.q(0)
    assert all(q[v] == Fraction(1, 256) for v in range(44, 300)) and not any(q[:44])
    outside = [v for v in range(300) if p[v] > 0 and q[v] == 0]
    above = [v for v in range(300) if q[v] > 0 and p[v] > q[v]]
    below = [v for v in range(300) if q[v] > p[v] > 0]
    zero = [v for v in range(300) if q[v] > 0 and p[v] == 0]
    assert (len(outside), len(above), len(below), len(zero)) == (8, 8, 48, 200)
    assert len(_residual(p, q)) == 16
    bonus = target.p(1)
    assert sum(x > 0 for x in bonus) == 16 and target.exact_row(1) and not target.exact_row(0)
    assert set(bonus) == {Fraction(0), Fraction(1, 16)}


def test_split_vocab_rows() -> None:
    """q = 5/16 on 2047 (p = 1/8), 1/16 on 16384 (p = 1/8), 7/16 on 24576 (p = 0), 3/16 on
    32767 (p = 1/4); p and the residual sit on both sides of 2047/2048 and 16383/16384; the
    bonus row is 8 tied tokens straddling four boundaries of 2048-token chunks."""
    target = target_by_name("split_vocab")
    p, q = target.p(0), target.q(0)
    stated = {2047: (5, 16, 1, 8), 16384: (1, 16, 1, 8), 24576: (7, 16, 0, 1), 32767: (3, 16, 1, 4)}
    assert sorted(t for t, _ in target.draft[0]) == sorted(stated)
    for v, (qn, qd, pn, pd) in stated.items():
        assert (q[v], p[v]) == (Fraction(qn, qd), Fraction(pn, pd)), v
    assert all(p[v] > 0 for v in (2047, 2048, 16383, 16384))
    residual = set(_residual(p, q))
    assert {16383, 16384} <= residual and 2048 in residual and 2047 not in residual
    bonus = [v for v, x in enumerate(target.p(1)) if x > 0]
    assert len(bonus) == 8 and target.exact_row(1)
    pairs = list(zip(bonus[::2], bonus[1::2], strict=True))
    assert all(b == a + 1 and b % 2048 == 0 for a, b in pairs)
    assert {b for _, b in pairs} >= {8192, 16384, 24576}  # the interpreter's boundaries too


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_logits_are_tau_ln_p_or_signed_zeros(target: ToyTarget) -> None:
    """[K+1, V] fp32: l_v = fp32(tau * ln p_v), -inf where p_v = 0; an exact row (all positive
    weights equal) is +0.0/-0.0 alternating over token ids instead."""
    logits = target.logits()
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (target.k + 1, target.vocab)
    for i in range(target.k + 1):
        p = target.p(i)
        positive = [v for v in range(target.vocab) if p[v] > 0]
        row = logits[i]
        assert bool((row[[v for v in range(target.vocab) if p[v] == 0]] == -math.inf).all())
        exact = len({p[v] for v in positive}) == 1
        assert target.exact_row(i) == exact
        if exact:
            values = row[positive]
            assert bool((values == 0).all())
            # alternating over token ids: +0.0 on even ids, -0.0 on odd ones
            assert torch.signbit(values).tolist() == [v % 2 == 1 for v in positive]
        else:
            want = torch.tensor(
                [target.tau * math.log(p[v]) for v in positive], dtype=torch.float32
            )
            assert torch.equal(row[positive], want), (target.name, i)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_q_forms_state_the_same_exact_law(target: ToyTarget) -> None:
    """q_dense [K, V] fp32 is count / C exactly; q_tensors is (ids, counts) [K, S] int32 in
    the draft's order; both are the law q(i) (length V, summing to 1)."""
    dense = target.q_dense()
    assert dense.dtype == torch.float32 and tuple(dense.shape) == (target.k, target.vocab)
    ids, counts = target.q_tensors()
    assert ids.dtype == counts.dtype == torch.int32
    assert tuple(ids.shape) == tuple(counts.shape) == (target.k, target.support)
    for i in range(target.k):
        q = target.q(i)
        assert len(q) == target.vocab and sum(q) == 1
        for v, count in target.draft[i]:
            assert q[v] == Fraction(count, target.denominator)
        assert sum(x > 0 for x in q) == target.support
        nonzero = dense[i].nonzero().flatten().tolist()
        assert sorted(nonzero) == sorted(v for v, _ in target.draft[i])
        assert all(Fraction(dense[i, v].item()) == q[v] for v in nonzero)
        assert ids[i].tolist() == [v for v, _ in target.draft[i]]
        assert counts[i].tolist() == [c for _, c in target.draft[i]]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_steps_are_the_row_steps_of_p_and_q(target: ToyTarget) -> None:
    """K drafted steps (accept = min(p, q)) and the bonus step (stop emits p_K); an invalid
    request differs only at invalid_row, and only for a target that has one."""
    steps = target.steps(invalid=False)
    assert len(steps) == target.k + 1
    for i in range(target.k):
        want = tuple(min(a, b) for a, b in zip(target.p(i), target.q(i), strict=True))
        assert steps[i].accept == want
    assert steps[-1].stop == target.p(target.k) and not any(steps[-1].accept)
    invalid = target.steps(invalid=True)
    changed = [i for i, (a, b) in enumerate(zip(steps, invalid, strict=True)) if a != b]
    assert changed == ([] if target.invalid_row is None else [target.invalid_row])


def test_unknown_target_lists_the_known_names() -> None:
    with pytest.raises(ValueError) as info:
        target_by_name("nope")
    assert str(info.value).endswith(", ".join(t.name for t in TARGETS))
    assert all(target_by_name(t.name) is t for t in TARGETS)


def test_targets_are_fixed() -> None:
    """Fixed targets: a target cannot be changed in place, and (frozen) it is hashable."""
    target = TARGETS[0]
    with pytest.raises(FrozenInstanceError):
        target.tau = 2.0  # type: ignore[misc]
    assert len({hash(t) for t in TARGETS}) == len(TARGETS)
    assert hash(replace(target)) == hash(target) and replace(target) == target


def test_logits_of_a_hand_target() -> None:
    """Weights of 1 count as positive: an all-ones row is exact (signed zeros), and a mixed
    row is tau * ln(w / 2^bits), -inf at w = 0."""
    target = replace(GOOD, tau=0.5, weights=((1, 1, 1, 1), (2, 1, 1, 0)))
    target.validate()
    assert target.exact_row(0) and not target.exact_row(1)
    logits = target.logits()
    assert logits[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.signbit(logits[0]).tolist() == [False, True, False, True]
    ln2 = math.log(2)
    want = torch.tensor([-0.5 * ln2, -ln2, -ln2, -math.inf], dtype=torch.float32)
    assert torch.equal(logits[1], want)
