"""verify-receipts: re-check every receipt's bytes, chain, schema, sources and verdict.

Each receipt gets one status:

- ``OK``    every check passed and the sources it names are the current tree's;
- ``STALE`` every check passed but the sources have moved on since it was written;
- ``ORPHAN`` a receipt that passes its own checks but has no manifest line while the chain
  is intact: what a writer killed between storing the receipt and appending its line leaves
  (``pp3cli.receipts.write``), and a leftover ``.<name>.partial`` temp file. Not evidence,
  not a failure; ``--strict`` makes it FAIL;
- ``FAIL``  a check failed: bytes, chain, parsing, schema, subject, supersedes, or the verdict
  recomputed from the raw data differs from the stored one.

Verdicts are recomputed by the per-kind functions of ``pp3cli.receipts.recompute``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pp3cli.evidence.verdict import VERDICTS
from pp3cli.receipts.recompute import RECOMPUTERS
from pp3cli.receipts.sources import sha256_file, source_digests, subject_names
from pp3cli.receipts.write import (
    INTOTO_STATEMENT_TYPE,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    RECEIPT_NAME,
    SCHEMA_VERSION,
    canonical_json_of_parsed,
    predicate_type,
    sha256_hex,
)
from pp3cli.run.errors import UsageProblem

OK, STALE, ORPHAN, FAIL = "OK", "STALE", "ORPHAN", "FAIL"
STATUSES = (OK, STALE, ORPHAN, FAIL)  # in rising severity
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CREATED = "%Y-%m-%dT%H:%M:%S.%fZ"  # the writer's isoformat, UTC, microseconds
_CREATED_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
_STATEMENT_KEYS = {"_type", "subject", "predicateType", "predicate"}
_PREDICATE_TYPES: dict[str, type | tuple[type, ...]] = {
    "argv": list,
    "git": dict,
    "sources": dict,
    "parameters": dict,
    "environment": dict,
    "data": dict,
    "verdict": str,
    "supersedes": list,
    "created_utc": str,
    "schema_version": int,
}


@dataclass
class Result:
    """One verified artefact: a receipt file or the manifest itself."""

    file: str
    status: str = OK
    reasons: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.status = FAIL
        self.reasons.append(reason)

    def stale(self, reason: str) -> None:
        if self.status == OK:
            self.status = STALE
        self.reasons.append(reason)

    def orphan(self, reason: str) -> None:
        if self.status in (OK, STALE):
            self.status = ORPHAN
        self.reasons.append(reason)

    def line(self) -> str:
        """``OK: file`` or ``STATUS: file — reasons``."""
        if not self.reasons:
            return f"{self.status}: {self.file}"
        return f"{self.status}: {self.file} — {'; '.join(self.reasons)}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "status": self.status, "reasons": list(self.reasons)}


class StrictJSONError(ValueError):
    """Input that is valid to Python's lenient parser but not to pp3: duplicates, NaN."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise StrictJSONError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _no_constants(token: str) -> Any:
    raise StrictJSONError(f"non-finite number {token}")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e999 is valid JSON text but overflows a double
        raise StrictJSONError(f"non-finite number {token} (overflows a double)")
    return value


def strict_loads(raw: bytes) -> Any:
    """Parse JSON refusing duplicate keys and NaN/Infinity, literal or by overflow
    (StrictJSONError/ValueError): every float it returns is finite."""
    return json.loads(
        raw.decode("utf-8"),
        object_pairs_hook=_no_duplicates,
        parse_constant=_no_constants,
        parse_float=_finite_float,
    )


@dataclass
class _ManifestEntry:
    line_no: int
    seq: int
    file: str
    sha256: str


