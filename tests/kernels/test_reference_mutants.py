"""The torch reference verifier against the contract's law, request by request: the checks
a mutation campaign over ``kernels/pp3kernels/reference.py`` found unpinned (AST operator,
comparison and constant mutants against tests/kernels/test_reference.py, whose law tests
are statistical and let a slip of one row, one token or one rounding through).

``_law`` below is a scalar re-statement of the law in ``pp3kernels.contract`` (and
DESIGN.md): plain Python floats (fp64) and numpy fp32 scalars, one request and one row at a
time, no code shared with the vectorised reference but the Philox uniforms (the law's
inputs) and fp32 ``exp`` (the law says "exp ... (fp32)"; it is evaluated on the same
[B, V] row tensor so that a 1-ulp vectorised-exp difference cannot enter)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from test_reference import _as_dense, _battery

from pp3kernels.contract import (
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
)
from pp3kernels.philox import acceptance_uniform, sample_uniform
from pp3kernels.reference import reference_verify_chain

Law = tuple[list[list[int]], list[int], list[int]]


def _f32(x: float) -> float:
    return float(np.float32(x))


def _q_rows(args: dict[str, Any], b: int, i: int, vocab: int) -> tuple[list[float], list[float]]:
    """(q_v as fp64, the integer count n_v, or q_v again for dense q) of request b, row i."""
    if "q_dense" in args:
        q = [float(v) for v in args["q_dense"][b, i].tolist()]
        return q, q
    counts = [0] * vocab
    for token, count in zip(
        args["q_ids"][b, i].tolist(), args["q_counts"][b, i].tolist(), strict=True
    ):
        if count > 0 and 0 <= token < vocab:
            counts[token] += count
    return [n / args["denominator"] for n in counts], [float(n) for n in counts]


def _inverse_cdf(weights: list[float], u: float) -> int:
    """Smallest v with the fp64 running sum of weights > u * total."""
    running: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        running.append(total)
    target = u * total
    return next((v for v, r in enumerate(running) if r > target), len(weights) - 1)


def _law(args: dict[str, Any]) -> Law:
    """tokens, accepted, status of every request by the contract's law (validated inputs)."""
    logits = args["logits"].to(torch.float32)
    batch, rows, vocab = logits.shape
    drafts = rows - 1
    temperature = args["temperature"].tolist()
    seed, position = args["seed"], args["position"]
    tau = torch.where(args["temperature"] == 0, 1.0, args["temperature"]).to(torch.float32)
    e_rows = [
        torch.exp((logits[:, i] - logits[:, i].amax(-1, keepdim=True)) / tau[:, None])
        for i in range(rows)
    ]
    coins = [acceptance_uniform(seed, position + i).tolist() for i in range(rows)]
    uniforms = [sample_uniform(seed, position + i).tolist() for i in range(rows)]
    out_tokens, out_accepted, out_status = [], [], []
    for b in range(batch):
        values = logits[b].tolist()
        status = STATUS_OK
        if any(math.isnan(v) for row in values for v in row):
            status = STATUS_NAN
        elif any(v == math.inf for row in values for v in row):
            status = STATUS_POSINF
        elif any(all(v == -math.inf for v in row) for row in values):
            status = STATUS_ALL_MASKED
        if status != STATUS_OK:
            out_tokens.append([-1] * rows)
            out_accepted.append(0)
            out_status.append(status)
            continue
        tokens = [-1] * rows
        accepted = 0
        for i in range(rows):
            row = values[i]
            top = max(row)
            argmax = min(v for v in range(vocab) if row[v] == top)
            e = [float(x) for x in e_rows[i][b].tolist()]
            s = _f32(math.fsum(e))
            u = uniforms[i][b]
            if i == drafts:  # bonus row after K accepts
                tokens[i] = argmax if temperature[b] == 0 else _inverse_cdf(e, u)
                break
            x = int(args["draft_tokens"][b, i])
            if temperature[b] == 0:
                if x == argmax:
                    tokens[i], accepted = x, accepted + 1
                    continue
                tokens[i] = argmax
                break
            if x >= 0:
                q, n = _q_rows(args, b, i, vocab)
                p_x = float(np.float32(e[x]) / np.float32(s))
                scale = float(args["denominator"]) if "q_ids" in args else 1.0
                if coins[i][b] * n[x] < p_x * scale:
                    tokens[i], accepted = x, accepted + 1
                    continue
                residual = [max(e[v] - q[v] * s, 0.0) for v in range(vocab)]
                weights = residual if any(r > 0 for r in residual) else e
            else:
                weights = e
            tokens[i] = _inverse_cdf(weights, u)
            break
        out_tokens.append(tokens)
        out_accepted.append(accepted)
        out_status.append(status)
    return out_tokens, out_accepted, out_status


