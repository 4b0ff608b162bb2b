"""Edge battery: the reference passes every check; planted defects fail the right ones."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pp3cli.evidence.edge import CHECKS, EdgeResult, check_cross_split_ties, run_edge_battery
from pp3kernels.contract import STATUS_NAN
from pp3kernels.interface import ChainResult
from pp3kernels.reference import reference_verify_chain

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def reference_results() -> list[EdgeResult]:
    return run_edge_battery(reference_verify_chain, device=CPU, seed=7)


def test_battery_names_every_required_check(reference_results: list[EdgeResult]) -> None:
    names = {r.name for r in reference_results}
    assert names == {
        "sparse_full_target_tails",
        "disjoint_support",
        "equal_q",
        "invalidated_proposals",
        "id_ties",
        "signed_zero",
        "cross_split_ties",
        "request_permutation",
        "nan_logits",
        "posinf_logits",
        "all_masked_logits",
        "tau_zero",
    }
    assert len(CHECKS) == len(names)


def test_reference_passes_every_check(reference_results: list[EdgeResult]) -> None:
    failed = [r for r in reference_results if not r.passed]
    assert not failed, failed


def _failed(verifier, names: set[str]) -> set[str]:  # type: ignore[no-untyped-def]
    by_name = {c.__name__.removeprefix("check_"): c for c in CHECKS}
    return {n for n in names if not by_name[n](verifier, CPU, 7).passed}


def test_ties_highest_id_fails_tie_checks() -> None:
    bad = functools.partial(reference_verify_chain, defect="ties_highest_id")
    ties = {"id_ties", "signed_zero", "cross_split_ties"}
    assert _failed(bad, ties) == ties


def test_selector_keeps_the_lowest_id_across_vocabulary_splits() -> None:
    """Finding 8: the split-vocabulary launch's tie rule, forced in the interpreter (the GPU
    takes it by itself at V = 32768): four chunks of 8192, ties straddling them."""
    from pp3kernels import LaunchPlan, verify_chain

    split = functools.partial(verify_chain, plan=LaunchPlan(1, 2048, 4, 8192, 4, 2048))
    result = check_cross_split_ties(split, CPU, 7)
    assert result.passed, result.detail


def test_batch_index_counters_fail_permutation() -> None:
    bad = functools.partial(reference_verify_chain, defect="batch_index_counters")
    assert _failed(bad, {"request_permutation"}) == {"request_permutation"}


def test_accept_ge_fails_equal_q_and_disjoint_support() -> None:
    bad = functools.partial(reference_verify_chain, defect="accept_ge")
    assert _failed(bad, {"equal_q", "disjoint_support"}) == {"equal_q", "disjoint_support"}


def test_status_ignoring_verifier_fails_poison_checks() -> None:
    def ignores_status(*args, **kwargs) -> ChainResult:  # type: ignore[no-untyped-def]
        out = reference_verify_chain(*args, **kwargs)
        return ChainResult(out.tokens, out.accepted, torch.zeros_like(out.status))

    assert _failed(ignores_status, {"nan_logits", "posinf_logits", "all_masked_logits"}) == {
        "nan_logits",
        "posinf_logits",
        "all_masked_logits",
    }


def test_tail_floor_fails_sparse_tails() -> None:
    """A sampler that never emits a token of probability < 2^-8 (a floored noise) fails."""

    def floored(logits, *args, **kwargs) -> ChainResult:  # type: ignore[no-untyped-def]
        clipped = torch.where(logits < -6.0, torch.full_like(logits, -torch.inf), logits)
        return reference_verify_chain(clipped, *args, **kwargs)

    assert _failed(floored, {"sparse_full_target_tails"}) == {"sparse_full_target_tails"}


def test_raising_verifier_is_a_failed_check() -> None:
    def raises(*args, **kwargs) -> ChainResult:  # type: ignore[no-untyped-def]
        raise ValueError("refused")

    results = run_edge_battery(raises, device=CPU, seed=0)
    assert all(not r.passed and "refused" in r.detail for r in results)


# ---- Tests that kill mutants the suite missed (a campaign, 2026-12-05: one AST mutation at
# a time in pp3cli/evidence/edge.py against test_edge). Each check must fail on an output
# that breaks only one of its conditions.

Fault = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def _with_fault(fault: Fault) -> Callable[..., ChainResult]:
    """The reference verifier with ``fault(tokens, accepted, status, seed)`` applied in place
    to copies of its outputs (``seed``: the call's seeds, to fault one call of several)."""

    def verifier(*args: Any, **kwargs: Any) -> ChainResult:
        out = reference_verify_chain(*args, **kwargs)
        tokens, accepted, status = out.tokens.clone(), out.accepted.clone(), out.status.clone()
        fault(tokens, accepted, status, args[3])
        return ChainResult(tokens, accepted, status)

    return verifier


def _set(name: str, index: Any, value: int) -> Fault:
    """A fault that writes ``value`` at ``index`` of one output (tokens, accepted, status)."""

    def fault(tokens: torch.Tensor, accepted: torch.Tensor, status: torch.Tensor, _: Any) -> None:
        {"tokens": tokens, "accepted": accepted, "status": status}[name][index] = value

    return fault


def _drop_tail_token(tokens: torch.Tensor, *_: Any) -> None:
    tokens[:, 0] = torch.where(tokens[:, 0] == 15, torch.zeros_like(tokens[:, 0]), tokens[:, 0])


def _shift_first(tokens: torch.Tensor, *_: Any) -> None:
    tokens[0, 0] = (tokens[0, 0] + 1) % 4


def _other_seed_only(
    tokens: torch.Tensor, accepted: torch.Tensor, status: torch.Tensor, seed: Any
) -> None:
    if int(seed[0]) == 7 + 12345:  # check_tau_zero's second call (_failed runs seed 7)
        tokens[0, 0] = (tokens[0, 0] + 1) % 16


def _neighbour_changes(
    tokens: torch.Tensor, accepted: torch.Tensor, status: torch.Tensor, _: Any
) -> None:
    if int(status[3]) != 0:  # the poisoned call only: a neighbour of the poisoned rows flips
        status[0] = STATUS_NAN


SINGLE_FAULTS: list[tuple[str, Fault]] = [
    ("sparse_full_target_tails", _set("status", 0, 1)),
    ("sparse_full_target_tails", _set("accepted", 0, 1)),
    ("sparse_full_target_tails", _drop_tail_token),
    ("sparse_full_target_tails", _set("tokens", (0, 1), 0)),
    ("disjoint_support", _set("accepted", 0, 1)),
    ("disjoint_support", _set("tokens", (0, 0), 4)),
    ("disjoint_support", _set("status", 0, 1)),
    ("equal_q", _set("accepted", 0, 2)),
    ("equal_q", _shift_first),
    ("equal_q", _set("tokens", (0, 3), 4)),
    ("invalidated_proposals", _set("accepted", 0, 2)),
    ("invalidated_proposals", _set("tokens", (0, 1), 5)),
    ("invalidated_proposals", _set("tokens", (0, 2), 0)),
    ("invalidated_proposals", _set("tokens", (slice(None), 1), 2)),  # token 1 always 2
    ("id_ties", _set("status", 0, 1)),
    ("tau_zero", _other_seed_only),
    ("nan_logits", _set("tokens", (3, 0), 0)),  # a poisoned row emits
    ("posinf_logits", _set("accepted", 4, 1)),  # one accepts
    ("all_masked_logits", _neighbour_changes),
]


@pytest.mark.parametrize(
    ("check", "fault"), SINGLE_FAULTS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(SINGLE_FAULTS)]
)
def test_each_condition_of_a_check_fails_it_alone(check: str, fault: Fault) -> None:
    assert _failed(_with_fault(fault), {check}) == {check}


