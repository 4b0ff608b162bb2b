"""The typed edge between host code and the Triton device code of ``pp3kernels.jit``.

Triton ships no type information, so a ``@triton.jit`` function is ``Any`` to mypy. Host
modules never touch that ``Any``: they hold each kernel as a ``Launchable`` (the one thing a
host does with a kernel is ``kernel[grid](*args, **meta)``), and they name the q forms of the
chain kernels with the plain integers below, which the device code wraps as constexprs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# How the chain kernels read q (their Q_MODE constexpr): not at all, as sparse integer
# counts (q_ids, q_counts over a power-of-two denominator), or as dense float rows.
Q_NONE = 0
Q_SPARSE = 1
Q_DENSE = 2

# Sizes of sparse q's support at which the finish kernel changes method; the plans size their
# tiles by them too (``pp3kernels.selector``):
# - the duplicate-support check compares every pair of slots ([R, S_P2, S_P2] per request)
#   up to this many padded slots, where it is cheap; host validation checks every S;
MAX_PAIRWISE_SLOTS = 16
# - the draw applies a rejected draft's residual to a tile slot by slot (S passes over the
#   tile) up to this many slots, and above it through the request's scratch row (one store
#   of the tile, a gather and a scatter of the S support entries, one load back);
MAX_LOOPED_SLOTS = 4
# - the support's chunk membership is one [S_P2, NSPLIT_P2] tile per request up to this many
#   elements, and a loop over the chunks with one [S_P2] tile above.
MAX_MEMBERSHIP_TILE = 4096
# - the acceptance test reads every draft row's slots in one [R, S_P2] tile per request up to
#   this many padded slots, and in tiles of this many slots above (S = 4096 as one tile
#   held 32768 slots of R = 8 rows in a 128-thread program).
MAX_SLOT_TILE = 256
# - the finish reads every draft row's support and the logits at its ids before it waits for
#   phase 1, so that the stop row's corrections and draw read nothing more after it, for
#   S > MAX_LOOPED_SLOTS up to this many slots of all its R rows (R * S_P2, where S_P2 <=
#   MAX_SLOT_TILE; S <= 128 at K = 5): those [R, S_P2] tiles stay in registers. (Step 27's
#   A/B: B4 / B64 at S = 64 -5% / -7%; the support launch's tiles of 128 slots read so
#   spilled and lost 4-36%, point drafts lost 2%: neither reads so.)
MAX_PREFETCH_SLOTS = 1024
# - the default GPU plans split the stop row's support over programs (LaunchPlan.support_tile)
#   from this many padded slots on.
SPLIT_SUPPORT_SLOTS = 128


class Launchable(Protocol):
    """A Triton kernel as the host sees it: ``kernel[grid]`` is the launcher for that grid.

    The launcher takes the kernel's arguments positionally, its constexprs and launch
    options (``num_warps``) by keyword, and runs asynchronously on the current stream.
    """

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]: ...
