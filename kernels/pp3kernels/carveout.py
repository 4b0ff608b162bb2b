"""The shared-memory carveout a loaded kernel asks CUDA for.

On the H200 (sm_90) each multiprocessor splits one 256 KB array between L1 and shared
memory: 0, 8, 16, 32, 64, 100, 132, 164, 196 or 228 KB of shared memory. Unless told, the
driver picks the split per kernel from its shared memory and occupancy, and a
multiprocessor runs the programs of two kernels side by side only while both fit its
current split: a program of a kernel that wants another split waits until the
multiprocessor has drained. The selector's phase-2 programs start during phase 1
(programmatic dependent launch) on multiprocessors that phase 1 fills, so where phase 2
reads much before its wait every kernel of a call asks for one split (``LaunchPlan.carveout``;
bench/NOTES.md, twenty-eighth and thirty-first sessions).

The ask is an attribute of the loaded kernel (the CUfunction), not of a launch: two plans
whose launches ran one compiled kernel would overwrite each other's value, and a CUDA graph
of one would run with whatever the other asked last. So the carveout is also a compile-time
argument of every kernel (``selector.launch_constants``, read by none): each value has its
own compiled kernels, asked once. A kernel's first launch runs with the driver's choice
(the handle exists only once it has launched); every later launch, and every graph captured
after it, with the plan's.
"""

from __future__ import annotations

import ctypes
import functools

# CUfunction_attribute CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (cuda.h)
_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
# the value each kernel (CUfunction handle) was last asked for
_asked: dict[int, int] = {}


@functools.cache
def _libcuda() -> ctypes.CDLL:
    """The CUDA driver library, which torch and Triton have loaded already."""
    return ctypes.CDLL("libcuda.so.1")


def prefer_carveout(launched: object, percent: int) -> None:
    """Ask CUDA to run the kernel ``launched`` (what a Triton launch returns: the compiled
    kernel, its ``function`` a CUfunction handle) with ``percent`` % of the multiprocessor's
    largest shared memory as shared memory (rounded up by the driver to a split it has), from
    its next launch on; -1 is the driver's own choice (CU_SHAREDMEM_CARVEOUT_DEFAULT), every
    kernel's until asked. The driver is asked only when a kernel's value changes; nothing is
    asked for anything without a CUfunction handle (Triton's interpreter). The range (-1 to
    100) is the launch plan's to check (``verify_chain`` refuses a plan outside it before
    anything launches); a value the driver refuses raises RuntimeError with its status."""
    function = getattr(launched, "function", None)
    if not isinstance(function, int) or _asked.get(function, -1) == percent:
        return
    status = _libcuda().cuFuncSetAttribute(
        ctypes.c_void_p(function), _PREFERRED_SHARED_MEMORY_CARVEOUT, ctypes.c_int(percent)
    )
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(preferred carveout {percent}%) failed: {status}")
    _asked[function] = percent
