"""Host validation behaviour a mutation campaign over ``pp3kernels/validate.py`` found unpinned.

Boundaries of the structural checks (V < 2^31, S >= 1, q_ids of rank 3), the exact
"(n more ... likewise)" counts of a refusal, token id 0 as a real proposal and support id,
which slot a message names when an earlier slot is legal, the dense sum tolerance, the
STATUS_BAD_DRAFT predicate ``bad_draft_requests`` and the slice bound on q reads.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pp3kernels.validate as validate
from pp3kernels.contract import SelectorInputError
from pp3kernels.interface import ChainInputs
from pp3kernels.validate import bad_draft_requests, validate_chain_inputs


def _inputs(
    drafts: list[list[int]],
    temperature: list[float],
    vocab: int,
    **q: Any,
) -> ChainInputs:
    """A call of B = len(drafts) requests over ``vocab`` tokens with the given q form."""
    batch, rows = len(drafts), len(drafts[0]) + 1
    return ChainInputs(
        torch.zeros((batch, rows, vocab)),
        torch.tensor(drafts, dtype=torch.int32).reshape(batch, rows - 1),
        torch.tensor(temperature, dtype=torch.float32),
        torch.zeros(batch, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        **q,
    )


def _sparse(ids: list[list[list[int]]], counts: list[list[list[int]]], c: int) -> dict[str, Any]:
    return {
        "q_ids": torch.tensor(ids, dtype=torch.int32),
        "q_counts": torch.tensor(counts, dtype=torch.int32),
        "denominator": c,
    }


def _message(inputs: ChainInputs) -> str:
    with pytest.raises(SelectorInputError) as refusal:
        validate_chain_inputs(inputs)
    return str(refusal.value)


def test_vocabulary_bound_is_exactly_int32_ids() -> None:
    """Token ids are int32: V = 2^31 - 1 is the largest vocabulary (its last id fits), and
    V = 2^31 is refused with the documented message. Expanded logits cost no memory."""
    for vocab in (2**31 - 1, 2**31):
        inputs = ChainInputs(
            torch.zeros((1, 1, 1), dtype=torch.bfloat16).expand(1, 1, vocab),
            torch.zeros((1, 0), dtype=torch.int32),
            torch.ones(1),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
        )
        if vocab < 2**31:
            assert validate_chain_inputs(inputs).vocab == vocab
        else:
            assert _message(inputs) == (
                "V = 2147483648 does not fit int32 token ids; expected V < 2^31"
            )


def test_empty_logits_axes_are_named() -> None:
    """K+1 = 0 rows or V = 0 is refused by name (not as a later draft_tokens shape error);
    V = 1 is a legal vocabulary."""
    rows_zero = ChainInputs(
        torch.zeros((2, 0, 4)),
        torch.zeros((2, 0), dtype=torch.int32),
        torch.ones(2),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )
    assert _message(rows_zero) == "logits has K+1 = 0 rows; expected at least the bonus row"
    assert _message(_inputs([[-1]], [1.0], 0)) == (
        "logits has V = 0; expected a vocabulary of at least 1 token"
    )
    # V = 1, dense q on its one token; an invalidated T1 proposal reads no q(x)
    one = _inputs([[-1], [0]], [1.0, 1.0], 1, q_dense=torch.ones((2, 1, 1)))
    assert validate_chain_inputs(one) == validate.ChainShape(2, 1, 1, "dense")


def test_q_ids_rank_and_slot_count() -> None:
    """q_ids must be [B, K, S] with S >= 1: a 2-D q_ids whose leading sizes match is
    refused by the [B, K, S] message, S = 0 by its own; S = 1 (a point mass) is legal."""
    c = 4
    point = _sparse([[[3]], [[1]]], [[[c]], [[c]]], c)
    shape = validate_chain_inputs(_inputs([[3], [1]], [1.0, 1.0], 5, **point))
    assert shape == validate.ChainShape(2, 1, 5, "sparse")
    flat = dict(point, q_ids=point["q_ids"][..., 0])
    assert _message(_inputs([[3], [1]], [1.0, 1.0], 5, **flat)) == (
        "q_ids has shape (2, 1); expected [B, K, S] = [2, 1, S]"
    )
    empty = dict(point, q_ids=point["q_ids"][..., :0], q_counts=point["q_counts"][..., :0])
    assert _message(_inputs([[3], [1]], [1.0, 1.0], 5, **empty)) == (
        "q_ids has S = 0 slots; expected S >= 1"
    )


def test_refusals_count_the_further_offenders_exactly() -> None:
    """ "(n more ... likewise)" counts the offenders after the reported one; a lone
    offender gets no such suffix."""
    lone = _inputs([[-1]] * 3, [1.0, -1.0, 0.0], 4)
    assert _message(lone) == (
        "request 1: temperature -1.0 is invalid; expected a finite value >= 0 (0 = greedy T0)"
    )
    two = _inputs([[-1]] * 3, [1.0, -1.0, float("nan")], 4)
    assert _message(two).endswith("(0 = greedy T0) (1 more requests likewise)")
    three = _inputs([[-1]] * 3, [float("inf"), -1.0, float("nan")], 4)
    assert _message(three).endswith("(0 = greedy T0) (2 more requests likewise)")
    one_row = _inputs([[-1, 4]], [1.0], 4)
    assert _message(one_row) == (
        "request 0, row 1: draft token 4 is out of range; expected -1 (invalidated) "
        "or an id in [0, 4)"
    )
    two_rows = _inputs([[5, -1], [-1, -3]], [1.0, 0.0], 4)
    assert _message(two_rows) == (
        "request 0, row 0: draft token 5 is out of range; expected -1 (invalidated) "
        "or an id in [0, 4) (1 more rows likewise)"
    )
    three_rows = _inputs([[5, -1], [-1, -3], [7, 0]], [1.0, 0.0, 1.0], 4)
    assert _message(three_rows).endswith("or an id in [0, 4) (2 more rows likewise)")


def test_a_single_request_with_a_single_draft_is_validated() -> None:
    """B = 1, K = 1 (one draft value) is checked like any other batch."""
    assert _message(_inputs([[9]], [0.0], 4)).startswith(
        "request 0, row 0: draft token 9 is out of range"
    )


def test_token_zero_is_a_real_proposal_and_support_id() -> None:
    """Id 0 is a token like any other: a T1 proposal 0 outside q's support (sparse or
    dense), a zero mass under a proposal 0, and a repeated support id 0 are refused."""
    c = 8
    outside = _sparse([[[1, 2]]], [[[4, 4]]], c)
    assert _message(_inputs([[0]], [1.0], 4, **outside)) == (
        "request 0, row 0: T1 proposal 0 has q count 0 (not in q's support); "
        "expected a proposal drawn from q, so q(x) > 0"
    )
    empty = _sparse([[[-1, -1]]], [[[0, 0]]], c)
    assert _message(_inputs([[0]], [1.0], 4, **empty)).startswith(
        "request 0, row 0: q mass 0 != denominator 8;"
    )
    repeated = _sparse([[[0, 0]]], [[[4, 4]]], c)
    assert _message(_inputs([[0]], [1.0], 4, **repeated)) == (
        "request 0, row 0: support id 0 appears more than once in q; "
        "expected unique ids within a row"
    )
    dense = torch.tensor([[[0.0, 0.5, 0.5, 0.0]]])
    assert _message(_inputs([[0]], [1.0], 4, q_dense=dense)) == (
        "request 0, row 0: T1 proposal 0 has q_dense = 0.0; "
        "expected q(x) > 0 for a proposal drawn from q"
    )
    assert _message(_inputs([[-1], [0]], [1.0, 1.0], 4)) == (
        "request 1, row 0: T1 proposal 0 was given without q; expected "
        "q_ids/q_counts/denominator or q_dense when a T1 request proposes a token"
    )


def test_messages_name_the_offending_slot_past_legal_ones() -> None:
    """A message names the first slot that breaks *its* rule: a padding slot before a
    negative count, a support id 0 or a count of 1 before an id out of range are legal."""
    c = 16
    negative = _sparse([[[1, -1, 2]]], [[[20, 0, -4]]], c)
    assert _message(_inputs([[1]], [1.0], 4, **negative)) == (
        "request 0, row 0: q count -4 at slot 2 is negative; expected a count >= 0"
    )
    below = _sparse([[[0, -3]]], [[[8, 8]]], c)
    assert _message(_inputs([[0]], [1.0], 4, **below)) == (
        "request 0, row 0: slot 1 has a positive count but id -3; expected an id in [0, 4)"
    )
    count_one = _sparse([[[0, 4]]], [[[15, 1]]], c)
    assert _message(_inputs([[0]], [1.0], 4, **count_one)) == (
        "request 0, row 0: slot 1 has a positive count but id 4; expected an id in [0, 4)"
    )
    padding = _sparse([[[1, -1, 3]]], [[[16, 0, 0]]], c)
    assert _message(_inputs([[1]], [1.0], 4, **padding)) == (
        "request 0, row 0: slot 2 has count 0 but id 3; expected padding id -1 for a zero count"
    )
    last_repeated = _sparse([[[3, 1, 3]]], [[[8, 4, 4]]], c)
    assert _message(_inputs([[1]], [1.0], 4, **last_repeated)).startswith(
        "request 0, row 0: support id 3 appears more than once in q;"
    )
    dense = torch.tensor([[[0.0, 1.0, 0.25, -0.25]]])
    assert _message(_inputs([[1]], [1.0], 4, q_dense=dense)) == (
        "request 0, row 0: q_dense[token 3] = -0.25; expected probabilities >= 0"
    )
    after_padding = _sparse([[[-1, 5]]], [[[0, 16]]], c)
    assert _message(_inputs([[-1]], [1.0], 4, **after_padding)) == (
        "request 0, row 0: slot 1 has a positive count but id 5; expected an id in [0, 4)"
    )


def test_sparse_and_dense_forms_of_one_q_flag_the_same_rows() -> None:
    """One q given sparse or dense: the draft range and the proposal-outside-q masks agree
    row for row. An id V is a range violation only (q is read at proposals in [0, V));
    a T1 proposal with q(x) = 0 is flagged, a T0 one and an invalidated one are not."""
    vocab, c = 4, 4
    drafts = [[1, 4, 3, -1], [3, 4, 1, 0]]
    temperature = [1.0, 0.0]
    ids = [[[1, 2]] * 4] * 2
    counts = [[[2, 2]] * 4] * 2
    dense = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(2, 4, vocab)
    forms = {
        "sparse": _inputs(drafts, temperature, vocab, **_sparse(ids, counts, c)),
        "dense": _inputs(drafts, temperature, vocab, q_dense=dense),
    }
    expected = {
        "draft_range": [[False, True, False, False], [False, True, False, False]],
        "proposal_outside_support": [[False, False, True, False], [False] * 4],
    }
    for form, inputs in forms.items():
        masks = {v.kind: v.mask.tolist() for v in validate.draft_violations(inputs)}
        for kind, mask in expected.items():
            assert masks[kind] == mask, (form, kind)
        assert _message(inputs).startswith("request 0, row 1: draft token 4 is out of range")


def test_dense_sum_tolerance_is_1e_4() -> None:
    """Dense rows must sum to 1 within 1e-4 (docs/selector.md): 1 + 0.8e-4 passes,
    1 + 1.2e-4 and 1 - 1.2e-4 are refused (fp64 q, so the sums are exact enough)."""

    def row(total: float) -> ChainInputs:
        dense = torch.tensor([[[0.5, 0.5, total - 1.0]]], dtype=torch.float64)
        return _inputs([[1]], [1.0], 3, q_dense=dense)

    validate_chain_inputs(row(1 + 0.8e-4))
    assert _message(row(1 + 1.2e-4)).startswith("request 0, row 0: q_dense sums to 1.0001")
    dense = torch.tensor([[[0.5, 0.5 - 1.2e-4, 0.0]]], dtype=torch.float64)
    assert "q_dense sums to 0.9998" in _message(_inputs([[1]], [1.0], 3, q_dense=dense))


def test_bad_draft_requests_flags_exactly_the_offending_requests() -> None:
    """The STATUS_BAD_DRAFT predicate (validate=False): a request is flagged iff any of its
    rows breaks a rule, whichever rule; other requests are not; K = 0 flags nobody."""
    c = 4
    ids = [[[1, -1], [2, -1]], [[1, -1], [2, -1]], [[1, -1], [2, 2]], [[1, -1], [2, -1]]]
    counts = [[[4, 0], [4, 0]], [[4, 0], [4, 0]], [[4, 0], [2, 2]], [[4, 0], [4, 0]]]
    drafts = [[1, 2], [1, 7], [1, 2], [1, 3]]  # ok, out of range, duplicate id, outside q
    inputs = _inputs(drafts, [1.0, 1.0, 1.0, 1.0], 4, **_sparse(ids, counts, c))
    assert bad_draft_requests(inputs).tolist() == [False, True, True, True]
    greedy = _inputs(drafts, [1.0, 0.0, 0.0, 0.0], 4, **_sparse(ids, counts, c))
    assert bad_draft_requests(greedy).tolist() == [False, True, True, False]
    no_drafts = _inputs([[]] * 3, [1.0, 0.0, 1.0], 4)
    flags = bad_draft_requests(no_drafts)
    assert flags.dtype == torch.bool and flags.tolist() == [False, False, False]


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_q_is_read_in_slices_of_the_bound(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The masks read q a slice of requests at a time, each slice holding at most
    VALIDATION_CHUNK_ELEMENTS entries (K x S sparse, K x V dense, per request)."""
    monkeypatch.setattr(validate, "VALIDATION_CHUNK_ELEMENTS", 12)
    batch, drafts, vocab, slots = 7, 2, 3, 2  # 4 sparse / 6 dense entries per request
    seen: list[tuple[int, ...]] = []
    name = "_sparse_masks" if form == "sparse" else "_dense_masks"
    original = getattr(validate, name)

    def spy(q: torch.Tensor, *rest: Any) -> dict[str, torch.Tensor]:
        seen.append(tuple(q.shape))
        masks: dict[str, torch.Tensor] = original(q, *rest)
        return masks

    monkeypatch.setattr(validate, name, spy)
    if form == "sparse":
        ids = torch.tensor([0, 1], dtype=torch.int32).expand(batch, drafts, slots)
        q = _sparse(ids.tolist(), [[[2, 2]] * drafts] * batch, 4)
    else:
        q = {"q_dense": torch.tensor([0.5, 0.5, 0.0]).expand(batch, drafts, vocab)}
    inputs = _inputs([[0, 1]] * batch, [1.0] * batch, vocab, **q)
    validate_chain_inputs(inputs)
    per_request = drafts * (slots if form == "sparse" else vocab)
    assert sum(shape[0] for shape in seen) == batch
    assert all(shape[1:] == (drafts, per_request // drafts) for shape in seen)
    assert all(1 <= shape[0] and shape[0] * per_request <= 12 for shape in seen), seen


def test_request_slices_cover_the_batch_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """q is read in consecutive request slices of at most VALIDATION_CHUNK_ELEMENTS
    entries, one request at least (a request larger than the bound is read alone)."""
    monkeypatch.setattr(validate, "VALIDATION_CHUNK_ELEMENTS", 7)
    for batch in (1, 5, 11):
        for per_request in (1, 2, 3, 5, 7, 8, 20):
            slices = list(validate._request_slices(batch, per_request))
            covered = [r for s in slices for r in range(batch)[s]]
            assert covered == list(range(batch)), (batch, per_request)
            for s in slices:
                size = len(range(batch)[s])
                assert size >= 1
                assert size == 1 or size * per_request <= 7, (batch, per_request, s)


def test_request_slices_are_as_large_as_the_bound_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is also the slice size: validation loops over its slices in Python, so each
    slice but the last holds every request that fits (bound // per_request, at least one) and
    a large batch of small rows is read in the fewest slices, not in needlessly small ones."""
    monkeypatch.setattr(validate, "VALIDATION_CHUNK_ELEMENTS", 7)
    for batch in (1, 5, 11, 30):
        for per_request in (1, 2, 3, 5, 7, 8, 20):
            slices = list(validate._request_slices(batch, per_request))
            sizes = [len(range(batch)[s]) for s in slices]
            full = max(1, 7 // per_request)
            assert sizes[:-1] == [full] * (len(sizes) - 1), (batch, per_request, sizes)
            assert 1 <= sizes[-1] <= full, (batch, per_request, sizes)


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_a_call_without_drafts_but_with_an_empty_q_flags_nobody(form: str) -> None:
    """K = 0 (only the bonus row) with q given in its empty shape [B, 0, S] / [B, 0, V]: a
    well-formed call, accepted by validation, and the STATUS_BAD_DRAFT predicate flags no
    request (q has no entries per request, yet it is still read in slices of the bound)."""
    batch, vocab = 3, 4
    if form == "sparse":
        q: dict[str, Any] = {
            "q_ids": torch.zeros((batch, 0, 2), dtype=torch.int32),
            "q_counts": torch.zeros((batch, 0, 2), dtype=torch.int32),
            "denominator": 4,
        }
    else:
        q = {"q_dense": torch.zeros((batch, 0, vocab))}
    inputs = _inputs([[]] * batch, [1.0, 0.0, 1.0], vocab, **q)
    assert validate_chain_inputs(inputs).q_form == form
    flags = bad_draft_requests(inputs)
    assert flags.dtype == torch.bool and flags.tolist() == [False, False, False]


@pytest.mark.parametrize(("form", "sizes"), [("sparse", [3, 3, 1]), ("dense", [2, 2, 2, 1])])
def test_q_is_read_in_the_fewest_slices_of_the_bound(
    form: str, sizes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's q is K x S (sparse) or K x V (dense) entries, not B x ...: with a bound of
    12 and K = 2, S = 2, V = 3, slices hold 3 (sparse) or 2 (dense) of the 7 requests."""
    monkeypatch.setattr(validate, "VALIDATION_CHUNK_ELEMENTS", 12)
    batch, drafts, vocab = 7, 2, 3
    seen: list[int] = []
    name = "_sparse_masks" if form == "sparse" else "_dense_masks"
    original = getattr(validate, name)

    def spy(q: torch.Tensor, *rest: Any) -> dict[str, torch.Tensor]:
        seen.append(int(q.shape[0]))
        masks: dict[str, torch.Tensor] = original(q, *rest)
        return masks

    monkeypatch.setattr(validate, name, spy)
    if form == "sparse":
        q = _sparse([[[0, 1]] * drafts] * batch, [[[2, 2]] * drafts] * batch, 4)
    else:
        q = {"q_dense": torch.tensor([0.5, 0.5, 0.0]).expand(batch, drafts, vocab)}
    validate_chain_inputs(_inputs([[0, 1]] * batch, [1.0] * batch, vocab, **q))
    assert seen == sizes
