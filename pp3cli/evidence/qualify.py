"""``pp3 qualify``: a hypothesis test of a chain verifier against the exact law.

Design (docs/method.md "Targets", docs/qualify.md):

- For each of the toy targets (``pp3cli.evidence.targets``) n requests share ONE run seed
  and get distinct positions (position = target_offset + 8 * request_index), so a verifier
  whose counters are keyed by the batch index repeats its randomness in every batch; the
  batch size is at most n / 16, so such a defect inflates every count at least 16-fold.
- Drafts are drawn from the target's integer q by ``pp3kernels.sample_drafts``; one draft
  row may be invalidated (-1) for odd request indices (the law is then an exact mixture).
- The family (all members of all targets, ``pp3cli.evidence.family``) is G-tested with
  pooled cells and Holm at alpha; the T0 greedy pairing and the edge battery must pass too.
  Negative controls (verifiers with one planted defect each) run the same battery at the
  same size and must each be caught; the verdict is FAIL if any control passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from pp3cli.evidence.edge import EdgeResult, run_edge_battery
from pp3cli.evidence.family import (
    MemberRecord,
    control_requests_for,
    judge_members,
    member_laws,
    requests_for,
    target_power,
)
from pp3cli.evidence.greedy import greedy_from_logits
from pp3cli.evidence.pairing import PairingReport, pair_sampled, pair_t0, pairing_members
from pp3cli.evidence.profiles import CAPPED_REPEATS, MIN_REPEATS, Profile
from pp3cli.evidence.shares import VERIFIER, RankCounts, RankShare
from pp3cli.evidence.stats import FamilyVerdict, holm
from pp3cli.evidence.targets import TARGETS, ToyTarget
from pp3cli.evidence.verdict import battery_caught, qualification_verdict
from pp3kernels import (
    STATUS_OK,
    ChainInputs,
    ChainResult,
    ChainVerifier,
    point_mass_q,
    sample_drafts,
)

POSITION_STRIDE = 8  # > K + 1: chain rows of distinct requests never share a position
TARGET_OFFSET_BITS = 40
GREEDY_VOCAB = 16
GREEDY_DENOMINATOR = 1 << 16

Progress = Callable[[str, int, int], None]


class DraftTransport(Protocol):
    """Carries a batch's drafts and q somewhere and back (e.g. through the drafter proxy).

    Returns the inputs as received on the other side; a lost or refused frame comes back
    as a fallback row (proposals -1), which changes the law, so the family sees it.
    """

    def __call__(
        self, inputs: ChainInputs, request_index: torch.Tensor, generation: int, vocab: int
    ) -> ChainInputs: ...


# ---------------------------------------------------------------------------- counting


def count_members(target: ToyTarget, result: ChainResult) -> dict[str, np.ndarray]:
    """Counts per member outcome for one batch of outputs (``member_laws`` order).

    A row is well formed iff status is OK, 0 <= accepted <= K, tokens[0..accepted] lie in
    [0, V) and the rest are -1; any other row counts on every member's "malformed" outcome.
    """
    k, vocab = target.k, target.vocab
    tokens = result.tokens.long()
    acc = result.accepted.long()
    cols = torch.arange(k + 1, device=tokens.device)
    acc_clamped = acc.clamp(0, k)
    emitted = cols.unsqueeze(0) <= acc_clamped.unsqueeze(1)
    in_range = (tokens >= 0) & (tokens < vocab)
    shape_ok = torch.where(emitted, in_range, tokens == -1).all(dim=1)
    good = (result.status.long() == STATUS_OK) & (acc >= 0) & (acc <= k) & shape_ok
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


def call_size(n: int, batch: int, repeats: int = MIN_REPEATS) -> int:
    """Requests per verifier call: at most ``batch`` and at most ceil(n / repeats)."""
    return max(1, min(batch, math.ceil(n / repeats)))


def target_inputs(
    target: ToyTarget, index: torch.Tensor, *, seed: int, target_index: int
) -> ChainInputs:
    """Inputs for the requests numbered ``index`` of one target (one run seed).

    Request r has position (target_index << 40) + 8 r; logits and q are one small table
    expanded with batch stride 0; drafts are drawn from q, row ``invalid_row`` set to -1 for
    odd r. q is sparse here whatever the target's ``q_form``: ``as_target_form`` turns it
    dense for a dense target (after the drafter proxy, which carries integer q only).
    """
    device = index.device
    b, k = index.shape[0], target.k
    logits = target.logits(device)
    q_ids, q_counts = target.q_tensors(device)
    position = (target_index << TARGET_OFFSET_BITS) + POSITION_STRIDE * index
    seeds = torch.full((b,), seed, dtype=torch.int64, device=device)
    ids = q_ids.unsqueeze(0).expand(b, k, target.support)
    counts = q_counts.unsqueeze(0).expand(b, k, target.support)
    drafts = sample_drafts(ids, counts, target.denominator, seeds, position)
    if target.invalid_row is not None:
        drafts = drafts.clone()
        drafts[(index % 2) == 1, target.invalid_row] = -1
    return ChainInputs(
        logits.unsqueeze(0).expand(b, k + 1, target.vocab),
        drafts,
        torch.full((b,), target.tau, dtype=torch.float32, device=device),
        seeds,
        position,
        q_ids=ids,
        q_counts=counts,
        denominator=target.denominator,
    )


def as_target_form(target: ToyTarget, inputs: ChainInputs) -> ChainInputs:
    """The inputs with q in the target's form: unchanged for sparse, q_dense for dense.

    Dense q is count / C in fp32 (exact: C is a power of two), scattered per request from
    the sparse q the inputs carry (padding slots, count 0, add nothing).
    """
    if target.q_form == "sparse" or inputs.q_ids is None or inputs.q_counts is None:
        return inputs
    batch = inputs.draft_tokens.shape[0]
    ids = inputs.q_ids.long()
    weights = inputs.q_counts.to(torch.float32) / float(target.denominator)
    dense = torch.zeros(batch, target.k, target.vocab, dtype=torch.float32, device=ids.device)
    dense.scatter_add_(-1, ids.clamp(min=0), torch.where(ids >= 0, weights, 0.0))
    return replace(inputs, q_ids=None, q_counts=None, denominator=None, q_dense=dense)


def target_calls(
    target: ToyTarget,
    target_index: int,
    n: int,
    *,
    device: torch.device,
    seed: int,
    profile: Profile,
    share: RankShare | None = None,
    transport: DraftTransport | None = None,
    task: str,
    progress: Progress | None = None,
) -> Iterator[ChainInputs]:
    """The inputs of each verifier call on one target, in request order: its requests
    (``n``, or its cap under ``profile``) in calls of ``call_size``, through ``transport``
    when given, q in the target's form.

    With ``share``, only that rank's calls. ``progress(task, done, total)`` follows each call,
    once the caller asks for the next one (or ends the loop).
    """
    requests = target.requests(profile.name, n)
    repeats = CAPPED_REPEATS if target.capped else profile.repeats
    size = call_size(requests, profile.batch, repeats)
    calls = math.ceil(requests / size)
    starts = [  # distributed: this rank's calls only (pp3cli.evidence.shares)
        start
        for start in range(0, requests, size)
        if share is None or share.owns_call(target_index, start // size, calls)
    ]
    total = sum(min(requests, start + size) - start for start in starts)
    done = 0
    for start in starts:
        stop = min(requests, start + size)
        index = torch.arange(start, stop, dtype=torch.int64, device=device)
        inputs = target_inputs(target, index, seed=seed, target_index=target_index)
        if transport is not None:
            inputs = transport(inputs, index, target_index, target.vocab)
        yield as_target_form(target, inputs)
        done += stop - start
        if progress is not None:
            progress(task, done, total)


# ---------------------------------------------------------------------------- greedy


@dataclass(frozen=True)
class GreedyReport:
    """T0 requests compared with the independent greedy path (``pp3cli.evidence.greedy``)."""

    n: int
    mismatches: int
    examples: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {"n": self.n, "mismatches": self.mismatches, "examples": list(self.examples)}


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
    verifier: ChainVerifier,
    device: torch.device,
    seed: int,
    batch: int,
    progress: Progress | None = None,
    max_examples: int = 10,
) -> GreedyReport:
    """n_greedy T0 requests, each paired with a T1 request in the same batch (even/odd rows).

    K alternates 4/5 between batches. Every T0 row's tokens, accepted length and status must
    equal the greedy path; a mismatch is recorded with the request's number.
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
        logits_np, drafts_np, tau_np = _greedy_batch(rng, b, 4 if number % 2 == 0 else 5)
        logits, drafts = torch.from_numpy(logits_np), torch.from_numpy(drafts_np)
        q_ids, q_counts = point_mass_q(drafts, GREEDY_DENOMINATOR)
        inputs = ChainInputs(
            logits.to(device),
            drafts.to(device),
            torch.from_numpy(tau_np).to(device),
            torch.full((b,), seed, dtype=torch.int64, device=device),
            torch.arange(b, dtype=torch.int64, device=device) * POSITION_STRIDE + (number << 32),
            q_ids=q_ids.to(device),
            q_counts=q_counts.to(device),
            denominator=GREEDY_DENOMINATOR,
        )
        result = inputs.verify_with(verifier)
        greedy = slice(0, b, 2)
        want_tokens, want_acc = greedy_from_logits(logits[greedy], drafts[greedy])
        got_tokens = result.tokens[greedy].cpu().to(torch.int32)
        got_acc = result.accepted[greedy].cpu().to(torch.int32)
        got_status = result.status[greedy].cpu()
        bad = (
            (got_tokens != want_tokens).any(dim=1)
            | (got_acc != want_acc)
            | (got_status != STATUS_OK)
        )
        mismatches += int(bad.sum())
        for row in bad.nonzero().flatten().tolist()[: max(0, max_examples - len(examples))]:
            examples.append(
                {
                    "request": done + row,
                    "batch": number,
                    "drafts": drafts_np[2 * row].tolist(),
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
    def caught(self) -> bool:
        """True when the battery caught the defect (as it must)."""
        return battery_caught(
            self.family.passed, self.greedy.mismatches, (e.passed for e in self.edge)
        )

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {
            "defect": self.defect,
            "members": [m.to_json() for m in self.members],
            "family": self.family.to_json(),
            "greedy": self.greedy.to_json(),
            "edge": [e.to_json() for e in self.edge],
            "failed_as_required": self.caught,
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
    edge_decides: bool = True  # False for a peer's or a user's verifier (edge.py: "differs")
    pairing: PairingReport | None = None  # --pair-with; its tests are in ``family``'s Holm
    rank_counts: dict[str, RankCounts] | None = None  # distributed: battery -> per-rank
    control_requests_per_target: int | None = None  # None: the verifier's

    @property
    def verdict(self) -> str:
        """``pp3cli.evidence.verdict.qualification_verdict`` of this run."""
        return qualification_verdict(
            self.family.passed,
            self.greedy.mismatches + (self.pairing.t0_mismatches if self.pairing else 0),
            (e.passed or not self.edge_decides for e in self.edge),
            (c.caught for c in self.controls),
        )

    def edge_summary(self) -> dict[str, list[str]]:
        """Edge checks by outcome: "meets" pp3's contract or "differs" from it."""
        return {
            "meets": [e.name for e in self.edge if e.passed],
            "differs": [e.name for e in self.edge if not e.passed],
        }

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
            "edge_decides": self.edge_decides,
            "edge_summary": self.edge_summary(),
            "pairing": None if self.pairing is None else self.pairing.to_json(),
            "targets": target_power(
                self.members,
                self.alpha,
                0 if self.pairing is None else len(self.pairing.tests),
            ),
            "verdict": self.verdict,
        } | (
            {}
            if self.control_requests_per_target is None
            else {"control_requests_per_target": self.control_requests_per_target}
        )


class BatteryResult(NamedTuple):
    """What one verifier's battery found (an empty part was skipped, see ``Battery.run``)."""

    members: list[MemberRecord]
    family: FamilyVerdict
    greedy: GreedyReport
    edge: list[EdgeResult]


@dataclass(frozen=True)
class Battery:
    """One qualification's fixed settings; ``run`` puts a verifier through all its parts.

    ``n`` requests per target, ``n_greedy`` paired T0 requests, one run ``seed``; the
    verifier under test and every control get the same battery, so the same inputs.
    """

    n: int
    n_greedy: int
    device: torch.device
    seed: int
    profile: Profile
    alpha: float
    targets: Sequence[ToyTarget] = TARGETS
    share: RankShare | None = None  # distributed: this rank's calls (evidence/shares.py)

    def sample(
        self,
        verifier: ChainVerifier,
        target_index: int,
        transport: DraftTransport | None,
        progress: Progress | None,
    ) -> dict[str, np.ndarray]:
        """Run ``n`` requests of one target through ``verifier``; counts per member."""
        target = self.targets[target_index]
        totals: dict[str, np.ndarray] = {}
        for inputs in target_calls(
            target,
            target_index,
            self.n,
            device=self.device,
            seed=self.seed,
            profile=self.profile,
            share=self.share,
            transport=transport,
            task=target.name,
            progress=progress,
        ):
            for name, values in count_members(target, inputs.verify_with(verifier)).items():
                totals[name] = totals[name] + values if name in totals else values
        return totals

    def family(
        self,
        verifier: ChainVerifier,
        transport: DraftTransport | None = None,
        progress: Progress | None = None,
    ) -> tuple[list[MemberRecord], FamilyVerdict]:
        """Sample every target, G-test each member, Holm over the family at ``alpha``."""
        counts: dict[str, np.ndarray] = {}
        for index in range(len(self.targets)):
            counts |= self.sample(verifier, index, transport, progress)
        laws = [
            law
            for target in self.targets
            for law in member_laws(target, target.requests(self.profile.name, self.n))
        ]
        if self.share is not None:
            counts = self.share.merge(laws, counts)
        return judge_members(laws, counts, self.alpha)

    def run(
        self,
        verifier: ChainVerifier,
        *,
        progress: Progress | None = None,
        stop_at_failure: bool = False,
        transport: DraftTransport | None = None,
    ) -> BatteryResult:
        """Family, then greedy pairing, then edge battery.

        With ``stop_at_failure`` (negative controls) a later part is skipped once an earlier
        one failed: the control has already been caught (greedy is then recorded with
        n = 0, the edge battery as an empty list).
        """
        members, family = self.family(verifier, transport, progress)
        greedy, edge = self.later_parts(
            verifier, family.passed, progress=progress, stop_at_failure=stop_at_failure
        )
        return BatteryResult(members, family, greedy, edge)

    def later_parts(
        self,
        verifier: ChainVerifier,
        family_passed: bool,
        *,
        progress: Progress | None = None,
        stop_at_failure: bool = False,
    ) -> tuple[GreedyReport, list[EdgeResult]]:
        """Greedy pairing, then edge battery, after a family that passed or not (see run)."""
        if stop_at_failure and not family_passed:
            return GreedyReport(0, 0, ()), []
        greedy = run_greedy_pairing(
            self.n_greedy,
            verifier=verifier,
            device=self.device,
            seed=self.seed,
            batch=self.profile.batch,
            progress=progress,
        )
        if stop_at_failure and greedy.mismatches:
            return greedy, []
        return greedy, run_edge_battery(verifier, device=self.device, seed=self.seed)


def run_qualification(
    profile: Profile,
    *,
    verifier: ChainVerifier,
    device: torch.device | str,
    alpha: float,
    seed: int = 0,
    tv: float | None = None,
    n_greedy: int | None = None,
    controls: Mapping[str, ChainVerifier] | None = None,
    full_controls: bool = False,
    transport: DraftTransport | None = None,
    targets: Sequence[ToyTarget] = TARGETS,
    progress: Progress | None = None,
    edge_decides: bool = True,
    pair_with: tuple[str, ChainVerifier] | None = None,
    share: RankShare | None = None,
) -> QualificationReport:
    """Run the family, greedy pairing and edge battery for ``verifier`` and each control.

    ``controls`` maps a defect name to a defective verifier (default: none); each runs the
    same battery at the same size and must be caught; unless ``full_controls``, a control
    stops at its first failing part. ``tv`` overrides the profile's size; a profile with a
    ``control_tv`` (exhaustive) sizes the controls for that TV instead.
    ``edge_decides`` False (peers, user modules) records edge checks without letting them
    decide. ``pair_with`` = (name, verifier) adds ``pp3cli.evidence.pairing``'s paired run:
    n_greedy T0 requests compared exactly, and its homogeneity tests join the Holm family.
    With ``share`` this rank runs its calls of every family, the merged counts are judged,
    and the batteries' greedy and edge parts are spread over the ranks
    (``_batteries_on_ranks``); ``pair_with`` is single-process for now.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha = {alpha}: expected 0 < alpha < 1")
    dev = torch.device(device)
    n = requests_for(profile, alpha, tv, targets)
    pairs = profile.n_greedy if n_greedy is None else n_greedy
    if pairs < 1:
        raise ValueError(f"n_greedy = {pairs}: expected at least 1")
    battery = Battery(n, pairs, dev, seed, profile, alpha, tuple(targets), share)
    n_controls = control_requests_for(profile, alpha, tv, targets)
    # Controls skip the capped targets (costly ones that judge the verifier only); each is
    # still caught by the rest of the family.
    control_battery = replace(
        battery, n=n_controls, targets=tuple(t for t in targets if not t.capped)
    )
    if share is not None:
        if pair_with is not None:
            raise ValueError("pair_with with several ranks: the paired run is single-process")
        named = [(VERIFIER, verifier), *(controls or {}).items()]
        results, rank_counts = _batteries_on_ranks(
            battery,
            control_battery,
            named,
            share,
            full_controls=full_controls,
            transport=transport,
            progress=progress,
        )
        reports_on_ranks = [
            ControlReport(name, tuple(r.members), r.family, r.greedy, tuple(r.edge))
            for (name, _), r in zip(named[1:], results[1:], strict=True)
        ]
        return _report(
            battery,
            control_battery,
            results[0],
            reports_on_ranks,
            rank_counts,
            edge_decides=edge_decides,
            pairing=None,
        )
    members, family, greedy, edge = battery.run(verifier, progress=progress, transport=transport)
    pairing = None
    if pair_with is not None:  # ---- --pair-with (pp3cli.evidence.pairing)
        other_name, other = pair_with
        t0_bad, examples = pair_t0(
            verifier, other, pairs, device=dev, seed=seed, batch=profile.batch, progress=progress
        )
        tests = pair_sampled(
            verifier, other, targets, n, device=dev, seed=seed, profile=profile, progress=progress
        )
        pairing = PairingReport(other_name, pairs, t0_bad, examples, tuple(tests))
        family = holm([m.result for m in members] + pairing_members(tests), alpha)
    reports = []
    for defect, control in (controls or {}).items():

        def tagged(task: str, done: int, total: int, _d: str = defect) -> None:
            if progress is not None:
                progress(f"control {_d}: {task}", done, total)

        caught = control_battery.run(control, progress=tagged, stop_at_failure=not full_controls)
        reports.append(
            ControlReport(
                defect, tuple(caught.members), caught.family, caught.greedy, tuple(caught.edge)
            )
        )
    tested = BatteryResult(members, family, greedy, edge)
    return _report(
        battery,
        control_battery,
        tested,
        reports,
        None,
        edge_decides=edge_decides,
        pairing=pairing,
    )


def _report(
    battery: Battery,
    control_battery: Battery,
    tested: BatteryResult,
    controls: Sequence[ControlReport],
    rank_counts: dict[str, RankCounts] | None,
    *,
    edge_decides: bool,
    pairing: PairingReport | None,
) -> QualificationReport:
    """The report of the verifier's battery ``tested`` and the controls'."""
    profile, n = battery.profile, battery.n
    return QualificationReport(
        profile=profile.name,
        requests_per_target=n,
        call_size=call_size(n, profile.batch, profile.repeats),
        alpha=battery.alpha,
        seed=battery.seed,
        members=tuple(tested.members),
        family=tested.family,
        greedy=tested.greedy,
        edge=tuple(tested.edge),
        controls=tuple(controls),
        edge_decides=edge_decides,
        pairing=pairing,
        rank_counts=rank_counts,
        control_requests_per_target=None if control_battery.n == n else control_battery.n,
    )


# ---------------------------------------------------------------------------- on ranks


def _batteries_on_ranks(
    battery: Battery,
    control_battery: Battery,
    named: Sequence[tuple[str, ChainVerifier]],
    share: RankShare,
    *,
    full_controls: bool,
    transport: DraftTransport | None,
    progress: Progress | None,
) -> tuple[list[BatteryResult], dict[str, RankCounts]]:
    """Every battery of a distributed run (``named``: the verifier first, then the controls).

    First every family, each split over the ranks and judged on the gathered counts (so all
    ranks know which control is already caught); then battery i's greedy pairing and edge
    battery (a control's only if its family passed, unless ``full_controls``) run on rank
    i mod N, so the ranks run them side by side; one last exchange gives every rank all
    results. Each part is a function of the seed alone, so the order changes nothing.
    """

    def tagged(name: str) -> Progress | None:
        if progress is None or name == VERIFIER:
            return progress
        return lambda task, done, total: progress(f"control {name}: {task}", done, total)

    def battery_of(name: str) -> Battery:
        return battery if name == VERIFIER else control_battery

    families = []
    rank_counts: dict[str, RankCounts] = {}
    for name, verifier in named:
        sent = transport if name == VERIFIER else None
        families.append(battery_of(name).family(verifier, sent, tagged(name)))
        (rank_counts[name],) = share.take()
    later: dict[int, tuple[GreedyReport, list[EdgeResult]]] = {}
    for index, ((name, verifier), (_, family)) in enumerate(zip(named, families, strict=True)):
        if share.group.owns(index):
            later[index] = battery_of(name).later_parts(
                verifier,
                family.passed,
                progress=tagged(name),
                stop_at_failure=name != VERIFIER and not full_controls,
            )
    for parts in share.group.gather_objects(later):
        later |= parts
    results = [
        BatteryResult(members, family, *later[index])
        for index, (members, family) in enumerate(families)
    ]
    return results, rank_counts
