"""Global options shared by every command (scratch root, receipts folder, output mode)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RECEIPTS = Path("receipts")


def default_scratch() -> Path:
    """Scratch root: $PP3_SCRATCH, else $XDG_CACHE_HOME/pp3/scratch, else ~/.cache/pp3/scratch."""
    env = os.environ.get("PP3_SCRATCH")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pp3" / "scratch"


@dataclass(frozen=True)
class Settings:
    """What the top-level callback parsed; commands read it from ``ctx.obj``."""

    scratch: Path
    receipts: Path
