"""Exact rational law of one T1 chain-verification request (kernels/contract.py).

A request has target rows p_0 .. p_K (rationals over V tokens, each summing to 1) and
integer draft laws q_i = counts_i / C_i for rows 0 .. K-1. The procedure is:

    for i in 0 .. K-1:
        if row i's proposal is invalidated (-1): emit z ~ p_i; stop          (a = i)
        draw x ~ q_i; accept with probability min(1, p_i(x) / q_i(x))
        on acceptance: emit x and go on to row i+1
        on rejection:  emit z ~ (p_i - q_i)+ / Z_i; stop                    (a = i)
    after K accepts: emit z ~ p_K                                           (a = K)

Outcomes are tuples ``(a, t_0, ..., t_a)``: the accepted length, then the a + 1 emitted
tokens (the first a are the accepted drafts, the last is the residual / target / bonus
sample). ``chain_law`` returns their probabilities as ``Fraction``s summing to exactly 1.

Per row, P(accept x) = q(x) min(1, p(x)/q(x)) = min(q(x), p(x)), so the total rejection
probability is Z = sum_x (q(x) - p(x))+ = sum_v (p(v) - q(v))+, and rejecting then
emitting z has probability (p(z) - q(z))+. Hence P(t = z) = min(q, p)(z) + (p - q)+(z)
= p(z): the single-step theorem, which ``lossless_identity`` checks slot by slot.

Every law here is built from one step per row (``row_step``): the acceptance weights
min(p_i, q_i) and the stop weights (the probability of stopping at row i and emitting z,
given row i is reached). ``chain_law`` enumerates accepted prefixes to give the full joint
law (used by ``pp3 oracle``); ``marginal_laws`` multiplies the same steps out into the
per-slot, accepted-length and (accepted length, final token) laws in O(K V) (used by
``pp3 qualify``, whose targets have too many prefixes to enumerate). Exact probabilities
travel in receipts as ``"num/den"`` text (``fraction_text`` / ``fraction_from_text``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import orjson

from pp3kernels.contract import NO_TOKEN

__all__ = [
    "DraftRow",
    "Law",
    "ResidualRule",
    "RowStep",
    "accepted_length_law",
    "chain_law",
    "clipped_residual",
    "conditional_slot_laws",
    "draft_law",
    "final_token_law",
    "fraction_from_text",
    "fraction_text",
    "identity_violations",
    "law_from_json",
    "law_sha256",
    "law_to_json",
    "lossless_identity",
    "marginal_laws",
    "outcome_key",
    "parse_outcome_key",
    "row_step",
    "slot_marginals",
    "validate_targets",
]

Law = dict[tuple[int, ...], Fraction]
# Distribution emitted at a rejection, as weights over V (normalised by the caller).
ResidualRule = Callable[[Sequence[Fraction], Sequence[Fraction]], list[Fraction]]


@dataclass(frozen=True)
class DraftRow:
    """Integer draft law of one row: ``counts[s] / denominator`` on token ``ids[s]``.

    Padding entries (id -1 with count 0) are allowed and ignored.
    """

    ids: tuple[int, ...]
    counts: tuple[int, ...]
    denominator: int


def draft_law(row: DraftRow, vocab: int) -> list[Fraction]:
    """Dense exact q over ``vocab`` tokens; validates mass = C, unique in-range support."""
    if row.denominator < 1 or row.denominator & (row.denominator - 1):
        raise ValueError(f"draft denominator {row.denominator}: expected a power of two >= 1")
    if len(row.ids) != len(row.counts):
        raise ValueError(
            f"draft row has {len(row.ids)} ids and {len(row.counts)} counts: expected equal"
        )
    dense = [Fraction(0)] * vocab
    seen: set[int] = set()
    total = 0
    for token, count in zip(row.ids, row.counts, strict=True):
        if token == NO_TOKEN and count == 0:
            continue
        if not 0 <= token < vocab:
            raise ValueError(f"draft support id {token}: expected 0 <= id < V = {vocab}")
        if count < 0:
            raise ValueError(f"draft count {count} for id {token}: expected >= 0")
        if token in seen:
            raise ValueError(f"draft support id {token} appears twice: expected unique ids")
        seen.add(token)
        total += count
        dense[token] = Fraction(count, row.denominator)
    if total != row.denominator:
        raise ValueError(f"draft counts sum to {total}: expected the denominator {row.denominator}")
    return dense


def validate_targets(targets: Sequence[Sequence[Fraction]]) -> list[list[Fraction]]:
    """Check K+1 >= 1 rows of equal length V >= 1, non-negative, each summing to exactly 1."""
    if not targets:
        raise ValueError("no target rows: expected K + 1 >= 1 rows")
    rows = [[Fraction(p) for p in row] for row in targets]
    vocab = len(rows[0])
    for index, row in enumerate(rows):
        if len(row) != vocab or vocab == 0:
            raise ValueError(
                f"target row {index} has {len(row)} entries: expected V = {vocab} >= 1"
            )
        if any(p < 0 for p in row):
            raise ValueError(f"target row {index} has a negative probability: {row}")
        total = sum(row, Fraction(0))
        if total != 1:
            raise ValueError(f"target row {index} sums to {total}: expected exactly 1")
    return rows


def clipped_residual(p: Sequence[Fraction], q: Sequence[Fraction]) -> list[Fraction]:
    """The correct rejection law's weights: (p - q)+ (normalised by ``chain_law``)."""
    return [max(pv - qv, Fraction(0)) for pv, qv in zip(p, q, strict=True)]


