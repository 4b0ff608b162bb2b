"""The command line end to end: in-process (CliRunner) and as a real `python -m pp3cli`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from pp3cli import __version__
from pp3cli.cli.app import app
from pp3cli.run.errors import Pp3Error
from pp3cli.run.scratch import ensure_scratch, repo_root
from pp3cli.run.settings import Settings

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pp3cli.run.locks import hold_scratch
    with hold_scratch(Path(sys.argv[1]), "holder-command", exclusive=False):
        print("held", flush=True)
        sys.stdin.read()
    """
)
COMMANDS = ("verify-receipts", "clean-scratch")


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    """Empty receipts, receipts with an unlisted file, a pp3 scratch root."""
    empty = tmp_path / "empty-receipts"
    empty.mkdir()
    broken = tmp_path / "broken-receipts"
    broken.mkdir()
    (broken / "probe-20250101T000000000000Z.json").write_text("{}\n")
    scratch = ensure_scratch(Settings(scratch=tmp_path / "scratch", receipts=empty))
    return {"empty": empty, "broken": broken, "scratch": scratch, "missing": tmp_path / "nope"}


@pytest.fixture
def lock_held(folders: dict[str, Path]) -> Iterator[int]:
    """Another process uses the scratch root (a run's shared hold); yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folders["scratch"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held", "lock holder did not start"
    yield holder.pid
    holder.stdin.close()
    holder.wait(timeout=30)


def invoke(args: list[str]) -> tuple[int, str]:
    """Run the app in-process; a Pp3Error maps to its exit code as `pp3cli.cli.app.main` does."""
    result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Pp3Error):
        return result.exception.exit_code, f"{result.output}pp3: {result.exception}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_version_and_help_in_process() -> None:
    code, output = invoke(["--version"])
    assert code == 0 and output.strip() == f"pp3 {__version__}", output
    code, output = invoke(["-h"])
    assert code == 0 and all(command in output for command in COMMANDS), output
    for command in COMMANDS:
        code, output = invoke([command, "-h"])
        assert code == 0 and "Usage:" in output and command in output, output


def test_exit_codes_in_process(folders: dict[str, Path], lock_held: int) -> None:
    scratch = str(folders["scratch"])
    code, output = invoke(["--receipts", str(folders["empty"]), "verify-receipts"])
    assert code == 0 and "no receipts in" in output, output
    code, output = invoke(["--receipts", str(folders["broken"]), "verify-receipts"])
    assert code == 1 and "FAIL: probe-20250101T000000000000Z.json" in output, output
    code, output = invoke(["--receipts", str(folders["missing"]), "verify-receipts"])
    assert code == 2 and "does not exist" in output, output
    code, output = invoke(["--scratch", "/", "clean-scratch"])
    assert code == 2 and "filesystem root" in output, output
    code, output = invoke(["verify-receipts", "--no-such-option"])
    assert code == 2 and "No such option" in output, output
    code, output = invoke(["--scratch", scratch, "clean-scratch"])
    assert code == 3 and "another pp3 is running with scratch root" in output, output


def test_real_process_exit_codes(folders: dict[str, Path], lock_held: int) -> None:
    """Each case is a real `python -m pp3cli`; they run concurrently to keep the file fast."""
    scratch = str(folders["scratch"])
    cases: list[tuple[list[str], int, str]] = [
        (["--version"], 0, f"pp3 {__version__}"),
        (["-h"], 0, "clean-scratch"),
        (["verify-receipts", "-h"], 0, "--strict"),
        (["clean-scratch", "-h"], 0, "--dry-run"),
        (["--receipts", str(folders["broken"]), "verify-receipts"], 1, "not in the manifest"),
        (["--scratch", "/", "clean-scratch"], 2, "filesystem root"),
        (["clean-scratch", "--bogus"], 2, "No such option"),
        (["--scratch", scratch, "clean-scratch"], 3, "another pp3 is running"),
    ]
    environment = {**os.environ, "COLUMNS": "200"}
    environment.pop("PP3_SCRATCH", None)
    environment.pop("PP3_RECEIPTS", None)
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "pp3cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            cwd=folders["empty"],
        )
        for args, _, _ in cases
    ]
    for process, (args, expected_code, fragment) in zip(running, cases, strict=True):
        output, _ = process.communicate(timeout=300)
        assert process.returncode == expected_code, (
            f"pp3 {' '.join(args)}: exit {process.returncode}, expected {expected_code}\n{output}"
        )
        assert fragment in output, f"pp3 {' '.join(args)}: {fragment!r} not in\n{output}"


@pytest.mark.parametrize("command", ["oracle", "probe", "qualify"])
def test_supersedes_is_checked_before_anything_runs(command: str, tmp_path: Path) -> None:
    receipts = tmp_path / "receipts"
    receipts.mkdir()
    base = ["--receipts", str(receipts), "--scratch", str(tmp_path / "s"), command]
    code, output = invoke([*base, "--supersedes", str(receipts / "absent.json")])
    assert code == 2 and "--supersede-reason" in output
    code, output = invoke(
        [*base, "--supersedes", str(receipts / "absent.json"), "--supersede-reason", "rerun"]
    )
    assert code == 2 and "absent.json" in output
    assert list(receipts.iterdir()) == []


HEAVY_MODULES = {"torch", "triton", "scipy"}


def _top_level_imports(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    """Exit code and the top-level modules a real `python -X importtime -m pp3cli` imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pp3cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    modules = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    return done.returncode, modules


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--help"], 0),
        (["--version"], 0),
        (["qualify", "--help"], 0),
        (["probe", "--help"], 0),
        (["qualify", "--bogus"], 2),
        (["oracle", "--alpha", "2"], 2),
        (["verify-receipts"], 0),
    ],
)
def test_cli_start_imports_no_torch_triton_or_scipy(
    args: list[str], code: int, folders: dict[str, Path]
) -> None:
    """--help, --version, usage errors and verify-receipts (no receipts) stay light."""
    returned, modules = _top_level_imports(
        ["--receipts", str(folders["empty"]), "--scratch", str(folders["scratch"]), *args],
        folders["empty"],
    )
    assert returned == code, (args, returned)
    assert "pp3cli" in modules and not modules & HEAVY_MODULES, sorted(modules & HEAVY_MODULES)