# ---- A second campaign (2026-12-05, evening): mutants that change a check's *inputs* so that
# it no longer exercises what it names (no -0.0 left, no tie in the bonus row, drafts off the
# greedy path, one logit value everywhere). The reference passes either way; each verifier
# below has one realistic defect that the check's real inputs expose and the mutant's hide.


def _negative_zero_read_as(value: float, rows: slice) -> Callable[..., ChainResult]:
    """The reference reading each -0.0 logit of chain ``rows`` as ``value`` (+0.0 kept): a
    selector comparing bit patterns, or masking on the sign bit."""

    def verifier(logits: torch.Tensor, *args: Any, **kwargs: Any) -> ChainResult:
        logits = logits.clone(memory_format=torch.contiguous_format)
        part = logits[:, rows]
        part[(part == 0) & torch.signbit(part)] = value
        return reference_verify_chain(logits, *args, **kwargs)

    return verifier


def _bonus_shifted(*args: Any, **kwargs: Any) -> ChainResult:
    """The reference, but a request that accepts every draft emits the next id as its bonus."""
    out = reference_verify_chain(*args, **kwargs)
    k, vocab = out.tokens.shape[1] - 1, args[0].shape[-1]
    tokens, full = out.tokens.clone(), out.accepted == k
    tokens[full, k] = (tokens[full, k] + 1) % vocab
    return ChainResult(tokens, out.accepted, out.status)


