"""The edge battery: named deterministic (or near-deterministic) checks of the contract.

Each check is a function ``check_x(verifier, device, seed) -> EdgeResult(name, passed,
detail)``; ``run_edge_battery`` runs them all. They need no statistics except
``sparse_full_target_tails``, whose binomial band has a false-failure probability below
1e-6 (stated in its detail).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.stats import binomtest

from pp3cli.evidence.greedy import greedy_from_logits
from pp3kernels import (
    STATUS_ALL_MASKED,
    STATUS_NAMES,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    ChainInputs,
    ChainResult,
    ChainVerifier,
    point_mass_q,
)

__all__ = ["CHECKS", "DENOMINATOR", "EdgeResult", "run_edge_battery"]

DENOMINATOR = 1 << 16


@dataclass(frozen=True)
class EdgeResult:
    """One named check: did it pass, and what was seen."""

    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """Receipt form."""
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


def _call(
    verifier: ChainVerifier,
    logits: torch.Tensor,
    drafts: torch.Tensor,
    tau: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    q: tuple[torch.Tensor, torch.Tensor, int] | None = None,
) -> ChainResult:
    """Verify with sparse q ``q`` = (ids, counts, C), by default a point mass on each draft."""
    ids, counts, den = q if q is not None else (*point_mass_q(drafts, DENOMINATOR), DENOMINATOR)
    inputs = ChainInputs(
        logits, drafts, tau, seed, position, q_ids=ids, q_counts=counts, denominator=den
    )
    return inputs.verify_with(verifier)


def _requests(b: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = torch.full((b,), seed, dtype=torch.int64, device=device)
    position = torch.arange(b, dtype=torch.int64, device=device) * 8 + (1 << 36)
    return seeds, position


def _dyadic_logits(weights: list[list[int]], device: torch.device) -> torch.Tensor:
    rows = [[math.log(w / sum(r)) if w > 0 else -math.inf for w in r] for r in weights]
    return torch.tensor(rows, dtype=torch.float32, device=device)


def _random_batch(
    rng: np.random.Generator, b: int, k: int, vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mixed T0 (even) / T1 (odd) requests with tie-rich logits and random drafts."""
    logits = rng.integers(-3, 4, size=(b, k + 1, vocab)).astype(np.float32)
    drafts = rng.integers(-1, vocab, size=(b, k)).astype(np.int32)
    tau = np.where(np.arange(b) % 2 == 0, 0.0, 1.0).astype(np.float32)
    return (
        torch.from_numpy(logits).to(device),
        torch.from_numpy(drafts).to(device),
        torch.from_numpy(tau).to(device),
    )


def _same(a: ChainResult, b: ChainResult) -> bool:
    return (
        torch.equal(a.tokens, b.tokens)
        and torch.equal(a.accepted, b.accepted)
        and torch.equal(a.status, b.status)
    )


def check_sparse_full_target_tails(
    verifier: ChainVerifier, device: torch.device, seed: int
) -> EdgeResult:
    """Invalidated drafts emit from p = (497, 1 x 15) / 512: every tail token must appear.

    n = 16384 draws, 32 expected per tail token (P(no hit) = e^-32); the tail total must
    lie inside the two-sided binomial band of level 1e-6 around 15/512.
    """
    n, vocab = 16384, 16
    weights = [[497] + [1] * 15, [1] * 16]
    logits = _dyadic_logits(weights, device).unsqueeze(0).expand(n, 2, vocab)
    drafts = torch.full((n, 1), -1, dtype=torch.int32, device=device)
    seeds, position = _requests(n, seed, device)
    tau = torch.ones(n, dtype=torch.float32, device=device)
    out = _call(verifier, logits, drafts, tau, seeds, position)
    if not bool((out.status == STATUS_OK).all()) or not bool((out.accepted == 0).all()):
        return EdgeResult("sparse_full_target_tails", False, "status not OK or accepted != 0")
    first = out.tokens[:, 0].long()
    outside = int(((first < 0) | (first >= vocab)).sum())  # counted apart, never as 0 or V-1
    hits = torch.bincount(first.clamp(0, vocab - 1), minlength=vocab).cpu().tolist()
    tail = sum(hits[1:])
    p_value = binomtest(tail, n, 15 / 512).pvalue
    missing = [v for v in range(1, vocab) if hits[v] == 0]
    passed = (
        outside == 0 and not missing and p_value > 1e-6 and bool((out.tokens[:, 1] == -1).all())
    )
    detail = (
        f"tail hits {hits[1:]} (expected 32 each), total {tail}/{n}, binomial p={p_value:.3g}, "
        f"emitted outside [0, {vocab}): {outside}"
    )
    return EdgeResult("sparse_full_target_tails", passed, detail)


