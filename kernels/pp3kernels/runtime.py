"""Where the kernels run: Triton's CPU interpreter or a compiled GPU backend.

``TRITON_INTERPRET=1`` must be set in the environment before Python starts (Triton reads it
at import); pp3 never flips it from inside Python. This is the one place that reads it.
"""

from __future__ import annotations

import os


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