def _check(args: dict[str, Any]) -> None:
    result = reference_verify_chain(**args)
    tokens, accepted, status = _law(args)
    for b in range(len(tokens)):
        got = (result.tokens[b].tolist(), int(result.accepted[b]), int(result.status[b]))
        assert got == (tokens[b], accepted[b], status[b]), f"request {b}"


def _with_dead_requests(args: dict[str, Any]) -> dict[str, Any]:
    logits = args["logits"].clone()
    logits[1, 2, 3] = float("nan")
    logits[2, 0, 0] = float("inf")
    logits[3, 1, :] = float("-inf")
    logits[4, 0, 1] = float("inf")
    logits[4, 3, 0] = float("nan")
    logits[5, 3, :] = float("-inf")
    logits[5, 0, 2] = float("inf")
    return {**args, "logits": logits}


def test_sparse_q_battery_follows_the_law_request_by_request() -> None:
    """Mixed T0/T1 requests with ties, masks, sparse q, x = -1 and dead requests: every
    token, accept count and status is the law's (pins the accept test U * n < p_x * C, the
    residual max(e - q s, 0) over the fp64 running sum, the row each draw uses and the
    status order NAN, POSINF, ALL_MASKED)."""
    _check(_with_dead_requests(_battery(batch=160, seed=21)))


def test_dense_q_battery_follows_the_law_request_by_request() -> None:
    """The same with q given dense (accept iff U * q_x < p_x; residual e - q s)."""
    _check(_as_dense(_with_dead_requests(_battery(batch=160, seed=22))))


def _four_token(draft: int, sparse: bool, batch: int = 4000) -> dict[str, Any]:
    """Row 0: e = (1, 1, 1, 1), s = 4, p = 1/4 exactly; q_0 = (1/2, 1/8, 3/8, 0) (dense,
    or counts (4, 1, 3) over C = 8). Bonus row 1: only tokens 1 and 2 live, p = (0, 1/2,
    1/2, 0)."""
    neg = float("-inf")
    generator = torch.Generator().manual_seed(23)
    args: dict[str, Any] = {
        "logits": torch.tensor([[0.0, 0.0, 0.0, 0.0], [neg, 0.0, 0.0, neg]]).expand(batch, 2, 4),
        "draft_tokens": torch.full((batch, 1), draft, dtype=torch.int32),
        "temperature": torch.full((batch,), 0.7),
        "seed": torch.randint(-(2**62), 2**62, (batch,), generator=generator),
        "position": torch.randint(0, 2**40, (batch,), generator=generator),
    }
    if sparse:
        args["q_ids"] = torch.tensor([[[0, 1, 2]]], dtype=torch.int32).expand(batch, 1, 3)
        args["q_counts"] = torch.tensor([[[4, 1, 3]]], dtype=torch.int32).expand(batch, 1, 3)
        args["denominator"] = 8
    else:
        args["q_dense"] = torch.tensor([[[0.5, 0.125, 0.375, 0.0]]]).expand(batch, 1, 4)
    return args


