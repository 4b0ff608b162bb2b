"""Is a kernel/reference disagreement on a T1 row a float-rounding event, or a real error?

The kernel and the torch reference follow the same procedure with the same uniforms, but
they sum in different orders and precisions (the kernel: fp32 per-lane running sums
combined across lanes, tiles and splits; the reference: fp64 sums of fp32 exponentials),
so their inverse-CDF targets u * total and their p_x differ by rounding. Where a uniform
lands that close to a token boundary (or U * q_x that close to p_x), the two may pick
neighbouring outcomes. How often depends on the row: the chance is about the rounding
divided by the width of the token drawn, and at V = 129280 a flat tail has widths of
order 1 / V. So a fixed agreement rate is the wrong test. This module measures each
disagreement instead, against the procedure evaluated in fp64 from the logits:

- ``accept``: the two accepted different counts; the first row a where they differ has
  draft x with true p_x and q_x; distance = |U q_x - p_x| / max(U q_x, p_x).
- ``emit``: the same count a but a different token at row a; with the true normalised
  weights w (the residual (p - q)+ after a rejection, p at an invalidated proposal or the
  bonus row) and cumulative W, the kernel's token v covers [W_{v-1}, W_v]; distance =
  how far the sample uniform u lies outside that interval (0 inside).

A disagreement is explained iff its distance <= ``EPSILON`` = 2e-6: fp32 carries 2^-24
relative error per operation, a tree sum of <= 2^17 positive terms adds at most 17 such
errors (1.0e-6), and the exponentials and scalings add a few ulps more. A one-token slip
on a flat V = 129280 row moves the target by about 1 / V = 7.7e-6, beyond EPSILON, and a
systematic error shows on most rows, where the uniform is far from every boundary.
"""

from __future__ import annotations

from typing import Any

import torch

from pp3kernels.philox import acceptance_uniform, sample_uniform
from pp3kernels.reference import _sparse_q_row

EPSILON = 2e-6


def _q_row(args: dict[str, Any], b: int, row: int, vocab: int) -> torch.Tensor:
    """q of request b at chain row ``row`` as fp64 [V] (sparse counts / C or dense q)."""
    if args.get("q_dense") is not None:
        dense: torch.Tensor = args["q_dense"]
        return dense[b, row].to(torch.float64).cpu()
    ids, counts = (args[key][b : b + 1].cpu() for key in ("q_ids", "q_counts"))
    return _sparse_q_row(ids, counts, args["denominator"], row, vocab)[0][0]


def rounding_distance(
    args: dict[str, Any],
    b: int,
    kernel: tuple[list[int], int],
    reference: tuple[list[int], int],
) -> tuple[str, float]:
    """("accept" | "emit", distance) of request b's disagreement; see the module docstring.

    ``kernel`` and ``reference`` are (tokens, accepted) of request b; b must be a T1
    request whose statuses are OK and whose outputs differ.
    """
    tokens, kernel_accepted = kernel
    _, reference_accepted = reference
    drafts = args["draft_tokens"][b].to(torch.int64).cpu()
    depth = drafts.shape[0]
    a = min(kernel_accepted, reference_accepted)
    tau = float(args["temperature"][b])
    logits = args["logits"][b, a].to(torch.float64).cpu()
    weights = torch.exp((logits - logits.max()) / tau)
    p = weights / weights.sum()
    seed = args["seed"][b : b + 1].cpu()
    rowpos = args["position"][b : b + 1].cpu() + a
    x = int(drafts[a]) if a < depth else -1
    if kernel_accepted != reference_accepted:
        q_x = float(_q_row(args, b, a, logits.shape[0])[x])
        coin = float(acceptance_uniform(seed, rowpos)[0]) * q_x
        p_x = float(p[x])
        return "accept", abs(coin - p_x) / max(coin, p_x)
    if x >= 0:  # a rejection at row a: the residual (p - q)+, or p if it is empty
        residual = (p - _q_row(args, b, a, logits.shape[0])).clamp(min=0.0)
        chosen = residual if float(residual.sum()) > 0 else p
    else:  # invalidated proposal or the bonus row: p itself
        chosen = p
    cumulative = (chosen / chosen.sum()).cumsum(0)
    v = tokens[a]
    if not 0 <= v < cumulative.shape[0]:
        return "emit", float("inf")
    low = float(cumulative[v - 1]) if v > 0 else 0.0
    high = float(cumulative[v])
    u = float(sample_uniform(seed, rowpos)[0])
    return "emit", max(0.0, low - u, u - high)
