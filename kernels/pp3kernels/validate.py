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

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from pp3kernels.contract import SelectorInputError, check_denominator
from pp3kernels.interface import ChainInputs

LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DENSE_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
DENSE_Q_SUM_TOLERANCE = 1e-4
# Validation reads q in slices of at most this many entries (requests x K x S, or x V for
# dense q): a few int64/fp64 temporaries of this size, ~0.25 GiB in all, whatever B is.
VALIDATION_CHUNK_ELEMENTS = 1 << 22
Describe = Callable[[int, int], str]


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
    describe: Describe


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


def _request_slices(batch: int, per_request: int) -> Iterator[slice]:
    """Consecutive slices of the batch holding at most VALIDATION_CHUNK_ELEMENTS q entries
    (``per_request`` each), at least one request per slice."""
    step = max(1, VALIDATION_CHUNK_ELEMENTS // max(per_request, 1))
    for start in range(0, batch, step):
        yield slice(start, min(batch, start + step))


def _chunked_masks(
    kinds: tuple[str, ...],
    batch_rows: tuple[int, int],
    per_request: int,
    device: torch.device,
    masks_of: Callable[[slice], dict[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """[B, K] masks of ``kinds``, filled slice by slice from ``masks_of(requests)``: only
    one slice's [requests, K, S or V] temporaries exist at a time (a broadcast input is
    never materialised beyond one slice)."""
    masks = {kind: torch.zeros(batch_rows, dtype=torch.bool, device=device) for kind in kinds}
    for requests in _request_slices(batch_rows[0], per_request):
        for kind, mask in masks_of(requests).items():
            masks[kind][requests] = mask
    return masks


_SPARSE_KINDS = (
    "count_negative",
    "padding_id",
    "support_id_range",
    "support_duplicate",
    "mass",
    "proposal_outside_support",
)
_DENSE_KINDS = ("dense_nonfinite", "dense_negative", "dense_sum", "proposal_outside_support")


def _sparse_masks(
    ids: torch.Tensor,
    counts: torch.Tensor,
    drafts: torch.Tensor,
    is_t1: torch.Tensor,
    vocab: int,
    denominator: int,
) -> dict[str, torch.Tensor]:
    """The sparse-q rules (module docstring) over [b, K, S] slices, as [b, K] masks."""
    ids = ids.to(torch.int64)
    counts = counts.to(torch.int64)
    positive = counts > 0
    # Duplicates among positive slots: non-positive slots get distinct sentinels below -1
    # so that only real support ids can collide.
    sentinel = -2 - torch.arange(ids.shape[2], device=ids.device, dtype=torch.int64)
    sorted_ids, _ = torch.where(positive, ids, sentinel).sort(dim=-1)
    duplicate = (sorted_ids[..., 1:] == sorted_ids[..., :-1]) & (sorted_ids[..., 1:] >= 0)
    total = counts.sum(-1)
    proposes = drafts >= 0
    zero_allowed = ~proposes | ~is_t1
    in_support = ((ids == drafts[..., None]) & positive).any(-1)
    return {
        "count_negative": (counts < 0).any(-1),
        "padding_id": ((counts == 0) & (ids != -1)).any(-1),
        "support_id_range": (positive & ((ids < 0) | (ids >= vocab))).any(-1),
        "support_duplicate": duplicate.any(-1),
        "mass": (total != denominator) & ~((total == 0) & zero_allowed),
        "proposal_outside_support": is_t1 & proposes & ~in_support & (drafts < vocab),
    }


def _dense_masks(
    q_dense: torch.Tensor, drafts: torch.Tensor, is_t1: torch.Tensor, vocab: int
) -> dict[str, torch.Tensor]:
    """The dense-q rules (module docstring) over [b, K, V] slices, as [b, K] masks."""
    dense = q_dense.to(torch.float64)
    t1_proposal = is_t1 & (drafts >= 0)
    nonfinite = ~torch.isfinite(dense)
    sums = torch.where(nonfinite, 0.0, dense).sum(-1)
    in_range = (drafts >= 0) & (drafts < vocab)
    q_at_draft = dense.gather(-1, torch.where(in_range, drafts, 0)[..., None])[..., 0]
    return {
        "dense_nonfinite": t1_proposal & nonfinite.any(-1),
        "dense_negative": t1_proposal & (dense < 0).any(-1),
        "dense_sum": t1_proposal & ((sums - 1.0).abs() > DENSE_Q_SUM_TOLERANCE),
        "proposal_outside_support": t1_proposal & in_range & ~(q_at_draft > 0),
    }


def _first_slot(mask: torch.Tensor) -> int:
    return int(mask.nonzero().flatten()[0])


def _sparse_message(kind: str, inputs: ChainInputs, b: int, i: int) -> str:
    """What is wrong with sparse q's row (b, i), read from that row alone."""
    assert inputs.q_ids is not None and inputs.q_counts is not None
    ids = inputs.q_ids[b, i].to(torch.int64)
    counts = inputs.q_counts[b, i].to(torch.int64)
    positive = counts > 0
    vocab = int(inputs.logits.shape[2])
    draft = int(inputs.draft_tokens[b, i])
    if kind == "count_negative":
        slot = _first_slot(counts < 0)
        return f"q count {int(counts[slot])} at slot {slot} is negative; expected a count >= 0"
    if kind == "padding_id":
        slot = _first_slot((counts == 0) & (ids != -1))
        return (
            f"slot {slot} has count 0 but id {int(ids[slot])}; "
            "expected padding id -1 for a zero count"
        )
    if kind == "support_id_range":
        slot = _first_slot(positive & ((ids < 0) | (ids >= vocab)))
        return (
            f"slot {slot} has a positive count but id {int(ids[slot])}; "
            f"expected an id in [0, {vocab})"
        )
    if kind == "support_duplicate":
        support, _ = ids[positive].sort()
        repeated = support[1:][support[1:] == support[:-1]]
        return (
            f"support id {int(repeated.max())} appears more than once "
            "in q; expected unique ids within a row"
        )
    if kind == "mass":
        return (
            f"q mass {int(counts.sum())} != denominator {inputs.denominator}; "
            "expected exactly C (0 only where the draft is -1 or the request is T0)"
        )
    return (
        f"T1 proposal {draft} has q count 0 (not in q's "
        "support); expected a proposal drawn from q, so q(x) > 0"
    )


def _dense_message(kind: str, inputs: ChainInputs, b: int, i: int) -> str:
    """What is wrong with dense q's row (b, i), read from that row alone."""
    assert inputs.q_dense is not None
    dense = inputs.q_dense[b, i].to(torch.float64)
    draft = int(inputs.draft_tokens[b, i])
    if kind == "dense_nonfinite":
        slot = _first_slot(~torch.isfinite(dense))
        return f"q_dense[token {slot}] = {dense[slot].item()}; expected finite probabilities"
    if kind == "dense_negative":
        slot = _first_slot(dense < 0)
        return f"q_dense[token {slot}] = {dense[slot].item()}; expected probabilities >= 0"
    if kind == "dense_sum":
        total = float(torch.where(torch.isfinite(dense), dense, 0.0).sum())
        return f"q_dense sums to {total!r}; expected 1 within {DENSE_Q_SUM_TOLERANCE}"
    return (
        f"T1 proposal {draft} has q_dense = {float(dense[draft])!r}; "
        "expected q(x) > 0 for a proposal drawn from q"
    )


def draft_violations(inputs: ChainInputs) -> list[Violation]:
    """Value violations of drafts and q, as [B, K] masks, in reporting order.

    Assumes ``check_structure`` passed. Every mask is evaluated (no short-circuit) so the
    result also serves as the STATUS_BAD_DRAFT predicate. q is read in slices of at most
    VALIDATION_CHUNK_ELEMENTS entries, so the extra memory is bounded whatever B is and a
    broadcast (stride-0) q is never materialised; a message reads its one row again.
    """
    q_ids, q_counts, q_dense = inputs.q_ids, inputs.q_counts, inputs.q_dense
    denominator = inputs.denominator
    vocab = int(inputs.logits.shape[2])
    drafts = inputs.draft_tokens.to(torch.int64)
    is_t1 = (inputs.temperature > 0)[:, None].expand_as(drafts)  # NaN temperature counts as T0 here
    t1_proposal = is_t1 & (drafts >= 0)
    violations = [
        Violation(
            "draft_range",
            (drafts < -1) | (drafts >= vocab),
            lambda b, i: (
                f"draft token {int(drafts[b, i])} is out of range; expected -1 "
                f"(invalidated) or an id in [0, {vocab})"
            ),
        )
    ]
    batch_rows = (int(drafts.shape[0]), int(drafts.shape[1]))

    def bind(describe: Callable[[str, ChainInputs, int, int], str], kind: str) -> Describe:
        return lambda b, i: describe(kind, inputs, b, i)

    if q_ids is not None and q_counts is not None and denominator is not None:
        ids, counts, den = q_ids, q_counts, denominator
        masks = _chunked_masks(
            _SPARSE_KINDS,
            batch_rows,
            batch_rows[1] * int(ids.shape[2]),
            drafts.device,
            lambda r: _sparse_masks(ids[r], counts[r], drafts[r], is_t1[r], vocab, den),
        )
        violations += [Violation(k, masks[k], bind(_sparse_message, k)) for k in _SPARSE_KINDS]
    elif q_dense is not None:
        dense = q_dense
        masks = _chunked_masks(
            _DENSE_KINDS,
            batch_rows,
            batch_rows[1] * vocab,
            drafts.device,
            lambda r: _dense_masks(dense[r], drafts[r], is_t1[r], vocab),
        )
        violations += [Violation(k, masks[k], bind(_dense_message, k)) for k in _DENSE_KINDS]
    else:
        violations.append(
            Violation(
                "missing_q",
                t1_proposal,
                lambda b, i: (
                    f"T1 proposal {int(drafts[b, i])} was given without q; expected "
                    "q_ids/q_counts/denominator or q_dense when a T1 request proposes a token"
                ),
            )
        )
    return violations


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
