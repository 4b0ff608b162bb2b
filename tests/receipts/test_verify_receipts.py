"""verify-receipts: every kind of tampering FAILs, moved sources are STALE (FAIL if --strict)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from pp3cli.cli.app import app
from pp3cli.receipts import recompute, write
from pp3cli.receipts.verify import FAIL, OK, ORPHAN, STALE, Result, verify_receipts
from pp3cli.receipts.write import canonical_json, manifest_line, write_receipt
from pp3cli.run.errors import Pp3Error

TOY = "toy"


def make_tree(root: Path) -> Path:
    (root / "pp3cli").mkdir(parents=True)
    (root / "kernels").mkdir()
    (root / "pp3cli" / "logic.py").write_text("# logic\n")
    (root / "kernels" / "selector.py").write_text("# selector\n")
    (root / "pyproject.toml").write_text("[project]\n")
    return root


def toy_verdict(predicate: Mapping[str, Any]) -> str:
    """The toy law: PASS iff the observed count is at most the threshold."""
    data = predicate["data"]
    return "PASS" if data["count"] <= predicate["parameters"]["threshold"] else "FAIL"


@pytest.fixture
def toy_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "RECEIPT_KINDS", write.RECEIPT_KINDS | {TOY})
    monkeypatch.setitem(recompute.RECOMPUTERS, TOY, toy_verdict)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


@pytest.fixture
def written(tmp_path: Path, tree: Path, toy_kind: None) -> list[Path]:
    """Three honest toy receipts: PASS, FAIL, PASS."""
    folder = tmp_path / "receipts"
    return [
        write_receipt(
            folder,
            TOY,
            parameters={"threshold": 5},
            environment={"gpu_name": None},
            data={"count": count},
            verdict=verdict,
            root=tree,
            argv=["pp3", "toy"],
        )
        for count, verdict in ((3, "PASS"), (9, "FAIL"), (5, "PASS"))
    ]


def statuses(results: list[Result]) -> dict[str, str]:
    return {result.file: result.status for result in results}


def report(results: list[Result]) -> str:
    return "\n".join(result.line() for result in results)


def manifest_of(receipt: Path) -> Path:
    return receipt.parent / "MANIFEST.jsonl"


def rebuild_manifest(folder: Path) -> None:
    """A forger's tidy-up: re-hash every listed file and re-chain the manifest."""
    manifest = folder / "MANIFEST.jsonl"
    files = [orjson.loads(line)["file"] for line in manifest.read_bytes().splitlines()]
    prev = None
    out = b""
    for seq, name in enumerate(files, start=1):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        line = manifest_line(seq, name, digest, prev)
        out += line + b"\n"
        prev = hashlib.sha256(line).hexdigest()
    manifest.write_bytes(out)


def forge(receipt: Path, stored: bytes) -> None:
    """Replace a receipt's bytes and keep the manifest chain consistent with them."""
    receipt.write_bytes(stored)
    rebuild_manifest(receipt.parent)


def edit_statement(receipt: Path, change: Any) -> None:
    """Apply ``change`` to the parsed statement and store it canonically, chain rebuilt."""
    statement = orjson.loads(receipt.read_bytes())
    change(statement)
    forge(receipt, canonical_json(statement) + b"\n")


def check(folder: Path, tree: Path, *, strict: bool = False) -> list[Result]:
    return verify_receipts(folder, root=tree, strict=strict)


def test_honest_receipts_are_ok(written: list[Path], tree: Path) -> None:
    results = check(written[0].parent, tree, strict=True)
    assert statuses(results) == {"MANIFEST.jsonl": OK, **{p.name: OK for p in written}}, report(
        results
    )
    assert results[1].line() == f"OK: {written[0].name}"


