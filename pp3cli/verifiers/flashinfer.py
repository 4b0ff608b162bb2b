"""FlashInfer's chain speculative sampling as a ``pp3kernels.ChainVerifier`` (optional extra).

``flashinfer.sampling.chain_speculative_sampling(draft_probs [B, K, V], draft_token_ids
[B, K], target_probs [B, K+1, V], ..., seed, offset)`` takes probabilities, not logits, and
has no temperature, no greedy mode and no invalidated proposal. The adapter maps pp3's
inputs onto it exactly, with one extra vocabulary column:

- target_probs: softmax(logits / tau) in fp32 for T1 rows; for T0 rows the one-hot at the
  argmax (lowest id on ties), so that FlashInfer's law is the greedy path. Column V (the
  "pad" token) has p = 0 in every row.
- draft_probs: q made dense exactly (count / C is exact in fp32 for C <= 2^24), or q_dense,
  or point masses on the proposals when q is absent.
- an invalidated proposal (-1) becomes the pad token with q = 1 on it: p(pad) = 0, so it is
  rejected with certainty and the residual (p - q)+ is p itself: "at -1 emit z ~ p_i and
  stop", as the contract says. A pad token that comes back is out of range and counts as
  malformed.
- seed [B] int64 and offset = position [B] int64 per output row (FlashInfer also keys its
  Philox subsequence by the row index, so its outputs depend on batch order: the edge
  battery's request-permutation check records that).
- it returns (tokens [B, K+1] int32 padded with -1, accepted-if-independent [B],
  emitted drafts [B]); pp3's accepted = emitted drafts. FlashInfer has no status: every row
  comes back STATUS_OK.

FlashInfer is not a dependency: ``load_chain_speculative_sampling`` imports it when asked
(``pip install flashinfer-python``; it compiles its sampling module with nvcc on first use).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pp3cli.run.errors import EnvironmentProblem
from pp3cli.verifiers.slices import InputsVerifier, in_slices
from pp3kernels import STATUS_OK, ChainInputs, ChainResult, ChainVerifier

if TYPE_CHECKING:
    from torch import Tensor

ENTRY = "flashinfer.sampling.chain_speculative_sampling"


# The files that define FlashInfer's chain law (Python wrapper, CUDA source and header),
# relative to the installed ``flashinfer`` package; their SHA-256 go into the receipt.
LAW_FILES = ("sampling.py", "data/csrc/sampling.cu", "data/include/flashinfer/sampling.cuh")


def law_digests(package_dir: Path) -> dict[str, str]:
    """{file: sha256} of ``LAW_FILES`` present under the installed package folder."""
    return {
        name: hashlib.sha256((package_dir / name).read_bytes()).hexdigest()
        for name in LAW_FILES
        if (package_dir / name).is_file()
    }


def load_chain_speculative_sampling() -> tuple[Callable[..., Any], dict[str, str]]:
    """FlashInfer's function and {"version", "file"}; EnvironmentProblem when not installed."""
    try:
        import flashinfer.sampling  # type: ignore[import-not-found, unused-ignore]
    except ImportError as err:
        raise EnvironmentProblem(
            f"--verifier flashinfer needs the flashinfer-python package ({err}); install it "
            "where a CUDA GPU and nvcc are (docs/verifiers.md)"
        ) from err
    function: Callable[..., Any] = flashinfer.sampling.chain_speculative_sampling
    version = str(getattr(flashinfer, "__version__", "unknown"))
    return function, {"version": version, "file": str(flashinfer.sampling.__file__)}


