"""The one chain-verifier interface: its inputs, its result, and the call signature.

Every verifier pp3 runs or judges has the ``verify_chain`` signature (``ChainVerifier``):
the Triton selector, the torch reference, the planted-defect controls, and adapters for
other engines' samplers. Whoever holds a batch (qualify, the oracle, the edge battery, the
probe, the wire receiver) holds it as one ``ChainInputs`` and calls a verifier through
``ChainInputs.verify_with``, so the argument list is written out here and nowhere else.

Shapes (B requests, K drafts, vocabulary V, S support slots; the law is in
``pp3kernels.contract``): logits [B, K+1, V] bf16/fp16/fp32, any strides (a shared target is
an expanded view with batch stride 0); draft_tokens [B, K] int32 (-1 = invalidated);
temperature [B] fp32 (0 = greedy T0); seed and position [B] int64; q either sparse integer
counts (q_ids, q_counts [B, K, S] int32 over the power-of-two ``denominator``), dense float
q_dense [B, K, V], or absent (allowed only where no T1 request proposes a token).

This module imports torch only for type checking, so the constants and these types load
on a machine without torch (a reviewer's laptop running ``pp3 verify-receipts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from torch import Tensor


class ChainResult(NamedTuple):
    """Outputs of one verification call."""

    tokens: Tensor  # [B, K+1] int32: emitted tokens, then -1 padding
    accepted: Tensor  # [B] int32: accepted drafts (emitted = accepted + 1 when OK)
    status: Tensor  # [B] int8: STATUS_* code


class ChainVerifier(Protocol):
    """A chain verifier: ``pp3kernels.verify_chain``'s signature and law."""

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
    ) -> ChainResult: ...


@dataclass(frozen=True)
class ChainInputs:
    """One batch of verification inputs (shapes in the module docstring)."""

    logits: Tensor
    draft_tokens: Tensor
    temperature: Tensor
    seed: Tensor
    position: Tensor
    q_ids: Tensor | None = None
    q_counts: Tensor | None = None
    denominator: int | None = None
    q_dense: Tensor | None = None

    def verify_with(self, verifier: ChainVerifier) -> ChainResult:
        """Run ``verifier`` on these inputs."""
        return verifier(
            self.logits,
            self.draft_tokens,
            self.temperature,
            self.seed,
            self.position,
            q_ids=self.q_ids,
            q_counts=self.q_counts,
            denominator=self.denominator,
            q_dense=self.q_dense,
        )

    def select(self, index: Tensor | slice) -> ChainInputs:
        """The requests at ``index`` (a permutation, a mask or a slice), q included."""

        def pick(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor[index]

        return ChainInputs(
            self.logits[index],
            self.draft_tokens[index],
            self.temperature[index],
            self.seed[index],
            self.position[index],
            q_ids=pick(self.q_ids),
            q_counts=pick(self.q_counts),
            denominator=self.denominator,
            q_dense=pick(self.q_dense),
        )
