"""Exit codes a mutation campaign over ``pp3cli/run/errors.py`` found unpinned (2026-12-05).

Every constant and every error class is checked against docs/exit-codes.md's table, read
from the document itself: scripts and CI rely on those numbers, so the code may not drift.
"""

from __future__ import annotations

import re

import pytest

from pp3cli.run import errors
from pp3cli.run.errors import CheckFailed, EnvironmentProblem, Pp3Error, RankFailed, UsageProblem
from pp3cli.run.scratch import repo_root

# docs/exit-codes.md's "name" column -> the constant that must carry its code
DOC_NAMES = {
    "ok": "EXIT_OK",
    "check failed": "EXIT_CHECK_FAILED",
    "usage": "EXIT_USAGE",
    "environment": "EXIT_ENVIRONMENT",
    "internal error": "EXIT_INTERNAL",
    "rank failed": "EXIT_RANK_FAILED",
    "interrupted": "EXIT_INTERRUPTED",
}


def _documented_codes() -> dict[str, int]:
    """The table of docs/exit-codes.md as {name: code}."""
    text = (repo_root() / "docs" / "exit-codes.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([a-z ]+) \|", text, flags=re.MULTILINE)
    return {name: int(code) for code, name in rows}


def test_every_exit_constant_is_the_documented_code() -> None:
    """EXIT_OK 0 ... EXIT_INTERRUPTED 130, each as the table states it (a code shifted by one
    would make a failed check read as a usage error, or a crash as a rank failure)."""
    documented = _documented_codes()
    assert set(documented) == set(DOC_NAMES), documented
    assert {DOC_NAMES[name]: code for name, code in documented.items()} == {
        constant: getattr(errors, constant) for constant in DOC_NAMES.values()
    }


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (Pp3Error, "check failed"),  # the base class: a check failed unless a subclass says
        (CheckFailed, "check failed"),
        (UsageProblem, "usage"),
        (EnvironmentProblem, "environment"),
        (RankFailed, "rank failed"),
    ],
)
def test_each_error_class_carries_its_documented_exit_code(
    error: type[Pp3Error], name: str
) -> None:
    """docs/exit-codes.md: CheckFailed 1, UsageProblem 2, EnvironmentProblem 3, RankFailed 5;
    read from an instance, as ``main()`` does."""
    assert error("message").exit_code == _documented_codes()[name]
