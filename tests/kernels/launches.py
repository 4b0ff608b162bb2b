"""Stand-ins for the selector's launch globals (``pp3kernels.selector._chain_*_kernel``), so
that a test can read one phase's arguments or leave a phase out."""

from __future__ import annotations

from typing import Any


class RecordingLaunch:
    """Launches the wrapped kernel and keeps the positional arguments of its last launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.args: tuple[Any, ...] = ()

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **meta: Any) -> None:
            self.args = args
            self.kernel[grid](*args, **meta)

        return launch


class NoLaunch:
    """Launches nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **meta: None