@dataclass(frozen=True)
class RowStep:
    """One chain row, exactly: what happens there given that the chain reaches it.

    ``accept[x]`` = P(propose x and accept it) = q(x) min(1, p(x)/q(x)) = min(p, q)(x);
    ``stop[z]`` = P(stop at this row and emit z). For a drafted row the stop is a rejection,
    probability 1 - sum(accept), and emits from the residual rule's weights normalised; an
    invalidated proposal or the bonus row stops with certainty and emits from p.
    """

    accept: tuple[Fraction, ...]
    stop: tuple[Fraction, ...]


def row_step(
    p: Sequence[Fraction],
    q: Sequence[Fraction] | None,
    *,
    residual: ResidualRule = clipped_residual,
) -> RowStep:
    """The step of a row with target p and draft law q (None: invalidated or bonus row).

    ``residual`` gives the rejection law's weights from (p, q); the default is the correct
    (p - q)+, for which accept + stop = min(p, q) + (p - q)+ = p. Another rule (a planted
    defect) yields the step of that procedure: rejection still has probability
    1 - sum_x min(p, q)(x) and then emits from the rule's weights, normalised.
    """
    zero = Fraction(0)
    if q is None:
        return RowStep(tuple(zero for _ in p), tuple(p))
    accept = tuple(min(pv, qv) for pv, qv in zip(p, q, strict=True))
    rejection = 1 - sum(accept, zero)
    if rejection == 0:
        return RowStep(accept, tuple(zero for _ in p))
    weights = residual(p, q)
    norm = sum(weights, zero)
    if len(weights) != len(p) or norm <= 0 or any(w < 0 for w in weights):
        raise ValueError(
            f"residual rule gave weights {weights}: expected {len(p)} non-negative weights "
            "with positive sum"
        )
    return RowStep(accept, tuple(rejection * w / norm for w in weights))


def _chain_steps(
    targets: Sequence[Sequence[Fraction]],
    drafts: Sequence[DraftRow],
    invalidated: Sequence[bool] | None,
    residual: ResidualRule,
) -> list[RowStep]:
    """Rows 0..K-1 from their targets and integer draft rows, then the bonus row K."""
    rows = validate_targets(targets)
    k = len(rows) - 1
    vocab = len(rows[0])
    if len(drafts) != k:
        raise ValueError(f"{len(drafts)} draft rows for {k + 1} target rows: expected K = {k}")
    mask = [False] * k if invalidated is None else [bool(flag) for flag in invalidated]
    if len(mask) != k:
        raise ValueError(f"{len(mask)} invalidation flags: expected K = {k}")
    steps = []
    for i in range(k):
        q = None if mask[i] else draft_law(drafts[i], vocab)
        steps.append(row_step(rows[i], q, residual=residual))
    steps.append(row_step(rows[k], None))
    return steps