@pytest.mark.parametrize("sparse", [True, False])
def test_exact_acceptance_residual_and_bonus_by_hand(sparse: bool) -> None:
    """p_0 = 1/4, q_0 = 1/2: accept iff U < 1/2 (U * 4 < 1/4 * 8, or U * 1/2 < 1/4).
    After an accept the bonus row 1 (rowpos + 1) gives token 1 iff its u < 1/2, else 2.
    After a rejection the residual max(e - q s, 0) = (1 - 2, 1 - 1/2, 1 - 3/2, 1)+ =
    (0, 1/2, 0, 1): token 1 iff 1/2 > 3/2 u (row 0's u), else token 3 (outside q's
    support: r = e there), never 0 or 2."""
    args = _four_token(0, sparse)
    result = reference_verify_chain(**args)
    coin = acceptance_uniform(args["seed"], args["position"]).tolist()
    u0 = sample_uniform(args["seed"], args["position"]).tolist()
    u1 = sample_uniform(args["seed"], args["position"] + 1).tolist()
    expected = []
    for b in range(len(coin)):
        if coin[b] < 0.5:
            expected.append(([0, 1 if u1[b] < 0.5 else 2], 1))
        else:
            expected.append(([1 if 0.5 > 1.5 * u0[b] else 3, -1], 0))
    got = list(zip(result.tokens.tolist(), result.accepted.tolist(), strict=True))
    assert got == expected
    accepted = sum(n for _, n in expected)
    assert 1800 < accepted < 2200  # P(accept) = 1/2: both branches are exercised


def test_invalidated_proposal_samples_p_with_row_zero_uniform() -> None:
    """x = -1: nothing is accepted and row 0 emits from p itself (r = e = (1, 1, 1, 1),
    running sums 1, 2, 3, 4): token v iff v < 4u <= v + 1, with u = sample_uniform(seed,
    position)."""
    args = _four_token(-1, sparse=True, batch=2000)
    result = reference_verify_chain(**args)
    u0 = sample_uniform(args["seed"], args["position"]).tolist()
    expected = [[next(v for v in range(4) if v + 1 > 4 * u), -1] for u in u0]
    assert result.tokens.tolist() == expected
    assert result.accepted.tolist() == [0] * 2000
    assert {t[0] for t in expected} == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("q", "draft", "token"),
    [((0.25, 0.5, 0.25, 0.0), 1, 3), ((0.0, 0.5, 0.5, 0.0), 1, 0), ((0.5, 0.25, 0.0, 0.25), 0, 3)],
)
def test_unclipped_residual_defect_with_a_zero_signed_total(
    q: tuple[float, ...], draft: int, token: int
) -> None:
    """``unclipped_residual``: e = (1, 1, 1, 1), s = 4, a draft with q_x = 1/2 (rejected
    iff U >= 1/2): the signed weights e - q s sum to exactly 0, so the target is u * 0 = 0
    whatever u, and the pick is the first running sum (along the vocabulary) above 0.
    (0, -1, 0, 1): sums (0, -1, -1, 0) never exceed 0 strictly (equal does not count), so
    the fallback V - 1 = 3; (1, -1, -1, 1): 1 > 0 at token 0; (-1, 0, 1, 0): sums
    (-1, -1, 0, 0), the fallback 3 although weight 2 alone is positive."""
    args = _four_token(draft, sparse=False, batch=400)
    args["q_dense"] = torch.tensor([[q]]).expand(400, 1, 4)
    result = reference_verify_chain(**args, defect="unclipped_residual")
    rejected = acceptance_uniform(args["seed"], args["position"]) >= 0.5
    assert int(rejected.sum()) > 100
    assert result.accepted.tolist() == (~rejected).long().tolist()
    assert result.tokens[rejected, 0].tolist() == [token] * int(rejected.sum())


def test_unnormalised_residual_defect_in_p_units() -> None:
    """``unnormalised_residual``: residual (0, 1/2, 0, 1) of the hand case divided by s = 4
    gives running sums (0, 1/8, 1/8, 3/8) against u itself: token 1 iff u < 1/8, else 3
    (the in-range pick, or the fallback's last positive token 3)."""
    args = _four_token(0, sparse=True)
    result = reference_verify_chain(**args, defect="unnormalised_residual")
    rejected = (acceptance_uniform(args["seed"], args["position"]) >= 0.5).tolist()
    u0 = sample_uniform(args["seed"], args["position"]).tolist()
    first = result.tokens[:, 0].tolist()
    picks = [first[b] for b in range(len(u0)) if rejected[b]]
    expected = [1 if u0[b] < 0.125 else 3 for b in range(len(u0)) if rejected[b]]
    assert picks == expected
    assert 1 in picks and 3 in picks


