"""Edge battery: the reference passes every check; planted defects fail the right ones."""

from __future__ import annotations

import functools

import pytest
import torch

from pp3cli.evidence.edge import CHECKS, EdgeResult, check_cross_split_ties, run_edge_battery
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
