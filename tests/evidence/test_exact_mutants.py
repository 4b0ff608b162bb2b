"""Tests that kill mutants of pp3cli/evidence/exact.py that test_exact.py let survive.

The ninth campaign (2026-12-05, one AST mutation at a time against test_exact.py): every
refusal the module promises is pinned by its message, since without the explicit check
most of these inputs either slip through silently or die later on an unrelated
IndexError / NameError that names nothing the user gave.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from pp3cli.evidence.exact import (
    DraftRow,
    RowStep,
    chain_law,
    draft_law,
    marginal_laws,
    parse_outcome_key,
    validate_targets,
)

HALF, QUARTER = Fraction(1, 2), Fraction(1, 4)
C = 1 << 4


def test_draft_ids_and_counts_of_different_lengths_are_named() -> None:
    """draft_law validates its row before reading it: two ids with one count is refused with
    both lengths, not by zip's generic complaint."""
    with pytest.raises(ValueError, match="draft row has 2 ids and 1 counts: expected equal"):
        draft_law(DraftRow((0, 1), (C,), C), 2)


def test_no_target_rows_is_refused_by_name() -> None:
    """K + 1 >= 1: an empty target list is a ValueError naming the rule, not an IndexError."""
    with pytest.raises(ValueError, match="no target rows: expected K \\+ 1 >= 1 rows"):
        validate_targets([])


def test_a_negative_probability_is_refused_even_where_the_row_sums_to_1() -> None:
    """(3/2, -1/2) sums to exactly 1; one negative entry (not only an all-negative row) makes
    it no law, and validate_targets must say so rather than let chain_law build a 'law' with
    negative outcome probabilities."""
    row = [3 * HALF, -HALF]
    assert sum(row) == 1
    with pytest.raises(ValueError, match="target row 1 has a negative probability"):
        validate_targets([[HALF, HALF], row])
    with pytest.raises(ValueError, match="negative probability"):
        chain_law([row], [])


@pytest.mark.parametrize("flags", [[False, False], []], ids=["one-too-many", "none-for-k-1"])
def test_invalidation_flags_must_number_exactly_k(flags: list[bool]) -> None:
    """K = 1 takes exactly one flag: a surplus flag would otherwise be ignored silently (a
    caller's off-by-one hidden), a missing one would surface as an IndexError."""
    p = [HALF, HALF]
    with pytest.raises(ValueError, match=f"{len(flags)} invalidation flags: expected K = 1"):
        chain_law([p, p], [DraftRow((0,), (C,), C)], invalidated=flags)


def test_marginal_laws_check_that_each_law_sums_to_1() -> None:
    """marginal_laws multiplies out whatever steps it is given; a step whose accept and stop
    weights do not add up to 1 (here a bonus row of mass 1/2) must be refused ("each law sums
    to exactly 1 (checked)"), not turned into marginals of a non-law."""
    short = RowStep((Fraction(0), Fraction(0)), (QUARTER, QUARTER))
    with pytest.raises(ValueError, match="exact law sums to 1/2, expected 1"):
        marginal_laws([short])


@pytest.mark.parametrize("text", ["x|1", "1|2,y", "|"])
def test_an_outcome_key_that_is_not_integers_is_a_value_error(text: str) -> None:
    """A stored law's key that does not parse is refused as a ValueError naming the expected
    form (what verify-receipts then reports), not a NameError from pp3's own code."""
    with pytest.raises(ValueError, match="expected 'a\\|t0,...,ta'"):
        parse_outcome_key(text)
