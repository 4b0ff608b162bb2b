"""vLLM Model Runner V2 ``rejection_sample`` (pinned overlay) on pp3's inputs, and back.

The overlay (``pp3cli.verifiers.overlay``) provides the function; this module maps one
``pp3kernels.ChainInputs`` to its keyword arguments and its outputs back to pp3's layout.
vLLM flattens requests to N = B*(K+1) "logits rows":

- ``target_logits`` [N, V]: row b*(K+1)+i is chain row i of request b. vLLM expects
  temperature already applied (its resampler runs with APPLY_TEMPERATURE=False), so rows
  of requests with tau not in {0, 1} are divided by tau (a copy); otherwise a view.
- ``draft_logits`` None: one-hot drafts, q(x) = 1 (else [B, K, V] draft logits, divided by
  tau inside vLLM; ``log q`` with -inf off the support gives the draft law q).
- ``draft_sampled`` [N] int64 shifted by one row: entry b*(K+1)+i+1 is draft i of request
  b; entry b*(K+1) (vLLM's last sampled token) is unused and set to 0.
- ``cu_num_logits`` [B+1] int32: request b owns rows [cu[b], cu[b+1]).
- ``pos`` [N] int64: position + i for chain row i (vLLM's per-row Philox offset).
- ``idx_mapping`` [B] int32 request -> state slot (identity here);
  ``expanded_idx_mapping`` [N] int32 row -> state slot; ``expanded_local_pos`` [N] int32
  row -> i in 0..K (row K is the bonus row).
- ``temperature`` [B] fp32 and ``seed`` [B] int64 per state slot;
  ``num_speculative_steps`` = K.

It returns ``(sampled [B, K+1] int64, num_sampled [B] int32)``: num_sampled = accepted + 1
tokens are valid; entries past them are uninitialised (``chain_from_vllm`` masks them).

``VllmMrv2Verifier`` makes the function a ``pp3kernels.ChainVerifier`` (``pp3 qualify
--verifier vllm-mrv2``). The draft law goes in as ``draft_logits`` only when some request's
q is not a point mass on its own proposal (``draft_logits_from_q``): vLLM's one-hot path is
then exactly q = 1 on the proposal. Otherwise ``draft_logits`` = tau * log q (natural log
of the exact count / C, rounded once to fp32; -inf off the support): vLLM divides it by tau
and renormalises, so it sees q up to fp32 rounding of log q (exact for tau = 1 and for point
masses). vLLM has no status output: every row comes back STATUS_OK, whatever its logits
(the edge battery records where that differs from pp3's contract).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pp3cli.verifiers.slices import InputsVerifier, in_slices
from pp3kernels import STATUS_OK, ChainInputs, ChainResult, ChainVerifier

if TYPE_CHECKING:
    from torch import Tensor


def vllm_arguments(inputs: ChainInputs, *, draft_logits: Tensor | None = None) -> dict[str, Any]:
    """Keyword arguments for ``rejection_sample`` from pp3's inputs (module docstring)."""
    import torch

    logits, draft_tokens = inputs.logits, inputs.draft_tokens
    batch, rows, vocab = (int(size) for size in logits.shape)
    depth = rows - 1
    device = logits.device
    flat = logits.reshape(batch * rows, vocab)
    scale = inputs.temperature.to(device=device, dtype=torch.float32)
    scaled = (scale != 0) & (scale != 1)
    if bool(scaled.any()):
        divisor = torch.where(scaled, scale, torch.ones_like(scale))
        flat = (logits.float() / divisor[:, None, None]).to(logits.dtype)
        flat = flat.reshape(batch * rows, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    draft_sampled = torch.zeros(batch, rows, dtype=torch.int64, device=device)
    draft_sampled[:, 1:] = draft_tokens.to(device=device, dtype=torch.int64)
    local = torch.arange(rows, dtype=torch.int64, device=device)
    requests = torch.arange(batch, dtype=torch.int32, device=device)
    return {
        "target_logits": flat,
        "draft_logits": draft_logits,
        "draft_sampled": draft_sampled.reshape(-1),
        "cu_num_logits": torch.arange(batch + 1, dtype=torch.int32, device=device) * rows,
        "pos": (inputs.position.to(device=device, dtype=torch.int64)[:, None] + local).reshape(-1),
        "idx_mapping": requests,
        "expanded_idx_mapping": requests.repeat_interleave(rows),
        "expanded_local_pos": local.to(torch.int32).repeat(batch),
        "temperature": scale.contiguous(),
        "seed": inputs.seed.to(device=device, dtype=torch.int64).contiguous(),
        "num_speculative_steps": depth,
    }


def interpreter_blocker() -> str | None:
    """Why vLLM's kernels cannot run in Triton's interpreter here, or None when they can.

    vLLM 0.33's kernels loop over runtime bounds (``range(num_draft_tokens)``); Triton
    3.6's interpreter converts such a bound through a one-element numpy array, which numpy
    >= 2.4 refuses (triton-lang/triton#9171). pp3's own kernels keep their bounds constexpr.
    """
    import numpy as np

    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        return (
            f"vLLM 0.33's Triton kernels cannot run in Triton's interpreter with numpy "
            f"{np.__version__} (runtime loop bounds; triton-lang/triton#9171): run it on a "
            "GPU, or in an environment with numpy < 2.4"
        )
    return None


def chain_from_vllm(sampled: Tensor, num_sampled: Tensor) -> tuple[Tensor, Tensor]:
    """vLLM outputs -> pp3's layout: tokens [B, K+1] int32 (-1 past the emitted ones) and
    accepted [B] int32 = num_sampled - 1."""
    import torch

    columns = torch.arange(sampled.shape[1], device=sampled.device)
    valid = columns[None, :] < num_sampled.to(torch.int64)[:, None]
    tokens = torch.where(valid, sampled, torch.full_like(sampled, -1)).to(torch.int32)
    return tokens, (num_sampled.to(torch.int32) - 1)


def point_mass_drafts(inputs: ChainInputs) -> bool:
    """True when every proposal's q is the point mass on that proposal (or q is absent)."""
    import torch

    drafts = inputs.draft_tokens.to(torch.int64)
    valid = drafts >= 0
    if inputs.q_dense is not None:
        q = inputs.q_dense.to(torch.float64)
        mass = q.gather(2, drafts.clamp(min=0).unsqueeze(2)).squeeze(2)
        return bool(torch.where(valid, mass == 1, torch.ones_like(valid)).all())
    if inputs.q_ids is None or inputs.q_counts is None:
        return True
    on_draft = (inputs.q_ids.to(torch.int64) == drafts.unsqueeze(2)) & (inputs.q_counts > 0)
    full = (inputs.q_counts.to(torch.int64) * on_draft).sum(dim=2) == int(inputs.denominator or 0)
    return bool(torch.where(valid, full, torch.ones_like(valid)).all())


def draft_logits_from_q(inputs: ChainInputs) -> Tensor:
    """vLLM's ``draft_logits`` [B, K, V] fp32 for pp3's q: tau * log q (-inf where q = 0).

    Sparse q is first made dense exactly (count / C in fp64, C a power of two), then its
    natural log is rounded once to fp32 and scaled by tau (vLLM divides by tau again; T0
    rows keep log q, which vLLM does not read). Without q, point masses on the proposals.
    """
    import torch

    logits = inputs.logits
    batch, rows, vocab = (int(size) for size in logits.shape)
    depth = rows - 1
    device = logits.device
    if inputs.q_dense is not None:
        dense = inputs.q_dense.to(device=device, dtype=torch.float64)
    elif inputs.q_ids is not None and inputs.q_counts is not None and inputs.denominator:
        dense = torch.zeros(batch, depth, vocab, dtype=torch.float64, device=device)
        ids = inputs.q_ids.to(device=device, dtype=torch.int64)
        weights = inputs.q_counts.to(device=device, dtype=torch.float64) / inputs.denominator
        weights = torch.where(ids >= 0, weights, torch.zeros_like(weights))  # -1: padding
        dense.scatter_add_(2, ids.clamp(min=0), weights)
    else:
        dense = torch.zeros(batch, depth, vocab, dtype=torch.float64, device=device)
        drafts = inputs.draft_tokens.to(device=device, dtype=torch.int64)
        dense.scatter_(2, drafts.clamp(min=0).unsqueeze(2), 1.0)
    log_q = torch.log(dense).to(torch.float32)
    tau = inputs.temperature.to(device=device, dtype=torch.float32)
    scale = torch.where(tau > 0, tau, torch.ones_like(tau))
    scaled = torch.where(torch.isfinite(log_q), log_q * scale[:, None, None], log_q)
    return scaled.contiguous()


# The adapter hands vLLM at most this many logits (requests x (K+1) x V) per call: the dense
# draft logits it builds from q ([requests, K, V], fp64 then fp32) and vLLM's tempered copy
# of the target logits stay a few GiB whatever the batch. vLLM draws each request's
# randomness from its own seed and positions, so slicing the batch changes no output.
ADAPTER_CHUNK_ELEMENTS = 1 << 27


class VllmMrv2Verifier(InputsVerifier):
    """vLLM MRV2's ``rejection_sample`` as a ``pp3kernels.ChainVerifier`` (module docstring).

    ``rejection_sample`` is the pinned overlay's function, or in tests a stand-in with its
    signature.
    """

    def __init__(self, rejection_sample: Callable[..., Any]) -> None:
        self.rejection_sample = rejection_sample

    def verify(self, inputs: ChainInputs) -> ChainResult:
        """Map pp3's inputs to vLLM's arguments, call it, map its outputs back."""
        import torch

        one_hot = point_mass_drafts(inputs)
        _batch, rows, vocab = (int(size) for size in inputs.logits.shape)

        def call(part: ChainInputs) -> ChainResult:
            draft_logits = None if one_hot else draft_logits_from_q(part)
            sampled, num_sampled = self.rejection_sample(
                **vllm_arguments(part, draft_logits=draft_logits)
            )
            tokens, accepted = chain_from_vllm(sampled, num_sampled)
            status = torch.full_like(accepted, STATUS_OK, dtype=torch.int8)
            return ChainResult(tokens, accepted, status)

        return in_slices(
            inputs, call, elements_per_request=rows * vocab, budget=ADAPTER_CHUNK_ELEMENTS
        )


def vllm_verifier(rejection_sample: Callable[..., Any]) -> ChainVerifier:
    """``VllmMrv2Verifier`` typed as the one verifier interface."""
    return VllmMrv2Verifier(rejection_sample)