def test_verify_receipts_recomputes_without_torch_or_triton(tmp_path: Path) -> None:
    """A reviewer's run over real receipts imports scipy to recompute, never torch/triton."""
    receipts = repo_root() / "receipts"
    returned, modules = _top_level_imports(
        ["--receipts", str(receipts), "verify-receipts"], tmp_path
    )
    assert returned == 0
    assert "scipy" in modules and not modules & {"torch", "triton"}, sorted(modules)


@pytest.mark.parametrize("command", ["qualify", "oracle", "probe"])
def test_receipted_commands_list_their_own_and_the_shared_options(command: str) -> None:
    own = {"qualify": "--via-proxy", "oracle": "--device", "probe": "--copy-mib"}[command]
    code, output = invoke([command, "-h"])
    assert code == 0, output
    for option in (own, "--cpus", "--nice", "--threads", "--expect-power-limit", "--detach"):
        assert option in output, (option, output)
    for option in ("--supersedes", "--supersede-reason", "--json"):
        assert option in output, (option, output)
    flat = " ".join(invoke(["qualify", "-h"])[1].replace("│", " ").split())  # wrapped lines
    assert "real drafter proxy" in flat  # a command's own help text


def test_only_pp3_errors_become_exit_codes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug exits 4 (never 1, a failed check; never 2, bad input), its traceback saved."""
    from pp3cli.cli import app as app_module
    from pp3cli.run.errors import UsageProblem

    def broken() -> None:
        raise ValueError("a bug, not bad input")

    def refused() -> None:
        raise UsageProblem("bad input")

    monkeypatch.setenv("PP3_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setattr(app_module, "_parsed", [])
    monkeypatch.setattr(app_module, "app", broken)
    with pytest.raises(SystemExit) as exited:
        app_module.main()
    assert exited.value.code == 4
    stderr = capsys.readouterr().err
    assert "internal error" in stderr and "ValueError: a bug, not bad input" in stderr, stderr
    saved = Path(stderr.split("traceback saved to ")[1].strip())
    assert saved.is_relative_to(tmp_path / "scratch" / "runs"), saved
    assert "raise ValueError" in saved.read_text() and "Traceback" in saved.read_text()
    monkeypatch.setattr(app_module, "app", refused)
    with pytest.raises(SystemExit) as exited:
        app_module.main()
    assert exited.value.code == 2


# The napper restores Python's SIGINT handler first: a shell starts background jobs with SIGINT
# ignored, Python keeps an inherited SIG_IGN, and then no Ctrl-C reaches any process at all
# (a CI run started with `&` timed out here on 2026-12-02). A user's terminal has the default.
NAPPER = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from pp3cli.cli import app as pp3_app

    @pp3_app.app.command("nap")
    def nap() -> None:
        print("ready", flush=True)
        time.sleep(120)

    sys.argv = ["pp3", "nap"]
    pp3_app.main()
    """
)


