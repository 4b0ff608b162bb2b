"""Exact rational chain law (pp3cli.evidence.exact): the lossless identity and its failure modes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from fractions import Fraction

import pytest

from pp3cli.evidence.exact import (
    DraftRow,
    RowStep,
    accepted_length_law,
    chain_law,
    clipped_residual,
    conditional_slot_laws,
    draft_law,
    final_token_law,
    fraction_from_text,
    identity_violations,
    law_from_json,
    law_sha256,
    law_to_json,
    lossless_identity,
    marginal_laws,
    parse_outcome_key,
    row_step,
    slot_marginals,
    validate_targets,
)

C = 1 << 10


def _random_target(rng: random.Random, vocab: int, zeros: int = 0) -> list[Fraction]:
    weights = [rng.randint(1, 20) for _ in range(vocab)]
    for index in rng.sample(range(vocab), zeros):
        weights[index] = 0
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


def _random_draft(rng: random.Random, vocab: int, support: int) -> DraftRow:
    ids = sorted(rng.sample(range(vocab), support))
    cuts = sorted(rng.sample(range(1, C), support - 1))
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, C], strict=True)]
    return DraftRow(tuple(ids), tuple(counts), C)


def _point(token: int) -> DraftRow:
    return DraftRow((token,), (C,), C)


def _first_token_law(law: dict[tuple[int, ...], Fraction], vocab: int) -> list[Fraction]:
    marginal = slot_marginals(law, 1)[0]
    return [marginal.get(v, Fraction(0)) for v in range(vocab)]


@pytest.mark.parametrize("case", range(12))
def test_single_step_emits_exactly_p(case: int) -> None:
    rng = random.Random(1000 + case)
    vocab = rng.randint(2, 8)
    p = _random_target(rng, vocab, zeros=rng.randint(0, vocab - 1))
    bonus = _random_target(rng, vocab)
    draft = _random_draft(rng, vocab, rng.randint(1, vocab))
    law = chain_law([p, bonus], [draft])
    assert sum(law.values()) == 1
    assert _first_token_law(law, vocab) == p
    assert lossless_identity(law, [p, bonus])


def test_disjoint_support_always_rejects_and_emits_p() -> None:
    p = [Fraction(1, 2), Fraction(1, 2), Fraction(0), Fraction(0)]
    draft = DraftRow((2, 3), (C // 4, 3 * C // 4), C)
    law = chain_law([p, p], [draft])
    assert accepted_length_law(law) == {0: Fraction(1)}
    assert law == {(0, 0): Fraction(1, 2), (0, 1): Fraction(1, 2)}


def test_equal_q_always_accepts() -> None:
    p = [Fraction(1, 4), Fraction(3, 4)]
    bonus = [Fraction(1, 8), Fraction(7, 8)]
    draft = DraftRow((0, 1), (C // 4, 3 * C // 4), C)
    law = chain_law([p, bonus], [draft])
    assert accepted_length_law(law) == {1: Fraction(1)}
    assert law[(1, 1, 1)] == Fraction(3, 4) * Fraction(7, 8)


def test_point_mass_draft() -> None:
    p = [Fraction(1, 8), Fraction(5, 8), Fraction(2, 8)]
    bonus = [Fraction(1, 3), Fraction(1, 3), Fraction(1, 3)]
    law = chain_law([p, bonus], [_point(1)])
    assert accepted_length_law(law) == {0: Fraction(3, 8), 1: Fraction(5, 8)}
    # rejecting the point mass at 1 emits from (p - q)+ = p without token 1
    assert law[(0, 0)] == Fraction(1, 8) and law[(0, 2)] == Fraction(2, 8)
    assert (0, 1) not in law
    assert _first_token_law(law, 3) == p


def test_chain_marginals_and_identity() -> None:
    rng = random.Random(7)
    vocab, k = 5, 3
    targets = [_random_target(rng, vocab, zeros=1) for _ in range(k + 1)]
    drafts = [_random_draft(rng, vocab, rng.randint(1, vocab)) for _ in range(k)]
    law = chain_law(targets, drafts)
    assert sum(law.values()) == 1
    assert all(len(key) == key[0] + 2 for key in law)
    assert lossless_identity(law, targets)
    marginals = slot_marginals(law, k + 1)
    assert all(sum(m.values()) == 1 for m in marginals)
    assert [marginals[0].get(v, 0) for v in range(vocab)] == targets[0]
    # P(slot 1 emitted) = P(accept row 0) = sum min(p_0, q_0)
    q0 = draft_law(drafts[0], vocab)
    reach = sum((min(a, b) for a, b in zip(targets[0], q0, strict=True)), Fraction(0))
    assert 1 - marginals[1].get(-1, Fraction(0)) == reach
    # the emitted token at slot 1 has law reach * p_1 on tokens
    assert [marginals[1].get(v, 0) for v in range(vocab)] == [reach * p for p in targets[1]]
    lengths = accepted_length_law(law)
    assert sum(lengths.values()) == 1
    finals = final_token_law(law)
    for a, prob in lengths.items():
        assert sum(v for (aa, _), v in finals.items() if aa == a) == prob


def test_invalidated_row_emits_target_and_stops() -> None:
    rng = random.Random(3)
    vocab, k = 4, 3
    targets = [_random_target(rng, vocab) for _ in range(k + 1)]
    drafts = [_random_draft(rng, vocab, 2) for _ in range(k)]
    law = chain_law(targets, drafts, invalidated=[False, True, False])
    assert max(accepted_length_law(law)) == 1
    assert lossless_identity(law, targets)
    assert sum(law.values()) == 1


def test_wrong_residuals_break_the_identity() -> None:
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]
    bonus = [Fraction(1, 4)] * 4
    draft = DraftRow((0, 1, 2), (C // 4, C // 2, C // 4), C)
    good = chain_law([p, bonus], [draft])
    assert lossless_identity(good, [p, bonus])

    def unclipped(pr: Sequence[Fraction], qr: Sequence[Fraction]) -> list[Fraction]:
        return [abs(a - b) for a, b in zip(pr, qr, strict=True)]  # |p - q| instead of (p - q)+

    def target_again(pr: Sequence[Fraction], qr: Sequence[Fraction]) -> list[Fraction]:
        return list(pr)  # resample from p on rejection

    for rule in (unclipped, target_again):
        bad = chain_law([p, bonus], [draft], residual=rule)
        assert sum(bad.values()) == 1
        assert not lossless_identity(bad, [p, bonus])
        assert identity_violations(bad, [p, bonus])[0].startswith("slot 0")
    assert chain_law([p, bonus], [draft], residual=clipped_residual) == good


def test_identity_catches_wrong_bonus_row() -> None:
    p0 = [Fraction(1, 2), Fraction(1, 2)]
    p1 = [Fraction(1, 4), Fraction(3, 4)]
    law = chain_law([p0, p1], [_point(0)])
    assert not lossless_identity(law, [p0, p0])  # bonus judged against the wrong row


def test_validation_names_the_problem() -> None:
    p = [Fraction(1, 2), Fraction(1, 2)]
    with pytest.raises(ValueError, match="sums to 3/4"):
        chain_law([[Fraction(1, 4), Fraction(1, 2)], p], [_point(0)])
    with pytest.raises(ValueError, match="sum to 1000"):
        chain_law([p, p], [DraftRow((0, 1), (500, 500), C)])
    with pytest.raises(ValueError, match="appears twice"):
        chain_law([p, p], [DraftRow((0, 0), (512, 512), C)])
    with pytest.raises(ValueError, match="power of two"):
        chain_law([p, p], [DraftRow((0,), (1000,), 1000)])
    with pytest.raises(ValueError, match="expected 0 <= id < V"):
        chain_law([p, p], [DraftRow((5,), (C,), C)])
    with pytest.raises(ValueError, match="K = 1"):
        chain_law([p, p], [])
    # padding entries are fine
    assert chain_law([p, p], [DraftRow((0, -1), (C, 0), C)]) == chain_law([p, p], [_point(0)])


def test_law_json_round_trip_and_hash() -> None:
    rng = random.Random(5)
    targets = [_random_target(rng, 4) for _ in range(3)]
    drafts = [_random_draft(rng, 4, 3) for _ in range(2)]
    law = chain_law(targets, drafts)
    data = law_to_json(law)
    assert law_from_json(data) == law
    assert law_sha256(law) == law_sha256(law_from_json(data))
    changed = dict(law)
    key = next(iter(changed))
    changed[key] += Fraction(1, 10**9)
    assert law_sha256(changed) != law_sha256(law)
    with pytest.raises(ValueError, match="a \\+ 1 tokens"):
        parse_outcome_key("2|1,2")


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/evidence/exact.py against test_exact, test_stats and test_oracle)

HALF = Fraction(1, 2)


def test_draft_rows_at_the_edges_of_validity() -> None:
    """A denominator of 1 and a zero count on a real id are valid; padding is only (-1, 0):
    -1 with a count is an id out of range; a zero count still claims its id (a second
    entry for it is a duplicate); id V is out of range."""
    assert draft_law(DraftRow((1,), (1,), 1), 3) == [0, 1, 0]
    assert draft_law(DraftRow((2, 0), (0, 4), 4), 3) == [1, 0, 0]
    with pytest.raises(ValueError, match="draft support id -1: expected 0 <= id < V = 3"):
        draft_law(DraftRow((-1, 1), (1, 3), 4), 3)
    with pytest.raises(ValueError, match="appears twice"):
        draft_law(DraftRow((2, 2), (0, 4), 4), 3)
    with pytest.raises(ValueError, match="draft support id 3: expected 0 <= id < V = 3"):
        draft_law(DraftRow((3,), (4,), 4), 3)
    with pytest.raises(ValueError, match="draft count -1 for id 1"):
        draft_law(DraftRow((0, 1), (5, -1), 4), 3)
    with pytest.raises(ValueError, match="power of two >= 1"):
        draft_law(DraftRow((), (), 0), 3)


def test_target_rows_need_one_common_positive_length() -> None:
    with pytest.raises(ValueError, match="target row 0 has 0 entries"):
        validate_targets([[]])
    with pytest.raises(ValueError, match="target row 1 has 3 entries: expected V = 2"):
        validate_targets([[HALF, HALF], [HALF, HALF, Fraction(0)]])


@pytest.mark.parametrize(
    ("weights", "why"),
    [([HALF], "one weight for two tokens"), ([0, 0], "zero sum"), ([2, -1], "a negative")],
)
def test_a_residual_rule_must_give_non_negative_weights_with_positive_sum(
    weights: list[Fraction], why: str
) -> None:
    p, q = [Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 4), Fraction(3, 4)]
    with pytest.raises(ValueError, match="non-negative weights with positive sum"):
        row_step(p, q, residual=lambda _p, _q: [Fraction(w) for w in weights])


@pytest.mark.parametrize("text", ["1", "a/2", "1/b", "1/0", "1/-2", "/2", "1/"])
def test_fraction_text_must_be_numerator_over_positive_denominator(text: str) -> None:
    with pytest.raises(ValueError, match="expected 'numerator/denominator'"):
        fraction_from_text(text)


def test_fraction_text_round_trip_of_a_negative_numerator() -> None:
    assert fraction_from_text("-3/4") == Fraction(-3, 4)


def test_final_token_and_conditional_laws_of_a_small_law() -> None:
    """(a, t0, ..., ta) outcomes: the final token is the last one; t0's law sums the
    outcomes that share it, whatever follows."""
    law = {(0, 3): Fraction(1, 4), (1, 3, 4): Fraction(1, 4), (1, 2, 5): HALF}
    assert final_token_law(law) == {(0, 3): Fraction(1, 4), (1, 4): Fraction(1, 4), (1, 5): HALF}
    assert conditional_slot_laws(law) == {
        (0, ()): {3: HALF, 2: HALF},
        (1, (3,)): {4: Fraction(1)},
        (1, (2,)): {5: Fraction(1)},
    }


def test_identity_checks_tokens_the_law_never_emits_and_slots_past_the_targets() -> None:
    """Row p = (1/2, 1/2, 0): a law that emits 0 and 2 half each matches p at token 0 only;
    both token 1 (p > 0, never emitted) and token 2 (emitted, p = 0) are reported. A slot
    past the last target row is reported too."""
    targets = [[HALF, HALF, Fraction(0)]]
    problems = identity_violations({(0, 0): HALF, (0, 2): HALF}, targets)
    assert problems == [
        "slot 0 after prefix []: P(t=1) = 0, p_0 = 1/2",
        "slot 0 after prefix []: P(t=2) = 1/2, p_0 = 0",
    ]
    beyond = identity_violations({(1, 0, 1): Fraction(1)}, targets)
    assert "slot 1 beyond the 1 target rows" in beyond


def test_exact_rows_are_frozen() -> None:
    step = row_step([HALF, HALF], None)
    for frozen, field in ((DraftRow((0,), (1,), 1), "denominator"), (step, "stop")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, 0)


def test_identity_reports_a_token_past_the_vocabulary() -> None:
    """A law that emits token V (outside p's row) is reported against p = 0, not raised on."""
    problems = identity_violations({(0, 0): HALF, (0, 2): HALF}, [[HALF, HALF]])
    assert "slot 0 after prefix []: P(t=2) = 1/2, p_0 = 0" in problems


def test_law_json_keeps_certain_outcomes_and_drops_impossible_ones() -> None:
    assert law_to_json({(0, 1): Fraction(1), (0, 2): Fraction(0)}) == {"0|1": "1/1"}


def test_draft_row_count_must_be_k() -> None:
    p = [HALF, HALF]
    with pytest.raises(ValueError, match="1 draft rows for 3 target rows: expected K = 2"):
        chain_law([p, p, p], [_point(0)])


# ---- A second campaign (2026-12-05, pp3cli/evidence/exact.py against test_exact and
# test_stats): the marginal laws of a chain worked by hand, the K = 0 chain, and rows of
# mismatched lengths.
#
# The hand chain, V = 2, K = 2 (every number below is worked from the procedure by hand):
#   row 0: p0 = (1/2, 1/2), q0 = point mass on 0. accept0 = min(p0, q0) = (1/2, 0); reject
#          w.p. 1/2 and emit from (p0 - q0)+ = (0, 1/2) normalised = (0, 1): stop0 = (0, 1/2).
#   row 1: p1 = (1/4, 3/4), q1 = (1/2, 1/2). accept1 = (1/4, 1/2); reject w.p. 1/4 and emit
#          from (p1 - q1)+ = (0, 1/4) normalised = (0, 1): stop1 = (0, 1/4).
#   row 2 (bonus): p2 = (1/3, 2/3): stop2 = p2.
# Reaching row 1 needs x0 = 0 (1/2); reaching row 2 needs x0 = 0 and any x1 (1/2 * 3/4 = 3/8).

THIRD, QUARTER, EIGHTH = Fraction(1, 3), Fraction(1, 4), Fraction(1, 8)
HAND_TARGETS = [[HALF, HALF], [QUARTER, 3 * QUARTER], [THIRD, 2 * THIRD]]
HAND_DRAFTS = [_point(0), DraftRow((0, 1), (C // 2, C // 2), C)]


def test_hand_chain_joint_law() -> None:
    """Outcome (a, x_0..x_{a-1}, z): prod accept_i(x_i) * stop_a(z)."""
    assert chain_law(HAND_TARGETS, HAND_DRAFTS) == {
        (0, 1): HALF,  # reject at row 0, emit 1
        (1, 0, 1): HALF * QUARTER,  # accept 0, reject at row 1, emit 1
        (2, 0, 0, 0): HALF * QUARTER * THIRD,  # accept 0, accept 0, bonus 0
        (2, 0, 0, 1): HALF * QUARTER * 2 * THIRD,
        (2, 0, 1, 0): HALF * HALF * THIRD,  # accept 0, accept 1, bonus 0
        (2, 0, 1, 1): HALF * HALF * 2 * THIRD,
    }


def _hand_steps(invalidated: bool) -> list[RowStep]:
    q0, q1 = (draft_law(d, 2) for d in HAND_DRAFTS)
    return [
        row_step(HAND_TARGETS[0], q0),
        row_step(HAND_TARGETS[1], None if invalidated else q1),
        row_step(HAND_TARGETS[2], None),
    ]


def test_hand_chain_steps() -> None:
    steps = _hand_steps(invalidated=False)
    assert [(s.accept, s.stop) for s in steps] == [
        ((HALF, 0), (0, HALF)),
        ((QUARTER, HALF), (0, QUARTER)),
        ((0, 0), (THIRD, 2 * THIRD)),
    ]


def test_hand_chain_marginal_laws() -> None:
    """reach = (1, 1/2, 3/8); slot j = reach_j (accept_j + stop_j), then 1 - reach_j;
    accepted = reach_i sum stop_i; joint = reach_i stop_i(v), i-major."""
    assert marginal_laws(_hand_steps(invalidated=False)) == {
        "slot0": [HALF, HALF, 0],
        "slot1": [EIGHTH, 3 * EIGHTH, HALF],
        "slot2": [EIGHTH, QUARTER, 5 * EIGHTH],
        "accepted": [HALF, EIGHTH, 3 * EIGHTH],
        "joint": [0, HALF, 0, EIGHTH, EIGHTH, QUARTER],
    }


def test_hand_chain_marginal_laws_with_row_1_invalidated() -> None:
    """Row 1 invalidated: reached w.p. 1/2, it emits z ~ p1 and stops; row 2 is never reached."""
    assert marginal_laws(_hand_steps(invalidated=True)) == {
        "slot0": [HALF, HALF, 0],
        "slot1": [EIGHTH, 3 * EIGHTH, HALF],
        "slot2": [0, 0, 1],
        "accepted": [HALF, HALF, 0],
        "joint": [0, HALF, EIGHTH, 3 * EIGHTH, 0, 0],
    }


@pytest.mark.parametrize("case", range(4))
def test_marginal_laws_agree_with_the_enumerated_law(case: int) -> None:
    """The O(K V) product form and chain_law's prefix enumeration are two derivations of the
    same law: their slot, accepted-length and (a, t_a) marginals must coincide."""
    rng = random.Random(2000 + case)
    vocab, k = rng.randint(2, 4), rng.randint(1, 3)
    targets = [_random_target(rng, vocab, zeros=rng.randint(0, vocab - 1)) for _ in range(k + 1)]
    drafts = [_random_draft(rng, vocab, rng.randint(1, vocab)) for _ in range(k)]
    flags = [rng.random() < 0.3 for _ in range(k)]
    law = chain_law(targets, drafts, invalidated=flags)
    steps = [
        row_step(targets[i], None if flags[i] else draft_law(drafts[i], vocab)) for i in range(k)
    ]
    laws = marginal_laws([*steps, row_step(targets[k], None)])
    for j, slot in enumerate(slot_marginals(law, k + 1)):
        assert laws[f"slot{j}"] == [slot.get(v, Fraction(0)) for v in [*range(vocab), -1]]
    lengths = accepted_length_law(law)
    assert laws["accepted"] == [lengths.get(a, Fraction(0)) for a in range(k + 1)]
    finals = final_token_law(law)
    assert laws["joint"] == [
        finals.get((a, v), Fraction(0)) for a in range(k + 1) for v in range(vocab)
    ]


def test_a_chain_of_no_drafts_is_its_bonus_row() -> None:
    """K = 0: one target row and no drafts; the chain emits z ~ p_0 with a = 0."""
    p = [QUARTER, 3 * QUARTER]
    assert chain_law([p], []) == {(0, 0): QUARTER, (0, 1): 3 * QUARTER}
    assert marginal_laws([row_step(p, None)]) == {
        "slot0": [QUARTER, 3 * QUARTER, 0],
        "accepted": [Fraction(1)],
        "joint": [QUARTER, 3 * QUARTER],
    }


def test_rows_of_mismatched_lengths_are_refused_not_truncated() -> None:
    """p and q over different vocabularies, or a step whose accept and stop rows differ in
    length, raise; dropping the extra entries would silently lose (here zero) mass."""
    with pytest.raises(ValueError):
        clipped_residual([HALF, HALF], [Fraction(1)])
    with pytest.raises(ValueError):
        row_step([Fraction(1), Fraction(0)], [Fraction(1)])  # would accept surely, V = 1
    malformed = RowStep((Fraction(1),), (Fraction(0), Fraction(0)))
    with pytest.raises(ValueError):
        marginal_laws([malformed, row_step([HALF, HALF], None)])
