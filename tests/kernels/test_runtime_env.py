"""``is_interpreter`` reads ``TRITON_INTERPRET`` exactly as Triton does.

Triton parses it as a boolean (``triton.knobs.runtime.interpret``: "1", "true", "on",
"yes", "y" in any case); pp3 must agree, or with ``TRITON_INTERPRET=false`` on a CPU
machine ``pp3 qualify`` skips its exit-3 hint and crashes launching a compiled kernel
(exit 4, "0 active drivers").
"""

from __future__ import annotations

import pytest
from triton import knobs

from pp3kernels.runtime import is_interpreter

VALUES = ["1", "0", "", "true", "TRUE", "false", "off", "no", "yes", "Y", "on", "2", " 1", "t"]


@pytest.mark.parametrize("value", VALUES)
def test_is_interpreter_agrees_with_triton(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """The same answer as Triton's own knob for every spelling, true or false."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert is_interpreter() is bool(knobs.runtime.interpret), value
