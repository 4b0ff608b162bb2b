"""Receipts: canonical JSON, source digests, git state, O_EXCL files and the manifest chain."""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

from pp3cli.receipts import write as receipts
from pp3cli.receipts.sources import git_state, source_digests, subject_names
from pp3cli.receipts.verify import strict_loads
from pp3cli.receipts.write import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    canonical_json,
    canonical_json_of_parsed,
    write_receipt,
)
from pp3cli.run.errors import Pp3Error
from pp3cli.run.scratch import repo_root


def make_tree(root: Path) -> Path:
    """A miniature project: the files whose digests a receipt records, plus some that it skips."""
    (root / "pp3cli" / "commands").mkdir(parents=True)
    (root / "kernels").mkdir()
    (root / "pp3cli" / "cli.py").write_text("# cli\n")
    (root / "pp3cli" / "commands" / "probe.py").write_text("# probe\n")
    (root / "kernels" / "selector.py").write_text("# selector\n")
    (root / "kernels" / "contract.py").write_text("# contract\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'pp3'\n")
    (root / "kernels" / "__pycache__").mkdir()
    (root / "kernels" / "__pycache__" / "selector.cpython-311.pyc").write_bytes(b"\0")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("# not a source of results\n")
    return root


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_canonical_json_sorts_keys_and_is_compact() -> None:
    assert canonical_json({"b": [1, 2.5], "a": {"z": None, "y": True}}) == (
        b'{"a":{"y":true,"z":null},"b":[1,2.5]}'
    )
    assert canonical_json({"n": np.int64(3), "v": np.arange(3)}) == b'{"n":3,"v":[0,1,2]}'


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"data": {"counts": [1, 2, math.nan]}}, "$.data.counts[2]"),
        ({"p": math.inf}, "$.p"),
        ({"p": [{"q": -math.inf}]}, "$.p[0].q"),
        ({"a": np.array([[0.0, 1.0], [np.nan, 2.0]])}, "$.a[1,0]"),
        ({"s": np.float32("nan")}, "$.s"),
    ],
)
def test_canonical_json_refuses_non_finite_naming_the_path(value: object, where: str) -> None:
    with pytest.raises(ValueError, match=re.escape(where)):
        canonical_json(value)


def test_canonical_json_of_parsed_is_canonical_json_of_what_strict_loads_admits() -> None:
    raw = b'{"b": [1, 2.5e300, -0.0, {"z": null}], "a": "\\u00e9", "n": -7}'
    parsed = strict_loads(raw)
    assert canonical_json_of_parsed(parsed) == canonical_json(parsed)
    # What the skipped walk would have caught never gets this far: the parser refuses it.
    for bad in (b'{"p": NaN}', b'{"p": -Infinity}', b'{"p": 1e999}'):
        with pytest.raises(ValueError):
            strict_loads(bad)


def test_canonical_json_refuses_non_string_keys() -> None:
    with pytest.raises(ValueError, match="not canonical JSON"):
        canonical_json({1: "x"})


def test_source_digests_cover_code_kernels_and_packaging(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "kernels" / "__pycache__" / "stale.py").write_text("# a cache, not a source\n")
    (root / "pp3cli" / "folder.py").mkdir()  # a folder, though its name matches *.py
    pinned = tmp_path / "pinned.py"
    pinned.write_text("# pinned external\n")
    digests = source_digests(root, {"external/pinned.py": pinned})
    assert sorted(digests) == [
        "external/pinned.py",
        "kernels/contract.py",
        "kernels/selector.py",
        "pp3cli/cli.py",
        "pp3cli/commands/probe.py",
        "pyproject.toml",
    ]
    assert digests["kernels/selector.py"] == sha(b"# selector\n")
    with pytest.raises(ValueError, match="missing.py"):
        source_digests(root, {"x": tmp_path / "missing.py"})


def test_the_project_tree_is_found_and_digested() -> None:
    """Receipts bind to the real tree: the CLI, the kernels and the packaging."""
    root = repo_root()
    assert (root / "pyproject.toml").is_file() and (root / "pp3cli" / "__init__.py").is_file()
    digests = source_digests(root)
    for name in ("pyproject.toml", "pp3cli/cli/app.py", "kernels/pp3kernels/selector.py"):
        assert name in digests, sorted(digests)[:5]


