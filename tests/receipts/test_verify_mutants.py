"""verify-receipts: the checks a mutation campaign over ``pp3cli/receipts/verify.py``
found unpinned (thirty-fifth session: AST operator mutants and statement deletions against
tests/receipts). Each test tampers with one honest toy receipt, re-chains the manifest so
only the targeted check can object, and pins the status and the exact reason it gives."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_verify_receipts import (
    TOY,
    _reference,
    edit_statement,
    forge,
    make_tree,
    manifest_of,
    report,
    statuses,
    toy_kind,
)

from pp3cli.receipts import recompute
from pp3cli.receipts.verify import FAIL, OK, ORPHAN, STALE, Result, strict_loads, verify_receipts
from pp3cli.receipts.write import canonical_json, manifest_line, write_receipt
from pp3cli.verifiers import overlay

pytestmark = pytest.mark.usefixtures(toy_kind.__name__)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


@pytest.fixture
def written(tmp_path: Path, tree: Path) -> list[Path]:
    """Three honest toy receipts (PASS, FAIL, PASS) in one chain."""
    return [
        write_receipt(
            tmp_path / "receipts", TOY, parameters={"threshold": 5},
            environment={"gpu_name": None}, data={"count": count}, verdict=verdict,
            root=tree, argv=["pp3", "toy"],
        )
        for count, verdict in ((3, "PASS"), (9, "FAIL"), (5, "PASS"))
    ]  # fmt: skip


def reasons_of(results: list[Result], name: str) -> list[str]:
    (found,) = [result for result in results if result.file == name]
    return found.reasons


def expect(results: list[Result], wanted: dict[str, str], reasons: dict[str, list[str]]) -> None:
    """Every artefact has ``wanted``'s status, and each one ``reasons`` names gives exactly
    those reasons, in order."""
    assert statuses(results) == wanted, report(results)
    for name, want in reasons.items():
        assert reasons_of(results, name) == want, report(results)


def test_a_manifest_line_of_the_wrong_shape_is_quoted_to_120_bytes(
    written: list[Path], tree: Path
) -> None:
    """A complete line that is strict JSON but not exactly ``{seq, file, sha256, prev}`` is
    a FAIL of the manifest quoting the line's first 120 bytes; the receipt it named is then
    unlisted in a broken chain, so it FAILs too. The chain goes on over the line's bytes:
    the next line, chained to them, is sound."""
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines()
    entry = orjson.loads(lines[1])
    entry["note"] = "x" * 200
    bad = canonical_json(entry)
    assert len(bad) > 121
    last = orjson.loads(lines[2])
    last["prev"] = hashlib.sha256(bad).hexdigest()
    manifest.write_bytes(lines[0] + b"\n" + bad + b"\n" + canonical_json(last) + b"\n")
    results = verify_receipts(written[0].parent, root=tree)
    expect(
        results,
        {"MANIFEST.jsonl": FAIL, written[0].name: OK, written[2].name: OK, written[1].name: FAIL},
        {
            "MANIFEST.jsonl": [f"line 2 is not {{seq, file, sha256, prev}}: {bad[:120]!r}"],
            written[1].name: ["not in the manifest, whose chain is broken (was its line deleted?)"],
        },
    )


def test_a_receipt_listed_twice_fails_and_so_does_the_manifest(
    written: list[Path], tree: Path
) -> None:
    """A second, well-chained line for the same file is refused: no file is listed twice."""
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines()
    again = manifest_line(
        4,
        written[0].name,
        hashlib.sha256(written[0].read_bytes()).hexdigest(),
        hashlib.sha256(lines[-1]).hexdigest(),
    )
    with manifest.open("ab") as out:
        out.write(again + b"\n")
    results = verify_receipts(written[0].parent, root=tree)
    expect(
        results,
        {"MANIFEST.jsonl": FAIL, written[0].name: FAIL, written[1].name: OK, written[2].name: OK},
        {
            "MANIFEST.jsonl": [
                f"line 4 ({written[0].name}): listed twice in the manifest (lines 1, 4)"
            ],
            written[0].name: ["listed twice in the manifest (lines 1, 4)"],
        },
    )


@pytest.mark.parametrize("replace", ["delete", "symlink", "folder"])
def test_a_listed_receipt_that_is_gone_or_not_a_regular_file_fails(
    written: list[Path], tree: Path, replace: str
) -> None:
    """A manifest line whose file is deleted, a symlink (even to the right bytes) or a
    folder is a FAIL of that receipt; the chain itself is intact."""
    stored = written[1].read_bytes()
    written[1].unlink()
    if replace == "symlink":
        elsewhere = tree / "elsewhere.json"
        elsewhere.write_bytes(stored)
        written[1].symlink_to(elsewhere)
    elif replace == "folder":
        written[1].mkdir()
    results = verify_receipts(written[0].parent, root=tree)
    expect(
        results,
        {"MANIFEST.jsonl": OK, written[0].name: OK, written[1].name: FAIL, written[2].name: OK},
        {written[1].name: ["listed in the manifest but missing (or not a regular file)"]},
    )


@pytest.mark.parametrize("statement", [[["nested"]], "a string", 7, None])
def test_a_receipt_that_is_not_a_json_object_fails_as_such(
    written: list[Path], tree: Path, statement: Any
) -> None:
    """A receipt whose JSON is a list, string, number or null is refused by name, never
    mistaken for a statement with odd keys (nor crashing on an unhashable one)."""
    forge(written[0], canonical_json(statement) + b"\n")
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == ["receipt is not a JSON object"]


@pytest.mark.parametrize("predicate", [[], "argv", 1])
def test_a_predicate_that_is_not_an_object_fails_as_such(
    written: list[Path], tree: Path, predicate: Any
) -> None:
    edit_statement(written[0], lambda s: s.update(predicate=predicate))
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == ["predicate is not an object"]


def test_an_unknown_verdict_fails_as_unknown(written: list[Path], tree: Path) -> None:
    """A verdict outside PASS/FAIL is a schema FAIL; the verdict is then not recomputed."""
    edit_statement(written[0], lambda s: s["predicate"].update(verdict="MAYBE"))
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == [
        "verdict 'MAYBE' is not one of ['PASS', 'FAIL']"
    ]


@pytest.mark.parametrize("argv", [["pp3", 1], ["pp3", None], [["pp3"]]])
def test_an_argv_holding_non_strings_fails(written: list[Path], tree: Path, argv: Any) -> None:
    """``argv`` is a list of strings (docs/receipts.md), not merely a list."""
    edit_statement(written[0], lambda s: s["predicate"].update(argv=argv))
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == ["predicate.argv holds non-strings"]


@pytest.mark.parametrize("digest", ["E" * 64, "e" * 63, "e" * 65, 1, None])
def test_a_source_digest_that_is_not_lowercase_hex_sha256_fails(
    written: list[Path], tree: Path, digest: Any
) -> None:
    """A recorded source outside the subject (``pp3cli/``) whose digest is not 64 lowercase
    hex digits is a schema FAIL, not merely a changed source (STALE)."""
    edit_statement(
        written[0], lambda s: s["predicate"]["sources"].update({"pp3cli/logic.py": digest})
    )
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == [
        "predicate.sources holds a value that is not a hex sha256"
    ]


@pytest.mark.parametrize(
    "created",
    [
        "2026-12-05 14:00:00.000000Z",
        "2026-12-05T14:00:00Z",
        "2026-12-05T14:00:00.000000",
        "2026-12-05T14:00:00.000000Z\n",
        "26-12-05T14:00:00.000000Z",
        "yesterday",
        "\u0662\u0660\u0662\u0665-01-01T00:00:00.000000Z",  # Arabic-Indic digits
        "2026-13-01T00:00:00.000000Z",  # not a real instant, though in the format
        "2026-02-30T00:00:00.000000Z",
        "2026-01-01T24:00:00.000000Z",
        "2026-01-01T00:60:00.000000Z",
    ],
)
def test_a_created_utc_not_in_the_stamp_format_fails(
    written: list[Path], tree: Path, created: str
) -> None:
    edit_statement(written[0], lambda s: s["predicate"].update(created_utc=created))
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert reasons_of(results, written[0].name) == [
        f"created_utc {created!r} is not YYYY-mm-ddTHH:MM:SS.ffffffZ"
    ]


def test_floats_are_parsed_to_their_values(tmp_path: Path, tree: Path) -> None:
    """strict_loads returns every finite float as itself, so an honest receipt holding
    floats (statistics, timings) verifies OK: its canonical form is its bytes."""
    assert strict_loads(b'{"p":[2.5,-0.125,1e-300,1.7976931348623157e308]}') == {
        "p": [2.5, -0.125, 1e-300, 1.7976931348623157e308]
    }
    folder = tmp_path / "floats"
    made = write_receipt(
        folder, TOY, parameters={"threshold": 5.5}, environment={"load": 0.25},
        data={"count": 1.5, "samples": [0.1, 2.5e-7]}, verdict="PASS", root=tree,
    )  # fmt: skip
    results = verify_receipts(folder, root=tree, strict=True)
    assert statuses(results) == {"MANIFEST.jsonl": OK, made.name: OK}, report(results)


@pytest.mark.parametrize(
    ("pinned", "status", "reasons"),
    [
        ("same", OK, []),
        ("other", STALE, ["sources moved on since: changed overlay/peer-1/pkg/sampler.py"]),
        (None, STALE, ["sources moved on since: missing overlay/peer-1/pkg/sampler.py"]),
    ],
)
def test_an_absent_overlay_file_is_checked_against_pp3s_pins(
    tmp_path: Path,
    tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    pinned: str | None,
    status: str,
    reasons: list[str],
) -> None:
    """``overlay/<overlay>/<path>`` with no ``<root>/.overlay/<overlay>/<path>`` on this
    machine is compared with the pin pp3 carries for ``<path>`` (``VLLM_PINS``): OK when
    the pin is the recorded digest, STALE (changed) when the pins moved on, STALE (missing)
    when pp3 pins no such file."""
    local = tree / ".overlay" / "peer-1" / "pkg" / "sampler.py"
    local.parent.mkdir(parents=True)
    local.write_text("# the overlay's sampler\n")
    recorded = hashlib.sha256(local.read_bytes()).hexdigest()
    folder = tmp_path / "receipts"
    made = write_receipt(
        folder, TOY, parameters={"threshold": 5}, environment={}, data={"count": 1},
        verdict="PASS", extra_sources={"overlay/peer-1/pkg/sampler.py": local}, root=tree,
    )  # fmt: skip
    local.unlink()  # a reviewer's machine without the overlay
    pins = {"pkg/other.py": "0" * 64}
    if pinned is not None:
        pins["pkg/sampler.py"] = recorded if pinned == "same" else "f" * 64
    monkeypatch.setattr(overlay, "VLLM_PINS", pins)
    results = verify_receipts(folder, root=tree)
    assert statuses(results) == {"MANIFEST.jsonl": OK, made.name: status}, report(results)
    assert reasons_of(results, made.name) == reasons


def test_an_orphan_passing_every_check_is_orphan_with_its_sources_still_compared(
    written: list[Path], tree: Path
) -> None:
    """An unlisted receipt stays ORPHAN (the more severe status) when its sources moved
    on, and both reasons are given."""
    stray = written[0].parent / "toy-20990101T000000000000Z.json"
    stray.write_bytes(written[0].read_bytes())
    (tree / "pp3cli" / "logic.py").write_text("# logic, edited\n")
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[stray.name] == ORPHAN, report(results)
    assert reasons_of(results, stray.name) == [
        "not in the manifest: its line never came (a writer killed between storing the "
        "receipt and appending its line?); not evidence",
        "sources moved on since: changed pp3cli/logic.py",
    ]
    assert statuses(results)[written[0].name] == STALE, report(results)


def test_a_result_as_a_dict_is_its_file_status_and_a_copy_of_its_reasons() -> None:
    """What ``verify-receipts --json`` lists per artefact: ``{file, status, reasons}``."""
    result = Result("toy-20990101T000000000000Z.json")
    assert result.as_dict() == {"file": result.file, "status": OK, "reasons": []}
    result.stale("sources moved on")
    result.orphan("not in the manifest")
    result.stale("again")
    assert result.as_dict() == {
        "file": "toy-20990101T000000000000Z.json",
        "status": ORPHAN,
        "reasons": ["sources moved on", "not in the manifest", "again"],
    }
    result.fail("bytes")
    result.orphan("later")
    shown = result.as_dict()
    assert shown == {
        "file": "toy-20990101T000000000000Z.json",
        "status": FAIL,
        "reasons": ["sources moved on", "not in the manifest", "again", "bytes", "later"],
    }
    shown["reasons"].append("edited by a caller")
    assert len(result.reasons) == 5
    assert result.line() == (
        "FAIL: toy-20990101T000000000000Z.json — "
        "sources moved on; not in the manifest; again; bytes; later"
    )


def test_a_manifest_chained_over_non_canonical_lines_fails(written: list[Path], tree: Path) -> None:
    """Every manifest line must be canonical JSON, even when ``seq`` and ``prev`` are
    consistent with the non-canonical bytes (re-chained over spaced-out lines)."""
    manifest = manifest_of(written[0])
    lines, prev = [], None
    for line in manifest.read_bytes().splitlines():
        entry = orjson.loads(line)
        entry["prev"] = prev
        spaced = json.dumps(entry, sort_keys=True).encode()  # ", " and ": " separators
        lines.append(spaced)
        prev = hashlib.sha256(spaced).hexdigest()
    manifest.write_bytes(b"".join(line + b"\n" for line in lines))
    results = verify_receipts(written[0].parent, root=tree)
    expect(
        results,
        {"MANIFEST.jsonl": FAIL, **{receipt.name: FAIL for receipt in written}},
        {
            "MANIFEST.jsonl": [
                f"line {number} ({receipt.name}): manifest line {number} is not canonical JSON"
                for number, receipt in enumerate(written, start=1)
            ],
            written[1].name: ["manifest line 2 is not canonical JSON"],
        },
    )


def test_a_statement_with_an_extra_or_missing_top_level_key_fails(
    written: list[Path], tree: Path
) -> None:
    """An in-toto Statement has exactly ``_type, subject, predicateType, predicate``."""
    edit_statement(written[0], lambda s: s.update(signature="trust me"))
    edit_statement(written[1], lambda s: s.pop("subject"))
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == FAIL, report(results)
    assert statuses(results)[written[1].name] == FAIL, report(results)
    expected = "['_type', 'predicate', 'predicateType', 'subject']"
    assert reasons_of(results, written[0].name) == [
        f"statement keys ['_type', 'predicate', 'predicateType', 'signature', 'subject']; "
        f"expected {expected}"
    ]
    assert reasons_of(results, written[1].name) == [
        f"statement keys ['_type', 'predicate', 'predicateType']; expected {expected}"
    ]


def test_a_kind_without_a_recomputer_fails_with_that_one_reason(
    written: list[Path], tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(recompute.RECOMPUTERS, TOY)
    results = verify_receipts(written[0].parent, root=tree)
    for receipt in written:
        assert reasons_of(results, receipt.name) == ["no recomputer for kind toy"]


@pytest.mark.parametrize("name", ["notes.json", "Toy-20990101T000000000000Z.json", "toy-2099.json"])
def test_a_json_file_not_named_like_a_receipt_fails_without_being_read(
    written: list[Path], tree: Path, name: str
) -> None:
    """``<kind>-<YYYYmmddTHHMMSSffffffZ>.json`` or FAIL, whatever the file holds, and the
    receipts around it are unaffected; a listed one (re-chained) FAILs the same way."""
    folder = written[0].parent
    (folder / name).write_bytes(written[0].read_bytes())
    results = verify_receipts(folder, root=tree)
    expect(
        results,
        {"MANIFEST.jsonl": OK, **{receipt.name: OK for receipt in written}, name: FAIL},
        {
            name: [
                "not in the manifest: its line never came (a writer killed between storing "
                "the receipt and appending its line?); not evidence",
                "file name is not <kind>-<YYYYmmddTHHMMSSffffffZ>.json",
            ]
        },
    )
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines()
    listed = manifest_line(
        len(lines) + 1,
        name,
        hashlib.sha256((folder / name).read_bytes()).hexdigest(),
        hashlib.sha256(lines[-1]).hexdigest(),
    )
    with manifest.open("ab") as out:
        out.write(listed + b"\n")
    results = verify_receipts(folder, root=tree)
    assert statuses(results)[name] == FAIL and statuses(results)["MANIFEST.jsonl"] == OK
    assert reasons_of(results, name) == ["file name is not <kind>-<YYYYmmddTHHMMSSffffffZ>.json"]


def test_supersedes_names_a_file_of_the_receipts_folder_never_a_path(
    written: list[Path], tree: Path
) -> None:
    """A ``supersedes`` file with a ``/`` does not exist as far as the verifier goes, even
    where that path leads to a file with the stated bytes (here: an earlier receipt)."""
    folder = written[0].parent
    (folder / "sub").mkdir()
    (folder / "sub" / written[0].name).write_bytes(written[0].read_bytes())
    digest = hashlib.sha256(written[0].read_bytes()).hexdigest()
    paths = [f"../{folder.name}/{written[0].name}", f"sub/{written[0].name}"]
    references = [{"file": path, "sha256": digest, "reason": "replaced"} for path in paths]
    edit_statement(written[2], lambda s: s["predicate"].update(supersedes=references))
    results = verify_receipts(folder, root=tree)
    assert statuses(results)[written[2].name] == FAIL, report(results)
    assert reasons_of(results, written[2].name) == [
        f"supersedes {path}, which does not exist" for path in paths
    ]


# ---- Four acceptances the campaign found, closed in verify.py (bench/pending patch)


def test_a_subject_naming_a_path_twice_fails_even_if_one_digest_is_right(
    written: list[Path], tree: Path
) -> None:
    """A tool matching the subject by name may take either entry: a wrong digest beside the
    right one for the same path is a FAIL, whichever comes first."""
    for wrong_first in (True, False):
        honest = written[0].read_bytes()

        def repeat(statement: dict[str, Any], wrong_first: bool = wrong_first) -> None:
            item = statement["subject"][0]
            wrong = {"name": item["name"], "digest": {"sha256": "0" * 64}}
            statement["subject"].insert(0 if wrong_first else 1, wrong)

        edit_statement(written[0], repeat)
        results = verify_receipts(written[0].parent, root=tree)
        reasons = reasons_of(results, written[0].name)
        assert statuses(results)[written[0].name] == FAIL, report(results)
        name = orjson.loads(honest)["subject"][0]["name"]
        assert f"subject names ['{name}'] more than once" in reasons, reasons
        forge(written[0], honest)
        assert statuses(verify_receipts(written[0].parent, root=tree))[written[0].name] == OK


def test_a_manifest_seq_of_true_is_not_line_1(written: list[Path], tree: Path) -> None:
    """``True == 1`` in Python; the manifest's seq must be an integer, as the schema's
    integers are."""
    manifest = manifest_of(written[0])
    lines = manifest.read_bytes().splitlines()
    first = orjson.loads(lines[0])
    first["seq"] = True
    out, prev = b"", None
    for index, line in enumerate(lines):
        entry = first if index == 0 else orjson.loads(line)
        entry["prev"] = prev
        raw = canonical_json(entry)
        out += raw + b"\n"
        prev = hashlib.sha256(raw).hexdigest()
    manifest.write_bytes(out)
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)["MANIFEST.jsonl"] == FAIL, report(results)
    assert "line 1 is not {seq, file, sha256, prev}" in report(results)


def test_an_orphans_supersedes_are_checked_too(written: list[Path], tree: Path) -> None:
    """An orphan has no manifest position, but what it supersedes must exist, match, be in
    the manifest and have a reason: with a bad entry it is a FAIL, not ORPHAN."""
    folder = written[0].parent
    statement = orjson.loads(written[0].read_bytes())
    statement["predicate"]["supersedes"] = [
        {"file": "toy-20000101T000000000000Z.json", "sha256": "0" * 64, "reason": ""}
    ]
    orphan = folder / "toy-20990101T000000000000Z.json"
    orphan.write_bytes(canonical_json(statement) + b"\n")
    results = verify_receipts(folder, root=tree)
    reasons = reasons_of(results, orphan.name)
    assert statuses(results)[orphan.name] == FAIL, report(results)
    assert "supersedes toy-20000101T000000000000Z.json, which does not exist" in reasons

    good = _reference(written[1])
    statement["predicate"]["supersedes"] = [good]
    orphan.write_bytes(canonical_json(statement) + b"\n")
    results = verify_receipts(folder, root=tree)
    assert statuses(results)[orphan.name] == ORPHAN, report(results)
    for broken, reason in (
        ({**good, "reason": " "}, f"supersedes {written[1].name} without a reason"),
        ({**good, "sha256": "0" * 64}, f"supersedes {written[1].name} with sha256 {'0' * 64}"),
    ):
        statement["predicate"]["supersedes"] = [broken]
        orphan.write_bytes(canonical_json(statement) + b"\n")
        results = verify_receipts(folder, root=tree)
        assert statuses(results)[orphan.name] == FAIL, report(results)
        assert any(r.startswith(reason) for r in reasons_of(results, orphan.name)), report(results)


def test_a_leap_day_stamp_is_a_real_instant(written: list[Path], tree: Path) -> None:
    edit_statement(
        written[0], lambda s: s["predicate"].update(created_utc="2024-02-29T23:59:59.999999Z")
    )
    results = verify_receipts(written[0].parent, root=tree)
    assert statuses(results)[written[0].name] == OK, report(results)
