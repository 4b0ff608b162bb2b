"""Where the kernels run: Triton's CPU interpreter or a compiled GPU backend.

``TRITON_INTERPRET=1`` must be set in the environment before Python starts (Triton reads it
at import); pp3 never flips it from inside Python. This is the one place that reads it.
"""

from __future__ import annotations

import os

# Triton's own reading of a boolean variable (``triton.knobs.env_bool``, its C++
# ``getenv_bool``): these values, case-insensitively, are true; anything else ("0",
# "false", "off", "no", "2", empty, unset) is false.
_TRUE = ("1", "true", "on", "yes", "y")


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE
