"""``pp3cli.verifiers.slices``: ``InputsVerifier`` packs the verifier call as one batch.

From the mutation campaign over ``slices.py``: the call's nine arguments reach ``verify``
as the one ``ChainInputs`` they name (``InputsVerifier.__call__``'s docstring), and its
result is the call's result; ``in_slices`` hands the sliced q arguments to every call.
"""

from __future__ import annotations

import torch

from pp3cli.verifiers.slices import InputsVerifier, in_slices
from pp3kernels import ChainInputs, ChainResult


class _Recording(InputsVerifier):
    def __init__(self, result: ChainResult) -> None:
        self.seen: list[ChainInputs] = []
        self.result = result

    def verify(self, inputs: ChainInputs) -> ChainResult:
        self.seen.append(inputs)
        return self.result


def _result(batch: int) -> ChainResult:
    return ChainResult(
        torch.zeros(batch, 2, dtype=torch.int32),
        torch.zeros(batch, dtype=torch.int32),
        torch.zeros(batch, dtype=torch.int8),
    )


def test_the_call_is_verify_of_its_arguments_packed_field_by_field() -> None:
    batch = 3
    logits, drafts = torch.zeros(batch, 2, 4), torch.zeros(batch, 1, dtype=torch.int32)
    tau, seed, position = torch.ones(batch), torch.arange(batch), torch.arange(batch) + 10
    q_ids = torch.zeros(batch, 1, 2, dtype=torch.int32)
    q_counts = torch.ones(batch, 1, 2, dtype=torch.int32)
    q_dense = torch.full((batch, 1, 4), 0.25)
    result = _result(batch)
    verifier = _Recording(result)
    returned = verifier(
        logits,
        drafts,
        tau,
        seed,
        position,
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=1 << 8,
        q_dense=q_dense,
    )
    assert returned is result
    (inputs,) = verifier.seen
    expected = {
        "logits": logits,
        "draft_tokens": drafts,
        "temperature": tau,
        "seed": seed,
        "position": position,
        "q_ids": q_ids,
        "q_counts": q_counts,
        "denominator": 1 << 8,
        "q_dense": q_dense,
    }
    for name, want in expected.items():
        assert getattr(inputs, name) is want, name


def test_the_q_arguments_default_to_none() -> None:
    verifier = _Recording(_result(1))
    tensors = (torch.zeros(1, 2, 4), torch.zeros(1, 1, dtype=torch.int32), torch.ones(1))
    verifier(*tensors, torch.zeros(1), torch.zeros(1))
    (inputs,) = verifier.seen
    assert (inputs.q_ids, inputs.q_counts, inputs.denominator, inputs.q_dense) == (None,) * 4


def test_every_slice_carries_its_own_rows_of_q_and_the_shared_denominator() -> None:
    batch = 5
    inputs = ChainInputs(
        torch.zeros(batch, 2, 3),
        torch.zeros(batch, 1, dtype=torch.int32),
        torch.ones(batch),
        torch.arange(batch),
        torch.zeros(batch, dtype=torch.int64),
        q_ids=torch.arange(batch, dtype=torch.int32).view(batch, 1, 1),
        q_counts=torch.arange(batch, dtype=torch.int32).view(batch, 1, 1) + 100,
        denominator=1 << 4,
    )
    seen: list[tuple[list[int], list[int], int | None]] = []

    def call(part: ChainInputs) -> ChainResult:
        assert part.q_ids is not None and part.q_counts is not None
        seen.append(
            (part.q_ids.flatten().tolist(), part.q_counts.flatten().tolist(), part.denominator)
        )
        return _result(int(part.seed.shape[0]))

    result = in_slices(inputs, call, elements_per_request=4, budget=8)
    assert seen == [([0, 1], [100, 101], 16), ([2, 3], [102, 103], 16), ([4], [104], 16)]
    assert result.tokens.shape == (batch, 2) and result.status.dtype == torch.int8
