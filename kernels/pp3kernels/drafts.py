"""Integer draft laws: quantising float q to counts over C, and drawing proposals from them.

The verifier needs the exact law each proposal was drawn from. pp3 therefore represents
a draft distribution as integer counts n_v over a power-of-two denominator C
(q_v = n_v / C exactly), and draws proposals from those counts with its own Philox
stream, so the proposal law is exactly q (no float rounding anywhere):

* ``quantise_q`` turns float probabilities into counts with sum exactly C and a positive
  count on every token with positive probability.
* ``sample_drafts`` draws x_i by exact integer inverse CDF: with
  r = draft_integer(seed, position + i, C) = w0 mod C (STREAM_DRAFT, index 0), uniform on
  [0, C), x_i is the id of the first slot whose running count exceeds r. Slot j is
  therefore chosen for exactly n_j of the C values of r: P(x_i = id_j) = n_j / C.
* ``point_mass_q`` is the q of a deterministic drafter: S = 1, count C on the proposal.
"""

from __future__ import annotations

import torch

from pp3kernels.contract import NO_TOKEN, SelectorInputError, check_denominator
from pp3kernels.philox import draft_integer


def _row_name(flat_index: int, leading: tuple[int, ...]) -> str:
    if not leading:
        return "the row"
    index = []
    for size in reversed(leading):
        index.append(flat_index % size)
        flat_index //= size
    return f"row {tuple(reversed(index))}"