def _check_manifest(
    manifest: Path, result: Result
) -> tuple[dict[str, _ManifestEntry], dict[str, list[str]]]:
    """Parse and chain-check the manifest; returns entries by file and chain faults by file."""
    entries: dict[str, _ManifestEntry] = {}
    faults: dict[str, list[str]] = {}
    if not manifest.exists():
        result.fail("manifest missing")
        return entries, faults
    raw = manifest.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if len(complete) != len(raw):
        # A writer killed mid-append; the next writer cuts this tail off (never a whole line).
        result.orphan(
            f"a torn last line of {len(raw) - len(complete)} bytes without its newline "
            "(a writer was killed while appending it); it is not part of the chain"
        )
    prev_bytes: bytes | None = None
    for line_no, line in enumerate(complete.splitlines(), start=1):
        where = f"line {line_no}"
        try:
            parsed = strict_loads(line)
        except ValueError as err:
            result.fail(f"{where} is not strict JSON: {err}")
            prev_bytes = line
            continue
        shape_ok = (
            isinstance(parsed, dict)
            and set(parsed) == {"seq", "file", "sha256", "prev"}
            and isinstance(parsed["seq"], int)
            and not isinstance(parsed["seq"], bool)
            and isinstance(parsed["file"], str)
            and isinstance(parsed["sha256"], str)
            and _HEX64.fullmatch(parsed["sha256"]) is not None
            and (parsed["prev"] is None or isinstance(parsed["prev"], str))
        )
        if not shape_ok:
            result.fail(f"{where} is not {{seq, file, sha256, prev}}: {line[:120]!r}")
            prev_bytes = line
            continue
        file = parsed["file"]
        problems = faults.setdefault(file, [])
        if canonical_json_of_parsed(parsed) != line:
            problems.append(f"manifest {where} is not canonical JSON")
        if parsed["seq"] != line_no:
            problems.append(
                f"manifest {where} has seq {parsed['seq']}, expected {line_no} "
                "(a line was deleted, inserted or reordered)"
            )
        expected_prev = None if prev_bytes is None else sha256_hex(prev_bytes)
        if parsed["prev"] != expected_prev:
            problems.append(
                f"manifest {where} prev {parsed['prev']} does not hash the line before "
                f"({expected_prev}): the chain is broken"
            )
        if file in entries:
            problems.append(
                f"listed twice in the manifest (lines {entries[file].line_no}, {line_no})"
            )
        else:
            entries[file] = _ManifestEntry(line_no, parsed["seq"], file, parsed["sha256"])
        if problems:
            result.fail(f"{where} ({file}): " + "; ".join(problems))
        prev_bytes = line
    faults = {file: problems for file, problems in faults.items() if problems}
    return entries, faults


