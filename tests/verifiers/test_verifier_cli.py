"""`pp3 qualify --verifier MODULE:FUNCTION` end to end, and how receipts bind a verifier's
files: a user's module is hashed into the receipt and its subject (a changed module makes
the receipt STALE); a pinned overlay file is checked against the overlay or the pins."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from pp3cli.receipts import recompute, write
from pp3cli.receipts.verify import OK, STALE, verify_receipts
from pp3cli.receipts.write import write_receipt
from pp3cli.run.scratch import repo_root
from pp3cli.verifiers import overlay

HERE = Path(__file__).resolve().parent


def _pp3(args: list[str], tmp_path: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PP3_SCRATCH=str(tmp_path / "scratch"),
        PYTHONPATH=os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, "-m", "pp3cli", "--receipts", str(tmp_path / "receipts"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo_root(),
    )


def test_module_verifier_qualifies_and_its_file_is_bound(tmp_path: Path) -> None:
    """The exact toy verifier PASSes the smoke profile with pp3's controls; the receipt
    names it, hashes its file into the subject, and goes STALE when the file changes."""
    user = tmp_path / "user"
    user.mkdir()
    module = user / "my_sampler.py"
    shutil.copy(HERE / "toy_verifiers.py", module)
    done = _pp3(
        ["qualify", "--profile", "smoke", "--verifier", "my_sampler:exact", "--json"],
        tmp_path,
        user,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    statement = orjson.loads(done.stdout)
    predicate = statement["predicate"]
    assert predicate["parameters"]["verifier"] == "my_sampler:exact"
    assert predicate["data"]["verifier"] == {
        "name": "my_sampler:exact",
        "kind": "module",
        "entry": "my_sampler:exact",
    }
    assert predicate["data"]["edge_decides"] is False
    assert predicate["data"]["edge_summary"]["differs"] == []
    assert all(c["failed_as_required"] for c in predicate["data"]["controls"])
    name = str(module.resolve())
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    assert predicate["sources"][name] == digest
    assert {"name": name, "digest": {"sha256": digest}} in statement["subject"]

    verified = _pp3(["verify-receipts", "--json"], tmp_path, user)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    module.write_text(module.read_text() + "\n# changed\n")
    stale = verify_receipts(tmp_path / "receipts", root=repo_root())
    assert [r.status for r in stale[1:]] == [STALE]
    assert name in stale[1].reasons[0]


def test_unknown_verifier_is_a_usage_error(tmp_path: Path) -> None:
    done = _pp3(["qualify", "--profile", "smoke", "--verifier", "nonsense"], tmp_path, HERE)
    assert done.returncode == 2, done.stderr
    assert "MODULE:FUNCTION" in done.stderr


def _toy(predicate: Mapping[str, Any]) -> str:
    return str(predicate["verdict"])


@pytest.fixture
def toy_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "RECEIPT_KINDS", write.RECEIPT_KINDS | {"toy"})
    monkeypatch.setitem(recompute.RECOMPUTERS, "toy", _toy)


def test_overlay_sources_are_checked_against_the_overlay_or_the_pins(
    tmp_path: Path, toy_kind: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receipt names overlay files ``overlay/<overlay>/<path>``: verify-receipts re-hashes
    ``<root>/.overlay/<overlay>/<path>`` when present, else compares with pp3's pins, so
    it is OK on a machine without the overlay and STALE when the overlay or the pins move."""
    tree = tmp_path / "tree"
    pinned = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
    local = tree / ".overlay" / "vllm-0.33.0" / pinned
    local.parent.mkdir(parents=True)
    local.write_bytes(b"def rejection_sample(): ...\n")
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    monkeypatch.setattr(overlay, "VLLM_PINS", {pinned: digest})
    name = f"overlay/vllm-0.33.0/{pinned}"
    path = write_receipt(
        tmp_path / "receipts",
        "toy",
        parameters={},
        environment={},
        data={},
        verdict="PASS",
        extra_sources={name: local},
        root=tree,
        argv=["pp3"],
    )
    subject = orjson.loads(path.read_bytes())["subject"]
    assert {"name": name, "digest": {"sha256": digest}} in subject

    def status() -> tuple[str, list[str]]:
        result = verify_receipts(tmp_path / "receipts", root=tree)[1]
        return result.status, result.reasons

    assert status() == (OK, [])
    shutil.rmtree(tree / ".overlay")  # no overlay here: the pins decide
    assert status() == (OK, [])
    monkeypatch.setattr(overlay, "VLLM_PINS", {pinned: "0" * 64})  # pp3 now pins another file
    state, reasons = status()
    assert state == STALE and name in reasons[0]
    monkeypatch.setattr(overlay, "VLLM_PINS", {pinned: digest})
    local.parent.mkdir(parents=True)
    local.write_bytes(b"def rejection_sample(): return 1\n")  # a changed overlay
    state, reasons = status()
    assert state == STALE and name in reasons[0]


def test_pair_with_from_the_command_line(tmp_path: Path) -> None:
    """--pair-with reaches the receipt: a T0 tie bug in the partner FAILs the run, and
    verify-receipts recomputes that verdict (pairing tests included) as stored."""
    done = _pp3(
        [
            "qualify",
            "--profile",
            "smoke",
            "--verifier",
            "reference",
            "--pair-with",
            "toy_verifiers:highest_id_on_ties",
            "--n-greedy",
            "300",
            "--json",
        ],
        tmp_path,
        HERE,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    predicate = orjson.loads(done.stdout)["predicate"]
    assert predicate["parameters"]["pair_with"] == "toy_verifiers:highest_id_on_ties"
    assert predicate["data"]["pair_with"]["kind"] == "module"
    pairing = predicate["data"]["pairing"]
    assert pairing["t0"] == 300 and pairing["t0_mismatches"] > 0
    assert predicate["data"]["greedy"]["mismatches"] == 0
    assert predicate["data"]["edge_decides"] is True  # the judged verifier is pp3's own
    assert "tests/verifiers/toy_verifiers.py" in predicate["sources"]
    results = verify_receipts(tmp_path / "receipts", root=repo_root())
    assert [r.status for r in results[1:]] == [OK], [r.reasons for r in results]


def test_pair_with_itself_is_a_usage_error(tmp_path: Path) -> None:
    done = _pp3(["qualify", "--verifier", "reference", "--pair-with", "reference"], tmp_path, HERE)
    assert done.returncode == 2, done.stderr
    assert "--pair-with reference" in done.stderr


def test_vllm_interpreter_blocker_names_numpy_2_4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's kernels cannot run in Triton 3.6's interpreter with numpy >= 2.4: qualify's
    precheck turns this reason into exit 3 before anything is created."""
    import numpy as np

    from pp3cli.verifiers.vllm_mrv2 import interpreter_blocker

    monkeypatch.setattr(np, "__version__", "2.4.6")
    assert "numpy 2.4.6" in (interpreter_blocker() or "")
    monkeypatch.setattr(np, "__version__", "2.3.5")
    assert interpreter_blocker() is None
