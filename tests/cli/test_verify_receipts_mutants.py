"""Tests that kill mutants a campaign over cli/verify_receipts.py found surviving.

`pp3 verify-receipts` prints one line per receipt on stdout (docs/receipts.md) and its
counts on stderr, so that stdout holds the lines alone; --json prints one object.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.run.errors import CheckFailed

UNLISTED = "probe-20250101T000000000000Z.json"


def _broken(tmp_path: Path) -> Path:
    """A receipts folder with one receipt and no manifest: two FAIL lines."""
    folder = tmp_path / "receipts"
    folder.mkdir()
    (folder / UNLISTED).write_text("{}\n")
    return folder


def test_stdout_holds_one_line_per_receipt_and_stderr_the_counts(tmp_path: Path) -> None:
    """The counts line goes to stderr; FAIL raises CheckFailed (exit 1) naming how many
    of how many failed."""
    folder = _broken(tmp_path)
    result = CliRunner().invoke(app, ["--receipts", str(folder), "verify-receipts"])
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["FAIL", "FAIL"], result.stdout
    assert lines[0] == "FAIL: MANIFEST.jsonl — manifest missing"
    assert lines[1].startswith(f"FAIL: {UNLISTED} — not in the manifest")
    assert result.stderr == "0 OK, 0 STALE, 0 ORPHAN, 2 FAIL\n"
    assert isinstance(result.exception, CheckFailed) and result.exception.exit_code == 1
    assert str(result.exception) == "2 of 2 failed verification"


def test_json_is_one_object_of_the_documented_shape(tmp_path: Path) -> None:
    """docs/receipts.md: {"receipts", "strict", "counts", "results": [{"file", "status",
    "reasons"}]}, alone on stdout, nothing on stderr."""
    folder = _broken(tmp_path)
    result = CliRunner().invoke(
        app, ["--receipts", str(folder), "verify-receipts", "--json", "--strict"]
    )
    payload = orjson.loads(result.stdout)
    assert set(payload) == {"receipts", "strict", "counts", "results"}
    assert payload["receipts"] == str(folder) and payload["strict"] is True
    assert payload["counts"] == {"OK": 0, "STALE": 0, "ORPHAN": 0, "FAIL": 2}
    assert [set(r) for r in payload["results"]] == [{"file", "status", "reasons"}] * 2
    assert [r["file"] for r in payload["results"]] == ["MANIFEST.jsonl", UNLISTED]
    assert result.stderr == "" and isinstance(result.exception, CheckFailed)