def test_unnormalised_residual_fallback_is_the_last_positive_token() -> None:
    """Token 3 masked: e = (1, 1, 1, 0), s = 3, q = (1/2, 1/2, 0, 0), x = 0; the residual
    (1 - 3/2, 1 - 3/2, 1, 0)+ = (0, 0, 1, 0) over s is 1/3 at token 2 only, so every
    rejection emits 2: below 1/3 by the search, above it by the fallback (the last token
    with a positive weight, not the last token)."""
    args = _four_token(0, sparse=False)
    neg = float("-inf")
    args["logits"] = torch.tensor([[0.0, 0.0, 0.0, neg], [neg, 0.0, 0.0, neg]]).expand(4000, 2, 4)
    args["q_dense"] = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]]).expand(4000, 1, 4)
    result = reference_verify_chain(**args, defect="unnormalised_residual")
    rejected = result.accepted == 0
    u0 = sample_uniform(args["seed"], args["position"])
    assert bool((u0[rejected] > 0.34).any()) and bool((u0[rejected] < 0.33).any())
    assert result.tokens[rejected, 0].tolist() == [2] * int(rejected.sum())


def test_empty_batch() -> None:
    """B = 0 returns empty outputs of the contract's shapes and dtypes (no slice at all)."""
    result = reference_verify_chain(
        torch.zeros((0, 3, 5)),
        torch.zeros((0, 2), dtype=torch.int32),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        q_dense=torch.zeros((0, 2, 5)),
    )
    assert result.tokens.shape == (0, 3) and result.tokens.dtype == torch.int32
    assert result.accepted.shape == (0,) and result.accepted.dtype == torch.int32
    assert result.status.shape == (0,) and result.status.dtype == torch.int8


@pytest.mark.parametrize("bad_id", [-2, 4, 7])
def test_support_id_outside_the_vocabulary_without_validation_is_bad_draft(bad_id: int) -> None:
    """validate=False, a positive count on support id -2, V = 4 or V + 3 in request 0 (q that
    ``validate_chain_inputs`` refuses): that request is STATUS_BAD_DRAFT and emits nothing,
    the q row is still built without an out-of-range index or scatter (such slots are
    dropped), and request 1 follows the law."""
    args = _four_token(0, sparse=True, batch=2)
    ids = args["q_ids"].clone()
    ids[0, 0, 1] = bad_id
    args["q_ids"] = ids
    result = reference_verify_chain(**args, validate=False)
    assert result.status.tolist() == [STATUS_BAD_DRAFT, STATUS_OK]
    assert result.tokens[0].tolist() == [-1, -1] and int(result.accepted[0]) == 0
    tokens, accepted, _ = _law(_four_token(0, sparse=True, batch=2))
    assert (result.tokens[1].tolist(), int(result.accepted[1])) == (tokens[1], accepted[1])


def _slice_sizes(monkeypatch: pytest.MonkeyPatch, args: dict[str, Any]) -> list[int]:
    """The request counts of the slices the reference verifies, in order."""
    import pp3kernels.reference as reference

    sizes: list[int] = []
    inner = reference._verify_requests

    def spy(inputs: Any, **kwargs: Any) -> Any:
        sizes.append(int(inputs.logits.shape[0]))
        return inner(inputs, **kwargs)

    monkeypatch.setattr(reference, "_verify_requests", spy)
    whole = reference_verify_chain(**args)
    tokens, accepted, _ = _law(args)
    assert (whole.tokens.tolist(), whole.accepted.tolist()) == (tokens, accepted)
    return sizes


