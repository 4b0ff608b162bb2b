"""Write receipts: canonical JSON in-toto Statements, never overwritten, hash-chained.

A receipt is an in-toto Statement v1 (see docs/receipts.md). Its stored bytes are
``canonical_json(statement) + b"\\n"``; the manifest ``MANIFEST.jsonl`` gets one canonical
line per receipt, ``{seq, file, sha256, prev}``, where ``sha256`` hashes the receipt's stored
bytes and ``prev`` hashes the previous manifest line's bytes (without its newline), so that a
deleted, reordered or replaced line breaks the chain.

Crash safety, in write order (all under the manifest lock):

1. the receipt's bytes go to a hidden temp file ``.<name>.partial`` in the receipts folder,
   fsynced: a crash here leaves only that temp file, never a torn receipt;
2. the temp file is hard-linked to the receipt's name (atomic, and fails if the name exists:
   a receipt is never overwritten), unlinked, and the folder fsynced;
3. the manifest line is appended in one write and fsynced. A crash between 2 and 3 leaves a
   complete receipt with no line: ``verify-receipts`` reports it ORPHAN, not FAIL. A crash
   inside 3 leaves a torn tail (bytes after the last newline) that was never a line; the next
   writer cuts that tail off (never a complete line) before appending its own.

The manifest's complete lines are never rewritten.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from filelock import FileLock

from pp3cli.evidence.verdict import VERDICTS
from pp3cli.receipts.sources import git_state, source_digests, subject_names
from pp3cli.run.errors import Pp3Error, UsageProblem
from pp3cli.run.scratch import repo_root, utc_stamp

__all__ = [
    "INTOTO_STATEMENT_TYPE",
    "MANIFEST_NAME",
    "RECEIPT_KINDS",
    "SCHEMA_VERSION",
    "canonical_json",
    "canonical_json_of_parsed",
    "manifest_line",
    "predicate_type",
    "supersede_entries",
    "write_receipt",
]

SCHEMA_VERSION = 1
INTOTO_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
MANIFEST_NAME = "MANIFEST.jsonl"
MANIFEST_LOCK_NAME = ".manifest.lock"
PARTIAL_SUFFIX = ".partial"  # ``.<receipt name>.partial``: a write that never finished
# Kinds a receipt may have; ``pp3cli.receipts.recompute`` has a verdict recomputer for each.
RECEIPT_KINDS: frozenset[str] = frozenset({"qualification", "oracle", "probe"})
RECEIPT_NAME = re.compile(r"(?P<kind>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)-(?P<stamp>\d{8}T\d{12}Z)\.json")


def predicate_type(kind: str) -> str:
    """The in-toto predicateType URI of a kind at this schema version."""
    return f"https://pp3.dev/{kind}/v{SCHEMA_VERSION}"


def _refuse_non_finite(obj: Any, path: str) -> None:
    """Walk ``obj``; raise ValueError naming the key path of the first NaN or infinity."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"non-finite number {obj!r} at {path}: receipts hold finite JSON")
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _refuse_non_finite(value, f"{path}.{key}")
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            _refuse_non_finite(value, f"{path}[{index}]")
    elif isinstance(obj, np.ndarray) and obj.dtype.kind in "fc":
        bad = np.argwhere(~np.isfinite(obj))
        if bad.size:
            where = ",".join(str(int(i)) for i in bad[0])
            raise ValueError(f"non-finite number at {path}[{where}]: receipts hold finite JSON")
    elif isinstance(obj, np.floating) and not np.isfinite(obj):
        raise ValueError(f"non-finite number {obj!r} at {path}: receipts hold finite JSON")


def canonical_json(obj: Any) -> bytes:
    """Canonical bytes: orjson, keys sorted, compact, UTF-8; NaN/inf refused (ValueError).

    Keys must be strings; integers must fit in 64 bits (orjson's range). numpy arrays and
    scalars serialise as their values.
    """
    _refuse_non_finite(obj, "$")
    return _dumps(obj)


def canonical_json_of_parsed(parsed: Any) -> bytes:
    """``canonical_json`` of a value ``verify.strict_loads`` built, without the walk that
    refuses NaN/inf: that parser already refused them (as literals and as overflowing
    numbers), and the walk costs most of a large receipt's check. Any other value goes
    through ``canonical_json``, whose walk is what keeps NaN out (orjson writes it as null).
    """
    return _dumps(parsed)


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as err:
        raise ValueError(f"value is not canonical JSON: {err}") from err


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def manifest_line(seq: int, file: str, sha256: str, prev: str | None) -> bytes:
    """One manifest line's bytes, without the newline."""
    return canonical_json({"seq": seq, "file": file, "sha256": sha256, "prev": prev})


