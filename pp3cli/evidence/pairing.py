"""``pp3 qualify --pair-with``: two verifiers on identical inputs.

The seed's paired check, between any two verifiers (e.g. pp3's selector and vLLM MRV2):

- **T0**: batches of tie-rich random logits (``qualify._greedy_batch``: even rows T0, odd
  rows T1, K alternating 4/5), the same ``ChainInputs`` for both. Every T0 request's emitted
  tokens, accepted length and status must be equal: one mismatch fails the run.
- **T1**: their random-number layouts differ, so sampled rows are compared as laws, not
  bit for bit. For each toy target both verifiers verify the same n requests (the family's
  inputs, one run seed); per target two two-sample G-tests of homogeneity
  (``stats.g_test_homogeneity``) compare the accepted-length law and the law of the last
  emitted token (the token at index ``accepted``).

Pre-registered alpha: the 2 x targets homogeneity tests are members of the qualification's
one Holm family (named ``pair/<target>/accepted`` and ``pair/<target>/final``), so the
family-wise alpha covers the G-tests against the exact law and the pairing together; with m
members in all, Holm's strictest step is alpha / m.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pp3cli.evidence.profiles import MIN_EXPECTED, Profile
from pp3cli.evidence.stats import MemberResult, g_test_homogeneity
from pp3cli.evidence.targets import ToyTarget
from pp3kernels import ChainInputs, ChainResult, ChainVerifier, point_mass_q

Progress = Callable[[str, int, int], None]
GREEDY_DENOMINATOR = 1 << 16
POSITION_STRIDE = 8


@dataclass(frozen=True)
class HomogeneityRecord:
    """One two-sample test: both samples' raw counts and the recomputable result."""

    name: str
    first: tuple[int, ...]
    second: tuple[int, ...]
    result: MemberResult

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {
            "name": self.name,
            "first": list(self.first),
            "second": list(self.second),
            "result": self.result.to_json(),
        }


@dataclass(frozen=True)
class PairingReport:
    """What the paired run found (``with_`` is the other verifier's name)."""

    with_: str
    t0: int
    t0_mismatches: int
    examples: tuple[dict[str, Any], ...]
    tests: tuple[HomogeneityRecord, ...]

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {
            "with": self.with_,
            "t0": self.t0,
            "t0_mismatches": self.t0_mismatches,
            "examples": list(self.examples),
            "tests": [test.to_json() for test in self.tests],
        }


