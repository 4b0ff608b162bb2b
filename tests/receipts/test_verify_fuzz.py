"""Fuzzing verify-receipts: mutated bytes and mutated JSON never crash it.

Every outcome is a status (OK, STALE, ORPHAN or FAIL) with a reason whenever it is not OK;
a receipt or manifest whose bytes changed while the manifest was left alone is never OK.
Derandomized (fixed examples) and bounded, so the run is short and repeatable.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verify_receipts import (
    TOY,
    make_tree,
    rebuild_manifest,
    report,
    toy_kind,
)

from pp3cli.receipts.verify import OK, STATUSES, verify_receipts
from pp3cli.receipts.write import MANIFEST_NAME, canonical_json, write_receipt

pytestmark = pytest.mark.usefixtures(toy_kind.__name__)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.fixture
def honest(tmp_path: Path) -> tuple[Path, Path]:
    """(receipts folder, source tree): three honest toy receipts and their manifest."""
    tree = make_tree(tmp_path / "tree")
    folder = tmp_path / "receipts"
    for count in (3, 9, 5):
        write_receipt(
            folder,
            TOY,
            parameters={"threshold": 5},
            environment={"gpu_name": None},
            data={"count": count, "nested": {"list": [1, 2.5, "x"]}},
            verdict="PASS" if count <= 5 else "FAIL",
            supersedes=[],
            root=tree,
            argv=["pp3", "toy"],
        )
    return folder, tree


def _check(folder: Path, tree: Path, changed: str | None) -> None:
    results = verify_receipts(folder, root=tree)
    assert results, "no results for a folder with receipts"
    for result in results:
        assert result.status in STATUSES, result.line()
        assert result.status == OK or result.reasons, result.line()
    if changed is not None:
        status = {result.file: result.status for result in results}
        assert status.get(changed, "absent") != OK, report(results)


def _files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if not path.name.startswith("."))


@FUZZ
@given(data=st.data())
def test_mutated_bytes_never_crash_the_reader(
    honest: tuple[Path, Path], data: st.DataObject
) -> None:
    source, tree = honest
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "receipts"
        shutil.copytree(source, folder)
        name = data.draw(st.sampled_from(_files(folder)), label="file")
        path = folder / name
        raw = bytearray(path.read_bytes())
        edit = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]), label="edit")
        at = data.draw(st.integers(0, max(0, len(raw) - 1)), label="at")
        if edit == "flip" and raw:
            raw[at] ^= data.draw(st.integers(1, 255), label="mask")
        elif edit == "truncate":
            del raw[at:]
        elif edit == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        else:
            del raw[at : at + data.draw(st.integers(1, 16), label="length")]
        changed = bytes(raw) != path.read_bytes()
        path.write_bytes(bytes(raw))
        # A changed receipt is never OK; a changed manifest is checked for not crashing.
        _check(folder, tree, name if changed and name != MANIFEST_NAME else None)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@FUZZ
@given(data=st.data())
def test_mutated_json_never_crashes_the_reader(
    honest: tuple[Path, Path], data: st.DataObject
) -> None:
    """Any value replaced or deleted anywhere in a statement, stored canonically; with the
    manifest left alone (the receipt must not be OK) or re-chained to match (deeper checks)."""
    source, tree = honest
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "receipts"
        shutil.copytree(source, folder)
        name = data.draw(
            st.sampled_from([n for n in _files(folder) if n != MANIFEST_NAME]), label="receipt"
        )
        path = folder / name
        statement = orjson.loads(path.read_bytes())
        where = data.draw(st.sampled_from(_paths(statement)[1:]), label="path")
        parent = statement
        for step in where[:-1]:
            parent = parent[step]
        if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(JSON_VALUES, label="value")
        stored = canonical_json(statement) + b"\n"
        changed = stored != path.read_bytes()
        path.write_bytes(stored)
        rechain = data.draw(st.booleans(), label="rechain")
        if rechain:
            rebuild_manifest(folder)
        _check(folder, tree, name if changed and not rechain else None)
