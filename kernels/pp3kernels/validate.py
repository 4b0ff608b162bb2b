"""Host validation of a chain-verification call, shared by the selector and the reference.

``validate_chain_inputs`` refuses every input that breaks the selector contract
(``pp3kernels.contract``) with a ``SelectorInputError`` naming the request index, the
chain row, the offending value and what was expected. Checks are vectorised: one pass of
tensor predicates, then the first offender is looked up and reported (with the number
of further offenders of the same kind).

Rules (B requests, K drafts, vocabulary V, denominator C):

* logits [B, K+1, V] bf16/fp16/fp32, any strides (an expanded view with batch stride 0
  is fine); draft_tokens [B, K] int32; temperature [B] fp32, finite and >= 0;
  seed, position [B] int64; every tensor on the logits' device.
* q is given in exactly one form, or not at all: sparse (q_ids and q_counts [B, K, S]
  int32 plus ``denominator``, a power of two in [1, MAX_DENOMINATOR]) or dense
  (q_dense [B, K, V] floating). No q is allowed only when no T1 request (tau > 0)
  has a draft != -1.
* drafts are -1 or in [0, V).
* sparse q: counts >= 0; a slot with count 0 is padding and holds id -1; a slot with a
  positive count holds an id in [0, V), unique within its row; each row's total is C,
  or 0 only where that row's draft is -1 or the request is T0; a T1 proposal x >= 0
  lies in its row's support.
* dense q, on T1 rows with a draft x >= 0: finite, >= 0, sums to 1 within 1e-4, and
  q(x) > 0.

``draft_violations`` exposes the per-(request, row) predicates so that a verifier run
with validate=False (a captured graph cannot raise) can flag those requests with
STATUS_BAD_DRAFT instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pp3kernels.contract import SelectorInputError, check_denominator
from pp3kernels.interface import ChainInputs

LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DENSE_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
DENSE_Q_SUM_TOLERANCE = 1e-4


@dataclass(frozen=True)
class ChainShape:
    """Sizes of a validated call and the q form it uses ('sparse', 'dense' or 'none')."""

    batch: int
    drafts: int
    vocab: int
    q_form: str


@dataclass(frozen=True)
class Violation:
    """One kind of value violation: ``mask`` [B, K] marks the offending (request, row)."""

    kind: str
    mask: torch.Tensor
    describe: Callable[[int, int], str]


def _require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise SelectorInputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _require(
    name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]
) -> None:
    if tuple(tensor.shape) != shape:
        raise SelectorInputError(
            f"{name} has shape {tuple(tensor.shape)}; expected {shape} "
            "(logits [B, K+1, V], draft_tokens [B, K], q [B, K, S] or [B, K, V], "
            "temperature/seed/position [B])"
        )
    if tensor.dtype not in dtypes:
        expected = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise SelectorInputError(
            f"{name} has dtype {str(tensor.dtype).removeprefix('torch.')}; expected {expected}"
        )


def check_structure(inputs: ChainInputs) -> ChainShape:
    """Types, shapes, dtypes, devices and the q form; raises SelectorInputError."""
    logits = _require_tensor("logits", inputs.logits)
    q_ids, q_counts, q_dense = inputs.q_ids, inputs.q_counts, inputs.q_dense
    denominator = inputs.denominator
    if logits.ndim != 3:
        raise SelectorInputError(
            f"logits has {logits.ndim} dimensions (shape {tuple(logits.shape)}); "
            "expected 3: [B, K+1, V]"
        )
    batch, rows, vocab = (int(n) for n in logits.shape)
    if rows < 1:
        raise SelectorInputError("logits has K+1 = 0 rows; expected at least the bonus row")
    if vocab < 1:
        raise SelectorInputError("logits has V = 0; expected a vocabulary of at least 1 token")
    if vocab >= 2**31:
        raise SelectorInputError(f"V = {vocab} does not fit int32 token ids; expected V < 2^31")
    if logits.dtype not in LOGITS_DTYPES:
        raise SelectorInputError(
            f"logits has dtype {str(logits.dtype).removeprefix('torch.')}; "
            "expected bfloat16, float16 or float32"
        )
    drafts = rows - 1
    named = {
        "draft_tokens": _require_tensor("draft_tokens", inputs.draft_tokens),
        "temperature": _require_tensor("temperature", inputs.temperature),
        "seed": _require_tensor("seed", inputs.seed),
        "position": _require_tensor("position", inputs.position),
    }
    _require("draft_tokens", named["draft_tokens"], (batch, drafts), (torch.int32,))
    _require("temperature", named["temperature"], (batch,), (torch.float32,))
    _require("seed", named["seed"], (batch,), (torch.int64,))
    _require("position", named["position"], (batch,), (torch.int64,))

    sparse_given = [v is not None for v in (q_ids, q_counts, denominator)]
    if any(sparse_given) and not all(sparse_given):
        missing = [
            n
            for n, g in zip(("q_ids", "q_counts", "denominator"), sparse_given, strict=True)
            if not g
        ]
        raise SelectorInputError(
            f"sparse q is incomplete: {', '.join(missing)} missing; expected q_ids, q_counts "
            "and denominator together"
        )
    if all(sparse_given) and q_dense is not None:
        raise SelectorInputError(
            "both sparse q (q_ids/q_counts) and q_dense were given; expected exactly one q form"
        )
    if all(sparse_given):
        q_form = "sparse"
        named["q_ids"] = _require_tensor("q_ids", q_ids)
        named["q_counts"] = _require_tensor("q_counts", q_counts)
        if named["q_ids"].ndim != 3 or named["q_ids"].shape[:2] != (batch, drafts):
            raise SelectorInputError(
                f"q_ids has shape {tuple(named['q_ids'].shape)}; expected [B, K, S] = "
                f"[{batch}, {drafts}, S]"
            )
        slots = int(named["q_ids"].shape[2])
        if slots < 1:
            raise SelectorInputError("q_ids has S = 0 slots; expected S >= 1")
        _require("q_ids", named["q_ids"], (batch, drafts, slots), (torch.int32,))
        _require("q_counts", named["q_counts"], (batch, drafts, slots), (torch.int32,))
        check_denominator(denominator)
    elif q_dense is not None:
        q_form = "dense"
        named["q_dense"] = _require_tensor("q_dense", q_dense)
        _require("q_dense", named["q_dense"], (batch, drafts, vocab), DENSE_Q_DTYPES)
    else:
        q_form = "none"

    for name, tensor in named.items():
        if tensor.device != logits.device:
            raise SelectorInputError(
                f"{name} is on {tensor.device} but logits is on {logits.device}; "
                "expected every tensor on one device"
            )
    return ChainShape(batch=batch, drafts=drafts, vocab=vocab, q_form=q_form)


def check_temperature(temperature: torch.Tensor) -> None:
    """temperature must be finite and >= 0 (0 selects T0 greedy)."""
    bad = ~torch.isfinite(temperature) | (temperature < 0)
    if bool(bad.any()):
        where = bad.nonzero().flatten()
        index = int(where[0])
        value = float(temperature[index])
        more = f" ({where.numel() - 1} more requests likewise)" if where.numel() > 1 else ""
        raise SelectorInputError(
            f"request {index}: temperature {value!r} is invalid; expected a finite value >= 0 "
            f"(0 = greedy T0){more}"
        )


def draft_violations(inputs: ChainInputs) -> list[Violation]:
    """Value violations of drafts and q, as [B, K] masks, in reporting order.

    Assumes ``check_structure`` passed. Every mask is evaluated (no short-circuit) so the
    result also serves as the STATUS_BAD_DRAFT predicate.
    """
    q_ids, q_counts, q_dense = inputs.q_ids, inputs.q_counts, inputs.q_dense
    denominator = inputs.denominator
    vocab = int(inputs.logits.shape[2])
    drafts = inputs.draft_tokens.to(torch.int64)
    is_t1 = (inputs.temperature > 0)[:, None].expand_as(drafts)  # NaN temperature counts as T0 here
    proposes = drafts >= 0
    t1_proposal = is_t1 & proposes
    violations: list[Violation] = []

    def value_at(tensor: torch.Tensor) -> Callable[[int, int], object]:
        return lambda b, i: tensor[b, i].item()

    draft_value = value_at(drafts)
    violations.append(
        Violation(
            "draft_range",
            (drafts < -1) | (drafts >= vocab),
            lambda b, i: (
                f"draft token {draft_value(b, i)} is out of range; expected -1 "
                f"(invalidated) or an id in [0, {vocab})"
            ),
        )
    )

    if q_ids is not None and q_counts is not None and denominator is not None:
        ids = q_ids.to(torch.int64)
        counts = q_counts.to(torch.int64)
        slots = ids.shape[2]
        positive = counts > 0

        negative = counts < 0
        violations.append(
            Violation(
                "count_negative",
                negative.any(-1),
                lambda b, i: _slot_message(
                    negative,
                    counts,
                    b,
                    i,
                    "q count {value} at slot {slot} is negative; expected a count >= 0",
                ),
            )
        )
        padding_bad = (counts == 0) & (ids != -1)
        violations.append(
            Violation(
                "padding_id",
                padding_bad.any(-1),
                lambda b, i: _slot_message(
                    padding_bad,
                    ids,
                    b,
                    i,
                    "slot {slot} has count 0 but id {value}; "
                    "expected padding id -1 for a zero count",
                ),
            )
        )
        id_bad = positive & ((ids < 0) | (ids >= vocab))
        violations.append(
            Violation(
                "support_id_range",
                id_bad.any(-1),
                lambda b, i: _slot_message(
                    id_bad,
                    ids,
                    b,
                    i,
                    "slot {slot} has a positive count but id {value}; "
                    f"expected an id in [0, {vocab})",
                ),
            )
        )
        # Duplicates among positive slots: give non-positive slots distinct sentinels
        # below -1 so that only real support ids can collide.
        sentinel = -2 - torch.arange(slots, device=ids.device, dtype=torch.int64)
        keyed = torch.where(positive, ids, sentinel)
        sorted_ids, _ = keyed.sort(dim=-1)
        dup_pair = (sorted_ids[..., 1:] == sorted_ids[..., :-1]) & (sorted_ids[..., 1:] >= 0)
        dup_value = torch.where(dup_pair, sorted_ids[..., 1:], sorted_ids.new_full((), -1))
        violations.append(
            Violation(
                "support_duplicate",
                dup_pair.any(-1),
                lambda b, i: (
                    f"support id {int(dup_value[b, i].max())} appears more than once "
                    "in q; expected unique ids within a row"
                ),
            )
        )
        raw_total = counts.sum(-1)
        zero_allowed = (~proposes) | (~is_t1)
        mass_bad = (raw_total != denominator) & ~((raw_total == 0) & zero_allowed)
        violations.append(
            Violation(
                "mass",
                mass_bad,
                lambda b, i: (
                    f"q mass {int(raw_total[b, i])} != denominator {denominator}; "
                    "expected exactly C (0 only where the draft is -1 or the request is T0)"
                ),
            )
        )
        in_support = ((ids == drafts[..., None]) & positive).any(-1)
        violations.append(
            Violation(
                "proposal_outside_support",
                t1_proposal & ~in_support & (drafts < vocab),
                lambda b, i: (
                    f"T1 proposal {draft_value(b, i)} has q count 0 (not in q's "
                    "support); expected a proposal drawn from q, so q(x) > 0"
                ),
            )
        )
    elif q_dense is not None:
        dense = q_dense.to(torch.float64)
        nonfinite = ~torch.isfinite(dense)
        violations.append(
            Violation(
                "dense_nonfinite",
                t1_proposal & nonfinite.any(-1),
                lambda b, i: _slot_message(
                    nonfinite,
                    dense,
                    b,
                    i,
                    "q_dense[token {slot}] = {value}; expected finite probabilities",
                ),
            )
        )
        negative_dense = dense < 0
        violations.append(
            Violation(
                "dense_negative",
                t1_proposal & negative_dense.any(-1),
                lambda b, i: _slot_message(
                    negative_dense,
                    dense,
                    b,
                    i,
                    "q_dense[token {slot}] = {value}; expected probabilities >= 0",
                ),
            )
        )
        sums = torch.where(nonfinite, 0.0, dense).sum(-1)
        sum_bad = (sums - 1.0).abs() > DENSE_Q_SUM_TOLERANCE
        violations.append(
            Violation(
                "dense_sum",
                t1_proposal & sum_bad,
                lambda b, i: (
                    f"q_dense sums to {float(sums[b, i])!r}; expected 1 within "
                    f"{DENSE_Q_SUM_TOLERANCE}"
                ),
            )
        )
        in_range = (drafts >= 0) & (drafts < vocab)
        q_at_draft = dense.gather(-1, torch.where(in_range, drafts, 0)[..., None])[..., 0]
        violations.append(
            Violation(
                "proposal_outside_support",
                t1_proposal & in_range & ~(q_at_draft > 0),
                lambda b, i: (
                    f"T1 proposal {draft_value(b, i)} has q_dense = "
                    f"{float(q_at_draft[b, i])!r}; expected q(x) > 0 for a proposal drawn from q"
                ),
            )
        )
    else:
        violations.append(
            Violation(
                "missing_q",
                t1_proposal,
                lambda b, i: (
                    f"T1 proposal {draft_value(b, i)} was given without q; expected "
                    "q_ids/q_counts/denominator or q_dense when a T1 request proposes a token"
                ),
            )
        )
    return violations


def _slot_message(mask: torch.Tensor, values: torch.Tensor, b: int, i: int, template: str) -> str:
    slot = int(mask[b, i].nonzero().flatten()[0])
    value = values[b, i, slot].item()
    return template.format(slot=slot, value=value)


def bad_draft_requests(inputs: ChainInputs) -> torch.Tensor:
    """[B] bool: requests with any draft/q violation (STATUS_BAD_DRAFT when not raising)."""
    draft_tokens = inputs.draft_tokens
    bad = torch.zeros(draft_tokens.shape, dtype=torch.bool, device=draft_tokens.device)
    for violation in draft_violations(inputs):
        bad |= violation.mask
    return bad.any(-1) if bad.shape[1] else bad.new_zeros(bad.shape[0])


def validate_chain_inputs(inputs: ChainInputs) -> ChainShape:
    """Refuse any input that breaks the selector contract (see the module docstring).

    Raises SelectorInputError naming the request index, the row, the offending value
    and what was expected; returns the call's sizes and q form when it is well formed.
    """
    shape = check_structure(inputs)
    check_temperature(inputs.temperature)
    if inputs.draft_tokens.numel() == 0:
        return shape
    for violation in draft_violations(inputs):
        if bool(violation.mask.any()):
            where = violation.mask.nonzero()
            b, i = (int(v) for v in where[0].tolist())
            more = f" ({where.shape[0] - 1} more rows likewise)" if where.shape[0] > 1 else ""
            raise SelectorInputError(f"request {b}, row {i}: {violation.describe(b, i)}{more}")
    return shape
