"""Tests that kill mutants a campaign over cli/app.py found surviving (tool and hand mutants).

The help a bare ``pp3`` prints, the unknown-option hint at its documented bounds, which
parse errors keep click's own message, and ``main()``'s mapping of every outcome to its
exit code with the message on stderr (docs/exit-codes.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import NoReturn

import pytest
from typer.testing import CliRunner

from pp3cli.cli import app as app_module
from pp3cli.cli.app import app, unknown_option_hint
from pp3cli.run.errors import EnvironmentProblem
from pp3cli.run.settings import Settings


@pytest.mark.parametrize(
    ("command", "help_text", "commands"),
    [
        ([], "Prove a speculative-decoding verifier exactly lossless", ("qualify", "oracle")),
        (["overlay"], "The pinned vLLM 0.33.0 rejection-sampler overlay", ("fetch", "verify")),
    ],
    ids=["pp3", "overlay"],
)
def test_a_group_without_a_command_prints_its_whole_help(
    command: list[str], help_text: str, commands: tuple[str, ...]
) -> None:
    """`pp3` and `pp3 overlay` alone show their help (what it does and its commands), not
    only click's "Missing command" usage line."""
    result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
    assert help_text in result.output and "Missing command" not in result.output, result.output
    assert all(name in result.output for name in commands), result.output


def test_a_positional_argument_keeps_its_placeholder_in_help() -> None:
    """Only yes/no flags lose their type placeholder: `overlay verify`'s PATH argument is
    still shown in the usage line."""
    result = CliRunner().invoke(app, ["overlay", "verify", "-h"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert usage.split() == ["Usage:", "pp3", "overlay", "verify", "[OPTIONS]", "[path]"]


def test_the_hint_offers_at_most_three_names_at_a_ratio_of_at_least_0_75() -> None:
    """unknown_option_hint's documented bounds: difflib ratio >= 0.75 between the names
    without dashes (abc/abcde is exactly 6/8), at most three suggestions, the value after
    '=' ignored."""
    assert unknown_option_hint("--abc", "c", ["--abcde"], []) == (
        "No such option: --abc. Did you mean --abcde?"
    )
    assert unknown_option_hint("--abc", "c", ["--abcdef"], []) == (  # 6/9 < 0.75
        "No such option: --abc. See pp3 c -h for the options."
    )
    own = ["--gpu1", "--gpu2", "--gpu3", "--gpu4"]
    hint = unknown_option_hint("--gpu=7", "qualify", own, ["--scratch"])
    assert hint.startswith("No such option: --gpu. Did you mean ") and hint.count("--gpu") == 4
    assert unknown_option_hint("--scratch=x", "probe", own, ["--scratch"]).startswith(
        "No such option: --scratch — --scratch is an option of pp3 itself"
    )


def test_an_option_missing_its_value_keeps_clicks_message() -> None:
    """Only an unknown option gets the hint: `--alpha` without a value is click's
    "requires an argument" (exit 2), not "No such option"."""
    result = CliRunner().invoke(app, ["qualify", "--alpha"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "requires an argument" in result.output and "No such option" not in result.output


def _main_with(
    monkeypatch: pytest.MonkeyPatch, raised: BaseException, capsys: pytest.CaptureFixture[str]
) -> tuple[object, str, str]:
    """main() around an app that raises ``raised``: its exit code, stdout, stderr."""

    def run() -> NoReturn:
        raise raised

    monkeypatch.setattr(app_module, "app", run)
    with pytest.raises(SystemExit) as exited:
        app_module.main()
    printed = capsys.readouterr()
    return exited.value.code, printed.out, printed.err


def test_main_maps_each_outcome_to_its_code_with_the_message_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/exit-codes.md: a Pp3Error exits with its code, `pp3: <message>` on stderr;
    Ctrl-C (while importing, or turned into exit 130 by Typer) exits 130 with
    `pp3: interrupted` on stderr; any other exit code passes through silently."""
    assert _main_with(monkeypatch, EnvironmentProblem("no GPU: x"), capsys) == (
        3,
        "",
        "pp3: no GPU: x\n",
    )
    assert _main_with(monkeypatch, KeyboardInterrupt(), capsys) == (130, "", "pp3: interrupted\n")
    assert _main_with(monkeypatch, SystemExit(130), capsys) == (130, "", "pp3: interrupted\n")
    assert _main_with(monkeypatch, SystemExit(0), capsys) == (0, "", "")
    assert _main_with(monkeypatch, SystemExit(1), capsys) == (1, "", "")


def test_a_crash_with_an_unusable_scratch_root_saves_its_traceback_in_tmp(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/exit-codes.md: when the scratch root is unusable (here `/`, which pp3 refuses
    to own), the traceback goes to a fresh /tmp/pp3-crash-*.txt, and the exit is still 4."""
    monkeypatch.setattr(app_module, "_parsed", [Settings(scratch=Path("/"), receipts=Path("r"))])
    code, out, err = _main_with(monkeypatch, ZeroDivisionError("planted"), capsys)
    assert code == 4 and out == "", (code, out)
    saved = Path(err.split("traceback saved to ")[1].strip())
    try:
        assert saved.parent == Path(tempfile.gettempdir()) and saved.name.startswith("pp3-crash-")
        assert "ZeroDivisionError: planted" in saved.read_text(encoding="utf-8")
    finally:
        saved.unlink()