def test_git_state(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    git = shutil.which("git")
    assert git is not None, "git is needed to record receipts' commits"
    identity = ["-c", "user.name=pp3", "-c", "user.email=pp3@example.invalid"]
    make_tree(tmp_path)
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    subprocess.run([git, "-C", str(tmp_path), "add", "-A"], check=True)
    subprocess.run([git, "-C", str(tmp_path), *identity, "commit", "-qm", "x"], check=True)
    state = git_state(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", state["commit"]) and state["dirty"] is False, state
    # a new receipt (and its manifest line) does not make the sources dirty
    write(tmp_path / "receipts", tmp_path)
    assert git_state(tmp_path)["dirty"] is False, "receipts/ must not count as a change"
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert git_state(tmp_path)["dirty"] is True
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "kernels" / "selector.py").write_text("# changed\n")
    assert git_state(tmp_path)["dirty"] is True


def write(receipts_dir: Path, root: Path, **overrides: object) -> Path:
    arguments: dict[str, object] = {
        "parameters": {"n": 10},
        "environment": {"gpu_name": None},
        "data": {"counts": [3, 7]},
        "verdict": "PASS",
        "root": root,
        "argv": ["pp3", "probe"],
    }
    arguments.update(overrides)
    return write_receipt(receipts_dir, "probe", **arguments)  # type: ignore[arg-type]


def test_git_state_is_unknown_where_git_status_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "git"
    fake.write_text(
        "#!/bin/sh\n"
        'for word in "$@"; do [ "$word" = rev-parse ] && { echo ' + "a" * 40 + "; exit 0; }; done\n"
        "echo 'fatal: index file corrupt' >&2; exit 128\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(fake))
    assert git_state(tmp_path) == {"commit": "a" * 40, "dirty": None}


def test_subject_names_judge_kernels_and_only_the_extra_names_that_were_digested() -> None:
    digested = {"kernels/a.py": "1", "pp3cli/b.py": "2", "vendor/sampler.py": "3"}
    extra = ["vendor/sampler.py", "vendor/never_hashed.py"]
    assert subject_names(digested, extra) == ["kernels/a.py", "vendor/sampler.py"]
    assert subject_names(digested) == ["kernels/a.py"]


def test_write_receipt_is_an_in_toto_statement(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree")
    path = write(tmp_path / "receipts", root)
    assert re.fullmatch(r"probe-\d{8}T\d{12}Z\.json", path.name), path.name
    stored = path.read_bytes()
    statement = orjson.loads(stored)
    assert stored == canonical_json(statement) + b"\n"
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == f"https://pp3.dev/probe/v{SCHEMA_VERSION}"
    assert statement["subject"] == [
        {"name": "kernels/contract.py", "digest": {"sha256": sha(b"# contract\n")}},
        {"name": "kernels/selector.py", "digest": {"sha256": sha(b"# selector\n")}},
    ]
    predicate = statement["predicate"]
    assert sorted(predicate) == sorted(
        ["argv", "git", "sources", "parameters", "environment", "data", "verdict",
         "supersedes", "created_utc", "schema_version"]
    )  # fmt: skip
    assert predicate["argv"] == ["pp3", "probe"] and predicate["verdict"] == "PASS"
    assert predicate["sources"] == source_digests(root)
    assert predicate["data"] == {"counts": [3, 7]} and predicate["schema_version"] == 1


def test_manifest_is_a_hash_chain(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree")
    first = write(tmp_path / "receipts", root)
    second = write(tmp_path / "receipts", root, verdict="FAIL")
    lines = (tmp_path / "receipts" / "MANIFEST.jsonl").read_bytes().splitlines()
    assert len(lines) == 2
    entries = [orjson.loads(line) for line in lines]
    assert entries[0] == {
        "seq": 1, "file": first.name, "sha256": sha(first.read_bytes()), "prev": None
    }  # fmt: skip
    assert entries[1] == {
        "seq": 2, "file": second.name, "sha256": sha(second.read_bytes()), "prev": sha(lines[0])
    }  # fmt: skip
    assert all(line == canonical_json(entry) for line, entry in zip(lines, entries, strict=True))


def test_an_existing_receipt_is_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_tree(tmp_path / "tree")
    monkeypatch.setattr(receipts, "utc_stamp", lambda moment=None: "20250101T000000000000Z")
    first = write(tmp_path / "receipts", root)
    original = first.read_bytes()
    with pytest.raises(Pp3Error, match=re.escape(first.name)):
        write(tmp_path / "receipts", root, verdict="FAIL")
    assert first.read_bytes() == original
    assert len((tmp_path / "receipts" / "MANIFEST.jsonl").read_bytes().splitlines()) == 1


def test_receipts_and_manifest_are_0644_in_a_folder_made_with_its_parents(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree")
    folder = tmp_path / "new" / "nested" / "receipts"
    old_mask = os.umask(0o022)
    try:
        path = write(folder, root)
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((folder / MANIFEST_NAME).stat().st_mode) == 0o644


@pytest.mark.parametrize("held", [b"", b'{"seq": 7, "file": "torn'], ids=["empty", "torn-only"])
def test_a_manifest_without_a_complete_line_starts_the_chain_at_one(
    tmp_path: Path, held: bytes
) -> None:
    root = make_tree(tmp_path / "tree")
    folder = tmp_path / "receipts"
    folder.mkdir()
    (folder / MANIFEST_NAME).write_bytes(held)
    path = write(folder, root)
    lines = (folder / MANIFEST_NAME).read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == [
        {"seq": 1, "file": path.name, "sha256": sha(path.read_bytes()), "prev": None}
    ]


def test_a_last_line_without_an_integer_seq_is_refused_and_quoted_to_120_bytes(
    tmp_path: Path,
) -> None:
    root = make_tree(tmp_path / "tree")
    folder = tmp_path / "receipts"
    folder.mkdir()
    line = b'{"seq": "7", "pad": "' + b"x" * 200 + b'"}\n'
    (folder / MANIFEST_NAME).write_bytes(line)
    with pytest.raises(Pp3Error, match="last line has no integer seq") as caught:
        write(folder, root)
    assert repr(line[:120]) in str(caught.value)
    assert repr(line[:121]) not in str(caught.value)
    assert (folder / MANIFEST_NAME).read_bytes() == line
    assert not list(folder.glob("*.json"))


def test_a_writer_failing_before_its_first_line_still_leaves_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_tree(tmp_path / "tree")
    folder = tmp_path / "receipts"

    def refuse(path: Path, stored: bytes) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(receipts, "_store_receipt", refuse)
    with pytest.raises(OSError, match="disk full"):
        write(folder, root)
    assert (folder / MANIFEST_NAME).read_bytes() == b""


def test_folder_fsync_refuses_a_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        receipts._fsync_folder(plain)
    receipts._fsync_folder(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "kind", "fragment"),
    [
        ({}, "toy", "unknown receipt kind 'toy'"),
        ({"verdict": "MAYBE"}, "probe", "verdict 'MAYBE'"),
        ({"supersedes": [{"file": "x.json"}]}, "probe", "supersedes[0]"),
        ({"data": {"p": math.nan}}, "probe", "$.predicate.data.p"),
    ],
)
def test_write_receipt_refuses_bad_input(
    tmp_path: Path, overrides: dict[str, object], kind: str, fragment: str
) -> None:
    root = make_tree(tmp_path / "tree")
    arguments: dict[str, object] = {
        "parameters": {}, "environment": {}, "data": {}, "verdict": "PASS", "root": root
    }  # fmt: skip
    arguments.update(overrides)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        write_receipt(tmp_path / "receipts", kind, **arguments)  # type: ignore[arg-type]
    assert not list((tmp_path / "receipts").glob("*.json"))


def test_supersede_entries_hash_the_old_receipt_and_need_a_reason(tmp_path: Path) -> None:
    from pp3cli.receipts.write import supersede_entries
    from pp3cli.run.errors import UsageProblem

    old = tmp_path / "qualification-20260101T000000000000Z.json"
    old.write_bytes(b'{"a":1}\n')
    entries = supersede_entries(tmp_path, [old], "counts were missing")
    assert entries == [
        {
            "file": old.name,
            "sha256": hashlib.sha256(b'{"a":1}\n').hexdigest(),
            "reason": "counts were missing",
        }
    ]
    assert supersede_entries(tmp_path, [Path(old.name)], "bare name")[0]["file"] == old.name
    with pytest.raises(UsageProblem, match="--supersede-reason"):
        supersede_entries(tmp_path, [old], None)
    elsewhere = tmp_path.parent / "stray.json"
    elsewhere.write_bytes(b"{}")
    with pytest.raises(UsageProblem, match="expected a receipt file in"):
        supersede_entries(tmp_path, [elsewhere], "not a receipt of this folder")
    assert supersede_entries(tmp_path, [], None) == []