def _check_schema(statement: Any, kind: str, result: Result) -> dict[str, Any] | None:
    """Structural checks; returns the predicate when it is usable for further checks."""
    if not isinstance(statement, dict):
        result.fail("receipt is not a JSON object")
        return None
    if set(statement) != _STATEMENT_KEYS:
        result.fail(f"statement keys {sorted(statement)}; expected {sorted(_STATEMENT_KEYS)}")
        return None
    if statement["_type"] != INTOTO_STATEMENT_TYPE:
        result.fail(f"_type {statement['_type']!r} is not {INTOTO_STATEMENT_TYPE}")
    if statement["predicateType"] != predicate_type(kind):
        result.fail(
            f"predicateType {statement['predicateType']!r} does not match kind {kind!r} "
            f"({predicate_type(kind)})"
        )
    subject = statement["subject"]
    subject_ok = isinstance(subject, list) and all(
        isinstance(item, dict)
        and set(item) == {"name", "digest"}
        and isinstance(item["name"], str)
        and isinstance(item["digest"], dict)
        and set(item["digest"]) == {"sha256"}
        and isinstance(item["digest"]["sha256"], str)
        and _HEX64.fullmatch(item["digest"]["sha256"]) is not None
        for item in subject
    )
    if not subject_ok:
        result.fail("subject is not a list of {name, digest: {sha256}}")
    predicate = statement["predicate"]
    if not isinstance(predicate, dict):
        result.fail("predicate is not an object")
        return None
    if set(predicate) != set(_PREDICATE_TYPES):
        missing = sorted(set(_PREDICATE_TYPES) - set(predicate))
        unexpected = sorted(set(predicate) - set(_PREDICATE_TYPES))
        result.fail(f"predicate fields: missing {missing}, unexpected {unexpected}")
        return None
    for key, expected in _PREDICATE_TYPES.items():
        value = predicate[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            result.fail(f"predicate.{key} is {type(value).__name__}, expected {expected}")
    if result.status == FAIL:
        return None
    if predicate["schema_version"] != SCHEMA_VERSION:
        result.fail(f"schema_version {predicate['schema_version']} is not {SCHEMA_VERSION}")
    if predicate["verdict"] not in VERDICTS:
        result.fail(f"verdict {predicate['verdict']!r} is not one of {list(VERDICTS)}")
    if not all(isinstance(arg, str) for arg in predicate["argv"]):
        result.fail("predicate.argv holds non-strings")
    git = predicate["git"]
    if (
        set(git) != {"commit", "dirty"}
        or not (git["commit"] is None or isinstance(git["commit"], str))
        or not (git["dirty"] is None or isinstance(git["dirty"], bool))
    ):
        result.fail(f"predicate.git is not {{commit: str|null, dirty: bool|null}}: {git}")
    if not all(
        isinstance(digest, str) and _HEX64.fullmatch(digest)
        for digest in predicate["sources"].values()
    ):
        result.fail("predicate.sources holds a value that is not a hex sha256")
    if not _is_created_stamp(predicate["created_utc"]):
        result.fail(f"created_utc {predicate['created_utc']!r} is not YYYY-mm-ddTHH:MM:SS.ffffffZ")
    for index, entry in enumerate(predicate["supersedes"]):
        if not (
            isinstance(entry, dict)
            and set(entry) == {"file", "sha256", "reason"}
            and all(isinstance(value, str) for value in entry.values())
        ):
            result.fail(f"supersedes[{index}] is not {{file, sha256, reason}} of strings")
    return None if result.status == FAIL else predicate


def _is_created_stamp(value: str) -> bool:
    """``value`` is a real UTC instant written as YYYY-mm-ddTHH:MM:SS.ffffffZ (ASCII digits)."""
    if _CREATED_SHAPE.fullmatch(value) is None:
        return False
    try:
        datetime.strptime(value, _CREATED)
    except ValueError:
        return False
    return True


def _check_subject(statement: dict[str, Any], predicate: dict[str, Any], result: Result) -> None:
    sources = predicate["sources"]
    names = [item["name"] for item in statement["subject"]]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # a tool matching by name may take either entry: each must be the one
        result.fail(f"subject names {repeated} more than once")
    named = {item["name"]: item["digest"]["sha256"] for item in statement["subject"]}
    for name, digest in named.items():
        if sources.get(name) != digest:
            result.fail(f"subject {name} digest {digest} differs from predicate.sources")
    missing = sorted(set(subject_names(sources)) - set(named))
    if missing:
        result.fail(f"verifier sources {missing} are hashed but not in the subject")


def _check_supersedes(
    predicate: dict[str, Any],
    entry: _ManifestEntry | None,
    entries: Mapping[str, _ManifestEntry],
    receipts_dir: Path,
    result: Result,
) -> None:
    for reference in predicate["supersedes"]:
        file = reference["file"]
        target = receipts_dir / file
        if "/" in file or not target.is_file():
            result.fail(f"supersedes {file}, which does not exist")
            continue
        actual = sha256_hex(target.read_bytes())
        if actual != reference["sha256"]:
            result.fail(f"supersedes {file} with sha256 {reference['sha256']}, but it is {actual}")
        earlier = entries.get(file)
        if earlier is None or (entry is not None and earlier.line_no >= entry.line_no):
            result.fail(f"supersedes {file}, which is not earlier in the manifest")
        if not reference["reason"].strip():
            result.fail(f"supersedes {file} without a reason")


def _check_verdict(kind: str, predicate: dict[str, Any], result: Result) -> None:
    recompute = RECOMPUTERS.get(kind)
    if recompute is None:
        result.fail(f"no recomputer for kind {kind}")
        return
    try:
        implied = recompute(predicate)
    except Exception as err:  # a recomputer refusing malformed data is a failed receipt
        result.fail(f"recomputing the verdict raised {type(err).__name__}: {err}")
        return
    if implied != predicate["verdict"]:
        result.fail(f"stored verdict {predicate['verdict']} but the raw data imply {implied}")


def _check_sources(
    predicate: dict[str, Any], current: Mapping[str, str], root: Path, result: Result
) -> None:
    recorded: dict[str, str] = predicate["sources"]
    changed, missing = [], []
    for name, digest in sorted(recorded.items()):
        now = current.get(name)
        if now is None:
            path = root / name
            if path.is_file():
                now = sha256_file(path)
            elif name.startswith(OVERLAY_PREFIX):
                now = _overlay_digest(name, root)
        if now is None:
            missing.append(name)
        elif now != digest:
            changed.append(name)
    added = sorted(set(current) - set(recorded))
    parts = [
        f"{label} {_listing(names)}"
        for label, names in (("changed", changed), ("missing", missing), ("added", added))
        if names
    ]
    if parts:
        result.stale("sources moved on since: " + "; ".join(parts))


OVERLAY_PREFIX = "overlay/"  # pp3cli.verifiers.registry.OVERLAY_SOURCE_PREFIX


def _overlay_digest(name: str, root: Path) -> str | None:
    """What a pinned overlay file ``overlay/<overlay>/<path>`` hashes to now.

    The file itself when ``<root>/.overlay/<overlay>/<path>`` exists, else the pin pp3
    carries for ``<path>`` (``pp3cli.verifiers.overlay.VLLM_PINS``, which an overlay must
    match to load): a receipt goes STALE when the overlay or its pins changed, not merely
    because this machine has no overlay. None when pp3 pins no such file.
    """
    from pp3cli.verifiers.overlay import VLLM_PINS

    overlay, _, path = name[len(OVERLAY_PREFIX) :].partition("/")
    local = root / ".overlay" / overlay / path
    if local.is_file():
        return sha256_file(local)
    return VLLM_PINS.get(path)


def _listing(names: list[str], shown: int = 4) -> str:
    """Up to ``shown`` names, then how many more: ``a, b, c, d and 7 more (11 files)``."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more ({len(names)} files)"


def verify_receipts(receipts_dir: Path, *, root: Path, strict: bool = False) -> list[Result]:
    """Verify every receipt under ``receipts_dir`` against the source tree at ``root``.

    Returns the manifest's result first, then one per receipt file (manifest order, then
    unlisted files by name, then leftover temp files). ``strict`` turns STALE and ORPHAN
    into FAIL.
    """
    if not receipts_dir.is_dir():
        raise UsageProblem(f"receipts folder {receipts_dir} does not exist")
    manifest_path = receipts_dir / MANIFEST_NAME
    on_disk = sorted(path.name for path in receipts_dir.glob("*.json") if path.is_file())
    if not on_disk and not manifest_path.exists():
        return []
    manifest = Result(MANIFEST_NAME)
    entries, faults = _check_manifest(manifest_path, manifest)
    chain_intact = manifest.status != FAIL
    current = source_digests(root)
    results = [manifest]
    names = [*entries, *(name for name in on_disk if name not in entries)]
    for name in names:
        result = Result(name)
        results.append(result)
        for problem in faults.get(name, []):
            result.fail(problem)
        entry = entries.get(name)
        path = receipts_dir / name
        if entry is None and chain_intact:
            result.orphan(
                "not in the manifest: its line never came (a writer killed between storing "
                "the receipt and appending its line?); not evidence"
            )
        elif entry is None:
            result.fail("not in the manifest, whose chain is broken (was its line deleted?)")
        if not path.is_file() or path.is_symlink():
            result.fail("listed in the manifest but missing (or not a regular file)")
            continue
        stored = path.read_bytes()
        if entry is not None and sha256_hex(stored) != entry.sha256:
            result.fail(f"sha256 {sha256_hex(stored)} differs from the manifest's {entry.sha256}")
        matched = RECEIPT_NAME.fullmatch(name)
        if matched is None:
            result.fail("file name is not <kind>-<YYYYmmddTHHMMSSffffffZ>.json")
            continue
        kind = matched["kind"]
        try:
            statement = strict_loads(stored)
        except ValueError as err:
            result.fail(f"not strict JSON: {err}")
            continue
        try:
            canonical = canonical_json_of_parsed(statement) + b"\n"
        except ValueError as err:
            result.fail(f"not canonical JSON: {err}")
            continue
        if canonical != stored:
            result.fail("bytes are not in canonical form (sorted keys, compact, one newline)")
        predicate = _check_schema(statement, kind, result)
        if predicate is None:
            continue
        _check_subject(statement, predicate, result)
        # An orphan has no manifest position: what it supersedes must exist, match its hash
        # and have a reason all the same, and be in the manifest.
        _check_supersedes(predicate, entry, entries, receipts_dir, result)
        _check_verdict(kind, predicate, result)
        if result.status != FAIL:
            _check_sources(predicate, current, root, result)
    for partial in sorted(receipts_dir.glob(f".*{PARTIAL_SUFFIX}")):
        leftover = Result(partial.name)
        leftover.orphan(
            "an unfinished receipt write (the writer stopped before naming it); not a receipt, "
            "safe to delete"
        )
        results.append(leftover)
    if strict:
        for result in results:
            if result.status in (STALE, ORPHAN):
                result.status = FAIL
    return results