def _last_manifest_entry(manifest: Path) -> tuple[int, str | None]:
    """(seq of the last complete line, sha256 of its bytes); (0, None) when there is none.

    A torn tail (bytes after the last newline, left by a writer killed mid-append) is cut
    off here, under the lock: it was never a line, and no complete line is touched.
    """
    if not manifest.exists():
        return 0, None
    raw = manifest.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if len(complete) != len(raw):
        with manifest.open("r+b") as handle:
            handle.truncate(len(complete))
            os.fsync(handle.fileno())
    lines = complete.splitlines()
    if not lines:
        return 0, None
    last = lines[-1]
    try:
        seq = orjson.loads(last).get("seq")
    except (orjson.JSONDecodeError, AttributeError):
        seq = None
    if not isinstance(seq, int):
        raise Pp3Error(f"{manifest}: last line has no integer seq: {last[:120]!r}")
    return seq, sha256_hex(last)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: Path) -> None:
    """Make a folder's entries (a new name, a rename) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _store_receipt(path: Path, stored: bytes) -> None:
    """Steps 1-2 of the module docstring: temp file, fsync, link to ``path``, fsync the folder.

    Pp3Error when ``path`` exists (a receipt is never overwritten).
    """
    partial = path.with_name(f".{path.name}{PARTIAL_SUFFIX}")
    partial.unlink(missing_ok=True)  # left by an earlier crash under this very name
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        _write_all(fd, stored)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(partial, path)
    except FileExistsError as err:
        partial.unlink()
        raise Pp3Error(f"receipt {path} already exists; pp3 never overwrites one") from err
    partial.unlink()
    _fsync_folder(path.parent)


def _append_line(manifest: Path, line: bytes) -> None:
    """Step 3: append one manifest line (with its newline) in one write, then fsync."""
    fd = os.open(manifest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        _write_all(fd, line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_folder(manifest.parent)


def supersede_entries(
    receipts_dir: Path, files: Sequence[Path], reason: str | None
) -> list[dict[str, str]]:
    """``{file, sha256, reason}`` for earlier receipts that a new one supersedes.

    Each file must be a receipt inside ``receipts_dir``; its stored bytes are hashed. A
    reason is required whenever any file is named.
    """
    if files and not reason:
        raise UsageProblem("--supersedes needs --supersede-reason: say why the old one is replaced")
    entries = []
    for given in files:
        path = given if given.parent != Path(".") else receipts_dir / given
        if path.resolve().parent != receipts_dir.resolve() or not path.is_file():
            raise UsageProblem(f"--supersedes {given}: expected a receipt file in {receipts_dir}")
        entries.append(
            {"file": path.name, "sha256": sha256_hex(path.read_bytes()), "reason": str(reason)}
        )
    return entries


def write_receipt(
    receipts_dir: Path,
    kind: str,
    *,
    parameters: Mapping[str, Any],
    environment: Mapping[str, Any],
    data: Mapping[str, Any],
    verdict: str,
    supersedes: Sequence[Mapping[str, str]] = (),
    extra_sources: Mapping[str, Path] | None = None,
    root: Path | None = None,
    argv: Sequence[str] | None = None,
) -> Path:
    """Write a new receipt and append it to the manifest chain; return its path.

    ``supersedes`` entries are ``{file, sha256, reason}`` naming earlier receipts this one
    replaces. ``root`` is the source tree to digest (default: the installed project) and
    ``argv`` the command line to record (default: ``sys.argv``). The file is created with
    a hard link (which fails if the name exists): an existing receipt is never overwritten
    (Pp3Error naming it). Crash safety: see the module docstring.
    """
    if kind not in RECEIPT_KINDS:
        raise ValueError(f"unknown receipt kind {kind!r}; expected one of {sorted(RECEIPT_KINDS)}")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {list(VERDICTS)}")
    references = []
    for index, entry in enumerate(supersedes):
        if set(entry) != {"file", "sha256", "reason"}:
            raise ValueError(
                f"supersedes[{index}] has keys {sorted(entry)}; expected file, sha256, reason"
            )
        references.append({key: str(entry[key]) for key in ("file", "sha256", "reason")})
    source_root = root or repo_root()
    sources = source_digests(source_root, extra_sources)
    now = datetime.now(timezone.utc)
    statement = {
        "_type": INTOTO_STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": sources[name]}}
            for name in subject_names(sources, extra_sources or {})
        ],
        "predicateType": predicate_type(kind),
        "predicate": {
            "argv": list(sys.argv if argv is None else argv),
            "git": git_state(source_root),
            "sources": sources,
            "parameters": dict(parameters),
            "environment": dict(environment),
            "data": dict(data),
            "verdict": verdict,
            "supersedes": references,
            "created_utc": now.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "schema_version": SCHEMA_VERSION,
        },
    }
    stored = canonical_json(statement) + b"\n"
    receipts_dir.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{utc_stamp(now)}.json"
    path = receipts_dir / name
    with FileLock(str(receipts_dir / MANIFEST_LOCK_NAME)):
        manifest = receipts_dir / MANIFEST_NAME
        seq, prev = _last_manifest_entry(manifest)
        if not manifest.exists():  # a crash before the first line still leaves a manifest
            manifest.touch()
            _fsync_folder(receipts_dir)
        _store_receipt(path, stored)
        _append_line(manifest, manifest_line(seq + 1, name, sha256_hex(stored), prev))
    return path
