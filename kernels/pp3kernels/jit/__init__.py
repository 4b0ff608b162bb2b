"""pp3kernels.jit: all Triton device code of the package, behind a typed edge.

Modules (each ``@triton.jit`` function's docstring states its maths):

- ``chain``   the selector's kernels, ``chain_stats_kernel`` (phase 1: per-chunk row
              statistics), ``chain_finish_kernel`` (phase 2: combine, walk the chain,
              draw the stop row's token), ``chain_rescan_kernel`` (dense q, between
              them: the rejected rows' exact chunk masses), ``chain_counts_kernel`` and
              ``chain_support_kernel`` (sparse q of a wide support, between them: the
              draft rows' counts, then the stop row's support sums per chunk, by tiles
              of slots), and their device helpers
- ``philox``  in-kernel Philox4x32-10 words and the contract's two uniforms, and
              ``philox_kat_kernel``, which runs Triton's generator on given words
- ``launch``  the typed edge: ``Launchable`` and the q-form codes ``Q_NONE``/``Q_SPARSE``/
              ``Q_DENSE``

Device modules are type-checked loosely (Triton has no stubs; see pyproject.toml); this
package exports each kernel as a ``Launchable`` so that host modules stay strictly typed.
Host code lives outside: ``pp3kernels.selector`` (plans and launches the chain kernels) and
``pp3kernels.philox`` (torch Philox and the known-answer checks).
"""

from __future__ import annotations

from pp3kernels.jit import chain as _chain
from pp3kernels.jit import philox as _philox
from pp3kernels.jit.launch import Q_DENSE, Q_NONE, Q_SPARSE, Launchable

chain_stats_kernel: Launchable = _chain.chain_stats_kernel
chain_finish_kernel: Launchable = _chain.chain_finish_kernel
chain_rescan_kernel: Launchable = _chain.chain_rescan_kernel
chain_counts_kernel: Launchable = _chain.chain_counts_kernel
chain_support_kernel: Launchable = _chain.chain_support_kernel
philox_kat_kernel: Launchable = _philox.philox_kat_kernel

__all__ = [
    "Q_DENSE",
    "Q_NONE",
    "Q_SPARSE",
    "Launchable",
    "chain_counts_kernel",
    "chain_finish_kernel",
    "chain_rescan_kernel",
    "chain_stats_kernel",
    "chain_support_kernel",
    "philox_kat_kernel",
]