def test_ctrl_c_exits_130_with_a_message() -> None:
    """A real process interrupted by SIGINT exits 130 (documented), saying so on stderr."""
    napper = subprocess.Popen(
        [sys.executable, "-c", NAPPER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert napper.stdout is not None
    assert napper.stdout.readline().strip() == "ready"
    napper.send_signal(signal.SIGINT)
    _, stderr = napper.communicate(timeout=60)
    assert napper.returncode == 130 and "pp3: interrupted" in stderr, (napper.returncode, stderr)


def test_a_crash_in_a_real_process_exits_4(tmp_path: Path) -> None:
    """An uncaught exception in a real `pp3` process: exit 4, the saved traceback named."""
    crasher = textwrap.dedent(
        """
        import sys
        from pp3cli.cli import app as pp3_app

        @pp3_app.app.command("crash")
        def crash() -> None:
            raise ZeroDivisionError("planted")

        sys.argv = ["pp3", "--scratch", sys.argv[1], "crash"]
        pp3_app.main()
        """
    )
    scratch = tmp_path / "scratch"
    done = subprocess.run(
        [sys.executable, "-c", crasher, str(scratch)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 4, (done.returncode, done.stderr)
    saved = Path(done.stderr.split("traceback saved to ")[1].strip())
    assert saved.parent.parent == scratch.resolve() / "runs" and saved.is_file(), done.stderr
    assert "ZeroDivisionError: planted" in saved.read_text()


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["oracle", "--device", "tpu"], 2, "--device 'tpu'"),
        (["oracle", "--device", "cuda"], 3, "no GPU"),
        (["probe"], 3, "no GPU"),
        (["qualify", "--profile", "smoke"], 3, "TRITON_INTERPRET is not 1"),
        (["oracle", "--device", "cpu", "--expect-power-limit", "700"], 3, "power limit"),
        (["qualify", "--alpha", "2"], 2, "--alpha 2"),
    ],
)
def test_nothing_is_created_before_validation_passes(
    args: list[str], code: int, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: a refused command leaves no run folder (nor any scratch root) behind."""
    import pynvml
    import torch

    import pp3kernels.runtime

    def no_nvml() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(pp3kernels.runtime, "is_interpreter", lambda: False)
    monkeypatch.setattr(pynvml, "nvmlInit", no_nvml)
    scratch, receipts = tmp_path / "scratch", tmp_path / "receipts"
    found, output = invoke(["--scratch", str(scratch), "--receipts", str(receipts), *args])
    assert found == code and fragment in output, output
    assert not scratch.exists() and not receipts.exists(), sorted(tmp_path.rglob("*"))


def test_a_held_device_lock_creates_nothing(tmp_path: Path) -> None:
    from pp3cli.run.locks import device_lock_name, hold_device

    scratch = tmp_path / "scratch"
    with hold_device(device_lock_name(None, cuda_available=False), "holder"):
        found, output = invoke(["--scratch", str(scratch), "oracle", "--device", "cpu"])
    assert found == 3 and "in use by another pp3" in output, output
    assert not scratch.exists()


HELP_PAGES: tuple[list[str], ...] = (
    [], ["qualify"], ["oracle"], ["probe"], ["verify-receipts"], ["clean-scratch"],
    ["overlay"], ["overlay", "fetch"], ["overlay", "verify"],
)  # fmt: skip


def _help(command: list[str], columns: int) -> str:
    result = CliRunner().invoke(app, [*command, "-h"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", HELP_PAGES, ids=lambda c: " ".join(c) or "pp3")
def test_help_shows_no_bool_placeholders_and_reflows_paragraphs(command: list[str]) -> None:
    """Finding 7: no `<bool>` on yes/no flags; a docstring paragraph is one line when wide."""
    import inspect

    from typer.main import get_command

    output = _help(command, 400)
    assert "<bool>" not in output, output
    target: Any = get_command(app)
    for name in command:
        target = target.get_command(None, name)
    for paragraph in inspect.cleandoc(target.help or "").split("\n\n"):
        flat = " ".join(paragraph.split())
        assert any(flat in line for line in output.splitlines()), (
            f"help paragraph broken across lines:\n{paragraph}\n---\n{output}"
        )


@pytest.mark.parametrize(
    ("args", "wanted", "unwanted"),
    [
        (["qualify", "--bogus"], "See pp3 qualify -h", "--cpus"),
        (["qualify", "--cpu", "3"], "Did you mean --cpus?", "Possible options"),
        (["verify-receipts", "--receipts", "x"], "option of pp3 itself", "Possible options"),
        (["verify-receipts", "--scratch", "x"], "pp3 --scratch VALUE verify-receipts", "Did you"),
    ],
)
def test_unknown_options_get_a_sane_hint(args: list[str], wanted: str, unwanted: str) -> None:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert wanted in result.output and unwanted not in result.output, result.output


def test_a_plan_prints_a_table_and_json_only_when_asked(tmp_path: Path) -> None:
    """--json is off unless given (a mutant defaulting it on passed every other test)."""
    base = ["--scratch", str(tmp_path / "s"), "--receipts", str(tmp_path / "r"), "qualify"]
    code, table = invoke([*base, "--plan", "--profile", "smoke"])
    assert code == 0 and "member" in table and not table.lstrip().startswith("{")
    code, text = invoke([*base, "--plan", "--profile", "smoke", "--json"])
    assert code == 0 and orjson.loads(text)["members"]


def test_a_detached_command_is_rerun_with_the_command_line_after_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["pp3", "--receipts", str(tmp_path / "r"), "oracle", "--detach"]
    monkeypatch.setattr(sys, "argv", argv)
    asked: list[tuple[str, list[str]]] = []

    def start(command: str, settings: Settings, args: list[str]) -> str:
        asked.append((command, list(args)))
        return "detached into a test"

    monkeypatch.setattr("pp3cli.run.detach.start_detached", start)
    code, output = invoke(argv[1:])
    assert code == 0 and "detached into a test" in output
    assert asked == [("oracle", argv[1:])]
    assert not (tmp_path / "r").exists()  # the detached run writes the receipt, not this one
