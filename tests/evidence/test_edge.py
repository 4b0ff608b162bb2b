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
