"""Tiny pure-torch verifiers for ``pp3 qualify --verifier MODULE:FUNCTION`` tests.

``exact`` wraps pp3's torch reference (it must PASS); ``ignores_q`` treats every proposal
as a point mass whatever q says (accept iff U < p(x): a real engines' bug when the draft
law is not one-hot), which the law tests must FAIL; ``highest_id_on_ties`` breaks T0 ties
towards the highest id, which only a T0 comparison can see.
"""

from __future__ import annotations

import torch

from pp3kernels import ChainResult, point_mass_q, reference_verify_chain

DENOMINATOR = 1 << 16


def exact(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    q_ids: torch.Tensor | None = None,
    q_counts: torch.Tensor | None = None,
    denominator: int | None = None,
    q_dense: torch.Tensor | None = None,
) -> ChainResult:
    """pp3's reference, called through the documented signature."""
    return reference_verify_chain(
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


def ignores_q(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    q_ids: torch.Tensor | None = None,
    q_counts: torch.Tensor | None = None,
    denominator: int | None = None,
    q_dense: torch.Tensor | None = None,
) -> ChainResult:
    """Planted bug: q(x) = 1 for every proposal (the draft law is ignored)."""
    ids, counts = point_mass_q(draft_tokens, DENOMINATOR)
    return reference_verify_chain(
        logits,
        draft_tokens,
        temperature,
        seed,
        position,
        q_ids=ids,
        q_counts=counts,
        denominator=DENOMINATOR,
    )


def highest_id_on_ties(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    q_ids: torch.Tensor | None = None,
    q_counts: torch.Tensor | None = None,
    denominator: int | None = None,
    q_dense: torch.Tensor | None = None,
) -> ChainResult:
    """Planted bug: the vocabulary is reversed, so T0 ties go to the highest id."""
    last = logits.shape[-1] - 1

    def mirror(ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids >= 0, last - ids, ids)

    result = reference_verify_chain(
        logits.flip(-1),
        mirror(draft_tokens),
        temperature,
        seed,
        position,
        q_ids=None if q_ids is None else mirror(q_ids),
        q_counts=q_counts,
        denominator=denominator,
        q_dense=None if q_dense is None else q_dense.flip(-1),
    )
    return ChainResult(mirror(result.tokens), result.accepted, result.status)
