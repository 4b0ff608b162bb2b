"""The qualification rule (pp3cli.evidence.verdict): each condition decides alone."""

from __future__ import annotations

import pytest

from pp3cli.evidence.verdict import (
    FAIL,
    PASS,
    VERDICTS,
    battery_caught,
    qualification_verdict,
    verdict_text,
)


def test_the_two_words() -> None:
    assert VERDICTS == ("PASS", "FAIL") and (PASS, FAIL) == VERDICTS
    assert verdict_text(True) == PASS and verdict_text(False) == FAIL


@pytest.mark.parametrize(
    ("family_passed", "mismatches", "edges", "caught"),
    [
        (True, 0, [True, True], False),
        (True, 0, [], False),
        (False, 0, [True], True),
        (True, 1, [True], True),
        (True, 0, [True, False, True], True),
    ],
)
def test_a_battery_is_caught_by_any_one_finding(
    family_passed: bool, mismatches: int, edges: list[bool], caught: bool
) -> None:
    assert battery_caught(family_passed, mismatches, iter(edges)) is caught


@pytest.mark.parametrize(
    ("family_passed", "mismatches", "edges", "controls", "verdict"),
    [
        (True, 0, [True], [True, True], PASS),
        (False, 0, [True], [True, True], FAIL),
        (True, 2, [True], [True, True], FAIL),
        (True, 0, [False], [True, True], FAIL),
        (True, 0, [True], [True, False], FAIL),  # a control the battery missed
    ],
)
def test_pass_needs_a_clean_battery_and_every_control_caught(
    family_passed: bool, mismatches: int, edges: list[bool], controls: list[bool], verdict: str
) -> None:
    assert qualification_verdict(family_passed, mismatches, iter(edges), iter(controls)) == verdict