@pytest.mark.parametrize(
    ("elements", "expected"), [(None, [9]), (2 * 12 + 11, [2, 2, 2, 2, 1]), (5 * 12, [5, 4])]
)
def test_slices_are_the_largest_that_fit_the_bound(
    monkeypatch: pytest.MonkeyPatch, elements: int | None, expected: list[int]
) -> None:
    """Slices hold floor(REFERENCE_CHUNK_ELEMENTS / V) requests (at least one), the last
    one the rest: 9 requests x V = 12 fit the default bound in one piece; a bound of 35
    logits gives slices of 2; of 60, slices of 5 then 4 (two parts are concatenated
    whole, not the first alone), and the output is the law's either way."""
    import pp3kernels.reference as reference

    if elements is not None:
        monkeypatch.setattr(reference, "REFERENCE_CHUNK_ELEMENTS", elements)
    args = _battery(batch=9, vocab=12, seed=24)
    assert _slice_sizes(monkeypatch, args) == expected


def test_a_vocabulary_over_the_bound_goes_one_request_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """V larger than the bound: floor(bound / V) = 0, yet every slice holds one request."""
    import pp3kernels.reference as reference

    monkeypatch.setattr(reference, "REFERENCE_CHUNK_ELEMENTS", 7)
    assert _slice_sizes(monkeypatch, _battery(batch=3, vocab=12, seed=25)) == [1, 1, 1]


def test_highest_tie_defect_keeps_a_unique_maximum_at_token_zero() -> None:
    """``ties_highest_id`` moves ties only: a unique maximum at id 0 stays y = 0 (ids off
    the maximum never take part), so a T0 draft of 0 is accepted twice and y_2 = 0."""
    result = reference_verify_chain(
        torch.tensor([[[5.0, 1.0, 1.0]] * 3]),
        torch.tensor([[0, 0]], dtype=torch.int32),
        torch.zeros(1),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64),
        defect="ties_highest_id",
    )
    assert result.tokens.tolist() == [[0, 0, 0]] and result.accepted.tolist() == [2]


def test_large_logits_are_shifted_by_their_maximum() -> None:
    """e_v = exp((l_v - m) / tau): integer logits moved up by 64 (still exact in bf16) give
    the law's outputs, identical to the unshifted ones (l - m is the same number), where
    exp(l / tau) alone, or exp((l + m) / tau), would overflow fp32 to inf."""
    args = _battery(batch=64, seed=26)
    shifted = {**args, "logits": args["logits"] + 64}
    assert torch.equal(shifted["logits"] - 64, args["logits"])
    _check(shifted)
    same = reference_verify_chain(**shifted)
    plain = reference_verify_chain(**args)
    assert same.tokens.tolist() == plain.tokens.tolist()
    assert same.accepted.tolist() == plain.accepted.tolist()


def test_one_token_vocabulary_with_an_invalidated_draft() -> None:
    """V = 1, x = -1, no q: the only token is emitted at row 0 (nothing gathered past it)."""
    result = reference_verify_chain(
        torch.zeros((3, 2, 1)),
        torch.full((3, 1), -1, dtype=torch.int32),
        torch.tensor([0.0, 0.5, 1.0]),
        torch.arange(3, dtype=torch.int64),
        torch.zeros(3, dtype=torch.int64),
    )
    assert result.tokens.tolist() == [[0, -1]] * 3 and result.accepted.tolist() == [0] * 3


def test_accept_ge_defect_never_accepts_an_invalidated_draft() -> None:
    """``accept_ge`` flips the coin test of proposals only: x = -1 is still no proposal
    (row 0 emits from p, nothing accepted), whatever U * n >= p_x * C says for slot 0."""
    args = _four_token(-1, sparse=True, batch=200)
    result = reference_verify_chain(**args, defect="accept_ge")
    assert result.accepted.tolist() == [0] * 200
    assert bool((result.tokens[:, 0] >= 0).all()) and bool((result.tokens[:, 1] == -1).all())


