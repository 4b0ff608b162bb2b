"""The greedy (T0) path, computed independently of any verifier: the one greedy reference.

T0 law (``pp3kernels.contract``): y_i = argmax_v l_{i,v} with the lowest id on ties and
-0.0 == +0.0; accept x_i iff x_i == y_i; at the first mismatch (or -1) emit y_i and stop;
after K accepts emit the bonus y_K. So the accepted length a is the number of leading
matches, and the tokens are x_0 .. x_{a-1} = y_0 .. y_{a-1}, then y_a, then -1 padding.

``torch.argmax`` returns the first maximal index (documented), and IEEE comparison makes
-0.0 == +0.0, so it computes y exactly as the contract states, on any device. Qualify's
greedy pairing and edge battery compare verifiers with this; the probe checks every
comparator's T0 rows against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def greedy_path(argmax: Tensor, drafts: Tensor) -> tuple[Tensor, Tensor]:
    """(tokens [B, K+1] int32 with -1 padding, accepted [B] int32) from y [B, K+1], x [B, K]."""
    import torch

    batch, rows = argmax.shape
    depth = rows - 1
    matches = (drafts.to(torch.int64) == argmax[:, :depth].to(torch.int64)).to(torch.int64)
    accepted = matches.cumprod(dim=1).sum(dim=1)
    columns = torch.arange(rows, device=argmax.device)[None, :]
    padding = torch.full((batch, rows), -1, dtype=torch.int64, device=argmax.device)
    tokens = torch.where(columns <= accepted[:, None], argmax.to(torch.int64), padding)
    return tokens.to(torch.int32), accepted.to(torch.int32)


def greedy_from_logits(logits: Tensor, drafts: Tensor) -> tuple[Tensor, Tensor]:
    """The greedy path of logits [B, K+1, V] (any float dtype) and drafts [B, K]."""
    import torch

    return greedy_path(torch.argmax(logits, dim=-1), drafts)
