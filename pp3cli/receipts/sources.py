"""Which files can change a result, their SHA-256 digests, and the git state of the tree."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Every file that can change a verdict or a timing: the CLI logic, the kernels, the packaging.
SOURCE_PATTERNS = ("pp3cli/**/*.py", "kernels/**/*.py", "pyproject.toml")
# The verifier sources a receipt judges (its in-toto subject).
SUBJECT_PREFIX = "kernels/"
# Receipts live here in the tree; they never make the tree "dirty" (``git_state``).
RECEIPTS_DIR = "receipts"


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_digests(root: Path, extra: Mapping[str, Path] | None = None) -> dict[str, str]:
    """``{posix path relative to root: sha256}`` for every file matching SOURCE_PATTERNS.

    ``extra`` adds pinned external files under the names given (use a repo-relative path
    when the file lives in the tree, so that verify-receipts can re-hash it). Bytecode
    caches never match (only ``*.py``); links are hashed through to their content.
    """
    root = root.resolve()
    digests: dict[str, str] = {}
    for pattern in SOURCE_PATTERNS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                digests[path.relative_to(root).as_posix()] = sha256_file(path)
    for name, path in (extra or {}).items():
        if not path.is_file():
            raise ValueError(f"pinned source {name!r} at {path} is not a readable file")
        digests[name] = sha256_file(path)
    return dict(sorted(digests.items()))


def subject_names(sources: Mapping[str, str], extra: Iterable[str] = ()) -> list[str]:
    """The verifier sources judged: every digested file under kernels/, plus ``extra``
    (the files of a peer's or a user's verifier, ``source_digests``' ``extra`` names)."""
    judged = {name for name in sources if name.startswith(SUBJECT_PREFIX)}
    return sorted(judged | {name for name in extra if name in sources})


def git_state(root: Path) -> dict[str, Any]:
    """``{"commit": hex or None, "dirty": bool or None}``; None when git or the repo is absent.

    Dirty means ``git status --porcelain`` lists anything outside ``receipts/``, untracked
    files included. The receipts folder itself is left out: writing a receipt changes it,
    and the next run's sources are no less the committed ones for that.
    """
    git = shutil.which("git")
    if git is None:
        return {"commit": None, "dirty": None}
    head = subprocess.run(
        [git, "-C", str(root), "rev-parse", "--verify", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    status = subprocess.run(
        [git, "-C", str(root), "status", "--porcelain", "--", ".", f":(exclude){RECEIPTS_DIR}"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}
