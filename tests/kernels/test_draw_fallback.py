"""The draw's rounding fallback, in the interpreter (``TRITON_INTERPRET=1``).

Where fp rounding leaves a draw's target at or past the tile's total weight, no running sum
exceeds it, and the draw takes the tile's last *positive-weight* id (``_tile_pick``,
``_one_tile_draw``): a token of probability zero must never come out, not even then. The
end-to-end tests cannot reach this branch on purpose (it needs the rounding to fall just
so), so these call the two helpers directly on a tile whose last ids weigh 0 (logit -inf),
with targets inside the mass and past it.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from pp3kernels.jit import chain
from pp3kernels.runtime import is_interpreter

pytestmark = pytest.mark.skipif(
    not is_interpreter(),
    reason="an interpreter test of two device helpers (TRITON_INTERPRET=1); on a GPU the "
    "selector's suites draw end to end",
)

BLOCK_F = 8


# Triton ships no type stubs (its decorator is untyped) and a device function's parameters
# take no annotation (see pyproject.toml on pp3kernels.jit).
@triton.jit  # type: ignore[untyped-decorator]
def _draw_kernel(  # type: ignore[no-untyped-def]
    logits_ptr, targets_ptr, out_ptr, V, row_max_value, BLOCK_F: tl.constexpr
):
    """Program t draws with target t from one point-q row of logits (T1, tau = 1): token of
    ``_tile_pick`` at out[2 t], of ``_one_tile_draw`` at out[2 t + 1]."""
    t = tl.program_id(0)
    zero = tl.zeros([1], dtype=tl.int64)
    row_max = tl.zeros([1], dtype=tl.float32) + row_max_value
    one = tl.zeros([1], dtype=tl.float32) + 1.0
    row = (logits_ptr, zero, 1, row_max, one, one)
    # q as the module docstring of pp3kernels.jit.chain lays it out (13 entries; point q,
    # Q_MODE 0: never read), its slots the [BLOCK_B, 1] placeholders of a call that reads them
    # itself.
    slot = tl.zeros([1, 1], dtype=tl.int32)
    no_logit = tl.zeros([1, 1], dtype=tl.float32)
    q = (
        logits_ptr,
        logits_ptr,
        zero,
        1,
        logits_ptr,
        zero,
        1,
        1.0,
        logits_ptr,
        zero,
        slot,
        slot,
        no_logit,
    )
    resid = tl.zeros([1], dtype=tl.int1)
    live = tl.zeros([1], dtype=tl.int32) == 0
    start = tl.zeros([1], dtype=tl.int32)
    end = start + V
    target = tl.load(targets_ptr + t + tl.zeros([1], dtype=tl.int32))
    before = tl.zeros([1], dtype=tl.float64)
    picked = chain._tile_pick(
        row, q, resid, live, start, end, target, before, 0, 1, 1, BLOCK_F, False
    )
    drawn = chain._one_tile_draw(row, q, resid, live, start, target, V, 0, 1, 1, BLOCK_F, False)
    tl.store(out_ptr + 2 * t + tl.arange(0, 1), picked)
    tl.store(out_ptr + 2 * t + 1 + tl.arange(0, 1), drawn)


def test_a_target_past_the_mass_takes_the_last_positive_weight_id() -> None:
    device = "cpu"
    inf = float("inf")
    logits = torch.tensor([0.0, -1.0, 0.5, -inf, 0.25, -inf, -inf], device=device)
    total = float(torch.exp(logits.double().cpu() - 0.5).sum())  # the row max is 0.5
    targets = torch.tensor(
        [0.0, 0.5, total * 0.999, total, total * 1.5, 1e30], dtype=torch.float64, device=device
    )
    out = torch.full((2 * len(targets),), -9, dtype=torch.int32, device=device)
    _draw_kernel[(len(targets),)](logits, targets, out, logits.numel(), 0.5, BLOCK_F)
    picked, drawn = out.view(-1, 2).t().cpu().tolist()
    assert picked == drawn, "the one-tile draw and the walk's pick differ"
    # inside the mass: the first id whose running sum passes the target; at or past it: the
    # last id of positive weight, 4 (ids 5 and 6 weigh 0 and are never drawn)
    assert picked == [0, 0, 4, 4, 4, 4]