def chain_law(
    targets: Sequence[Sequence[Fraction]],
    drafts: Sequence[DraftRow],
    invalidated: Sequence[bool] | None = None,
    *,
    residual: ResidualRule = clipped_residual,
) -> Law:
    """Exact joint law of (a, t_0 .. t_a) for one T1 request; sums to exactly 1.

    ``targets``: K+1 rows p_0..p_K; ``drafts``: K integer draft rows; ``invalidated``: K
    flags, True where row i's proposal is -1 (that row emits z ~ p_i and stops);
    ``residual``: the rejection rule (``row_step``). Outcome (a, x_0..x_{a-1}, z) has
    probability prod_{i<a} accept_i(x_i) * stop_a(z).
    """
    law: Law = {}
    prefixes: dict[tuple[int, ...], Fraction] = {(): Fraction(1)}
    for row, step in enumerate(_chain_steps(targets, drafts, invalidated, residual)):
        advanced: dict[tuple[int, ...], Fraction] = {}
        for prefix, mass in prefixes.items():
            for token, weight in enumerate(step.stop):
                if weight > 0:
                    law[(row, *prefix, token)] = mass * weight
            for token, weight in enumerate(step.accept):
                if weight > 0:
                    advanced[(*prefix, token)] = mass * weight
        prefixes = advanced
    total = sum(law.values(), Fraction(0))
    if total != 1:  # cannot happen for valid inputs; guards the bookkeeping itself
        raise RuntimeError(f"exact chain law sums to {total}, not 1")
    return law


def marginal_laws(steps: Sequence[RowStep]) -> dict[str, list[Fraction]]:
    """Per-slot, accepted-length and joint (accepted length, final token) laws of a chain.

    With beta_i = sum_x accept_i(x), reach_0 = 1 and reach_{i+1} = reach_i beta_i:
    ``slot{j}``: P(t_j = v) = reach_j (accept_j(v) + stop_j(v)), then P(slot j absent)
    = 1 - reach_j as the last outcome; ``accepted``: P(a = i) = reach_i sum_z stop_i(z);
    ``joint``: P(a = i, t_a = v) = reach_i stop_i(v), outcomes ordered i-major. Each law
    sums to exactly 1 (checked).
    """
    reach = [Fraction(1)]
    for step in steps[:-1]:
        reach.append(reach[-1] * sum(step.accept, Fraction(0)))
    laws: dict[str, list[Fraction]] = {}
    for j, step in enumerate(steps):
        emitted = [reach[j] * (a + s) for a, s in zip(step.accept, step.stop, strict=True)]
        laws[f"slot{j}"] = [*emitted, 1 - reach[j]]
    laws["accepted"] = [
        r * sum(step.stop, Fraction(0)) for r, step in zip(reach, steps, strict=True)
    ]
    laws["joint"] = [r * s for r, step in zip(reach, steps, strict=True) for s in step.stop]
    for key, law in laws.items():
        total = sum(law, Fraction(0))
        if total != 1:
            raise ValueError(f"{key}: exact law sums to {total}, expected 1")
    return laws


def accepted_length_law(law: Mapping[tuple[int, ...], Fraction]) -> dict[int, Fraction]:
    """P(a = k) for each accepted length k."""
    out: dict[int, Fraction] = {}
    for key, prob in law.items():
        out[key[0]] = out.get(key[0], Fraction(0)) + prob
    return out


def final_token_law(law: Mapping[tuple[int, ...], Fraction]) -> dict[tuple[int, int], Fraction]:
    """Joint law of (a, last emitted token t_a)."""
    out: dict[tuple[int, int], Fraction] = {}
    for key, prob in law.items():
        pair = (key[0], key[-1])
        out[pair] = out.get(pair, Fraction(0)) + prob
    return out


def slot_marginals(
    law: Mapping[tuple[int, ...], Fraction], slots: int
) -> list[dict[int, Fraction]]:
    """For output slots j = 0 .. slots-1: P(t_j = v), with key -1 for "slot j not emitted"."""
    out: list[dict[int, Fraction]] = [{} for _ in range(slots)]
    for key, prob in law.items():
        tokens = key[1:]
        for j in range(slots):
            token = tokens[j] if j < len(tokens) else NO_TOKEN
            out[j][token] = out[j].get(token, Fraction(0)) + prob
    return out


