"""Plain-torch reference of the selector contract (``pp3kernels.contract``), for tests.

``reference_verify_chain`` is vectorised over the batch and loops over the K+1 chain rows
only; the batch goes through in slices of at most REFERENCE_CHUNK_ELEMENTS logits per row
pass, so its memory is bounded whatever B is (requests are independent: slicing changes no
bit). Per request b and row i (tau = temperature[b], l = logits[b, i, :] in fp32):

    m = max_v l_v,  e_v = exp((l_v - m) / tau)   (fp32),
    s = sum_v e_v   (accumulated in fp64, rounded once to fp32: independent of the
                     batch layout and of the reduction order up to fp64 rounding),
    p_v = e_v / s   (fp32).

T1 (tau > 0), row i < K with draft x >= 0 and integer q (count n of x over C):
accept iff U * n < p_x * C in fp64, U = acceptance_uniform(seed, position + i). Both
products are exact (U has 25 significant bits, n <= 2^24; p_x * C is a power-of-two
scaling), so the comparison is exact given U and p_x; it is strict, so p_x = 0 is never
accepted. Dense float q: accept iff U * q_x < p_x in fp64.

Emission (first rejection, first x = -1, or the bonus row K after K accepts) draws
u = sample_uniform(seed, position + i) and returns the smallest v with
R_v = sum_{w <= v} r_w > u * R_{V-1}, the running sums R in fp64 over the whole row, where
r_v = max(e_v - q_v * s, 0) after a rejection (q_v = n_v / C, or the dense q_v; e_v for
tokens outside the support since q_v = 0 there) and r_v = e_v otherwise. Because
0 < u < 1 and R is non-decreasing, the chosen v always has r_v > 0 (a token whose weight
is absorbed by fp64 rounding of the running sum counts as weight 0).

Zero residual: in exact arithmetic a rejection implies p_x < q_x, hence some token with
p_v > q_v and a positive residual. In floats p and q can agree so closely that every
max(e_v - q_v s, 0) is 0 (p == q up to rounding). Then the row samples from p instead
(r_v = e_v): the residual law is undefined there and p is the limit of (p - q)+ / Z as
q -> p, which keeps the output a valid token with p_v > 0.

T0 (tau = 0): y_i = the lowest id v with l_v == max (so -0.0 == +0.0 and ties go to the
lowest id); accept x_i iff x_i == y_i; emit y_i at the first mismatch or -1; after K
accepts emit y_K. No random number is used.

A request any of whose K+1 rows holds NaN, +inf, or only -inf emits nothing: tokens all
-1, accepted 0, status NAN / POSINF / ALL_MASKED (checked in that order over all rows).
With validate=False, draft and q violations that ``validate_chain_inputs`` would refuse
mark the request STATUS_BAD_DRAFT instead (after the three logits statuses), emitting
nothing; a bad temperature is then not checked (undefined output).

Planted defects (``defect=``), the negative controls that qualify must catch:

* ``accept_ge``: accept iff U >= p_x / q_x (U * n >= p_x * C) instead of U < ratio.
* ``reused_coin``: the residual/bonus sample u is built from the acceptance stream's
  words (STREAM_ACCEPT, same rowpos) instead of STREAM_SAMPLE, so after a rejection u
  is correlated with the coin that rejected.
* ``unclipped_residual``: residual weights e_v - q_v s without max(., 0); the inverse CDF
  runs over the signed running sum (first v with R_v > u * R_{V-1}, else V - 1).
* ``unnormalised_residual``: weights r_v / s (p's units) with target u instead of
  u * total; when u exceeds the total residual mass the fallback picks the last token
  with positive weight.
* ``bonus_wrong_row``: the bonus (after K accepts) is sampled from row K-1 (T1, with
  row K's uniform) or is y_{K-1} (T0) instead of row K. No effect when K = 0.
* ``batch_index_counters``: every counter uses rowpos = batch index + row instead of
  position + row (breaks permutation equivariance and per-request reproducibility).
* ``ties_highest_id``: T0 argmax ties go to the highest id.
* ``ignore_temperature``: T1 rows use tau = 1.
* ``dense_q_next_row``: dense q is read one draft position late (row i uses q_{i+1}; the
  last row its own): a layout slip confined to the dense-q path, invisible with sparse q.
"""

from __future__ import annotations

import torch

from pp3kernels.contract import (
    NO_TOKEN,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    STREAM_ACCEPT,
)
from pp3kernels.interface import ChainInputs, ChainResult
from pp3kernels.philox import (
    acceptance_uniform,
    philox_words,
    sample_uniform,
    sample_uniform_from_words,
)
from pp3kernels.validate import bad_draft_requests, check_structure, validate_chain_inputs

# The reference verifies at most this many logits per row pass (requests x V): its
# temporaries are a few [requests, V] fp64 tensors, so a slice costs a few hundred MiB
# whatever the batch (B = 20000 at V = 129280 asked for > 120 GiB in one piece).
REFERENCE_CHUNK_ELEMENTS = 1 << 22