def flashinfer_arguments(
    logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    *,
    q_ids: Tensor | None,
    q_counts: Tensor | None,
    denominator: int | None,
    q_dense: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(draft_probs [B, K, V+1], draft_token_ids [B, K] int32, target_probs [B, K+1, V+1])."""
    import torch

    batch, rows, vocab = (int(size) for size in logits.shape)
    depth = rows - 1
    device = logits.device
    tau = temperature.to(device=device, dtype=torch.float32)
    greedy = tau == 0
    scale = torch.where(greedy, torch.ones_like(tau), tau)
    scaled = logits.float() / scale[:, None, None]
    target = torch.zeros(batch, rows, vocab + 1, dtype=torch.float32, device=device)
    target[..., :vocab] = torch.softmax(scaled, dim=-1)
    argmax = logits.float().argmax(dim=-1, keepdim=True)  # first maximum: the lowest id
    one_hot = torch.zeros_like(target).scatter_(2, argmax, 1.0)
    target = torch.where(greedy[:, None, None], one_hot, target)

    drafts = draft_tokens.to(device=device, dtype=torch.int64)
    invalid = drafts < 0
    draft = torch.zeros(batch, depth, vocab + 1, dtype=torch.float32, device=device)
    if q_dense is not None:
        draft[..., :vocab] = q_dense.to(device=device, dtype=torch.float32)
    elif q_ids is not None and q_counts is not None and denominator:
        ids = q_ids.to(device=device, dtype=torch.int64)
        weights = q_counts.to(device=device, dtype=torch.float32) / denominator
        weights = torch.where(ids >= 0, weights, torch.zeros_like(weights))  # -1: padding
        draft.scatter_add_(2, ids.clamp(min=0), weights)
    else:
        draft.scatter_(2, drafts.clamp(min=0).unsqueeze(2), 1.0)
    pad = torch.zeros_like(draft)
    pad[..., vocab] = 1.0
    draft = torch.where(invalid[:, :, None], pad, draft)
    proposals = torch.where(invalid, torch.full_like(drafts, vocab), drafts).to(torch.int32)
    return draft.contiguous(), proposals.contiguous(), target.contiguous()


# At most this many fp32 elements of target probabilities [requests, K+1, V+1] per
# FlashInfer call (512 MiB; the draft probabilities and the softmax's temporaries are of the
# same order). The strict profile's V = 32768 target calls with 2^19 requests: ~200 GB in
# one piece. Slicing changes which Philox subsequence a request gets (FlashInfer keys it by
# the row's index in the call), not the law.
SLICE_ELEMENTS = 1 << 27


class FlashInferVerifier(InputsVerifier):
    """FlashInfer's ``chain_speculative_sampling`` (or a stand-in with its signature)."""

    def __init__(self, chain_speculative_sampling: Callable[..., Any]) -> None:
        self.chain_speculative_sampling = chain_speculative_sampling

    def verify(self, inputs: ChainInputs) -> ChainResult:
        """Map pp3's inputs (module docstring), call FlashInfer on slices of at most
        ``SLICE_ELEMENTS`` target elements, map its outputs back in request order."""
        _batch, rows, vocab = (int(size) for size in inputs.logits.shape)
        return in_slices(
            inputs,
            self._call,
            elements_per_request=rows * (vocab + 1),
            budget=SLICE_ELEMENTS,
        )

    def _call(self, inputs: ChainInputs) -> ChainResult:
        """One FlashInfer call on the whole of its inputs."""
        import torch

        draft, proposals, target = flashinfer_arguments(
            inputs.logits,
            inputs.draft_tokens,
            inputs.temperature,
            q_ids=inputs.q_ids,
            q_counts=inputs.q_counts,
            denominator=inputs.denominator,
            q_dense=inputs.q_dense,
        )
        device = inputs.logits.device
        tokens, _independent, emitted = self.chain_speculative_sampling(
            draft,
            proposals,
            target,
            deterministic=True,
            seed=inputs.seed.to(device=device, dtype=torch.int64).contiguous(),
            offset=inputs.position.to(device=device, dtype=torch.int64).contiguous(),
        )
        accepted = emitted.to(torch.int32)
        status = torch.full_like(accepted, STATUS_OK, dtype=torch.int8)
        return ChainResult(tokens.to(torch.int32), accepted, status)


def flashinfer_verifier(chain_speculative_sampling: Callable[..., Any]) -> ChainVerifier:
    """``FlashInferVerifier`` typed as the one verifier interface."""
    return FlashInferVerifier(chain_speculative_sampling)
