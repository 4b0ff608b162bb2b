"""`pp3 oracle`: the verifier's samples against the exact rational law of its own inputs.

For each of four synthetic draft policies on a fixed rational target (V = 8, K = 3):

1. the float draft probabilities are quantised to integer counts over C = 2^16 with
   ``pp3kernels.quantise_q`` on the run's device; those exact counts are what the exact
   law is computed for (``pp3cli.evidence.exact.chain_law``), and the law is checked, with
   ``Fraction``s and no tolerance, to satisfy the lossless identity;
2. N requests are drawn: drafts by ``pp3kernels.sample_drafts`` from the same counts,
   then one verifier call (``verify_chain`` or ``reference_verify_chain``) at tau = 1;
3. the observed joint (accepted length, emitted tokens) is tested against the exact
   law with the G-test (pre-registered pooling; any impossible outcome, malformed row or
   accepted token that differs from its draft fails outright), and the four members form
   one Holm family at alpha.

Targets are multiples of 1/64; the GPU gets fp32 ln p (-inf where p = 0). Its softmax
equals the rational p up to fp32 rounding (~1e-7), far below the test's resolution;
see docs/method.md ("Exact oracle"). Where a quantised q(x) equalled p(x) exactly, fp32
rounding could make an exactly-impossible rejection reachable, so such a policy is
refused before sampling (it does not happen for these targets).

The receipt stores the targets, the integer counts, the exact law (``"num/den"``) and its
SHA-256, and the raw outcome counts; ``recompute_oracle`` (what ``verify-receipts`` runs
for kind ``oracle``) rebuilds the law from the stored inputs and re-runs every test from the
counts, trusting no stored statistic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from pp3cli.evidence.exact import (
    DraftRow,
    Law,
    chain_law,
    fraction_from_text,
    fraction_text,
    identity_violations,
    law_sha256,
    law_to_json,
    outcome_key,
)
from pp3cli.evidence.profiles import ALPHA, MIN_EXPECTED
from pp3cli.evidence.stats import MemberResult, g_test, holm, noncentrality_for_power, power_of
from pp3cli.evidence.verdict import verdict_text

if TYPE_CHECKING:
    import torch

    from pp3kernels import ChainVerifier

__all__ = [
    "DENOMINATOR",
    "MALFORMED",
    "POLICIES",
    "TARGET_WEIGHTS",
    "Policy",
    "judge",
    "recompute_oracle",
    "run_oracle",
    "targets",
]

DENOMINATOR = 1 << 16
TARGET_BITS = 6  # p_i(v) = TARGET_WEIGHTS[i][v] / 64
# K + 1 = 4 rows over V = 8; zeros give impossible outcomes and off-support draft mass.
TARGET_WEIGHTS: tuple[tuple[int, ...], ...] = (
    (20, 12, 9, 8, 6, 5, 4, 0),
    (0, 3, 25, 16, 10, 6, 4, 0),
    (7, 7, 14, 0, 28, 2, 6, 0),
    (16, 13, 9, 8, 7, 5, 4, 2),
)
MALFORMED = "malformed"  # pseudo-outcome: bad status, bad range/padding, prefix != drafts
CHUNK_GPU = 1 << 17
CHUNK_CPU = 1 << 13


def targets() -> list[list[Fraction]]:
    """The exact target rows p_0..p_K."""
    total = 1 << TARGET_BITS
    return [[Fraction(w, total) for w in row] for row in TARGET_WEIGHTS]


@dataclass(frozen=True)
class Policy:
    """A synthetic draft policy: float q rows [K][V] before quantisation, and a -1 mask."""

    name: str
    description: str
    rows: tuple[tuple[float, ...], ...]
    invalidated: tuple[bool, ...]


def _normalise(weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(w / total for w in weights)


def _build_policies() -> tuple[Policy, ...]:
    rows = [[w / 64 for w in row] for row in TARGET_WEIGHTS[:-1]]
    k = len(rows)
    point_tokens = (1, 2, 5)  # a mid token, the argmax, a small-probability token
    point = tuple(
        tuple(1.0 if v == t else 0.0 for v in range(len(r)))
        for t, r in zip(point_tokens, rows, strict=True)
    )
    sharpened = tuple(_normalise([p * p for p in row]) for row in rows)
    flattened = []
    for row in rows:
        top = sorted(range(len(row)), key=lambda v: (-row[v], v))[:4]
        flattened.append(
            _normalise([math.sqrt(row[v]) if v in top else 0.0 for v in range(len(row))])
        )
    off_support = []
    for row in rows:
        holes = [v for v, p in enumerate(row) if p == 0]
        off_support.append(
            tuple(0.5 * p + (0.5 / len(holes) if v in holes else 0.0) for v, p in enumerate(row))
        )
    none = (False,) * k
    return (
        Policy("point-mass", "one-hot draft on tokens 1, 2, 5 (mid, argmax, tail)", point, none),
        Policy("sharpened", "q proportional to p^2", sharpened, none),
        Policy(
            "flattened-truncated",
            "q proportional to sqrt(p) on the top 4 tokens; row 2's proposal invalidated (-1)",
            tuple(flattened),
            (False, False, True),
        ),
        Policy(
            "off-support",
            "q = p/2 plus 1/2 spread over tokens where p = 0",
            tuple(off_support),
            none,
        ),
    )


POLICIES: tuple[Policy, ...] = _build_policies()


def _draft_rows(
    ids: Sequence[Sequence[int]], counts: Sequence[Sequence[int]], denominator: int
) -> list[DraftRow]:
    return [
        DraftRow(tuple(int(t) for t in row_ids), tuple(int(c) for c in row_counts), denominator)
        for row_ids, row_counts in zip(ids, counts, strict=True)
    ]


def _near_ties(target_rows: Sequence[Sequence[Fraction]], drafts: Sequence[DraftRow]) -> list[str]:
    """Draft tokens with q(x) = p(x) exactly: fp32 rounding could then reject them."""
    problems = []
    for i, row in enumerate(drafts):
        for token, count in zip(row.ids, row.counts, strict=True):
            if count > 0 and Fraction(count, row.denominator) == target_rows[i][token]:
                problems.append(f"row {i} token {token}: q = p = {target_rows[i][token]}")
    return problems


def judge(
    target_rows: Sequence[Sequence[Fraction]],
    members: Sequence[Mapping[str, Any]],
    alpha: float,
) -> tuple[list[MemberResult], list[list[str]], dict[str, Any], str]:
    """Recompute every member from its inputs and counts.

    Each member mapping holds ``name``, ``q_ids``, ``q_counts``, ``denominator``,
    ``invalidated``, ``counts`` ({outcome key: count}), ``malformed`` (count) and ``n``.
    The exact law is rebuilt from the target and the integer counts. Returns (G-test
    results, lossless-identity violations per member, Holm family JSON, verdict); the
    verdict is PASS iff every law satisfies the identity, every member's counts add up to
    its n and the Holm family at ``alpha`` rejects nothing.
    """
    results: list[MemberResult] = []
    violations: list[list[str]] = []
    sound = True
    for member in members:
        drafts = _draft_rows(member["q_ids"], member["q_counts"], int(member["denominator"]))
        law = chain_law(target_rows, drafts, [bool(f) for f in member["invalidated"]])
        violations.append(identity_violations(law, target_rows))
        result = _member_test(str(member["name"]), law, member["counts"], int(member["malformed"]))
        sound = sound and not violations[-1] and result.n == int(member["n"])
        results.append(result)
    family = holm(results, alpha)
    verdict = verdict_text(sound and family.passed)
    return results, violations, family.to_json(), verdict


def _member_test(name: str, law: Law, counts: Mapping[str, int], malformed: int) -> MemberResult:
    law_text = {outcome_key(key): prob for key, prob in law.items()}
    keys = sorted(set(law_text) | set(counts))
    observed = [int(counts.get(key, 0)) for key in keys] + [malformed]
    probs = [law_text.get(key, Fraction(0)) for key in keys] + [Fraction(0)]
    return g_test(name, observed, probs, MIN_EXPECTED)


def _sample_counts(
    policy_index: int,
    logits: torch.Tensor,
    q_ids: torch.Tensor,
    q_counts: torch.Tensor,
    invalidated: Sequence[bool],
    n: int,
    seed: int,
    verifier: ChainVerifier,
    chunk: int,
) -> tuple[dict[str, int], int, dict[str, int]]:
    """Run n requests in chunks; return ({outcome key: count}, malformed, status counts)."""
    import torch

    from pp3kernels import ChainInputs, sample_drafts

    device = logits.device
    rows, vocab = logits.shape
    k = rows - 1
    # outcome code for (a, t_0..t_a): offset[a] + sum_j t_j V^j
    offsets = [0]
    for a in range(k + 1):
        offsets.append(offsets[-1] + vocab ** (a + 1))
    space = offsets[-1]
    powers = torch.tensor([vocab**j for j in range(rows)], dtype=torch.int64, device=device)
    offset_t = torch.tensor(offsets[:-1], dtype=torch.int64, device=device)
    mask = torch.tensor(list(invalidated), dtype=torch.bool, device=device)
    slot = torch.arange(rows, device=device)
    histogram = torch.zeros(space + 1, dtype=torch.int64, device=device)
    status_hist = torch.zeros(256, dtype=torch.int64, device=device)
    # distinct Philox key per policy, distinct counters per request (stride K+1 positions)
    policy_seed = (seed * 8 + policy_index) % (1 << 63)
    for start in range(0, n, chunk):
        batch = min(chunk, n - start)
        seeds = torch.full((batch,), policy_seed, dtype=torch.int64, device=device)
        positions = (torch.arange(start, start + batch, dtype=torch.int64, device=device)) * rows
        ids_b = q_ids.unsqueeze(0).expand(batch, -1, -1)
        counts_b = q_counts.unsqueeze(0).expand(batch, -1, -1)
        drafts = sample_drafts(ids_b, counts_b, DENOMINATOR, seeds, positions)
        drafts = torch.where(mask.unsqueeze(0), torch.full_like(drafts, -1), drafts)
        inputs = ChainInputs(
            logits.unsqueeze(0).expand(batch, -1, -1),
            drafts.to(torch.int32).contiguous(),
            torch.ones(batch, dtype=torch.float32, device=device),
            seeds,
            positions,
            q_ids=ids_b,
            q_counts=counts_b,
            denominator=DENOMINATOR,
        )
        result = inputs.verify_with(verifier)
        tokens = result.tokens.to(torch.int64)
        accepted = result.accepted.to(torch.int64)
        status = result.status.to(torch.int64)
        status_hist += torch.bincount(status & 0xFF, minlength=256)
        inside = (accepted >= 0) & (accepted <= k)
        acc = accepted.clamp(0, k).unsqueeze(1)
        emitted = slot.unsqueeze(0) <= acc
        ok = (status == 0) & inside
        ok &= torch.where(emitted, (tokens >= 0) & (tokens < vocab), tokens == -1).all(dim=1)
        before = slot[:k].unsqueeze(0) < acc
        ok &= torch.where(before, tokens[:, :k] == drafts.to(torch.int64), True).all(dim=1)
        code = offset_t[acc.squeeze(1)] + (torch.where(emitted, tokens, 0) * powers).sum(dim=1)
        code = torch.where(ok, code, torch.full_like(code, space))
        histogram += torch.bincount(code, minlength=space + 1)
    flat = histogram.cpu().tolist()
    counts: dict[str, int] = {}
    for a in range(k + 1):
        for tokens_tuple in itertools.product(range(vocab), repeat=a + 1):
            code = offsets[a] + sum(t * vocab**j for j, t in enumerate(tokens_tuple))
            if flat[code]:
                counts[outcome_key((a, *tokens_tuple))] = int(flat[code])
    statuses = {str(s): int(c) for s, c in enumerate(status_hist.cpu().tolist()) if c}
    return counts, int(flat[space]), statuses


def run_oracle(
    device: str,
    n: int,
    seed: int,
    verifier: ChainVerifier,
    *,
    label: str,
    alpha: float = ALPHA,
    chunk: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the oracle: exact laws, N requests per policy, G-tests, Holm; return receipt data.

    Returns {"parameters", "data", "verdict"}; ``data["policies"]`` holds, per policy, the
    integer counts, the exact law and its SHA-256, the identity check, the raw outcome
    counts and the member's statistics; ``data["family"]`` the Holm verdict.
    """
    import torch

    from pp3kernels import quantise_q

    if n < 1:
        raise ValueError(f"n = {n}: expected at least one request per policy")
    dev = torch.device(device)
    if chunk is None:
        chunk = CHUNK_GPU if dev.type == "cuda" else CHUNK_CPU
    target_rows = targets()
    logits = torch.tensor(
        [[math.log(float(p)) if p > 0 else -math.inf for p in row] for row in target_rows],
        dtype=torch.float32,
        device=dev,
    )
    members: list[dict[str, Any]] = []
    problems: list[str] = []
    for index, policy in enumerate(POLICIES):
        probs = torch.tensor(policy.rows, dtype=torch.float32, device=dev)
        q_ids, q_counts = quantise_q(probs, DENOMINATOR)
        q_ids, q_counts = q_ids.to(torch.int32), q_counts.to(torch.int32)
        ids_list = q_ids.cpu().tolist()
        counts_list = q_counts.cpu().tolist()
        drafts = _draft_rows(ids_list, counts_list, DENOMINATOR)
        law = chain_law(target_rows, drafts, policy.invalidated)
        ties = _near_ties(target_rows, drafts)
        if ties:
            problems.extend(f"{policy.name}: {tie}" for tie in ties)
            continue
        if progress is not None:
            progress(f"oracle: {policy.name}: exact law of {len(law)} outcomes, {n} requests")
        counts, malformed, statuses = _sample_counts(
            index, logits, q_ids, q_counts, policy.invalidated, n, seed, verifier, chunk
        )
        member = {
            "name": policy.name,
            "description": policy.description,
            "q_ids": ids_list,
            "q_counts": counts_list,
            "denominator": DENOMINATOR,
            "invalidated": list(policy.invalidated),
            "law": law_to_json(law),
            "law_sha256": law_sha256(law),
            "n": n,
            "counts": counts,
            "malformed": malformed,
            "status_counts": statuses,
        }
        members.append(member)
    if problems:
        raise ValueError(
            "draft quantisation put q(x) = p(x) exactly, where fp32 rounding could reach an "
            "exactly impossible rejection: " + "; ".join(problems)
        )
    results, violations, family, verdict = judge(target_rows, members, alpha)
    for member, result, wrong in zip(members, results, violations, strict=True):
        member["identity"] = not wrong
        member["identity_violations"] = wrong[:10]
        member["member"] = result.to_json()
        member["power"] = _power_statement(result, n, alpha / len(members))
    parameters = {
        "n_per_policy": n,
        "seed": seed,
        "alpha": alpha,
        "verifier": label,
        "device": str(dev),
        "temperature": 1.0,
        "k": len(target_rows) - 1,
        "vocab": len(target_rows[0]),
        "denominator": DENOMINATOR,
        "min_expected": MIN_EXPECTED,
        "targets": [[fraction_text(p) for p in row] for row in target_rows],
        "policies": [policy.name for policy in POLICIES],
    }
    return {
        "parameters": parameters,
        "data": {"policies": members, "family": family},
        "verdict": verdict,
    }


