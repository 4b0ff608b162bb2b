"""Stand-ins for the selector's launch globals (``pp3kernels.selector._chain_*_kernel``), so
that a test can read one phase's arguments or leave a phase out."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


class RecordingLaunch:
    """Launches the wrapped kernel and keeps the positional arguments, the keywords and what
    the launch returned (on a GPU, the compiled kernel) of its last launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.args: tuple[Any, ...] = ()
        self.meta: dict[str, Any] = {}
        self.launched: Any = None

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **meta: Any) -> Any:
            self.args, self.meta = args, meta
            self.launched = self.kernel[grid](*args, **meta)
            return self.launched

        return launch


class NoLaunch:
    """Launches nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **meta: None


@dataclass
class Launch:
    """One recorded launch: its grid, its positional arguments by the kernel's parameter
    names, and its keywords (constexprs and launch options)."""

    grid: tuple[int, ...]
    args: dict[str, Any]
    meta: dict[str, Any]


class LaunchRecorder:
    """Launches nothing and keeps every launch (``Launch``), for tests of the host side."""

    def __init__(self, kernel: Any) -> None:
        self.names = list(inspect.signature(kernel.fn).parameters)
        self.launches: list[Launch] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **meta: Any) -> None:
            self.launches.append(Launch(grid, dict(zip(self.names, args, strict=False)), meta))

        return launch
