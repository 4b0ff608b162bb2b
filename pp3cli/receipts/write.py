"""Write receipts: canonical JSON in-toto Statements, never overwritten, hash-chained.

A receipt is an in-toto Statement v1 (see docs/receipts.md). Its stored bytes are
``canonical_json(statement) + b"\\n"``; the manifest ``MANIFEST.jsonl`` gets one canonical
line per receipt, ``{seq, file, sha256, prev}``, where ``sha256`` hashes the receipt's stored
bytes and ``prev`` hashes the previous manifest line's bytes (without its newline), so that a
deleted, reordered or replaced line breaks the chain.
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
    "manifest_line",
    "predicate_type",
    "supersede_entries",
    "write_receipt",
]

SCHEMA_VERSION = 1
INTOTO_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
MANIFEST_NAME = "MANIFEST.jsonl"
MANIFEST_LOCK_NAME = ".manifest.lock"
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
    """(seq of the last line, sha256 of its bytes); (0, None) for a missing or empty manifest."""
    if not manifest.exists():
        return 0, None
    raw = manifest.read_bytes()
    if raw and not raw.endswith(b"\n"):
        raise Pp3Error(f"{manifest} does not end with a newline: a write was cut short; repair it")
    lines = raw.splitlines()
    if not lines:
        return 0, None
    last = lines[-1]
    seq = orjson.loads(last).get("seq")
    if not isinstance(seq, int):
        raise Pp3Error(f"{manifest}: last line has no integer seq: {last!r}")
    return seq, sha256_hex(last)


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
    O_EXCL: an existing receipt is never overwritten (Pp3Error naming it).
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
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError as err:
            raise Pp3Error(f"receipt {path} already exists; pp3 never overwrites one") from err
        with os.fdopen(fd, "wb") as handle:
            handle.write(stored)
            handle.flush()
            os.fsync(handle.fileno())
        manifest = receipts_dir / MANIFEST_NAME
        seq, prev = _last_manifest_entry(manifest)
        line = manifest_line(seq + 1, name, sha256_hex(stored), prev)
        with manifest.open("ab") as handle:
            handle.write(line + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
    return path