def _power_statement(result: MemberResult, n: int, member_alpha: float) -> dict[str, float]:
    """Power of the member at Holm's strictest level alpha/m (a lower bound on its power)."""
    if result.df < 1:
        return {"member_alpha": member_alpha, "power_at_tv_0.01": 0.0, "tv_at_power_0.99": 1.0}
    lam = noncentrality_for_power(result.df, member_alpha, 0.99)
    return {
        "member_alpha": member_alpha,
        "power_at_tv_0.01": power_of(n, 1e-2, result.df, member_alpha),
        "tv_at_power_0.99": math.sqrt(lam / (4.0 * n)),
    }


def recompute_oracle(predicate: Mapping[str, Any]) -> str:
    """Verdict implied by an oracle receipt's raw data.

    Rebuilds each exact law from the stored target and integer counts, requires it to
    match the stored law and its SHA-256, re-runs the G-tests from the raw outcome counts
    and Holm at the stored alpha. Stored statistics are ignored.
    """
    parameters = predicate["parameters"]
    data = predicate["data"]
    target_rows = [[fraction_from_text(p) for p in row] for row in parameters["targets"]]
    members = list(data["policies"])
    if not members or len(members) != len(parameters["policies"]):
        return "FAIL"
    for member in members:
        drafts = _draft_rows(member["q_ids"], member["q_counts"], int(member["denominator"]))
        law = chain_law(target_rows, drafts, [bool(f) for f in member["invalidated"]])
        if law_sha256(law) != member["law_sha256"] or law_to_json(law) != dict(member["law"]):
            return "FAIL"
        if int(member["n"]) != int(parameters["n_per_policy"]):
            return "FAIL"
    _, _, _, verdict = judge(target_rows, members, float(parameters["alpha"]))
    return verdict