def check_disjoint_support(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """Drafts from q on {4, 5} while p lives on {0..3}: never accepted, emit inside supp p."""
    n, k, vocab = 4096, 2, 8
    logits = _dyadic_logits([[4, 2, 1, 1, 0, 0, 0, 0]] * (k + 1), device)
    logits = logits.unsqueeze(0).expand(n, k + 1, vocab)
    drafts = (4 + torch.arange(n * k, device=device) % 2).reshape(n, k).to(torch.int32)
    ids = torch.tensor([4, 5], dtype=torch.int32, device=device).expand(n, k, 2)
    counts = torch.full((n, k, 2), DENOMINATOR // 2, dtype=torch.int32, device=device)
    seeds, position = _requests(n, seed, device)
    tau = torch.ones(n, dtype=torch.float32, device=device)
    out = _call(verifier, logits, drafts, tau, seeds, position, (ids, counts, DENOMINATOR))
    accepted_any = int((out.accepted != 0).sum())
    outside = int(((out.tokens[:, 0] < 0) | (out.tokens[:, 0] > 3)).sum())
    bad_status = int((out.status != STATUS_OK).sum())
    passed = accepted_any == 0 and outside == 0 and bad_status == 0
    detail = (
        f"accepted>0: {accepted_any}, emitted outside support: {outside}, status!=OK: {bad_status}"
    )
    return EdgeResult("disjoint_support", passed, detail)


def _uniform_exact(n: int, k: int, device: torch.device) -> torch.Tensor:
    """Rows uniform on {0..3} written as signed zeros: fp32 softmax is exactly 1/4."""
    row = [0.0, -0.0, 0.0, -0.0] + [-math.inf] * 4
    return torch.tensor([row] * (k + 1), dtype=torch.float32, device=device).expand(n, k + 1, 8)


def check_equal_q(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """q = p (uniform on 4 tokens, exact in fp32): every draft is accepted, bonus in supp p."""
    n, k = 4096, 3
    logits = _uniform_exact(n, k, device)
    drafts = (torch.arange(n * k, device=device) % 4).reshape(n, k).to(torch.int32)
    ids = torch.arange(4, dtype=torch.int32, device=device).expand(n, k, 4)
    counts = torch.full((n, k, 4), DENOMINATOR // 4, dtype=torch.int32, device=device)
    seeds, position = _requests(n, seed, device)
    tau = torch.full((n,), 0.5, dtype=torch.float32, device=device)
    out = _call(verifier, logits, drafts, tau, seeds, position, (ids, counts, DENOMINATOR))
    rejected = int((out.accepted != k).sum())
    wrong = int((out.tokens[:, :k] != drafts).any(dim=1).sum())
    bonus_bad = int(((out.tokens[:, k] < 0) | (out.tokens[:, k] > 3)).sum())
    passed = rejected == 0 and wrong == 0 and bonus_bad == 0
    detail = (
        f"rejections: {rejected}, tokens != drafts: {wrong}, bonus outside support: {bonus_bad}"
    )
    return EdgeResult("equal_q", passed, detail)


def check_invalidated_proposals(
    verifier: ChainVerifier, device: torch.device, seed: int
) -> EdgeResult:
    """q = p on row 0, draft row 1 = -1: accepted is exactly 1, token 1 from p_1, then -1."""
    n, k = 4096, 3
    logits = _uniform_exact(n, k, device)
    drafts = (torch.arange(n * k, device=device) % 4).reshape(n, k).to(torch.int32)
    drafts[:, 1] = -1
    ids = torch.arange(4, dtype=torch.int32, device=device).expand(n, k, 4)
    counts = torch.full((n, k, 4), DENOMINATOR // 4, dtype=torch.int32, device=device)
    seeds, position = _requests(n, seed, device)
    tau = torch.ones(n, dtype=torch.float32, device=device)
    out = _call(verifier, logits, drafts, tau, seeds, position, (ids, counts, DENOMINATOR))
    wrong_length = int((out.accepted != 1).sum())
    second = out.tokens[:, 1]
    outside = int(((second < 0) | (second > 3)).sum())
    padding = int((out.tokens[:, 2:] != -1).any(dim=1).sum())
    seen = sorted(set(second.cpu().tolist()))
    passed = wrong_length == 0 and outside == 0 and padding == 0 and seen == [0, 1, 2, 3]
    detail = (
        f"accepted != 1: {wrong_length}, token 1 outside supp p_1: {outside}, "
        f"bad padding: {padding}, token-1 values seen: {seen}"
    )
    return EdgeResult("invalidated_proposals", passed, detail)


def _t0_check(
    name: str,
    verifier: ChainVerifier,
    device: torch.device,
    seed: int,
    logits: np.ndarray,
    drafts: np.ndarray,
) -> EdgeResult:
    n = logits.shape[0]
    tokens, accepted = greedy_from_logits(torch.from_numpy(logits), torch.from_numpy(drafts))
    want_tokens, want_acc = tokens.numpy(), accepted.numpy()
    seeds, position = _requests(n, seed, device)
    out = _call(
        verifier,
        torch.from_numpy(logits).to(device),
        torch.from_numpy(drafts).to(device),
        torch.zeros(n, dtype=torch.float32, device=device),
        seeds,
        position,
    )
    got = out.tokens.cpu().numpy()
    bad = (got != want_tokens).any(axis=1) | (out.accepted.cpu().numpy() != want_acc)
    bad |= out.status.cpu().numpy() != STATUS_OK
    rows = np.flatnonzero(bad)
    detail = f"{len(rows)}/{n} requests differ from the greedy path"
    if len(rows):
        r = int(rows[0])
        detail += f"; first: request {r} expected {want_tokens[r].tolist()} got {got[r].tolist()}"
    return EdgeResult(name, len(rows) == 0, detail)


def check_id_ties(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """T0 rows whose maximum is tied between several ids: the lowest id must win."""
    rng = np.random.default_rng([seed, 1])
    n, k, vocab = 2048, 3, 16
    logits = rng.integers(0, 3, size=(n, k + 1, vocab)).astype(np.float32)
    logits[..., vocab - 1] = 2.0  # the highest id always ties for the maximum
    y = np.argmax(logits, axis=-1)
    drafts = np.where(rng.random((n, k)) < 0.5, y[:, :k], vocab - 1).astype(np.int32)
    return _t0_check("id_ties", verifier, device, seed, logits, drafts)


def check_signed_zero(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """T0 rows whose maximum is 0 held as -0.0 and +0.0: -0.0 == +0.0, lowest id wins."""
    rng = np.random.default_rng([seed, 2])
    n, k, vocab = 2048, 3, 16
    logits = np.full((n, k + 1, vocab), -1.0, dtype=np.float32)
    for row in range(k + 1):
        a = rng.integers(0, vocab, size=n)
        b = rng.integers(0, vocab, size=n)
        logits[np.arange(n), row, a] = -0.0
        logits[np.arange(n), row, b] = 0.0
    y = np.argmax(logits, axis=-1)
    drafts = np.where(rng.random((n, k)) < 0.6, y[:, :k], rng.integers(0, vocab, (n, k)))
    return _t0_check("signed_zero", verifier, device, seed, logits, drafts.astype(np.int32))


SPLIT_TIE_VOCAB = 32768  # a real vocabulary size: on a GPU the selector splits it in chunks
# Tied maxima straddling the GPU plan's chunk boundaries (chunks of 2048 tokens at this V):
# the combine step across splits must keep the lowest id.
SPLIT_TIE_PAIRS = ((2047, 2048), (4095, 30000), (16383, 16384), (0, 32767), (6000, 20000))


def check_cross_split_ties(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """T0 rows at V = 32768 whose maximum is tied across vocabulary splits (ids such as 2047
    and 2048 on either side of a chunk boundary, some held as -0.0 and +0.0): the lowest id
    must win, as in one piece. On a GPU this V takes the split-vocabulary launch; in the
    interpreter, one split."""
    rng = np.random.default_rng([seed, 4])
    n, k, vocab = 32, 1, SPLIT_TIE_VOCAB
    logits = rng.integers(-6, -1, size=(n, k + 1, vocab)).astype(np.float32)
    pairs = np.array(SPLIT_TIE_PAIRS)
    for row in range(k + 1):
        low, high = pairs[rng.integers(0, len(pairs), size=n)].T
        zero = rng.random(n) < 0.5  # the tie held at 0 as -0.0 (low id) and +0.0 (high id)
        logits[np.arange(n), row, low] = np.where(zero, -0.0, 2.0)
        logits[np.arange(n), row, high] = np.where(zero, 0.0, 2.0)
    y = np.argmax(logits, axis=-1)
    high_of = dict(SPLIT_TIE_PAIRS)  # a draft on the tie's higher id must be rejected
    partner = np.vectorize(lambda token: high_of.get(int(token), int(token)))(y[:, :k])
    drafts = np.where(rng.random((n, k)) < 0.5, y[:, :k], partner).astype(np.int32)
    return _t0_check("cross_split_ties", verifier, device, seed, logits, drafts)


def check_tau_zero(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """tau = 0 is greedy, draws nothing: the greedy path, the same under another seed."""
    rng = np.random.default_rng([seed, 3])
    n, k, vocab = 2048, 4, 16
    logits = rng.normal(size=(n, k + 1, vocab)).astype(np.float32)
    y = np.argmax(logits, axis=-1)
    drafts = np.where(rng.random((n, k)) < 0.8, y[:, :k], -1).astype(np.int32)
    first = _t0_check("tau_zero", verifier, device, seed, logits, drafts)
    second = _t0_check("tau_zero", verifier, device, seed + 12345, logits, drafts)
    passed = first.passed and second.passed
    return EdgeResult(
        "tau_zero", passed, f"seed {seed}: {first.detail}; other seed: {second.detail}"
    )


def check_request_permutation(
    verifier: ChainVerifier, device: torch.device, seed: int
) -> EdgeResult:
    """Permuting requests permutes outputs bit for bit; a request alone gives the same tokens."""
    rng = np.random.default_rng([seed, 4])
    n, k, vocab = 1024, 4, 16
    logits, drafts, tau = _random_batch(rng, n, k, vocab, device)
    seeds = torch.from_numpy(rng.integers(0, 2**62, size=n)).to(device)
    position = torch.from_numpy(rng.integers(0, 2**40, size=n)).to(device)
    ids, counts = point_mass_q(drafts, DENOMINATOR)
    inputs = ChainInputs(
        logits, drafts, tau, seeds, position, q_ids=ids, q_counts=counts, denominator=DENOMINATOR
    )
    base = inputs.verify_with(verifier)
    perm = torch.from_numpy(rng.permutation(n)).to(device)
    moved = inputs.select(perm).verify_with(verifier)
    permuted = ChainResult(*(output[perm] for output in base))
    same_perm = _same(permuted, moved)
    alone = inputs.select(slice(5, 12)).verify_with(verifier)
    same_alone = _same(alone, ChainResult(*(output[5:12] for output in base)))
    differ = int((permuted.tokens != moved.tokens).any(dim=1).sum())
    detail = (
        f"permuted batch: {differ}/{n} requests differ; 7-request sub-batch identical: {same_alone}"
    )
    return EdgeResult("request_permutation", same_perm and same_alone, detail)


def _poison_check(
    name: str,
    status: int,
    poison: Callable[[torch.Tensor], None],
    verifier: ChainVerifier,
    device: torch.device,
    seed: int,
) -> EdgeResult:
    rng = np.random.default_rng([seed, 5])
    n, k, vocab = 256, 4, 16
    logits, drafts, tau = _random_batch(rng, n, k, vocab, device)
    seeds, position = _requests(n, seed, device)
    clean = _call(verifier, logits, drafts, tau, seeds, position)
    dirty_logits = logits.clone()
    poison(dirty_logits)
    dirty = _call(verifier, dirty_logits, drafts, tau, seeds, position)
    targets = torch.tensor([3, 4, 100, 101], device=device)
    others = torch.ones(n, dtype=torch.bool, device=device)
    others[targets] = False
    got_status = dirty.status[targets].cpu().tolist()
    ok_rows = (
        all(s == status for s in got_status)
        and bool((dirty.tokens[targets] == -1).all())
        and bool((dirty.accepted[targets] == 0).all())
    )
    unaffected = (
        torch.equal(dirty.tokens[others], clean.tokens[others])
        and torch.equal(dirty.accepted[others], clean.accepted[others])
        and torch.equal(dirty.status[others], clean.status[others])
    )
    detail = (
        f"poisoned requests report {[STATUS_NAMES.get(s, s) for s in got_status]} "
        f"(expected {STATUS_NAMES[status]}), tokens -1 and accepted 0: {ok_rows}; "
        f"other requests unchanged: {unaffected}"
    )
    return EdgeResult(name, ok_rows and unaffected, detail)


def _set_nan(x: torch.Tensor) -> None:
    x[3, 0, 2] = math.nan  # T0 request, first row
    x[4, 4, 7] = math.nan  # T1 request, bonus row
    x[100, 2, 0] = math.nan
    x[101, 1, 15] = math.nan
    x[101, 1, 3] = math.inf  # NaN is reported before +inf


def _set_posinf(x: torch.Tensor) -> None:
    x[3, 1, 5] = math.inf
    x[4, 0, 0] = math.inf
    x[100, 4, 15] = math.inf
    x[101, 3, 8] = math.inf


def _set_all_masked(x: torch.Tensor) -> None:
    x[3, 0, :] = -math.inf
    x[4, 4, :] = -math.inf
    x[100, 2, :] = -math.inf
    x[101, 1, :] = -math.inf


def check_nan_logits(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """A NaN in any row a request owns: status NAN, nothing emitted, neighbours unchanged."""
    return _poison_check("nan_logits", STATUS_NAN, _set_nan, verifier, device, seed)


def check_posinf_logits(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """A +inf in any row: status POSINF, nothing emitted, neighbours unchanged."""
    return _poison_check("posinf_logits", STATUS_POSINF, _set_posinf, verifier, device, seed)


def check_all_masked_logits(verifier: ChainVerifier, device: torch.device, seed: int) -> EdgeResult:
    """A row of only -inf: status ALL_MASKED, nothing emitted, neighbours unchanged."""
    return _poison_check(
        "all_masked_logits", STATUS_ALL_MASKED, _set_all_masked, verifier, device, seed
    )


CHECKS: tuple[Callable[[ChainVerifier, torch.device, int], EdgeResult], ...] = (
    check_sparse_full_target_tails,
    check_disjoint_support,
    check_equal_q,
    check_invalidated_proposals,
    check_id_ties,
    check_signed_zero,
    check_cross_split_ties,
    check_request_permutation,
    check_nan_logits,
    check_posinf_logits,
    check_all_masked_logits,
    check_tau_zero,
)


def run_edge_battery(
    verifier: ChainVerifier, *, device: torch.device | str, seed: int
) -> list[EdgeResult]:
    """Run every check; an exception inside a check is a failed check naming the error."""
    dev = torch.device(device)
    results = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            results.append(check(verifier, dev, seed))
        except (ValueError, RuntimeError, IndexError, AssertionError) as err:
            results.append(EdgeResult(name, False, f"raised {type(err).__name__}: {err}"))
    return results