def test_empty_folder_has_nothing_to_verify(tmp_path: Path, tree: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert check(tmp_path / "empty", tree) == []
    with pytest.raises(Pp3Error) as err:
        check(tmp_path / "absent", tree)
    assert err.value.exit_code == 2 and "absent" in str(err.value)


def test_edited_byte_fails(written: list[Path], tree: Path) -> None:
    stored = bytearray(written[1].read_bytes())
    stored[stored.index(b'"count":9') + 8] = ord("2")
    written[1].write_bytes(bytes(stored))
    results = check(written[1].parent, tree)
    assert statuses(results)[written[1].name] == FAIL, report(results)
    assert "differs from the manifest" in report(results)
    assert statuses(results)[written[0].name] == OK, report(results)


def test_deleted_manifest_line_fails(written: list[Path], tree: Path) -> None:
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(lines[0] + lines[2])
    results = check(written[0].parent, tree)
    found = statuses(results)
    assert found[written[1].name] == FAIL and found[written[2].name] == FAIL, report(results)
    assert found["MANIFEST.jsonl"] == FAIL and "not in the manifest" in report(results)
    assert "seq 3, expected 2" in report(results)


def test_reordered_manifest_lines_fail(written: list[Path], tree: Path) -> None:
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(lines[1] + lines[0] + lines[2])
    results = check(written[0].parent, tree)
    found = statuses(results)
    assert found["MANIFEST.jsonl"] == FAIL, report(results)
    assert all(found[p.name] == FAIL for p in written), report(results)


def test_replaced_manifest_line_fails(written: list[Path], tree: Path) -> None:
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines(keepends=True)
    entry = orjson.loads(lines[0])
    entry["sha256"] = "0" * 64  # a canonical, well-formed, but different line
    manifest.write_bytes(canonical_json(entry) + b"\n" + lines[1] + lines[2])
    results = check(written[0].parent, tree)
    found = statuses(results)
    assert found[written[0].name] == FAIL and found[written[1].name] == FAIL, report(results)
    assert "chain is broken" in report(results)


def test_unlisted_receipt_is_orphan_while_the_chain_is_intact(
    written: list[Path], tree: Path
) -> None:
    """A receipt without its line (a writer killed in between) is ORPHAN, never FAIL."""
    stray = written[0].parent / "toy-20990101T000000000000Z.json"
    stray.write_bytes(written[0].read_bytes())
    results = check(written[0].parent, tree)
    found = statuses(results)
    assert found[stray.name] == ORPHAN, report(results)
    assert f"ORPHAN: {stray.name} — not in the manifest" in report(results)
    assert all(found[p.name] == OK for p in written) and found["MANIFEST.jsonl"] == OK
    assert statuses(check(written[0].parent, tree, strict=True))[stray.name] == FAIL


def test_unlisted_receipt_with_bad_content_fails(written: list[Path], tree: Path) -> None:
    stray = written[0].parent / "toy-20990101T000000000000Z.json"
    stray.write_bytes(written[0].read_bytes().replace(b'"count":3', b'"count":9'))
    results = check(written[0].parent, tree)
    assert statuses(results)[stray.name] == FAIL, report(results)
    assert "not in the manifest" in report(results)


@pytest.mark.parametrize(
    ("forged", "fragment"),
    [
        (b'"count":3,"count":99', "duplicate key 'count'"),
        (b'"count":NaN', "non-finite number NaN"),
        (b'"count":1e999', "non-finite number 1e999"),
    ],
)
def test_non_strict_json_fails_even_with_a_consistent_chain(
    written: list[Path], tree: Path, forged: bytes, fragment: str
) -> None:
    stored = written[0].read_bytes()
    forge(written[0], stored.replace(b'"count":3', forged, 1))
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert fragment in report(results), report(results)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda s: s["predicate"].pop("verdict"), "missing ['verdict']"),
        (lambda s: s.update(predicateType="https://pp3.dev/probe/v1"), "does not match kind"),
        (lambda s: s["predicate"].update(schema_version=2), "schema_version 2"),
        (lambda s: s["predicate"].update(argv="pp3 toy"), "predicate.argv is str"),
        (lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"), "_type"),
        (lambda s: s["subject"][0]["digest"].update(sha256="f" * 64), "differs from predicate"),
        (lambda s: s.update(subject=[]), "not in the subject"),
        (lambda s: s["predicate"]["git"].update(dirty="yes"), "predicate.git"),
    ],
)
def test_wrong_schema_fails(written: list[Path], tree: Path, change: Any, fragment: str) -> None:
    edit_statement(written[0], change)
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL and fragment in report(results), report(
        results
    )


def test_verdict_not_implied_by_the_data_fails(written: list[Path], tree: Path) -> None:
    edit_statement(written[0], lambda s: s["predicate"]["data"].update(count=6))
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert "stored verdict PASS but the raw data imply FAIL" in report(results)


def test_recomputer_that_raises_fails(written: list[Path], tree: Path) -> None:
    edit_statement(written[0], lambda s: s["predicate"]["data"].pop("count"))
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL and "KeyError" in report(results), report(
        results
    )


