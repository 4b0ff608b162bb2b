"""One exception hierarchy for pp3; the CLI turns each into its documented exit code.

Exit codes: 0 ok, 1 a check failed, 2 usage (bad input), 3 environment (no GPU where
one is required, lock held, power limit not as expected, missing tool), 4 internal error
(an exception that is not a ``Pp3Error``: a bug; ``pp3cli.cli.app.main`` saves its
traceback), 5 a rank of a distributed run failed (died, or an exchange with the other ranks
failed or timed out), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4
EXIT_RANK_FAILED = 5
EXIT_INTERRUPTED = 130


class Pp3Error(Exception):
    """Base class: a human diagnostic plus the exit code the CLI reports."""

    exit_code: int = EXIT_CHECK_FAILED


class CheckFailed(Pp3Error):
    """A verification or statistical check did not pass (exit 1)."""

    exit_code = EXIT_CHECK_FAILED


class UsageProblem(Pp3Error):
    """Bad input: names the offending value and what was expected (exit 2)."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(Pp3Error):
    """The machine is not as required: no GPU, lock held, power limit differs (exit 3)."""

    exit_code = EXIT_ENVIRONMENT


class RankFailed(Pp3Error):
    """A rank of a distributed run died or an exchange failed; no receipt was written (exit 5)."""

    exit_code = EXIT_RANK_FAILED
