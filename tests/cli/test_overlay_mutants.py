"""`pp3 overlay fetch|verify`, which a mutation campaign over ``cli/overlay.py`` found
unpinned (no test ran either command, only their help).

docs/probe.md: fetch writes ``<scratch>/overlay/vllm-0.33.0/`` (or ``--dest DIR/...``),
never overwrites one (exit 2 with its path; ``--force-new`` takes the next number) and
prints the overlay's path; verify re-hashes the overlay at PATH, else at the default place
(exit 1 naming the first mismatch), and with ``--signature`` also prints the entry's
signature. The pins pp3 carries are swapped for a one-file fake wheel's where a command
must succeed.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.run.errors import Pp3Error
from pp3cli.verifiers import overlay

ENTRY = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
ENTRY_SOURCE = b"def rejection_sample(target_logits, draft_logits, num_speculative_steps: int):\n"
ENTRY_SOURCE += b"    return None\n"
PINS = {ENTRY: hashlib.sha256(ENTRY_SOURCE).hexdigest()}


def invoke(args: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr; a Pp3Error maps to its exit code as ``main`` does."""
    result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Pp3Error):
        return result.exception.exit_code, result.stdout, f"{result.stderr}{result.exception}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "fake.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(ENTRY, ENTRY_SOURCE)
    return path


@pytest.fixture
def fake_pins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fake wheel's pins in place of vLLM's, for the commands and the functions they
    call (whose ``pins`` defaults were bound to ``VLLM_PINS`` at import); no ``vllm``
    module is left loaded."""
    verify = overlay.verify_overlay

    def verify_fake(overlay_dir: Path, pins: object = None) -> dict[str, Any]:
        return verify(overlay_dir, PINS)

    for name in ("fetch_overlay", "load_vllm_rejection_sample"):
        monkeypatch.setattr(overlay, name, functools.partial(getattr(overlay, name), pins=PINS))
    monkeypatch.setattr(overlay, "verify_overlay", verify_fake)
    monkeypatch.setattr(overlay, "VLLM_PINS", PINS)
    yield
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def test_verify_looks_at_the_path_else_dest_else_the_scratch_overlay(tmp_path: Path) -> None:
    """No overlay anywhere: the refusal (exit 3) names the folder each form resolves to."""
    scratch = str(tmp_path / "scratch")
    cases = [
        ([], tmp_path / "scratch" / "overlay" / "vllm-0.33.0"),
        (["--dest", str(tmp_path / "d")], tmp_path / "d" / "vllm-0.33.0"),
        ([str(tmp_path / "p"), "--dest", str(tmp_path / "d")], tmp_path / "p"),
    ]
    for extra, folder in cases:
        code, out, err = invoke(["--scratch", scratch, "overlay", "verify", *extra])
        assert code == 3 and err.startswith(f"{folder} is not a pp3 vLLM overlay"), (extra, err)
        assert out == ""


def test_verify_prints_ok_and_only_with_signature_the_entrys_signature(
    tmp_path: Path, fake_pins: None
) -> None:
    """An intact overlay: "OK: <path>" on stdout; ``--signature`` adds the imported
    entry's signature, and without it nothing is imported."""
    target = overlay.fetch_overlay(tmp_path / "scratch", wheel=_wheel(tmp_path))
    args = ["--scratch", str(tmp_path / "scratch"), "overlay", "verify"]
    assert invoke(args) == (0, f"OK: {target}\n", "")
    assert "vllm" not in sys.modules
    code, out, _ = invoke([*args, "--signature"])
    assert code == 0 and out == (
        f"OK: {target}\nrejection_sample(target_logits, draft_logits, num_speculative_steps: int)\n"
    )


def test_verify_fails_naming_the_changed_file(tmp_path: Path, fake_pins: None) -> None:
    """A pinned file edited on disk: exit 1 naming it, and no "OK"."""
    target = overlay.fetch_overlay(tmp_path, dest=tmp_path / "o", wheel=_wheel(tmp_path))
    (target / ENTRY).write_bytes(ENTRY_SOURCE + b"# edited\n")
    code, out, err = invoke(["overlay", "verify", str(target)])
    assert code == 1 and err.startswith(f"{ENTRY}: sha256 "), err
    assert out == ""


def test_fetch_prints_the_new_overlay_on_stdout_and_progress_on_stderr(
    tmp_path: Path, fake_pins: None
) -> None:
    """stdout is the overlay's path alone (for scripts); what it fetched and each pinned
    file checked go to stderr."""
    dest = tmp_path / "o"
    code, out, err = invoke(
        ["overlay", "fetch", "--dest", str(dest), "--wheel", str(_wheel(tmp_path))]
    )
    assert (code, out) == (0, f"{dest / 'vllm-0.33.0'}\n"), err
    assert err.splitlines() == ["fetching vllm==0.33.0 (about 336 MB) ...", f"OK: {ENTRY}"]
    assert overlay.verify_overlay(dest / "vllm-0.33.0")["files"] == PINS


def test_fetch_never_overwrites_unless_force_new(tmp_path: Path) -> None:
    """An existing overlay: exit 2 with its path before the wheel is read; with
    ``--force-new`` the wheel is read (this one lacks vLLM's pinned files: exit 1) and
    nothing is written."""
    dest = tmp_path / "o"
    (dest / "vllm-0.33.0").mkdir(parents=True)
    args = ["overlay", "fetch", "--dest", str(dest), "--wheel", str(_wheel(tmp_path))]
    code, _, err = invoke(args)
    assert code == 2 and f"an overlay already exists at {dest / 'vllm-0.33.0'}" in err, err
    code, _, err = invoke([*args, "--force-new"])
    assert code == 1 and "missing from fake.whl" in err, err
    assert sorted(p.name for p in dest.iterdir()) == ["vllm-0.33.0"]