def _seeds_offset_by_batch_size(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    tau: torch.Tensor,
    seed: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> ChainResult:
    """Draws keyed by the batch size as well: a permuted batch agrees, a sub-batch does not."""
    return reference_verify_chain(logits, drafts, tau, seed + seed.shape[0], *args, **kwargs)


def _reads_the_previous_requests_logits(
    logits: torch.Tensor, *args: Any, **kwargs: Any
) -> ChainResult:
    """An off-by-one request stride: request i verified against request i - 1's logits."""
    return reference_verify_chain(logits.roll(1, dims=0), *args, **kwargs)


def _invalidated_stop_shifted(*args: Any, **kwargs: Any) -> ChainResult:
    """The reference, but a chain stopped by an invalidated draft (-1) emits the next id."""
    out = reference_verify_chain(*args, **kwargs)
    drafts, vocab = args[1], args[0].shape[-1]
    k = drafts.shape[1]
    rows = torch.nonzero(out.accepted < k).flatten()
    stop = out.accepted[rows].long()
    rows = rows[drafts[rows, stop] == -1]
    tokens = out.tokens.clone()
    at = out.accepted[rows].long()
    tokens[rows, at] = (tokens[rows, at] + 1) % vocab
    return ChainResult(tokens, out.accepted, out.status)


def _greedy_ignores_nan(
    logits: torch.Tensor, drafts: torch.Tensor, tau: torch.Tensor, *args: Any, **kwargs: Any
) -> ChainResult:
    """A T0 path that argmaxes past NaN (read as -inf) and reports OK; T1 rows are right."""
    greedy = (tau == 0).view(-1, 1, 1)
    logits = torch.where(greedy & logits.isnan(), -torch.inf, logits)
    return reference_verify_chain(logits, drafts, tau, *args, **kwargs)


INPUT_DEFECTS: list[tuple[str, Callable[..., ChainResult]]] = [
    # -0.0 below +0.0 in the bonus row only: the ties must reach the last row, held as -0.0
    ("signed_zero", _negative_zero_read_as(-1e-30, slice(-1, None))),
    ("cross_split_ties", _negative_zero_read_as(-1e-30, slice(-1, None))),
    # -0.0 masked: the uniform rows must hold -0.0 for equal_q to see it
    ("equal_q", _negative_zero_read_as(-torch.inf, slice(None))),
    # a wrong bonus: the drafts must follow the greedy path for requests to reach it
    ("id_ties", _bonus_shifted),
    ("signed_zero", _bonus_shifted),
    ("cross_split_ties", _bonus_shifted),
    ("tau_zero", _bonus_shifted),
    # tau = 0 with invalidated drafts: some drafts must be -1
    ("tau_zero", _invalidated_stop_shifted),
    # a NaN in T0 requests: the poisoned set must hold T0 requests (even indices)
    ("nan_logits", _greedy_ignores_nan),
    ("request_permutation", _seeds_offset_by_batch_size),
    # requests must differ in their logits for a neighbour's to be told apart
    ("request_permutation", _reads_the_previous_requests_logits),
]


@pytest.mark.parametrize(
    ("check", "verifier"), INPUT_DEFECTS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(INPUT_DEFECTS)]
)
def test_a_check_sees_the_defect_its_inputs_are_built_for(
    check: str, verifier: Callable[..., ChainResult]
) -> None:
    assert _failed(verifier, {check}) == {check}


@pytest.mark.parametrize("error", [ValueError, RuntimeError, IndexError, AssertionError])
def test_each_error_a_verifier_may_raise_is_a_failed_check_naming_it(
    error: type[Exception],
) -> None:
    """A refusal (ValueError), a device error (RuntimeError), an index past a tensor or a
    failed assertion inside a check: that check fails with ``raised <type>: <message>``, in
    CHECKS order, and the battery goes on."""

    def raises(*args: Any, **kwargs: Any) -> ChainResult:
        raise error("boom")

    results = run_edge_battery(raises, device=CPU, seed=0)
    assert [r.name for r in results] == [c.__name__.removeprefix("check_") for c in CHECKS]
    assert {(r.passed, r.detail) for r in results} == {(False, f"raised {error.__name__}: boom")}


def test_an_error_that_is_a_bug_is_not_turned_into_a_failed_check() -> None:
    """Any other exception (here a TypeError) is a bug in pp3 or its caller: it propagates
    (docs/exit-codes.md: exit 4 with a traceback), never read as the verifier's FAIL."""

    def broken(*args: Any, **kwargs: Any) -> ChainResult:
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        run_edge_battery(broken, device=CPU, seed=0)


def test_the_permutation_detail_counts_the_requests_that_differ(
    reference_results: list[EdgeResult],
) -> None:
    """The receipt's detail reports what was seen: the reference is equivariant, so none of
    the 1024 permuted requests differ (a detail counting the equal ones read 1024/1024)."""
    (result,) = [r for r in reference_results if r.name == "request_permutation"]
    assert result.detail == (
        "permuted batch: 0/1024 requests differ; 7-request sub-batch identical: True"
    )


def _tail_as_padding(tokens: torch.Tensor, *_: Any) -> None:
    """vLLM's padding-tile bug (DESIGN.md): the last tail token 15 emitted as id V = 16."""
    tokens[:, 0] = torch.where(tokens[:, 0] == 15, torch.full_like(tokens[:, 0], 16), tokens[:, 0])


def _first_as_minus_one(tokens: torch.Tensor, *_: Any) -> None:
    """Every head token 0 emitted as -1 (nothing) with status OK."""
    tokens[:, 0] = torch.where(tokens[:, 0] == 0, torch.full_like(tokens[:, 0], -1), tokens[:, 0])


@pytest.mark.parametrize("fault", [_tail_as_padding, _first_as_minus_one])
def test_sparse_tails_fail_an_emitted_id_outside_the_vocabulary(fault: Fault) -> None:
    """The tail count clamped every token into [0, V): an id V was counted as token V - 1
    (a verifier emitting 16 for 15 passed) and -1 as token 0. An id outside [0, V) fails."""
    assert _failed(_with_fault(fault), {"sparse_full_target_tails"}) == {"sparse_full_target_tails"}
