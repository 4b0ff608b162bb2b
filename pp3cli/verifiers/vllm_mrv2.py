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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from pp3kernels import ChainInputs


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


def chain_from_vllm(sampled: Tensor, num_sampled: Tensor) -> tuple[Tensor, Tensor]:
    """vLLM outputs -> pp3's layout: tokens [B, K+1] int32 (-1 past the emitted ones) and
    accepted [B] int32 = num_sampled - 1."""
    import torch

    columns = torch.arange(sampled.shape[1], device=sampled.device)
    valid = columns[None, :] < num_sampled.to(torch.int64)[:, None]
    tokens = torch.where(valid, sampled, torch.full_like(sampled, -1)).to(torch.int32)
    return tokens, (num_sampled.to(torch.int32) - 1)