def quantise_q(
    probs: torch.Tensor, denominator: int, *, max_support: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer counts over C approximating ``probs`` [..., V], exact mass C per row.

    Each row is normalised by its fp64 sum, p_v = probs_v / sum_w probs_w. Rounding rule
    (deterministic, vectorised): every token with p_v > 0 first receives one count (so
    q(v) > 0 wherever p(v) > 0; this needs C >= the number of positive tokens), and the
    remaining R = C - #positive counts are apportioned by largest remainder on
    t_v = R * p_v: floor(t_v) each, then one more to each of the R - sum floor(t) tokens
    with the largest fractional parts t_v - floor(t_v), ties to the lowest id. So
    n_v = 1 + floor(t_v) or 2 + floor(t_v) on the support and sum_v n_v = C exactly.

    Returns (ids, counts), int32 [..., S]: support ids in increasing order, then padding
    (id -1, count 0). S = max_support if given (error if a row needs more), otherwise the
    largest support size over all rows (at least 1).
    """
    denominator = check_denominator(denominator)
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise SelectorInputError(
            f"probs must be a floating-point tensor [..., V]; got {type(probs).__name__}"
            + (f" of dtype {probs.dtype}" if isinstance(probs, torch.Tensor) else "")
        )
    if probs.ndim < 1 or probs.shape[-1] < 1:
        raise SelectorInputError(
            f"probs has shape {tuple(probs.shape)}; expected [..., V] with V >= 1"
        )
    leading = tuple(int(n) for n in probs.shape[:-1])
    vocab = int(probs.shape[-1])
    flat = probs.reshape(-1, vocab).to(torch.float64)
    rows = flat.shape[0]

    bad = ~torch.isfinite(flat) | (flat < 0)
    if bool(bad.any()):
        row, token = (int(v) for v in bad.nonzero()[0].tolist())
        raise SelectorInputError(
            f"{_row_name(row, leading)}, token {token}: probability {float(flat[row, token])!r}; "
            "expected finite values >= 0"
        )
    totals = flat.sum(dim=-1)
    empty = totals <= 0
    if bool(empty.any()):
        row = int(empty.nonzero()[0])
        raise SelectorInputError(
            f"{_row_name(row, leading)} has total probability 0; expected a positive mass"
        )
    positive = flat > 0
    support = positive.sum(dim=-1)
    too_many = support > denominator
    if bool(too_many.any()):
        row = int(too_many.nonzero()[0])
        raise SelectorInputError(
            f"{_row_name(row, leading)} has {int(support[row])} tokens with positive "
            f"probability but denominator {denominator}; expected a power-of-two denominator "
            f">= {int(support[row])} so every such token gets a positive count"
        )
    if max_support is not None:
        if max_support < 1:
            raise SelectorInputError(f"max_support {max_support} must be >= 1")
        over = support > max_support
        if bool(over.any()):
            row = int(over.nonzero()[0])
            raise SelectorInputError(
                f"{_row_name(row, leading)} has {int(support[row])} tokens with positive "
                f"probability; expected at most max_support = {max_support}"
            )
        slots = max_support
    else:
        slots = max(int(support.max()) if rows else 1, 1)

    # Finite probabilities can still sum past the fp64 range (inf): such rows are
    # normalised through flat * 2^-64, exact for every value that matters (p_v is
    # scale-free; a value the scaling underflows is below 2^-1010 against a sum above
    # 2^1024, so t_v = 0 either way, and it keeps its count through ``positive``). Rows
    # with a finite sum are untouched (bit for bit).
    overflow = torch.isinf(totals)
    shares = flat
    if bool(overflow.any()):
        shares = torch.where(overflow[:, None], flat * 2.0**-64, flat)
        totals = shares.sum(dim=-1)
    remaining = denominator - support  # R >= 0
    target = remaining[:, None].to(torch.float64) * (shares / totals[:, None])
    floors = torch.where(positive, target.floor(), 0.0).to(torch.int64)
    leftover = (remaining - floors.sum(dim=-1)).clamp(min=0)
    leftover = torch.minimum(leftover, support)
    fraction = torch.where(positive, target - floors.to(torch.float64), -1.0)
    order = torch.sort(fraction, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(vocab, device=order.device).expand(rows, vocab))
    extra = (rank < leftover[:, None]) & positive
    counts_full = torch.where(positive, 1 + floors + extra.to(torch.int64), 0)
    mass = counts_full.sum(dim=-1)
    if bool((mass != denominator).any()):  # cannot happen; refuse rather than emit bad q
        row = int((mass != denominator).nonzero()[0])
        raise RuntimeError(
            f"quantise_q produced mass {int(mass[row])} != {denominator} on "
            f"{_row_name(row, leading)}; please report this input"
        )

    ids = torch.full((rows, slots), NO_TOKEN, dtype=torch.int64, device=probs.device)
    counts = torch.zeros((rows, slots), dtype=torch.int64, device=probs.device)
    row_idx, token_idx = positive.nonzero(as_tuple=True)
    slot_idx = (positive.cumsum(dim=-1) - 1)[row_idx, token_idx]
    ids[row_idx, slot_idx] = token_idx
    counts[row_idx, slot_idx] = counts_full[row_idx, token_idx]
    shape = (*leading, slots)
    return ids.to(torch.int32).reshape(shape), counts.to(torch.int32).reshape(shape)


def point_mass_q(draft_tokens: torch.Tensor, denominator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q of a deterministic drafter: ids = x, counts = C (S = 1); x = -1 gives padding.

    ``draft_tokens`` [..., K] integer; returns (ids, counts) int32 [..., K, 1].
    """
    denominator = check_denominator(denominator)
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.is_floating_point():
        raise SelectorInputError("draft_tokens must be an integer tensor [..., K]")
    below = draft_tokens < NO_TOKEN
    if bool(below.any()):
        where = tuple(int(v) for v in below.nonzero()[0].tolist())
        raise SelectorInputError(
            f"draft token {int(draft_tokens[where])} at index {where}; expected -1 or an id >= 0"
        )
    proposes = draft_tokens >= 0
    ids = torch.where(proposes, draft_tokens.to(torch.int64), NO_TOKEN)[..., None]
    counts = torch.where(proposes, denominator, 0)[..., None]
    return ids.to(torch.int32), counts.to(torch.int32)


def sample_drafts(
    q_ids: torch.Tensor,
    q_counts: torch.Tensor,
    denominator: int,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    invalidate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw proposals x [B, K] int32 exactly from integer q (see the module docstring).

    q_ids, q_counts [B, K, S] int32 over power-of-two ``denominator`` C; seed, position
    [B] int64. Draft i of request b uses r = draft_integer(seed[b], position[b] + i, C).
    A row with total count 0, or with ``invalidate[b, i]`` True, gives -1. Refuses
    negative counts, a row total other than 0 or C, and positive counts on ids < 0.
    """
    denominator = check_denominator(denominator)
    for name, tensor in (("q_ids", q_ids), ("q_counts", q_counts)):
        if not isinstance(tensor, torch.Tensor) or tensor.ndim != 3 or tensor.dtype != torch.int32:
            raise SelectorInputError(f"{name} must be an int32 tensor [B, K, S]")
    if q_ids.shape != q_counts.shape or q_ids.shape[2] < 1:
        raise SelectorInputError(
            f"q_ids {tuple(q_ids.shape)} and q_counts {tuple(q_counts.shape)}; expected the "
            "same shape [B, K, S] with S >= 1"
        )
    batch, drafts, _ = (int(n) for n in q_ids.shape)
    for name, tensor in (("seed", seed), ("position", position)):
        if (
            not isinstance(tensor, torch.Tensor)
            or tensor.shape != (batch,)
            or tensor.dtype != torch.int64
        ):
            raise SelectorInputError(f"{name} must be an int64 tensor [B] = [{batch}]")
    if invalidate is not None and (
        not isinstance(invalidate, torch.Tensor)
        or invalidate.shape != (batch, drafts)
        or invalidate.dtype != torch.bool
    ):
        raise SelectorInputError(f"invalidate must be a bool tensor [B, K] = [{batch}, {drafts}]")
    for name, tensor in (("q_counts", q_counts), ("seed", seed), ("position", position)) + (
        (("invalidate", invalidate),) if invalidate is not None else ()
    ):
        if tensor.device != q_ids.device:
            raise SelectorInputError(
                f"{name} is on {tensor.device} but q_ids is on {q_ids.device}; expected one device"
            )

    counts = q_counts.to(torch.int64)
    ids = q_ids.to(torch.int64)
    negative = counts < 0
    if bool(negative.any()):
        b, i, slot = (int(v) for v in negative.nonzero()[0].tolist())
        raise SelectorInputError(
            f"request {b}, row {i}: q count {int(counts[b, i, slot])} at slot {slot}; "
            "expected counts >= 0"
        )
    bad_id = (counts > 0) & (ids < 0)
    if bool(bad_id.any()):
        b, i, slot = (int(v) for v in bad_id.nonzero()[0].tolist())
        raise SelectorInputError(
            f"request {b}, row {i}: slot {slot} has count {int(counts[b, i, slot])} but id "
            f"{int(ids[b, i, slot])}; expected a token id >= 0"
        )
    total = counts.sum(dim=-1)
    bad_mass = (total != 0) & (total != denominator)
    if bool(bad_mass.any()):
        b, i = (int(v) for v in bad_mass.nonzero()[0].tolist())
        raise SelectorInputError(
            f"request {b}, row {i}: q mass {int(total[b, i])}; expected {denominator} "
            "(or 0 for no proposal)"
        )

    offsets = torch.arange(drafts, dtype=torch.int64, device=q_ids.device)
    r = draft_integer(seed[:, None], position[:, None] + offsets[None, :], denominator)
    running = counts.cumsum(dim=-1)
    chosen_slot = (running <= r[..., None]).sum(dim=-1).clamp(max=q_ids.shape[2] - 1)
    token = ids.gather(2, chosen_slot[..., None])[..., 0]
    no_draft = total == 0
    if invalidate is not None:
        no_draft = no_draft | invalidate
    return torch.where(no_draft, NO_TOKEN, token).to(torch.int32)
