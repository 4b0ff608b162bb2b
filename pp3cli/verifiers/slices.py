"""Calling a peer's sampler on slices of a batch, so that its dense temporaries stay bounded.

Peers take dense per-request tensors (vLLM: draft logits [B, K, V]; FlashInfer: fp32
probabilities [B, K+1, V+1]), so one call on a qualification batch of 2^19 requests at
V = 32768 would ask for hundreds of GB. Each adapter is an ``InputsVerifier``: it writes
its mapping as a function of one ``ChainInputs`` and states its elements per request and a
budget; ``in_slices`` calls it on consecutive request slices within that budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from pp3kernels import ChainInputs, ChainResult

if TYPE_CHECKING:
    from torch import Tensor


class InputsVerifier(ABC):
    """A ``pp3kernels.ChainVerifier`` written as ``verify`` of one ``ChainInputs``: the
    call's arguments are packed as one batch here, once for every adapter."""

    def __call__(
        self,
        logits: Tensor,
        draft_tokens: Tensor,
        temperature: Tensor,
        seed: Tensor,
        position: Tensor,
        *,
        q_ids: Tensor | None = None,
        q_counts: Tensor | None = None,
        denominator: int | None = None,
        q_dense: Tensor | None = None,
    ) -> ChainResult:
        """``verify`` on the call's arguments as one ``ChainInputs``."""
        return self.verify(
            ChainInputs(
                logits,
                draft_tokens,
                temperature,
                seed,
                position,
                q_ids=q_ids,
                q_counts=q_counts,
                denominator=denominator,
                q_dense=q_dense,
            )
        )

    @abstractmethod
    def verify(self, inputs: ChainInputs) -> ChainResult:
        """The verifier's result on ``inputs``."""


def in_slices(
    inputs: ChainInputs,
    call: Callable[[ChainInputs], ChainResult],
    *,
    elements_per_request: int,
    budget: int,
) -> ChainResult:
    """``call`` on slices of max(1, budget // elements_per_request) requests, in order;
    the results concatenated along the batch (a batch of 0 requests is called once)."""
    import torch

    step = max(1, budget // max(1, elements_per_request))
    batch = int(inputs.draft_tokens.shape[0])
    parts = [
        call(inputs.select(slice(start, start + step))) for start in range(0, max(batch, 1), step)
    ]
    return ChainResult(*(torch.cat(list(column)) for column in zip(*parts, strict=True)))