DEFECTS: tuple[str, ...] = (
    "accept_ge",
    "reused_coin",
    "unclipped_residual",
    "unnormalised_residual",
    "bonus_wrong_row",
    "batch_index_counters",
    "ties_highest_id",
    "ignore_temperature",
    "dense_q_next_row",
)


class _RowStats:
    """Per-row statistics of one chain row for the whole batch."""

    def __init__(
        self,
        row: torch.Tensor,
        tau: torch.Tensor,
        highest_tie: bool,
    ) -> None:
        vocab = row.shape[-1]
        self.max = row.amax(dim=-1)
        ids = torch.arange(vocab, device=row.device)
        at_max = row == self.max[:, None]
        if highest_tie:
            self.argmax = torch.where(at_max, ids, -1).amax(dim=-1)
        else:
            self.argmax = torch.where(at_max, ids, vocab).amin(dim=-1)
        self.e = torch.exp((row - self.max[:, None]) / tau[:, None])  # fp32
        self.s = self.e.to(torch.float64).sum(dim=-1).to(torch.float32)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Smallest v with cumsum(weights)_v > u * total, weights >= 0 fp64 [B, V], u [B]."""
    running = weights.cumsum(dim=-1)
    target = u * running[:, -1]
    index = torch.searchsorted(running, target[:, None].contiguous(), right=True)[:, 0]
    return index.clamp(max=weights.shape[-1] - 1)


def _first_exceeding(running: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """First v with running_v > target (running need not be monotone); V - 1 if none."""
    exceeds = running > target[:, None]
    first = exceeds.to(torch.int8).argmax(dim=-1)
    return torch.where(exceeds.any(dim=-1), first, running.shape[-1] - 1)


def _sample_row(
    stats: _RowStats,
    q_row: torch.Tensor | None,
    use_residual: torch.Tensor,
    u: torch.Tensor,
    defect: str | None,
) -> torch.Tensor:
    """Emitted token per request: residual law where ``use_residual``, else p."""
    e = stats.e.to(torch.float64)
    s = stats.s.to(torch.float64)[:, None]
    if q_row is None:
        signed = e
    else:
        signed = torch.where(use_residual[:, None], e - q_row * s, e)
    if defect == "unclipped_residual":
        running = signed.cumsum(dim=-1)
        return _first_exceeding(running, u * running[:, -1])
    residual = signed.clamp(min=0.0)
    if defect == "unnormalised_residual":
        weights = residual / s
        running = weights.cumsum(dim=-1)
        positive = weights > 0
        vocab = weights.shape[-1]
        last_positive = vocab - 1 - positive.flip(-1).to(torch.int8).argmax(dim=-1)
        index = torch.searchsorted(running, u[:, None].contiguous(), right=True)[:, 0]
        return torch.where(index >= vocab, last_positive, index)
    total_zero = residual.sum(dim=-1) == 0
    weights = torch.where(total_zero[:, None], e, residual)
    return _inverse_cdf(weights, u)


def _sparse_q_row(
    q_ids: torch.Tensor, q_counts: torch.Tensor, denominator: int, row: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as fp64 [B, V] = counts / C, integer counts as fp64 [B, V]) for chain row ``row``."""
    ids = q_ids[:, row].to(torch.int64)
    counts = q_counts[:, row].to(torch.int64)
    valid = (counts > 0) & (ids >= 0) & (ids < vocab)
    target = torch.where(valid, ids, vocab)
    buffer = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.float64, device=ids.device)
    buffer.scatter_add_(1, target, torch.where(valid, counts, 0).to(torch.float64))
    count_row = buffer[:, :vocab]
    return count_row / denominator, count_row