def test_kind_without_recomputer_fails(
    written: list[Path], tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(recompute.RECOMPUTERS, TOY)
    results = check(written[0].parent, tree)
    assert all(statuses(results)[p.name] == FAIL for p in written), report(results)
    assert "no recomputer for kind toy" in report(results)


def test_every_receipt_kind_has_a_recomputer() -> None:
    assert set(recompute.RECOMPUTERS) == set(write.RECEIPT_KINDS)


def test_supersedes_must_reference_an_earlier_receipt_by_hash(
    written: list[Path], tree: Path
) -> None:
    folder = written[0].parent
    good = {
        "file": written[0].name,
        "sha256": hashlib.sha256(written[0].read_bytes()).hexdigest(),
        "reason": "threshold corrected",
    }
    bad_hash = {**good, "sha256": "1" * 64}
    missing = {**good, "file": "toy-20000101T000000000000Z.json"}
    made = [
        write_receipt(
            folder, TOY, parameters={"threshold": 5}, environment={}, data={"count": 1},
            verdict="PASS", supersedes=[reference], root=tree,
        )
        for reference in (good, bad_hash, missing)
    ]  # fmt: skip
    results = check(folder, tree)
    found = statuses(results)
    assert found[made[0].name] == OK, report(results)
    assert found[made[1].name] == FAIL and f"with sha256 {'1' * 64}" in report(results)
    assert found[made[2].name] == FAIL and "does not exist" in report(results)


def test_changed_source_is_stale_and_fails_when_strict(written: list[Path], tree: Path) -> None:
    (tree / "kernels" / "selector.py").write_text("# selector, improved\n")
    results = check(written[0].parent, tree)
    assert all(statuses(results)[p.name] == STALE for p in written), report(results)
    assert f"STALE: {written[0].name} — sources moved on since: changed kernels/selector.py" in (
        report(results)
    )
    strict = check(written[0].parent, tree, strict=True)
    assert all(statuses(strict)[p.name] == FAIL for p in written), report(strict)


def test_added_source_is_stale(written: list[Path], tree: Path) -> None:
    (tree / "pp3cli" / "new.py").write_text("# new\n")
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == STALE and "added pp3cli/new.py" in report(results)


def invoke(args: list[str]) -> tuple[int, str]:
    """Run the app; a Pp3Error maps to its exit code as the console entry point does."""
    result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Pp3Error):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_command_lines_json_and_exit_codes(written: list[Path], tree: Path) -> None:
    folder = str(written[0].parent)
    code, output = invoke(["--receipts", folder, "verify-receipts", "--source-root", str(tree)])
    assert code == 0 and f"OK: {written[2].name}" in output, output
    code, output = invoke(
        ["--receipts", folder, "verify-receipts", "--json", "--source-root", str(tree)]
    )
    payload = orjson.loads(output.strip().splitlines()[0])
    assert code == 0 and payload["counts"] == {"OK": 4, "STALE": 0, "ORPHAN": 0, "FAIL": 0}, output
    (tree / "kernels" / "selector.py").write_text("# moved on\n")
    code, output = invoke(["--receipts", folder, "verify-receipts", "--source-root", str(tree)])
    assert code == 0 and "STALE:" in output, output
    code, output = invoke(
        ["--receipts", folder, "verify-receipts", "--strict", "--source-root", str(tree)]
    )
    assert code == 1 and f"FAIL: {written[0].name} — sources moved on" in output, output


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-01)


def test_supersedes_with_a_blank_reason_fails(written: list[Path], tree: Path) -> None:
    reference = {
        "file": written[0].name,
        "sha256": hashlib.sha256(written[0].read_bytes()).hexdigest(),
        "reason": "   ",
    }
    edit_statement(written[2], lambda s: s["predicate"]["supersedes"].append(reference))
    results = check(written[2].parent, tree)
    assert statuses(results)[written[2].name] == FAIL, report(results)
    assert "without a reason" in report(results), report(results)


def test_non_canonical_bytes_fail_even_with_a_consistent_chain(
    written: list[Path],
    tree: Path,
) -> None:
    statement = orjson.loads(written[0].read_bytes())
    forge(written[0], orjson.dumps(statement, option=orjson.OPT_INDENT_2) + b"\n")
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert "not in canonical form" in report(results), report(results)


# ---- Tests that kill mutants the suite missed (a second campaign, 2026-12-05: one AST
# mutation at a time in pp3cli/receipts/verify.py against tests/receipts and test_probe)


def _reference(receipt: Path, reason: str = "replaced") -> dict[str, str]:
    return {
        "file": receipt.name,
        "sha256": hashlib.sha256(receipt.read_bytes()).hexdigest(),
        "reason": reason,
    }


