"""The selector contract's numbers and its denominator check: what a mutation campaign over
``kernels/pp3kernels/contract.py`` found unpinned (its constants are only ever used by
name in the tests, so a shifted code or stream went unseen). The values are those of
docs/selector.md (status table, "stream = 1 acceptance coin, 2 residual / bonus sample,
3 synthetic drafter", C a power of two <= 2^24, padding -1): other peers and the wire read
them as numbers."""

from __future__ import annotations

import pytest

from pp3kernels.contract import (
    MAX_DENOMINATOR,
    NO_TOKEN,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAMES,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_SAMPLE,
    SelectorInputError,
    check_denominator,
    is_power_of_two_denominator,
)


def test_status_codes_streams_and_limits_are_the_documented_numbers() -> None:
    """docs/selector.md's status table (0 OK .. 4 BAD_DRAFT), the three stream tags, the
    largest denominator 2^24 (U's 24 bits times a count of 24 bits stay exact in fp64)
    and the padding token -1."""
    statuses = (STATUS_OK, STATUS_NAN, STATUS_POSINF, STATUS_ALL_MASKED, STATUS_BAD_DRAFT)
    assert statuses == (0, 1, 2, 3, 4)
    assert (STREAM_ACCEPT, STREAM_SAMPLE, STREAM_DRAFT) == (1, 2, 3)
    assert MAX_DENOMINATOR == 2**24
    assert NO_TOKEN == -1


def test_status_names() -> None:
    """The names the edge checks print for each code (one per code, no other key)."""
    assert STATUS_NAMES == {0: "ok", 1: "nan", 2: "posinf", 3: "all_masked", 4: "bad_draft"}


@pytest.mark.parametrize("denominator", [1, 2, 4, 8, 1024, 2**23, 2**24])
def test_powers_of_two_up_to_the_limit_are_denominators(denominator: int) -> None:
    """Every power of two in [1, 2^24], both ends included."""
    assert is_power_of_two_denominator(denominator)
    assert check_denominator(denominator) == denominator


@pytest.mark.parametrize(
    "denominator", [0, -1, -4, 3, 5, 6, 7, 12, 2**24 - 1, 2**24 + 1, 2**25, True, 2.0, "4", None]
)
def test_other_values_are_refused_by_name(denominator: object) -> None:
    """0, negatives, non-powers of two (odd 2^k - 1 included), anything above 2^24, a bool
    (True is 1 as an int), a float 2.0 and a string: not a denominator, and the error
    names the value and the rule."""
    assert not is_power_of_two_denominator(denominator)
    with pytest.raises(SelectorInputError) as raised:
        check_denominator(denominator)
    assert str(raised.value) == (
        f"denominator {denominator!r} is not a power of two in [1, {2**24}]"
    )