def reference_verify_chain(
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
    validate: bool = True,
    defect: str | None = None,
) -> ChainResult:
    """Verify a batch of draft chains exactly as the contract states (module docstring).

    Inputs as ``validate_chain_inputs``; returns ChainResult(tokens [B, K+1] int32,
    accepted [B] int32, status [B] int8) on the logits' device. ``defect`` plants one of
    ``DEFECTS`` (negative controls); None is the correct verifier.
    """
    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}; expected None or one of {', '.join(DEFECTS)}")
    inputs = ChainInputs(
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
    shape = validate_chain_inputs(inputs) if validate else check_structure(inputs)
    if shape.batch == 0:
        return _verify_requests(inputs, validate=validate, defect=defect, first_request=0)
    # Requests are independent (their draws depend on seed and position only), so the batch
    # is verified in slices whose [requests, V] row temporaries stay bounded.
    step = max(1, REFERENCE_CHUNK_ELEMENTS // shape.vocab)
    parts = [
        _verify_requests(
            inputs.select(slice(start, start + step)),
            validate=validate,
            defect=defect,
            first_request=start,
        )
        for start in range(0, shape.batch, step)
    ]
    if len(parts) == 1:
        return parts[0]
    return ChainResult(*(torch.cat(outputs) for outputs in zip(*parts, strict=True)))


def _verify_requests(
    inputs: ChainInputs, *, validate: bool, defect: str | None, first_request: int
) -> ChainResult:
    """``reference_verify_chain`` on validated (or structure-checked) requests; the first
    is request ``first_request`` of the caller's batch (the batch-index defect needs it)."""
    logits, draft_tokens, temperature = inputs.logits, inputs.draft_tokens, inputs.temperature
    seed, position = inputs.seed, inputs.position
    q_ids, q_counts, q_dense = inputs.q_ids, inputs.q_counts, inputs.q_dense
    denominator = inputs.denominator
    batch, rows, vocab = (int(n) for n in logits.shape)
    drafts = rows - 1
    device = logits.device

    tokens = torch.full((batch, drafts + 1), NO_TOKEN, dtype=torch.int64, device=device)
    accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    status = torch.full((batch,), STATUS_OK, dtype=torch.int8, device=device)
    if batch == 0:
        return ChainResult(tokens.to(torch.int32), accepted.to(torch.int32), status)

    # Statuses over every row the request owns, in the contract's order.
    has_nan = torch.zeros(batch, dtype=torch.bool, device=device)
    has_posinf = torch.zeros_like(has_nan)
    all_masked = torch.zeros_like(has_nan)
    for row_index in range(drafts + 1):
        row = logits[:, row_index, :]
        has_nan |= torch.isnan(row).any(dim=-1)
        has_posinf |= (row == float("inf")).any(dim=-1)
        all_masked |= (row == float("-inf")).all(dim=-1)
    status[all_masked] = STATUS_ALL_MASKED
    status[has_posinf] = STATUS_POSINF
    status[has_nan] = STATUS_NAN
    if not validate and drafts > 0:
        bad = bad_draft_requests(inputs)
        status[bad & (status == STATUS_OK)] = STATUS_BAD_DRAFT
    dead = status != STATUS_OK

    greedy = temperature == 0
    tau = torch.where(greedy, 1.0, temperature).to(torch.float32)
    if defect == "ignore_temperature":
        tau = torch.ones_like(tau)
    if defect == "batch_index_counters":
        base = first_request + torch.arange(batch, dtype=torch.int64, device=device)
    else:
        base = position.to(torch.int64)
    drafts_long = draft_tokens.to(torch.int64)

    active = ~dead
    previous: _RowStats | None = None
    for row_index in range(drafts + 1):
        row = logits[:, row_index, :].to(torch.float32)
        row = torch.where(dead[:, None], 0.0, row)
        stats = _RowStats(row, tau, highest_tie=defect == "ties_highest_id")
        rowpos = base + row_index
        if defect == "reused_coin":
            w0, w1, _, _ = philox_words(seed, rowpos, STREAM_ACCEPT)
            u = sample_uniform_from_words(w0, w1)
        else:
            u = sample_uniform(seed, rowpos)

        if row_index < drafts:
            x = drafts_long[:, row_index]
            proposes = x >= 0
            x_safe = torch.where(proposes & (x < vocab), x, 0)
            accept_greedy = proposes & (x == stats.argmax)

            coin = acceptance_uniform(seed, rowpos)
            p_x = (stats.e.gather(1, x_safe[:, None])[:, 0] / stats.s).to(torch.float64)
            q_row: torch.Tensor | None
            if q_ids is not None and q_counts is not None and denominator is not None:
                q_row, count_row = _sparse_q_row(q_ids, q_counts, denominator, row_index, vocab)
                lhs = coin * count_row.gather(1, x_safe[:, None])[:, 0]
                rhs = p_x * denominator
            elif q_dense is not None:
                q_index = row_index
                if defect == "dense_q_next_row":
                    q_index = min(row_index + 1, drafts - 1)
                q_row = q_dense[:, q_index].to(torch.float64)
                lhs = coin * q_row.gather(1, x_safe[:, None])[:, 0]
                rhs = p_x
            else:
                q_row = None
                lhs = torch.ones_like(coin)
                rhs = torch.zeros_like(coin)  # never accept (such rows are refused or BAD)
            if defect == "accept_ge":
                accept_sampled = proposes & (lhs >= rhs)
            else:
                accept_sampled = proposes & (lhs < rhs)
            accept = torch.where(greedy, accept_greedy, accept_sampled)

            stop = active & ~accept
            sampled = _sample_row(stats, q_row, proposes, u, defect)
            emitted = torch.where(greedy, stats.argmax, sampled)
            keep = active & accept
            tokens[:, row_index] = torch.where(keep, x, tokens[:, row_index])
            tokens[:, row_index] = torch.where(stop, emitted, tokens[:, row_index])
            accepted += keep.to(torch.int64)
            active = keep
        else:
            source = stats
            if defect == "bonus_wrong_row" and previous is not None:
                source = previous
            no_residual = torch.zeros(batch, dtype=torch.bool, device=device)
            sampled = _sample_row(source, None, no_residual, u, defect)
            emitted = torch.where(greedy, source.argmax, sampled)
            tokens[:, row_index] = torch.where(active, emitted, tokens[:, row_index])
        previous = stats

    tokens[dead] = NO_TOKEN
    accepted[dead] = 0
    return ChainResult(tokens.to(torch.int32), accepted.to(torch.int32), status)
