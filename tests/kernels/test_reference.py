"""The torch reference verifier: determinism, T0 edge cases, statuses, defects and its law."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from scipy.stats import power_divergence

from pp3kernels.contract import (
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
)
from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts
from pp3kernels.interface import ChainResult
from pp3kernels.philox import sample_uniform
from pp3kernels.reference import DEFECTS, reference_verify_chain

ALPHA = 1e-6


def _battery(batch: int = 512, drafts: int = 3, vocab: int = 12, seed: int = 0) -> dict[str, Any]:
    """Mixed T0/T1 requests with ties, -inf masks, sparse q and drafts drawn from it."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn((batch, drafts + 1, vocab), generator=generator) * 2
    logits = logits.round()  # small integers: many ties for T0
    mask = torch.rand((batch, drafts + 1, vocab), generator=generator) < 0.2
    logits = torch.where(mask, float("-inf"), logits)
    logits[..., 0] = torch.where(logits[..., 0] == float("-inf"), 0.0, logits[..., 0])
    temperature = torch.rand(batch, generator=generator) * 1.5 + 0.3
    temperature[: batch // 4] = 0.0
    temperature = temperature.to(torch.float32)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    q_probs = torch.softmax(torch.randn((batch, drafts, vocab), generator=generator), dim=-1)
    q_probs = torch.where(torch.rand(q_probs.shape, generator=generator) < 0.3, 0.0, q_probs)
    q_probs[..., 1] += 0.05
    q_ids, q_counts = quantise_q(q_probs, 1024)
    draft_tokens = sample_drafts(q_ids, q_counts, 1024, seeds, positions)
    # T0 requests: mostly propose the argmax so that chains run to the bonus row
    greedy_pick = logits[:, :drafts].argmax(-1).to(torch.int32)
    use_greedy = torch.rand((batch, drafts), generator=generator) < 0.8
    t0 = (temperature == 0)[:, None]
    draft_tokens = torch.where(t0 & use_greedy, greedy_pick, draft_tokens)
    invalid = torch.rand((batch, drafts), generator=generator) < 0.05
    draft_tokens = torch.where(invalid, -1, draft_tokens).to(torch.int32)
    # T0 drafts need not be in q's support; rebuild q for T0 rows as point masses
    pm_ids, pm_counts = point_mass_q(draft_tokens, 1024)
    width = q_ids.shape[-1]
    pad = (0, width - 1)
    pm_ids = torch.nn.functional.pad(pm_ids, pad, value=-1)
    pm_counts = torch.nn.functional.pad(pm_counts, pad, value=0)
    q_ids = torch.where(t0[..., None], pm_ids, q_ids)
    q_counts = torch.where(t0[..., None], pm_counts, q_counts)
    return {
        "logits": logits.to(torch.bfloat16),
        "draft_tokens": draft_tokens,
        "temperature": temperature,
        "seed": seeds,
        "position": positions,
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": 1024,
    }


def _run(args: dict[str, Any], **extra: Any) -> ChainResult:
    return reference_verify_chain(**args, **extra)


def _select(args: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    return {k: v[index] if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _assert_same(a: ChainResult, b: ChainResult) -> None:
    for name, x, y in zip(ChainResult._fields, a, b, strict=True):
        differ = (x != y).reshape(x.shape[0], -1).any(-1).nonzero().flatten().tolist()
        assert not differ, (
            f"{name} differs for requests {differ[:10]}: {x[differ[:3]]} vs {y[differ[:3]]}"
        )


def test_outputs_are_well_formed() -> None:
    args = _battery()
    result = _run(args)
    batch, rows = args["draft_tokens"].shape[0], args["draft_tokens"].shape[1] + 1
    assert result.tokens.dtype == torch.int32 and result.tokens.shape == (batch, rows)
    assert result.accepted.dtype == torch.int32 and result.status.dtype == torch.int8
    assert bool((result.status == STATUS_OK).all())
    emitted = (result.tokens >= 0).sum(-1)
    assert torch.equal(emitted, result.accepted + 1)
    # accepted drafts are echoed, and the emitted tokens have p > 0 in their row
    for b in range(batch):
        a = int(result.accepted[b])
        assert torch.equal(result.tokens[b, :a], args["draft_tokens"][b, :a])
        row = args["logits"][b, a].float()
        assert row[int(result.tokens[b, a])] > float("-inf")


def test_permutation_equivariance_bit_for_bit() -> None:
    args = _battery(seed=1)
    result = _run(args)
    permutation = torch.randperm(512, generator=torch.Generator().manual_seed(2))
    permuted = _run(_select(args, permutation))
    _assert_same(permuted, ChainResult(*(t[permutation] for t in result)))


def test_same_request_alone_or_in_a_batch() -> None:
    args = _battery(seed=3)
    result = _run(args)
    for index in (0, 7, 130, 200, 511):
        alone = _run(_select(args, torch.tensor([index])))
        _assert_same(alone, ChainResult(*(t[index : index + 1] for t in result)))
    # an expanded (batch stride 0) target gives the same as a materialised one
    shared = args["logits"][:1].expand(512, -1, -1)
    _assert_same(_run({**args, "logits": shared}), _run({**args, "logits": shared.contiguous()}))


def test_t0_ties_lowest_id_and_signed_zero() -> None:
    neg = float("-inf")
    logits = torch.tensor(
        [
            [[-1.0, -0.0, 0.0, -0.0], [2.0, 5.0, 5.0, neg], [0.0, 0.0, neg, 0.0]],
            [[-0.0, 0.0, -1.0, -2.0], [neg, neg, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]],
        ]
    )
    drafts = torch.tensor([[1, 1], [0, 2]], dtype=torch.int32)
    args = {
        "logits": logits,
        "draft_tokens": drafts,
        "temperature": torch.zeros(2),
        "seed": torch.zeros(2, dtype=torch.int64),
        "position": torch.zeros(2, dtype=torch.int64),
    }
    result = _run(args)
    assert result.tokens.tolist() == [[1, 1, 0], [0, 2, 0]]
    assert result.accepted.tolist() == [2, 2]
    highest = _run(args, defect="ties_highest_id")
    assert highest.tokens.tolist() == [[3, -1, -1], [1, -1, -1]]
    assert highest.accepted.tolist() == [0, 0]


def test_statuses_and_other_requests_unaffected() -> None:
    args = _battery(batch=64, seed=4)
    clean = _run(args)
    logits = args["logits"].clone()
    logits[3, -1, 5] = float("nan")  # in the bonus row, after any stop
    logits[10, 0, 2] = float("inf")
    logits[20, 1, :] = float("-inf")
    logits[30, 0, 0] = float("inf")
    logits[30, 2, 0] = float("nan")  # NaN wins over +inf
    result = _run({**args, "logits": logits})
    expected = {3: STATUS_NAN, 10: STATUS_POSINF, 20: STATUS_ALL_MASKED, 30: STATUS_NAN}
    for b in range(64):
        if b in expected:
            assert int(result.status[b]) == expected[b]
            assert result.tokens[b].tolist() == [-1] * logits.shape[1]
            assert int(result.accepted[b]) == 0
        else:
            assert int(result.status[b]) == STATUS_OK
            assert torch.equal(result.tokens[b], clean.tokens[b])
            assert int(result.accepted[b]) == int(clean.accepted[b])


def test_bad_draft_status_without_validation() -> None:
    args = _battery(batch=16, seed=5)
    drafts = args["draft_tokens"].clone()
    drafts[2, 0] = 99  # out of range
    t1 = (args["temperature"] > 0).nonzero().flatten().tolist()
    victim = t1[0]
    counts = args["q_counts"].clone()
    counts[victim, 0, 0] += 1  # mass C + 1
    with pytest.raises(ValueError, match="request 2, row 0: draft token 99"):
        _run({**args, "draft_tokens": drafts})
    result = _run({**args, "draft_tokens": drafts, "q_counts": counts}, validate=False)
    assert int(result.status[2]) == STATUS_BAD_DRAFT
    assert int(result.status[victim]) == STATUS_BAD_DRAFT
    assert result.tokens[2].tolist() == [-1] * 4
    others = [b for b in range(16) if b not in (2, victim)]
    assert bool((result.status[others] == STATUS_OK).all())


def test_dense_q_equal_to_counts_gives_identical_output() -> None:
    args = _battery(seed=6)
    vocab = args["logits"].shape[-1]
    ids, counts = args["q_ids"].long(), args["q_counts"].long()
    dense = torch.zeros((*ids.shape[:2], vocab + 1), dtype=torch.float64)
    dense.scatter_add_(2, torch.where(ids >= 0, ids, vocab), counts.double() / 1024)
    dense = dense[..., :vocab].to(torch.float32)  # n / 1024 is exact in fp32
    dense_args = {k: v for k, v in args.items() if k not in ("q_ids", "q_counts", "denominator")}
    _assert_same(_run({**dense_args, "q_dense": dense}), _run(args))


def test_zero_residual_falls_back_to_p() -> None:
    """p = (1/2, 1/2), dense q = (1/2 + 4e-5) x 2: a rejection leaves residual 0 in floats."""
    batch = 40_000
    generator = torch.Generator().manual_seed(7)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.zeros(batch, dtype=torch.int64)
    dense = torch.full((batch, 1, 2), 0.5 + 4e-5)
    result = _run(
        {
            "logits": torch.zeros((1, 2, 2)).expand(batch, -1, -1),
            "draft_tokens": torch.zeros((batch, 1), dtype=torch.int32),
            "temperature": torch.ones(batch),
            "seed": seeds,
            "position": positions,
            "q_dense": dense,
        }
    )
    rejected = (result.accepted == 0).nonzero().flatten()
    assert rejected.numel() > 0  # P(reject) = 8e-5 per request: ~3 expected
    u = sample_uniform(seeds[rejected], positions[rejected])
    assert result.tokens[rejected, 0].tolist() == (u >= 0.5).long().tolist()
    assert result.tokens[rejected, 1].tolist() == [-1] * rejected.numel()


def _as_dense(args: dict[str, Any]) -> dict[str, Any]:
    """The same call with q given dense: count / C in fp32 (exact, C a power of two)."""
    args = dict(args)
    ids, counts = args.pop("q_ids").long(), args.pop("q_counts")
    denominator = args.pop("denominator")
    dense = torch.zeros(*ids.shape[:2], args["logits"].shape[-1], dtype=torch.float32)
    weights = torch.where(ids >= 0, counts.float() / denominator, 0.0)
    dense.scatter_add_(-1, ids.clamp(min=0), weights)
    return {**args, "q_dense": dense}


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_changes_the_output(defect: str) -> None:
    args = _battery(seed=8)
    if defect.startswith("dense_"):
        # A dense-path defect is invisible with sparse q, and shows with dense q.
        sparse = _run(args, defect=defect)
        clean_sparse = _run(args)
        assert torch.equal(sparse.tokens, clean_sparse.tokens)
        args = _as_dense(args)
    clean = _run(args)
    planted = _run(args, defect=defect)
    differs = (planted.tokens != clean.tokens).any(-1) | (planted.accepted != clean.accepted)
    assert int(differs.sum()) > 0, f"defect {defect} left all 512 outputs unchanged"


def test_unknown_defect_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match="unknown defect 'nope'; expected None or one of accept_ge"
    ):
        _run(_battery(batch=2), defect="nope")


def _first_token_law(
    drafts: torch.Tensor,
    q: dict[str, Any],
    logits_row: torch.Tensor,
    tau: float,
    seed: int,
    defect: str | None = None,
) -> torch.Tensor:
    batch = drafts.shape[0]
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    positions = torch.randint(0, 2**40, (batch,), generator=generator, dtype=torch.int64)
    rows = drafts.shape[1] + 1
    result = reference_verify_chain(
        logits_row.expand(batch, rows, -1),
        drafts,
        torch.full((batch,), tau),
        seeds,
        positions,
        defect=defect,
        **q,
    )
    return torch.bincount(result.tokens[:, 0].long(), minlength=logits_row.shape[-1])


def _g_test(observed: torch.Tensor, p: torch.Tensor) -> float:
    possible = p > 0
    assert int(observed[~possible].sum()) == 0, "a token with p = 0 was emitted"
    expected = p[possible] * observed.sum()
    assert float(expected.min()) >= 20
    _, p_value = power_divergence(
        observed[possible].double().numpy(), expected.numpy(), lambda_="log-likelihood"
    )
    return float(p_value)


_TARGET = torch.tensor([1.0, 0.2, float("-inf"), -0.7, 2.0, 0.5])
_TAU = 0.8


def _target_p() -> torch.Tensor:
    return torch.softmax(_TARGET.double() / _TAU, dim=-1)


def test_first_token_law_with_point_mass_drafts() -> None:
    batch, vocab = 20_000, 6
    generator = torch.Generator().manual_seed(9)
    drafts = torch.randint(0, vocab, (batch, 2), generator=generator, dtype=torch.int32)
    q_ids, q_counts = point_mass_q(drafts, 8)
    q = {"q_ids": q_ids, "q_counts": q_counts, "denominator": 8}
    observed = _first_token_law(drafts, q, _TARGET.view(1, 1, -1), _TAU, seed=10)
    assert _g_test(observed, _target_p()) > ALPHA


def test_first_token_law_with_sparse_drafts() -> None:
    batch, vocab = 20_000, 6
    q_probs = torch.tensor([0.3, 0.1, 0.25, 0.05, 0.1, 0.2]).expand(batch, 2, vocab)
    q_ids, q_counts = quantise_q(q_probs, 64)
    generator = torch.Generator().manual_seed(11)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)
    drafts = sample_drafts(q_ids, q_counts, 64, seeds, torch.zeros(batch, dtype=torch.int64))
    q = {"q_ids": q_ids, "q_counts": q_counts, "denominator": 64}
    observed = _first_token_law(drafts, q, _TARGET.view(1, 1, -1), _TAU, seed=12)
    assert _g_test(observed, _target_p()) > ALPHA


@pytest.mark.parametrize(
    "defect", ["accept_ge", "unnormalised_residual", "reused_coin", "unclipped_residual"]
)
def test_first_token_law_catches_planted_defects(defect: str) -> None:
    batch, vocab = 20_000, 6
    generator = torch.Generator().manual_seed(13)
    drafts = torch.randint(0, vocab, (batch, 2), generator=generator, dtype=torch.int32)
    q_ids, q_counts = point_mass_q(drafts, 8)
    q = {"q_ids": q_ids, "q_counts": q_counts, "denominator": 8}
    observed = _first_token_law(drafts, q, _TARGET.view(1, 1, -1), _TAU, seed=14, defect=defect)
    p = _target_p()
    impossible_hits = int(observed[p == 0].sum())
    if impossible_hits == 0:
        expected = p[p > 0] * observed.sum()
        _, p_value = power_divergence(
            observed[p > 0].double().numpy(), expected.numpy(), lambda_="log-likelihood"
        )
        assert p_value < ALPHA, f"defect {defect} passed the G-test: p = {p_value}"


@pytest.mark.parametrize("defect", [None, "batch_index_counters", "reused_coin"])
def test_any_slice_size_gives_the_same_bits(
    defect: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference verifies the batch in request slices of bounded size: the slicing
    (here 1, then 5 requests per slice, against one piece) changes no output bit, also
    for the defect that keys its draws by the batch index, and with validate=False."""
    import pp3kernels.reference as reference

    args = _battery(batch=61, vocab=12, seed=5)
    args["draft_tokens"][3, 0] = 12  # out of range: BAD_DRAFT without validation
    whole = _run(args, defect=defect, validate=False)
    for requests in (1, 5):
        monkeypatch.setattr(reference, "REFERENCE_CHUNK_ELEMENTS", requests * 12)
        _assert_same(_run(args, defect=defect, validate=False), whole)
    assert int(whole.status[3]) == STATUS_BAD_DRAFT