def test_dense_q_next_row_defect_reads_the_next_row_then_the_last() -> None:
    """``dense_q_next_row`` with K = 3: row i uses q_{i+1} and the last row its own, so
    its output is the law's for q rows (1, 2, 2), request by request."""
    args = _as_dense(_battery(batch=160, seed=27))
    shifted = {**args, "q_dense": args["q_dense"][:, [1, 2, 2]]}
    result = reference_verify_chain(**args, defect="dense_q_next_row")
    tokens, accepted, _ = _law(shifted)
    assert result.tokens.tolist() == tokens and result.accepted.tolist() == accepted


# u = fl(2/3) = 6004799503160661 * 2^-53 is on sample_uniform's grid ((2k + 1) * 2^-53, odd
# numerator), and the grid step below it is 2^-52.
_TIE_U = 2 / 3
_BELOW_TIE_U = 2 / 3 - 2**-52


@pytest.mark.parametrize(("u", "token"), [(_TIE_U, 2), (_BELOW_TIE_U, 1)])
@pytest.mark.parametrize("defect", [None, "unnormalised_residual"])
def test_an_exact_tie_of_the_running_sum_moves_to_the_next_token(
    monkeypatch: pytest.MonkeyPatch, u: float, token: int, defect: str | None
) -> None:
    """The inverse CDF is strict: the smallest v with R_v > u * R_{V-1}, so a running sum
    equal to the target is passed over. e = (1, 1, 1), x = -1 (row 0 samples p): R =
    (1, 2, 3) and u = fl(2/3) gives u * 3 = 2 - 2^-53, which fp64 rounds (to even) to
    exactly 2 = R_1, so token 2, not 1; one grid step lower the target is below 2 and
    token 1 is right. ``unnormalised_residual`` compares u itself with the running sums of
    e / s = fl(1/3): R_1 = 2 fl(1/3) = fl(2/3) = u, the same tie, the same answer. A tie
    has probability about 2^-52 per draw, so u is planted (a value the generator can give:
    the law is a function of u)."""
    numerator, scale = _TIE_U.as_integer_ratio()
    assert scale == 2**53 and numerator % 2 == 1
    assert _TIE_U * 3 == 2.0 and _BELOW_TIE_U * 3 < 2.0
    import pp3kernels.reference as reference

    def planted(seed: torch.Tensor, rowpos: torch.Tensor) -> torch.Tensor:
        return torch.full(rowpos.shape, u, dtype=torch.float64)

    monkeypatch.setattr(reference, "sample_uniform", planted)
    result = reference_verify_chain(
        torch.zeros((2, 2, 3)),
        torch.full((2, 1), -1, dtype=torch.int32),
        torch.tensor([1.0, 0.5]),
        torch.arange(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
        defect=defect,
    )
    assert result.tokens.tolist() == [[token, -1]] * 2
    assert result.accepted.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("poison", "status"),
    [(float("nan"), STATUS_NAN), (float("inf"), STATUS_POSINF), (None, STATUS_ALL_MASKED)],
)
def test_logits_statuses_take_precedence_over_bad_draft(poison: float | None, status: int) -> None:
    """validate=False: a request whose q is refused (support id V with a positive count)
    AND whose logits are NaN / +inf / all -inf in a row keeps the logits status: the
    contract checks STATUS_BAD_DRAFT only after the three logits statuses, so BAD_DRAFT
    marks only requests that are otherwise OK (request 1, bad q alone, is BAD_DRAFT)."""
    args = _four_token(0, sparse=True, batch=3)
    ids = args["q_ids"].clone()
    ids[:2, 0, 1] = 4
    logits = args["logits"].clone()
    if poison is None:
        logits[0, 1, :] = float("-inf")
    else:
        logits[0, 1, 2] = poison
    result = reference_verify_chain(**{**args, "q_ids": ids, "logits": logits}, validate=False)
    assert result.status.tolist() == [status, STATUS_BAD_DRAFT, STATUS_OK]
    assert result.tokens[:2].tolist() == [[-1, -1]] * 2 and result.accepted[:2].tolist() == [0, 0]


