"""``pp3 qualify``: a hypothesis test of a chain verifier against the exact law.

Design (docs/method.md "Targets", docs/qualify.md):

- For each of the five toy targets (``pp3cli.targets``) n requests share ONE run seed and
  get distinct positions (position = target_offset + 8 * request_index), so a verifier whose
  counters are keyed by the batch index repeats its randomness in every batch; the batch
  size is at most n / 16, so such a defect inflates every count at least 16-fold.
- Drafts are drawn from the target's integer q by ``pp3kernels.sample_drafts``; one draft
  row may be invalidated (-1) for odd request indices, and the law is then the exact
  mixture (n_even / n) law_valid + (n_odd / n) law_invalid.
- Members per target, all exact (Fractions): the emitted token at every output slot j
  (V tokens + "absent"), the accepted length (0..K), and the joint (accepted length,
  final token). Every member has one more outcome, "malformed" (status not OK, token out
  of range, bad padding), with exact probability 0, so a single malformed row fails it.
- The family (all members of all targets) is G-tested with pooled cells and Holm at
  alpha; T0 greedy pairing and the edge battery must pass too. Negative controls (the
  reference with one planted defect each) run the same battery at the same size and
  must each FAIL; the verdict is FAIL if any control passes.

Exact law of one chain (rows i = 0..K-1 with target p_i and draft law q_i, bonus row K):
beta_i = sum_v min(p_i, q_i)(v) (acceptance; 0 for an invalidated row),
reach_i = prod_{m<i} beta_m, residual rho_i = (p_i - q_i)+ (p_i for an invalidated row and
for the bonus row). Then P(slot j = v) = reach_j p_j(v) (min + residual = p),
P(slot j absent) = 1 - reach_j, P(accepted = i) = reach_i (1 - beta_i) (i < K) and
reach_K (i = K), P(accepted = i, final = v) = reach_i rho_i(v).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
import torch

from pp3cli.edge import (
    DENOMINATOR,
    STATUS_OK,
    ChainOutput,
    EdgeResult,
    point_mass_for,
    run_edge_battery,
)
from pp3cli.stats import FamilyVerdict, MemberResult, g_test, holm, pool_cells, samples_for_tv
from pp3cli.targets import TARGETS, ToyTarget
from pp3cli.verify import register_recomputer

__all__ = [
    "PROFILES",
    "DraftTransport",
    "ControlReport",
    "GreedyReport",
    "MemberLaw",
    "MemberRecord",
    "PlanRow",
    "Profile",
    "QualificationReport",
    "Verifier",
    "count_members",
    "frac_from_text",
    "frac_text",
    "member_laws",
    "plan_samples",
    "ProxyTransport",
    "recompute_qualification",
    "run_battery",
    "run_family",
    "run_greedy_pairing",
    "run_qualification",
    "sample_target",
]

POWER = 0.99
MIN_EXPECTED = 20.0
MIN_REPEATS = 16  # every batch-index-keyed counter is reused at least this often
POSITION_STRIDE = 8  # > K + 1: chain rows of distinct requests never share a position
TARGET_OFFSET_BITS = 40
GREEDY_VOCAB = 16

Progress = Callable[[str, int, int], None]
# (drafts, q_ids, q_counts, denominator, temperature, request_index, generation, vocab)
#   -> (drafts, q_ids, q_counts) as received on the other side of a transport.
DraftTransport = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor, int, int],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]


class ProxyTransport:
    """Send the drafts through ``pp3cli.proxy`` (a real drafter process) and back.

    A lost or refused frame comes back as a fallback row (proposals -1), which changes the
    law, so the family sees it; nothing is patched up here. Every call's frame counts are
    added up in ``totals`` for the receipt.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.totals: dict[str, int] = {}
        self.refused_by_reason: dict[str, int] = {}
        self.drafter_lost = 0

    def __call__(
        self,
        drafts: torch.Tensor,
        q_ids: torch.Tensor,
        q_counts: torch.Tensor,
        denominator: int,
        temperature: torch.Tensor,
        request_index: torch.Tensor,
        generation: int,
        vocab: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from pp3cli.proxy import send_drafts_through_proxy

        got_drafts, got_ids, got_counts, stats = send_drafts_through_proxy(
            drafts,
            q_ids.contiguous(),
            q_counts.contiguous(),
            denominator,
            temperature,
            request_index,
            generation,
            vocab_size=vocab,
        )
        record = stats.to_json()
        self.calls += 1
        for key in ("rounds", "frames_sent", "frames_received", "frames_accepted"):
            self.totals[key] = self.totals.get(key, 0) + int(record[key])
        for key in ("frames_refused", "fallbacks", "rounds_timed_out"):
            self.totals[key] = self.totals.get(key, 0) + int(record[key])
        for reason, count in record["refused_by_reason"].items():
            self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + int(count)
        self.drafter_lost += int(bool(record["drafter_lost"]))
        return got_drafts, got_ids, got_counts

    def summary(self) -> dict[str, Any]:
        """The receipt's ``proxy`` block: frames each way, refusals by reason, fallbacks."""
        return {
            "mode": "process",
            "calls": self.calls,
            **self.totals,
            "refused_by_reason": dict(sorted(self.refused_by_reason.items())),
            "drafter_lost_calls": self.drafter_lost,
        }


class Verifier(Protocol):
    """A chain verifier with the ``pp3kernels.verify_chain`` signature."""

    def __call__(
        self,
        logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        position: torch.Tensor,
        *,
        q_ids: torch.Tensor | None = None,
        q_counts: torch.Tensor | None = None,
        denominator: int | None = None,
    ) -> ChainOutput: ...


@dataclass(frozen=True)
class Profile:
    """How big a run is: requests per target (or a TV to size it), batch, greedy pairs."""

    name: str
    requests: int | None  # per target; None: sized from ``tv``
    tv: float | None
    batch: int  # most requests per verifier call
    n_greedy: int
    repeats: int = 16  # at least this many verifier calls per target


PROFILES: dict[str, Profile] = {
    "smoke": Profile("smoke", requests=2000, tv=None, batch=1024, n_greedy=1000, repeats=8),
    "seed": Profile("seed", requests=20_000, tv=None, batch=8192, n_greedy=100_000),
    "strict": Profile("strict", requests=None, tv=1e-3, batch=1 << 22, n_greedy=1_000_000),
}


def frac_text(value: Fraction) -> str:
    """A Fraction as "num/den" (the receipt's form of an exact probability)."""
    return f"{value.numerator}/{value.denominator}"


def frac_from_text(text: str) -> Fraction:
    """Parse "num/den" back; raise ValueError naming the text when it is not one."""
    num, sep, den = text.partition("/")
    if not sep or not num.lstrip("-").isdigit() or not den.isdigit() or int(den) == 0:
        raise ValueError(f"exact probability {text!r}: expected 'numerator/denominator'")
    return Fraction(int(num), int(den))


# ---------------------------------------------------------------------------- exact law


@dataclass(frozen=True)
class MemberLaw:
    """One family member: its name, target, kind and exact outcome probabilities."""

    name: str
    target: str
    kind: str  # "slot", "accepted" or "joint"
    probs: tuple[Fraction, ...]  # last outcome: "malformed", probability 0


def _chain_parts(
    target: ToyTarget, invalid: bool
) -> tuple[list[Fraction], list[list[Fraction]], list[list[Fraction]]]:
    """(beta_i, p_i, rho_i) of one configuration; rows K has beta 0 and rho = p."""
    k = target.k
    beta: list[Fraction] = []
    rows: list[list[Fraction]] = []
    residual: list[list[Fraction]] = []
    for i in range(k + 1):
        p = list(target.p(i))
        rows.append(p)
        if i == k or (invalid and i == target.invalid_row):
            beta.append(Fraction(0))
            residual.append(p)
            continue
        q = target.q(i)
        beta.append(sum((min(a, b) for a, b in zip(p, q, strict=True)), Fraction(0)))
        residual.append([max(a - b, Fraction(0)) for a, b in zip(p, q, strict=True)])
    return beta, rows, residual


def _configuration_laws(target: ToyTarget, invalid: bool) -> dict[str, list[Fraction]]:
    k, vocab = target.k, target.vocab
    beta, rows, residual = _chain_parts(target, invalid)
    reach = [Fraction(1)]
    for i in range(k):
        reach.append(reach[-1] * beta[i])
    laws: dict[str, list[Fraction]] = {}
    for j in range(k + 1):
        laws[f"slot{j}"] = [reach[j] * p for p in rows[j]] + [1 - reach[j]]
    laws["accepted"] = [reach[i] * (1 - beta[i]) for i in range(k)] + [reach[k]]
    joint: list[Fraction] = []
    for i in range(k + 1):
        joint.extend(reach[i] * r for r in residual[i])
    laws["joint"] = joint
    if len(joint) != (k + 1) * vocab:
        raise ValueError(f"{target.name}: joint law has {len(joint)} outcomes")
    return laws


def member_laws(target: ToyTarget, n: int) -> list[MemberLaw]:
    """Exact laws of the target's members for n requests (odd indices invalidated).

    With an ``invalid_row`` the requests are a fixed mixture: ceil(n/2) valid, floor(n/2)
    invalidated, and each member's law is the weighted mixture of the two configurations.
    """
    if n < 1:
        raise ValueError(f"n = {n}: expected at least one request")
    valid = _configuration_laws(target, invalid=False)
    if target.invalid_row is None:
        mixed = valid
    else:
        odd = Fraction(n // 2, n)
        invalid = _configuration_laws(target, invalid=True)
        mixed = {
            key: [(1 - odd) * a + odd * b for a, b in zip(valid[key], invalid[key], strict=True)]
            for key in valid
        }
    out = []
    for key, probs in mixed.items():
        kind = "slot" if key.startswith("slot") else key
        total = sum(probs, Fraction(0))
        if total != 1:
            raise ValueError(f"{target.name}/{key}: exact law sums to {total}, expected 1")
        out.append(MemberLaw(f"{target.name}/{key}", target.name, kind, (*probs, Fraction(0))))
    return out


# ---------------------------------------------------------------------------- counting


def count_members(
    target: ToyTarget, tokens: torch.Tensor, accepted: torch.Tensor, status: torch.Tensor
) -> dict[str, np.ndarray]:
    """Counts per member outcome for one batch of outputs (see ``member_laws`` order).

    A row is well formed iff status is OK, 0 <= accepted <= K, tokens[0..accepted] lie in
    [0, V) and the rest are -1; any other row counts on every member's "malformed" outcome.
    """
    k, vocab = target.k, target.vocab
    tokens = tokens.long()
    acc = accepted.long()
    cols = torch.arange(k + 1, device=tokens.device)
    acc_clamped = acc.clamp(0, k)
    emitted = cols.unsqueeze(0) <= acc_clamped.unsqueeze(1)
    in_range = (tokens >= 0) & (tokens < vocab)
    shape_ok = torch.where(emitted, in_range, tokens == -1).all(dim=1)
    good = (status.long() == STATUS_OK) & (acc >= 0) & (acc <= k) & shape_ok
    counts: dict[str, np.ndarray] = {}

    def tally(codes: torch.Tensor, outcomes: int) -> np.ndarray:
        codes = torch.where(good, codes, torch.full_like(codes, outcomes))
        return torch.bincount(codes, minlength=outcomes + 1).cpu().numpy().astype(np.int64)

    for j in range(k + 1):
        slot = torch.where(emitted[:, j], tokens[:, j].clamp(0, vocab - 1), vocab)
        counts[f"{target.name}/slot{j}"] = tally(slot, vocab + 1)
    counts[f"{target.name}/accepted"] = tally(acc_clamped, k + 1)
    final = tokens.gather(1, acc_clamped.unsqueeze(1)).squeeze(1).clamp(0, vocab - 1)
    counts[f"{target.name}/joint"] = tally(acc_clamped * vocab + final, (k + 1) * vocab)
    return counts


def _batches(n: int, batch: int) -> list[tuple[int, int]]:
    return [(start, min(n, start + batch)) for start in range(0, n, batch)]


def call_size(n: int, batch: int, repeats: int = MIN_REPEATS) -> int:
    """Requests per verifier call: at most ``batch`` and at most ceil(n / repeats)."""
    return max(1, min(batch, math.ceil(n / repeats)))


def sample_target(
    target: ToyTarget,
    n: int,
    *,
    verifier: Verifier,
    device: torch.device,
    seed: int,
    batch: int,
    target_index: int,
    repeats: int = MIN_REPEATS,
    transport: DraftTransport | None = None,
    progress: Progress | None = None,
) -> dict[str, np.ndarray]:
    """Run n requests of ``target`` through ``verifier``; return counts per member.

    All requests use ``seed``; request r has position (target_index << 40) + 8 r. The
    logits and q are one small table expanded with batch stride 0.
    """
    sample_drafts = importlib.import_module("pp3kernels").sample_drafts

    k = target.k
    logits = target.logits(device)
    q_ids, q_counts = target.q_tensors(device)
    totals: dict[str, np.ndarray] = {}
    size = call_size(n, batch, repeats)
    done = 0
    for start, stop in _batches(n, size):
        b = stop - start
        index = torch.arange(start, stop, dtype=torch.int64, device=device)
        position = (target_index << TARGET_OFFSET_BITS) + POSITION_STRIDE * index
        seeds = torch.full((b,), seed, dtype=torch.int64, device=device)
        ids = q_ids.unsqueeze(0).expand(b, k, target.support)
        counts = q_counts.unsqueeze(0).expand(b, k, target.support)
        drafts = sample_drafts(ids, counts, target.denominator, seeds, position)
        if target.invalid_row is not None:
            drafts = drafts.clone()
            odd = (index % 2) == 1
            drafts[odd, target.invalid_row] = -1
        temperature = torch.full((b,), target.tau, dtype=torch.float32, device=device)
        if transport is not None:
            drafts, ids, counts = transport(
                drafts,
                ids,
                counts,
                target.denominator,
                temperature,
                index,
                target_index,
                target.vocab,
            )
        result = verifier(
            logits.unsqueeze(0).expand(b, k + 1, target.vocab),
            drafts,
            temperature,
            seeds,
            position,
            q_ids=ids,
            q_counts=counts,
            denominator=target.denominator,
        )
        for name, values in count_members(
            target, result.tokens, result.accepted, result.status
        ).items():
            totals[name] = totals[name] + values if name in totals else values
        done += b
        if progress is not None:
            progress(target.name, done, n)
    return totals


# ---------------------------------------------------------------------------- family


@dataclass(frozen=True)
class MemberRecord:
    """A member's raw counts, exact law, pooled cells and G-test result."""

    law: MemberLaw
    observed: tuple[int, ...]
    result: MemberResult

    def to_json(self) -> dict[str, Any]:
        """Receipt form: counts, exact probabilities as "num/den", pooled groups, stats."""
        pooling = pool_cells(self.law.probs, max(1, self.result.n), MIN_EXPECTED)
        return {
            "name": self.law.name,
            "target": self.law.target,
            "kind": self.law.kind,
            "observed": list(self.observed),
            "exact": [frac_text(p) for p in self.law.probs],
            "pooled": {
                "groups": [list(g) for g in pooling.groups],
                "impossible": list(pooling.impossible),
            },
            "result": self.result.to_json(),
        }


def requests_for(profile: Profile, alpha: float, tv: float | None = None) -> int:
    """Requests per target: the profile's fixed count, or sized from a TV by ``plan_samples``."""
    wanted = tv if tv is not None else profile.tv
    if wanted is None:
        if profile.requests is None:
            raise ValueError(f"profile {profile.name!r} has neither requests nor tv")
        return profile.requests
    return max(row.n_needed for row in plan_samples(wanted, alpha))


def run_family(
    n: int,
    *,
    verifier: Verifier,
    device: torch.device,
    seed: int,
    batch: int,
    alpha: float,
    targets: Sequence[ToyTarget] = TARGETS,
    repeats: int = MIN_REPEATS,
    transport: DraftTransport | None = None,
    progress: Progress | None = None,
) -> tuple[list[MemberRecord], FamilyVerdict]:
    """Sample every target n times, G-test each member, and apply Holm over the family."""
    records: list[MemberRecord] = []
    for index, target in enumerate(targets):
        counts = sample_target(
            target,
            n,
            verifier=verifier,
            device=device,
            seed=seed,
            batch=batch,
            target_index=index,
            repeats=repeats,
            transport=transport,
            progress=progress,
        )
        for law in member_laws(target, n):
            observed = tuple(int(c) for c in counts[law.name])
            result = g_test(law.name, observed, law.probs, MIN_EXPECTED)
            records.append(MemberRecord(law, observed, result))
    return records, holm([r.result for r in records], alpha)


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanRow:
    """Samples one member needs to detect a TV deviation with power 0.99."""

    member: str
    outcomes: int
    df: int
    n_needed: int


def plan_samples(tv: float, alpha: float, power: float = POWER) -> list[PlanRow]:
    """Per member: n with P(reject | TV = tv on the pooled cells) >= power.

    Sized at alpha / m (m = family size, Holm's strictest step), so the guarantee holds
    whatever the other members do. df depends on pooling, which depends on n: iterate
    n -> pool at n -> df -> samples_for_tv until n stops growing.
    """
    laws = [law for target in TARGETS for law in member_laws(target, 2)]
    member_alpha = alpha / len(laws)
    rows = []
    for target in TARGETS:
        for law in member_laws(target, 2):
            possible = sum(1 for p in law.probs if p > 0)
            n = samples_for_tv(tv, max(1, possible - 1), member_alpha, power)
            df = possible - 1
            for _ in range(20):
                df = max(1, len(pool_cells(law.probs, n, MIN_EXPECTED).groups) - 1)
                needed = samples_for_tv(tv, df, member_alpha, power)
                if needed <= n:
                    break
                n = needed
            rows.append(PlanRow(law.name, len(law.probs), df, n))
    return rows


# ---------------------------------------------------------------------------- greedy


@dataclass(frozen=True)
class GreedyReport:
    """T0 requests compared with the independent numpy greedy path."""

    n: int
    mismatches: int
    examples: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {"n": self.n, "mismatches": self.mismatches, "examples": list(self.examples)}


def greedy_reference(logits: np.ndarray, drafts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy path in numpy: y_i = first argmax (lowest id; -0.0 == +0.0), accept x_i == y_i.

    Returns (tokens [N, K+1] with -1 padding, accepted [N]).
    """
    y = np.argmax(logits, axis=-1).astype(np.int64)  # first maximum; -0.0 == 0.0 compares equal
    k = drafts.shape[1]
    match = drafts.astype(np.int64) == y[:, :k]
    accepted = np.cumprod(match, axis=1).sum(axis=1)
    cols = np.arange(k + 1)[None, :]
    tokens = np.where(cols <= accepted[:, None], y, -1)
    return tokens, accepted


def _greedy_batch(
    rng: np.random.Generator, b: int, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random logits with many ties, signed zeros and -inf; drafts mostly on the greedy path.

    Even rows are T0, odd rows T1 (tau in {1/2, 1, 2}). Returns (logits, drafts, tau).
    """
    vocab = GREEDY_VOCAB
    logits = rng.integers(-3, 4, size=(b, k + 1, vocab)).astype(np.float32)
    negative_zero = (logits == 0) & (rng.random(logits.shape) < 0.5)
    logits[negative_zero] = -0.0
    masked = rng.random(logits.shape) < 0.15
    keep = rng.integers(0, vocab, size=(b, k + 1))
    masked[np.arange(b)[:, None], np.arange(k + 1)[None, :], keep] = False
    logits[masked] = -np.inf
    y = np.argmax(logits, axis=-1)[:, :k]
    choice = rng.random((b, k))
    drafts = np.where(choice < 0.75, y, rng.integers(0, vocab, size=(b, k)))
    drafts = np.where(choice > 0.96, -1, drafts).astype(np.int32)
    tau = np.where(np.arange(b) % 2 == 0, 0.0, rng.choice([0.5, 1.0, 2.0], size=b))
    return logits, drafts, tau.astype(np.float32)


def run_greedy_pairing(
    n_greedy: int,
    *,
    verifier: Verifier,
    device: torch.device,
    seed: int,
    batch: int,
    progress: Progress | None = None,
    max_examples: int = 10,
) -> GreedyReport:
    """n_greedy T0 requests, each paired with a T1 request in the same batch (even/odd rows).

    K alternates 4/5 between batches. Every T0 row's tokens, accepted length and status must
    equal the numpy greedy path; a mismatch is recorded with the request's number.
    """
    rng = np.random.default_rng([seed, 0x67726565])
    mismatches = 0
    examples: list[dict[str, Any]] = []
    done = 0
    size = max(2, 2 * min(batch, n_greedy))
    number = 0
    while done < n_greedy:
        pairs = min(size // 2, n_greedy - done)
        b = 2 * pairs
        k = 4 if number % 2 == 0 else 5
        logits, drafts, tau = _greedy_batch(rng, b, k)
        position = torch.arange(b, dtype=torch.int64, device=device) * POSITION_STRIDE + (
            number << 32
        )
        seeds = torch.full((b,), seed, dtype=torch.int64, device=device)
        draft_t = torch.from_numpy(drafts).to(device)
        q_ids, q_counts = point_mass_for(draft_t)
        result = verifier(
            torch.from_numpy(logits).to(device),
            draft_t,
            torch.from_numpy(tau).to(device),
            seeds,
            position,
            q_ids=q_ids,
            q_counts=q_counts,
            denominator=DENOMINATOR,
        )
        greedy = slice(0, b, 2)
        want_tokens, want_acc = greedy_reference(logits[greedy], drafts[greedy])
        got_tokens = result.tokens[greedy].cpu().numpy().astype(np.int64)
        got_acc = result.accepted[greedy].cpu().numpy().astype(np.int64)
        got_status = result.status[greedy].cpu().numpy()
        bad = (
            (got_tokens != want_tokens).any(axis=1)
            | (got_acc != want_acc)
            | (got_status != STATUS_OK)
        )
        mismatches += int(bad.sum())
        for row in np.flatnonzero(bad)[: max(0, max_examples - len(examples))]:
            examples.append(
                {
                    "request": done + int(row),
                    "batch": number,
                    "drafts": drafts[2 * row].tolist(),
                    "expected_tokens": want_tokens[row].tolist(),
                    "got_tokens": got_tokens[row].tolist(),
                    "expected_accepted": int(want_acc[row]),
                    "got_accepted": int(got_acc[row]),
                    "status": int(got_status[row]),
                }
            )
        done += pairs
        number += 1
        if progress is not None:
            progress("greedy pairing", done, n_greedy)
    return GreedyReport(n_greedy, mismatches, tuple(examples))


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class ControlReport:
    """One negative control: a verifier with a planted defect, run through the battery."""

    defect: str
    members: tuple[MemberRecord, ...]
    family: FamilyVerdict
    greedy: GreedyReport
    edge: tuple[EdgeResult, ...]

    @property
    def failed(self) -> bool:
        """True when the battery caught the defect (as it must)."""
        return (
            not self.family.passed
            or self.greedy.mismatches > 0
            or not all(e.passed for e in self.edge)
        )

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {
            "defect": self.defect,
            "members": [m.to_json() for m in self.members],
            "family": self.family.to_json(),
            "greedy": self.greedy.to_json(),
            "edge": [e.to_json() for e in self.edge],
            "failed_as_required": self.failed,
        }


@dataclass(frozen=True)
class QualificationReport:
    """Everything a qualification run found; ``verdict`` is PASS or FAIL."""

    profile: str
    requests_per_target: int
    call_size: int
    alpha: float
    seed: int
    members: tuple[MemberRecord, ...]
    family: FamilyVerdict
    greedy: GreedyReport
    edge: tuple[EdgeResult, ...]
    controls: tuple[ControlReport, ...] = field(default_factory=tuple)

    @property
    def verdict(self) -> str:
        """PASS iff the family, greedy pairing and edge battery pass and every control fails."""
        ok = (
            self.family.passed
            and self.greedy.mismatches == 0
            and all(e.passed for e in self.edge)
            and all(c.failed for c in self.controls)
        )
        return "PASS" if ok else "FAIL"

    def to_json(self) -> dict[str, Any]:
        """Receipt ``data``."""
        return {
            "profile": self.profile,
            "requests_per_target": self.requests_per_target,
            "call_size": self.call_size,
            "members": [m.to_json() for m in self.members],
            "family": self.family.to_json(),
            "greedy": self.greedy.to_json(),
            "edge": [e.to_json() for e in self.edge],
            "controls": [c.to_json() for c in self.controls],
            "verdict": self.verdict,
        }


def run_battery(
    n: int,
    n_greedy: int,
    *,
    verifier: Verifier,
    device: torch.device,
    seed: int,
    profile: Profile,
    alpha: float,
    targets: Sequence[ToyTarget],
    progress: Progress | None,
    stop_at_failure: bool = False,
    transport: DraftTransport | None = None,
) -> tuple[list[MemberRecord], FamilyVerdict, GreedyReport, list[EdgeResult]]:
    """Family, then greedy pairing, then edge battery.

    With ``stop_at_failure`` (negative controls) a later part is skipped once an earlier
    one failed: the control has already failed as required (greedy is then recorded with
    n = 0, the edge battery as an empty list).
    """
    members, family = run_family(
        n,
        verifier=verifier,
        device=device,
        seed=seed,
        batch=profile.batch,
        alpha=alpha,
        targets=targets,
        repeats=profile.repeats,
        transport=transport,
        progress=progress,
    )
    if stop_at_failure and not family.passed:
        return members, family, GreedyReport(0, 0, ()), []
    greedy = run_greedy_pairing(
        n_greedy,
        verifier=verifier,
        device=device,
        seed=seed,
        batch=profile.batch,
        progress=progress,
    )
    if stop_at_failure and greedy.mismatches:
        return members, family, greedy, []
    edge = run_edge_battery(verifier, device=device, seed=seed)
    return members, family, greedy, edge


def run_qualification(
    profile: Profile,
    *,
    verifier: Verifier,
    device: torch.device | str,
    alpha: float = 1e-5,
    seed: int = 0,
    tv: float | None = None,
    n_greedy: int | None = None,
    controls: Mapping[str, Verifier] | None = None,
    full_controls: bool = False,
    transport: DraftTransport | None = None,
    targets: Sequence[ToyTarget] = TARGETS,
    progress: Progress | None = None,
) -> QualificationReport:
    """Run the family, greedy pairing and edge battery for ``verifier`` and each control.

    ``controls`` maps a defect name to a defective verifier (default: none); each runs the
    same battery at the same size and must FAIL; unless ``full_controls``, a control stops
    at its first failing part. ``tv`` overrides the profile's size.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha = {alpha}: expected 0 < alpha < 1")
    dev = torch.device(device)
    n = requests_for(profile, alpha, tv)
    pairs = profile.n_greedy if n_greedy is None else n_greedy
    if pairs < 1:
        raise ValueError(f"n_greedy = {pairs}: expected at least 1")
    members, family, greedy, edge = run_battery(
        n,
        pairs,
        verifier=verifier,
        device=dev,
        seed=seed,
        profile=profile,
        alpha=alpha,
        targets=targets,
        progress=progress,
        transport=transport,
    )
    reports = []
    for defect, control in (controls or {}).items():

        def tagged(task: str, done: int, total: int, _d: str = defect) -> None:
            if progress is not None:
                progress(f"control {_d}: {task}", done, total)

        c_members, c_family, c_greedy, c_edge = run_battery(
            n,
            pairs,
            verifier=control,
            device=dev,
            seed=seed,
            profile=profile,
            alpha=alpha,
            targets=targets,
            progress=tagged,
            stop_at_failure=not full_controls,
        )
        reports.append(ControlReport(defect, tuple(c_members), c_family, c_greedy, tuple(c_edge)))
    return QualificationReport(
        profile=profile.name,
        requests_per_target=n,
        call_size=call_size(n, profile.batch, profile.repeats),
        alpha=alpha,
        seed=seed,
        members=tuple(members),
        family=family,
        greedy=greedy,
        edge=tuple(edge),
        controls=tuple(reports),
    )


# ---------------------------------------------------------------------------- recompute


def _recompute_members(
    stored: Sequence[Mapping[str, Any]], alpha: float
) -> tuple[list[MemberResult], FamilyVerdict, list[str]]:
    """Recompute each member's G-test from raw counts and exact probabilities; list problems."""
    problems: list[str] = []
    results: list[MemberResult] = []
    for entry in stored:
        name = str(entry["name"])
        observed = [int(c) for c in entry["observed"]]
        probs = [frac_from_text(str(p)) for p in entry["exact"]]
        if len(observed) != len(probs):
            problems.append(f"{name}: {len(observed)} counts for {len(probs)} outcomes")
            continue
        try:
            result = g_test(name, observed, probs, MIN_EXPECTED)
        except ValueError as err:
            problems.append(f"{name}: {err}")
            continue
        results.append(result)
        claimed = entry["result"]
        if int(claimed["n"]) != sum(observed) or result.n != int(claimed["n"]):
            problems.append(f"{name}: counts sum to {sum(observed)}, receipt says n={claimed['n']}")
        for key in ("statistic", "p_value"):
            if not math.isclose(
                float(claimed[key]), getattr(result, key), rel_tol=1e-9, abs_tol=1e-300
            ):
                problems.append(
                    f"{name}: stored {key} {claimed[key]} != recomputed {getattr(result, key)}"
                )
        for key in ("df", "impossible_hits", "failed_outright", "cells"):
            if claimed[key] != getattr(result, key):
                problems.append(
                    f"{name}: stored {key} {claimed[key]} != recomputed {getattr(result, key)}"
                )
        pooling = pool_cells(probs, max(1, result.n), MIN_EXPECTED)
        groups = [list(g) for g in pooling.groups]
        if entry.get("pooled", {}).get("groups") != groups:
            problems.append(f"{name}: stored pooled groups differ from the pre-registered rule")
    return results, holm(results, alpha), problems


def recompute_qualification(predicate: Mapping[str, Any]) -> tuple[str, list[str]]:
    """Recompute every statistic and the verdict of a qualification receipt's predicate.

    Returns (recomputed verdict, problems). The verdict is FAIL when the family, greedy
    pairing or edge battery fails, when a control passes, or when any stored statistic,
    pooled cell or verdict differs from what the raw counts give.
    """
    data = predicate["data"]
    alpha = float(predicate["parameters"]["alpha"])
    results, family, problems = _recompute_members(data["members"], alpha)
    if family.passed != bool(data["family"]["passed"]):
        problems.append(
            f"family: stored passed={data['family']['passed']}, recomputed {family.passed}"
        )
    ok = family.passed and int(data["greedy"]["mismatches"]) == 0
    ok = ok and all(bool(e["passed"]) for e in data["edge"])
    for control in data["controls"]:
        _, c_family, c_problems = _recompute_members(control["members"], alpha)
        problems.extend(f"control {control['defect']}: {p}" for p in c_problems)
        failed = (
            not c_family.passed
            or int(control["greedy"]["mismatches"]) > 0
            or not all(bool(e["passed"]) for e in control["edge"])
        )
        if failed != bool(control["failed_as_required"]):
            problems.append(f"control {control['defect']}: stored failed flag is wrong")
        ok = ok and failed
    verdict = "PASS" if ok and not problems else "FAIL"
    if str(predicate.get("verdict")) != verdict and not problems:
        problems.append(f"stored verdict {predicate.get('verdict')} != recomputed {verdict}")
    return verdict, problems


@register_recomputer("qualification")
def recompute_verdict(predicate: Mapping[str, Any]) -> str:
    """verify-receipts hook: the verdict the receipt's raw counts imply (FAIL on any mismatch)."""
    verdict, _problems = recompute_qualification(predicate)
    return verdict