def _same_t0(
    first: ChainResult, second: ChainResult, rows: slice
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    a_tokens, b_tokens = first.tokens[rows].cpu(), second.tokens[rows].cpu()
    a_acc, b_acc = first.accepted[rows].cpu(), second.accepted[rows].cpu()
    a_status, b_status = first.status[rows].cpu(), second.status[rows].cpu()
    bad = (
        (a_tokens.to(torch.int64) != b_tokens.to(torch.int64)).any(dim=1)
        | (a_acc.to(torch.int64) != b_acc.to(torch.int64))
        | (a_status.to(torch.int64) != b_status.to(torch.int64))
    )
    details = [
        {
            "row": int(row),
            "tokens": [a_tokens[row].tolist(), b_tokens[row].tolist()],
            "accepted": [int(a_acc[row]), int(b_acc[row])],
            "status": [int(a_status[row]), int(b_status[row])],
        }
        for row in bad.nonzero().flatten().tolist()
    ]
    return bad, details


def pair_t0(
    first: ChainVerifier,
    second: ChainVerifier,
    n_t0: int,
    *,
    device: torch.device,
    seed: int,
    batch: int,
    progress: Progress | None = None,
    max_examples: int = 10,
) -> tuple[int, tuple[dict[str, Any], ...]]:
    """(mismatches, examples) over ``n_t0`` T0 requests verified by both on the same inputs."""
    from pp3cli.evidence.qualify import _greedy_batch

    rng = np.random.default_rng([seed, 0x70616972])
    mismatches, done, number = 0, 0, 0
    examples: list[dict[str, Any]] = []
    while done < n_t0:
        pairs = min(max(1, batch), n_t0 - done)
        size = 2 * pairs
        logits_np, drafts_np, tau_np = _greedy_batch(rng, size, 4 if number % 2 == 0 else 5)
        drafts = torch.from_numpy(drafts_np)
        q_ids, q_counts = point_mass_q(drafts, GREEDY_DENOMINATOR)
        inputs = ChainInputs(
            torch.from_numpy(logits_np).to(device),
            drafts.to(device),
            torch.from_numpy(tau_np).to(device),
            torch.full((size,), seed, dtype=torch.int64, device=device),
            torch.arange(size, dtype=torch.int64, device=device) * POSITION_STRIDE + (number << 32),
            q_ids=q_ids.to(device),
            q_counts=q_counts.to(device),
            denominator=GREEDY_DENOMINATOR,
        )
        bad, details = _same_t0(
            inputs.verify_with(first), inputs.verify_with(second), slice(0, size, 2)
        )
        mismatches += int(bad.sum())
        for entry in details[: max(0, max_examples - len(examples))]:
            examples.append({"request": done + entry["row"], "batch": number, **entry})
        done += pairs
        number += 1
        if progress is not None:
            progress("paired T0", done, n_t0)
    return mismatches, tuple(examples)


def sampled_histograms(target: ToyTarget, result: ChainResult) -> dict[str, np.ndarray]:
    """{"accepted": counts over 0..K plus malformed, "final": counts over 0..V-1 plus other}.

    A row whose status is not OK or whose accepted / final token is out of range counts on
    the last ("malformed") outcome of both.
    """
    k, vocab = target.k, target.vocab
    acc = result.accepted.long()
    ok = (result.status.long() == 0) & (acc >= 0) & (acc <= k)
    final = result.tokens.long().gather(1, acc.clamp(0, k).unsqueeze(1)).squeeze(1)
    ok_final = ok & (final >= 0) & (final < vocab)
    acc_codes = torch.where(ok, acc, torch.full_like(acc, k + 1))
    final_codes = torch.where(ok_final, final, torch.full_like(final, vocab))
    return {
        "accepted": torch.bincount(acc_codes, minlength=k + 2).cpu().numpy().astype(np.int64),
        "final": torch.bincount(final_codes, minlength=vocab + 1).cpu().numpy().astype(np.int64),
    }


def homogeneity_tests(
    first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray]
) -> list[HomogeneityRecord]:
    """One ``g_test_homogeneity`` per histogram name present in both (sorted by name)."""
    records = []
    for name in sorted(set(first) & set(second)):
        a = tuple(int(c) for c in first[name])
        b = tuple(int(c) for c in second[name])
        records.append(HomogeneityRecord(name, a, b, g_test_homogeneity(name, a, b, MIN_EXPECTED)))
    return records


def pairing_members(tests: Sequence[HomogeneityRecord]) -> list[MemberResult]:
    """The tests as members of the Holm family."""
    return [test.result for test in tests]


def pair_sampled(
    first: ChainVerifier,
    second: ChainVerifier,
    targets: Sequence[ToyTarget],
    n: int,
    *,
    device: torch.device,
    seed: int,
    profile: Profile,
    progress: Progress | None = None,
) -> list[HomogeneityRecord]:
    """Both verifiers on the family's inputs: each target's requests (``n``, or its cap
    under ``profile``) in the family's calls, q in the target's form."""
    from pp3cli.evidence.qualify import target_calls

    records = []
    for target_index, target in enumerate(targets):
        totals: list[dict[str, np.ndarray]] = [{}, {}]
        for inputs in target_calls(
            target,
            target_index,
            n,
            device=device,
            seed=seed,
            profile=profile,
            task=f"paired {target.name}",
            progress=progress,
        ):
            for side, verifier in enumerate((first, second)):
                counts = sampled_histograms(target, inputs.verify_with(verifier))
                for key, values in counts.items():
                    name = f"pair/{target.name}/{key}"
                    totals[side][name] = (
                        totals[side][name] + values if name in totals[side] else values
                    )
        records.extend(homogeneity_tests(totals[0], totals[1]))
    return records