def test_supersedes_a_later_or_unlisted_receipt_fails(written: list[Path], tree: Path) -> None:
    """Only an earlier manifest entry can be superseded: not a later one (by the right
    hash), and not a file on disk that the manifest never listed."""
    folder = written[0].parent
    later = _reference(written[2])
    edit_statement(written[0], lambda s: s["predicate"]["supersedes"].append(later))
    results = check(folder, tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert f"supersedes {written[2].name}, which is not earlier in the manifest" in report(results)
    assert statuses(results)[written[2].name] == OK, report(results)

    unlisted = folder / "toy-20000101T000000000000Z.json"
    unlisted.write_bytes(written[1].read_bytes())
    made = write_receipt(
        folder, TOY, parameters={"threshold": 5}, environment={}, data={"count": 1},
        verdict="PASS", supersedes=[_reference(unlisted)], root=tree,
    )  # fmt: skip
    results = check(folder, tree)
    assert statuses(results)[made.name] == FAIL, report(results)
    assert f"supersedes {unlisted.name}, which is not earlier in the manifest" in report(results)


def test_a_receipt_cannot_supersede_itself(written: list[Path], tree: Path) -> None:
    """A reference to the receipt's own manifest entry is not an earlier one (whatever its
    hash, which cannot match the bytes that contain it)."""
    itself = _reference(written[1])
    edit_statement(written[1], lambda s: s["predicate"]["supersedes"].append(itself))
    results = check(written[1].parent, tree)
    assert statuses(results)[written[1].name] == FAIL, report(results)
    assert f"supersedes {written[1].name}, which is not earlier in the manifest" in report(results)


def test_receipts_without_their_manifest_fail(written: list[Path], tree: Path) -> None:
    manifest_of(written[0]).unlink()
    results = check(written[0].parent, tree)
    assert statuses(results)["MANIFEST.jsonl"] == FAIL and "manifest missing" in report(results)
    assert {p.name for p in written} <= set(statuses(results)), report(results)


def test_a_bool_where_an_int_is_expected_fails(written: list[Path], tree: Path) -> None:
    """JSON true is not the integer 1 (Python's bool is an int subclass)."""
    edit_statement(written[0], lambda s: s["predicate"].update(schema_version=True))
    results = check(written[0].parent, tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert "predicate.schema_version is bool" in report(results), report(results)


def test_a_torn_manifest_tail_reports_its_length(written: list[Path], tree: Path) -> None:
    with manifest_of(written[0]).open("ab") as manifest:
        manifest.write(b'{"seq":4')
    results = check(written[0].parent, tree)
    assert "a torn last line of 8 bytes without its newline" in report(results), report(results)


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("tools/my_verifier.py", "tools/my_verifier.py"),  # a user's verifier, in the tree
        (".overlay/peer-1/pkg/sampler.py", "overlay/peer-1/pkg/sampler.py"),  # a local overlay
    ],
)
def test_extra_sources_are_hashed_again_where_they_lie(
    tmp_path: Path, tree: Path, toy_kind: None, where: str, name: str
) -> None:
    """A recorded source outside the tree's source patterns is re-hashed where it lies (an
    ``overlay/<name>/<path>`` under ``<root>/.overlay/``): OK while unchanged, STALE once
    changed, and missing once gone (pp3 pins no digest for these paths)."""
    source = tree / where
    source.parent.mkdir(parents=True)
    source.write_text("# mine\n")
    folder = tmp_path / "receipts"
    made = write_receipt(
        folder, TOY, parameters={"threshold": 5}, environment={}, data={"count": 1},
        verdict="PASS", extra_sources={name: source}, root=tree,
    )  # fmt: skip
    assert statuses(check(folder, tree, strict=True))[made.name] == OK
    source.write_text("# mine, edited\n")
    results = check(folder, tree)
    assert statuses(results)[made.name] == STALE, report(results)
    assert f"changed {name}" in report(results), report(results)
    source.unlink()
    assert f"missing {name}" in report(check(folder, tree))


def test_long_source_listings_are_cut_after_four_names(written: list[Path], tree: Path) -> None:
    for index in range(4):
        (tree / "pp3cli" / f"new{index}.py").write_text("# new\n")
    four = report(check(written[0].parent, tree))
    assert "added pp3cli/new0.py, pp3cli/new1.py, pp3cli/new2.py, pp3cli/new3.py\n" in four + "\n"
    assert "more (" not in four
    for index in range(4, 6):
        (tree / "pp3cli" / f"new{index}.py").write_text("# new\n")
    six = report(check(written[0].parent, tree))
    assert (
        "added pp3cli/new0.py, pp3cli/new1.py, pp3cli/new2.py, pp3cli/new3.py and 2 more (6 files)"
        in six
    )