def test_accept_ge_defect_accepts_exactly_when_the_coin_reaches_the_ratio() -> None:
    """``accept_ge`` in the hand case (p_0 = 1/4, q_0 = 1/2, ratio 1/2): a proposal is
    accepted iff U * 4 >= 1/4 * 8, i.e. U >= 1/2, request by request; drafts with U < 1/2
    are rejected (the defect flips the comparison, it does not accept every proposal)."""
    args = _four_token(0, sparse=True, batch=400)
    result = reference_verify_chain(**args, defect="accept_ge")
    reaches = (acceptance_uniform(args["seed"], args["position"]) >= 0.5).long()
    assert result.accepted.tolist() == reaches.tolist()
    assert 100 < int(reaches.sum()) < 300  # both outcomes occur


# U = (j + 1/2) 2^-24 with j = 5592405 is 11184811 * 2^-25 = fl32(1/3): a value on the
# acceptance grid equal to p_x = e_x / s = fl32(1 / 3) of three equal logits.
_TIE_COIN = 11184811 * 2**-25


@pytest.mark.parametrize(("defect", "accepted"), [(None, 0), ("accept_ge", 1)])
def test_a_coin_equal_to_the_ratio_is_a_rejection(
    monkeypatch: pytest.MonkeyPatch, defect: str | None, accepted: int
) -> None:
    """The accept test is strict: U * n < p_x * C. Three equal logits give p_0 = fl32(1/3),
    q = the point mass on 0 (n = C = 8), and U planted at exactly p_0 (a grid value; a tie
    has probability 2^-24 per draw): U * 8 == p_0 * 8, so the correct verifier rejects
    (then emits 1 or 2, the residual (0, 1, 1)), and ``accept_ge`` (U * n >= p_x * C)
    accepts."""
    assert float(np.float32(1) / np.float32(3)) == _TIE_COIN
    assert (_TIE_COIN * 2**24 - 0.5).is_integer() and _TIE_COIN * 2**24 < 2**24
    import pp3kernels.reference as reference

    def planted(seed: torch.Tensor, rowpos: torch.Tensor) -> torch.Tensor:
        return torch.full(rowpos.shape, _TIE_COIN, dtype=torch.float64)

    monkeypatch.setattr(reference, "acceptance_uniform", planted)
    result = reference_verify_chain(
        torch.zeros((64, 2, 3)),
        torch.zeros((64, 1), dtype=torch.int32),
        torch.ones(64),
        torch.arange(64, dtype=torch.int64),
        torch.zeros(64, dtype=torch.int64),
        q_ids=torch.zeros((64, 1, 1), dtype=torch.int32),
        q_counts=torch.full((64, 1, 1), 8, dtype=torch.int32),
        denominator=8,
        defect=defect,
    )
    assert result.accepted.tolist() == [accepted] * 64
    if accepted:
        assert result.tokens[:, 0].tolist() == [0] * 64
    else:
        assert set(result.tokens[:, 0].tolist()) == {1, 2}


@pytest.mark.parametrize("defect", ["unclipped_residual", "unnormalised_residual"])
def test_residual_defects_leave_rows_without_a_rejection_alone(defect: str) -> None:
    """Both residual defects change the residual only: a row that samples p (x = -1: no
    proposal, so r = e) still gives token v iff v < 4u <= v + 1 for e = (1, 1, 1, 1).
    ``unclipped_residual`` compares the running sums (1, 2, 3, 4) with u * R_{V-1} = 4u
    (not u, not u + 4), ``unnormalised_residual`` the sums of e / s (1/4, ..., 1) with u;
    the signed total of a rejected row is 0, so only such rows pin the target's scale."""
    args = _four_token(-1, sparse=True, batch=2000)
    result = reference_verify_chain(**args, defect=defect)
    u0 = sample_uniform(args["seed"], args["position"]).tolist()
    expected = [[next(v for v in range(4) if v + 1 > 4 * u), -1] for u in u0]
    assert result.tokens.tolist() == expected
    assert {t[0] for t in expected} == {0, 1, 2, 3}
