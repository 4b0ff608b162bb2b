"""Pure-torch stand-ins with the signatures of vLLM MRV2's ``rejection_sample`` and
FlashInfer's ``chain_speculative_sampling``, implementing the rejection-sampling law as
those functions document it. They let CI test pp3's adapters (argument mapping there and
back, temperature, q, invalidated proposals) without a 336 MB wheel or a GPU; the real
functions are checked in the GPU run (and vLLM's in Triton's interpreter when an overlay
is present, tests/verifiers/test_overlay.py).

Randomness: one torch.Generator per call, seeded from the first request's seed and
position (the callers give every call distinct positions), so calls are independent.
"""

from __future__ import annotations

import torch

MIX = 0x9E3779B97F4A7C15


def _generator(seed: torch.Tensor, offset: torch.Tensor) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed((int(seed[0]) * MIX + int(offset[0])) % (1 << 63))
    return generator


def _chain(
    target: torch.Tensor,
    draft: torch.Tensor,
    drafts: torch.Tensor,
    greedy: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Modified rejection sampling on probabilities: target [R, K+1, V], draft [R, K, V]
    (fp64), drafts [R, K] (-1 invalid), greedy [R] bool. Returns (tokens [R, K+1] with -1
    past the emitted ones, accepted [R])."""
    rows, depth = drafts.shape
    valid = drafts >= 0
    x = drafts.clamp(min=0).unsqueeze(2)
    p_x = target[:, :depth].gather(2, x).squeeze(2)
    q_x = draft.gather(2, x).squeeze(2)
    argmax = target.argmax(dim=-1)
    u = torch.rand(rows, depth, dtype=torch.float64, generator=generator)
    ratio = torch.where(q_x > 0, p_x / q_x.clamp(min=1e-300), torch.zeros_like(p_x))
    accept = torch.where(greedy[:, None], drafts == argmax[:, :depth], u < ratio) & valid
    rejected = (~accept).to(torch.int64)
    first = torch.where(
        rejected.any(dim=1), rejected.argmax(dim=1), torch.full_like(rejected[:, 0], depth)
    )
    index = torch.arange(rows)
    p_row = target[index, first]
    q_row = torch.zeros_like(p_row)
    stopped = first < depth
    use_residual = stopped & valid[index, first.clamp(max=depth - 1)]
    q_row[use_residual] = draft[index[use_residual], first[use_residual]]
    weights = (p_row - q_row).clamp(min=0)
    empty = weights.sum(dim=1) <= 0
    weights[empty] = p_row[empty]
    sampled = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    final = torch.where(greedy, argmax[index, first], sampled)
    tokens = torch.full((rows, depth + 1), -1, dtype=torch.int64)
    columns = torch.arange(depth + 1)
    padded = torch.cat([drafts.to(torch.int64), torch.zeros(rows, 1, dtype=torch.int64)], dim=1)
    tokens = torch.where(columns[None, :] < first[:, None], padded, tokens)
    tokens[index, first] = final
    return tokens, first


def rejection_sample(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64: bool = False,
    use_block_verification: bool = False,
    contexts: torch.Tensor | None = None,
    watermarking: torch.Tensor | None = None,
    watermarking_skip_mask: torch.Tensor | None = None,
    watermark_key: int | None = None,
    fly_window_size: int = 0,
    fly_entropy_threshold: float = 0.3,
    fly_entropy_top_k: int = 3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM MRV2's law: target logits already tempered, draft logits divided by tau here,
    draft_sampled shifted by one row; returns (sampled [R, K+1] int64 with garbage past
    num_sampled, num_sampled [R] int32)."""
    requests = cu_num_logits.shape[0] - 1
    depth = num_speculative_steps
    counts = cu_num_logits[1:] - cu_num_logits[:-1]
    assert bool((counts == depth + 1).all()), "the stand-in takes full chains only"
    vocab = target_logits.shape[1]
    tau = temperature[idx_mapping.long()].float()
    greedy = tau == 0
    target = torch.softmax(target_logits.double().reshape(requests, depth + 1, vocab), dim=-1)
    drafts = draft_sampled.reshape(requests, depth + 1)[:, 1:]
    if draft_logits is None:
        draft = torch.zeros(requests, depth, vocab, dtype=torch.float64)
        draft.scatter_(2, drafts.clamp(min=0).unsqueeze(2), 1.0)
    else:
        scale = torch.where(greedy, torch.ones_like(tau), tau).double()
        scaled = draft_logits[idx_mapping.long()].double() / scale[:, None, None]
        draft = torch.softmax(scaled, dim=-1)
    start = cu_num_logits[:-1].long()
    generator = _generator(seed[idx_mapping.long()], pos[start])
    tokens, first = _chain(target, draft, drafts.long(), greedy, generator)
    sampled = torch.where(tokens >= 0, tokens, torch.full_like(tokens, 987654321))
    return sampled, (first + 1).to(torch.int32)


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's law on probabilities (no temperature, no greedy mode): returns
    (tokens [B, K+1] int32 padded with -1, accepted-if-independent [B], emitted drafts [B])."""
    rows, depth = draft_token_ids.shape
    assert isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)
    assert bool((draft_token_ids >= 0).all()), "FlashInfer takes no -1 proposal"
    rng = _generator(seed, offset)
    greedy = torch.zeros(rows, dtype=torch.bool)
    tokens, first = _chain(
        target_probs.double(), draft_probs.double(), draft_token_ids.long(), greedy, rng
    )
    emitted = first.to(torch.int32)
    return tokens.to(torch.int32), emitted.clone(), emitted