def conditional_slot_laws(
    law: Mapping[tuple[int, ...], Fraction],
) -> dict[tuple[int, tuple[int, ...]], dict[int, Fraction]]:
    """Law of t_j given (a >= j, t_<j = prefix), for every slot j and reachable prefix.

    Keyed by (j, prefix); each value sums to 1. Since a >= j, the prefix consists of
    accepted drafts.
    """
    joint: dict[tuple[int, tuple[int, ...]], dict[int, Fraction]] = {}
    for key, prob in law.items():
        accepted, tokens = key[0], key[1:]
        for j in range(accepted + 1):
            cell = joint.setdefault((j, tuple(tokens[:j])), {})
            cell[tokens[j]] = cell.get(tokens[j], Fraction(0)) + prob
    out: dict[tuple[int, tuple[int, ...]], dict[int, Fraction]] = {}
    for cond, cell in joint.items():
        mass = sum(cell.values(), Fraction(0))
        out[cond] = {token: prob / mass for token, prob in cell.items()}
    return out


def identity_violations(
    law: Mapping[tuple[int, ...], Fraction], targets: Sequence[Sequence[Fraction]]
) -> list[str]:
    """Where the lossless identity fails: t_j | (a >= j, t_<j = x) must have law p_j exactly."""
    rows = validate_targets(targets)
    problems: list[str] = []
    total = sum(law.values(), Fraction(0))
    if total != 1:
        problems.append(f"law sums to {total}, not 1")
    for (j, prefix), cell in sorted(conditional_slot_laws(law).items()):
        if j >= len(rows):
            problems.append(f"slot {j} beyond the {len(rows)} target rows")
            continue
        row = rows[j]
        for token in sorted(set(cell) | {v for v, p in enumerate(row) if p > 0}):
            got = cell.get(token, Fraction(0))
            want = row[token] if 0 <= token < len(row) else Fraction(0)
            if got != want:
                problems.append(
                    f"slot {j} after prefix {list(prefix)}: P(t={token}) = {got}, p_{j} = {want}"
                )
    return problems


def lossless_identity(
    law: Mapping[tuple[int, ...], Fraction], targets: Sequence[Sequence[Fraction]]
) -> bool:
    """True iff for every slot j and reachable accepted prefix x, t_j | (a >= j, x) ~ p_j."""
    return not identity_violations(law, targets)


def outcome_key(key: Iterable[int]) -> str:
    """Canonical text of an outcome: ``"a|t0,t1,..."``."""
    items = list(key)
    return f"{items[0]}|" + ",".join(str(t) for t in items[1:])


def parse_outcome_key(text: str) -> tuple[int, ...]:
    """Inverse of ``outcome_key``; validates that there are a + 1 tokens."""
    head, _, tail = text.partition("|")
    try:
        accepted = int(head)
        tokens = tuple(int(t) for t in tail.split(",")) if tail else ()
    except ValueError as err:
        raise ValueError(f"outcome key {text!r}: expected 'a|t0,...,ta'") from err
    if accepted < 0 or len(tokens) != accepted + 1:
        raise ValueError(f"outcome key {text!r}: expected a >= 0 and a + 1 tokens")
    return (accepted, *tokens)


def fraction_text(value: Fraction) -> str:
    """An exact probability as ``"num/den"`` (the receipts' form)."""
    return f"{value.numerator}/{value.denominator}"


def fraction_from_text(text: object) -> Fraction:
    """Parse ``"num/den"`` back; ValueError naming the text when it is not one."""
    num, sep, den = str(text).partition("/")
    if not sep or not num.lstrip("-").isdigit() or not den.isdigit() or int(den) == 0:
        raise ValueError(f"exact probability {text!r}: expected 'numerator/denominator'")
    return Fraction(int(num), int(den))


def law_to_json(law: Mapping[tuple[int, ...], Fraction]) -> dict[str, str]:
    """{outcome_key: "num/den"} for the outcomes of positive probability."""
    return {outcome_key(key): fraction_text(prob) for key, prob in sorted(law.items()) if prob != 0}


def law_from_json(data: Mapping[str, str]) -> Law:
    """Inverse of ``law_to_json``."""
    return {parse_outcome_key(text): fraction_from_text(value) for text, value in data.items()}


def law_sha256(law: Mapping[tuple[int, ...], Fraction]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact) of ``law_to_json(law)``."""
    blob = orjson.dumps(law_to_json(law), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()
