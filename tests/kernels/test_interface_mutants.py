"""The verifier interface and the interpreter switch, which a mutation campaign over
``pp3kernels/interface.py`` and ``pp3kernels/runtime.py`` found unpinned.

``ChainInputs.verify_with`` hands every field to its own parameter, ``select`` picks the
requests of every per-request tensor (q included, whichever form it has) and keeps the
batch-wide ``denominator``; a batch is immutable; ``is_interpreter`` reads
``TRITON_INTERPRET`` as Triton does for "1", "0", empty and unset.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pp3kernels import ChainInputs, ChainResult
from pp3kernels.runtime import is_interpreter


def _inputs(*, sparse: bool) -> ChainInputs:
    """B = 3 requests; every per-request tensor holds its request index plus its own offset."""
    b, k, v, s = 3, 2, 4, 2
    rows = torch.arange(b)

    def per_request(offset: int, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        return (rows.reshape(b, *[1] * len(shape)) + offset).expand(b, *shape).to(dtype)

    logits = per_request(0, k + 1, v, dtype=torch.float32)
    drafts = per_request(10, k, dtype=torch.int32)
    temperature = per_request(20, dtype=torch.float32)
    seed = per_request(30, dtype=torch.int64)
    position = per_request(40, dtype=torch.int64)
    if sparse:
        return ChainInputs(
            logits,
            drafts,
            temperature,
            seed,
            position,
            q_ids=per_request(50, k, s, dtype=torch.int32),
            q_counts=per_request(60, k, s, dtype=torch.int32),
            denominator=8,
        )
    return ChainInputs(
        logits,
        drafts,
        temperature,
        seed,
        position,
        q_dense=per_request(70, k, v, dtype=torch.float32),
    )


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse-q", "dense-q"])
def test_select_picks_the_same_requests_from_every_tensor(sparse: bool) -> None:
    """A permutation picks request 2 then 0 from every per-request tensor; the absent q
    form stays None and the denominator (batch-wide) is kept."""
    inputs = _inputs(sparse=sparse)
    picked = inputs.select(torch.tensor([2, 0]))
    for field in dataclasses.fields(picked):
        value = getattr(picked, field.name)
        original = getattr(inputs, field.name)
        if isinstance(original, torch.Tensor):
            assert isinstance(value, torch.Tensor), field.name
            assert torch.equal(value, original[torch.tensor([2, 0])]), field.name
        else:
            assert value == original, field.name
    assert (picked.q_dense is None) == sparse and (picked.q_ids is None) == (not sparse)
    assert picked.denominator == (8 if sparse else None)


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse-q", "dense-q"])
def test_verify_with_hands_each_field_to_its_parameter(sparse: bool) -> None:
    """Positional logits, drafts, temperature, seed, position; q by keyword, as
    ``ChainVerifier`` declares (a swap would pass type checks and shapes alike)."""
    inputs = _inputs(sparse=sparse)
    seen: dict[str, object] = {}
    done = ChainResult(torch.zeros(1), torch.zeros(1), torch.zeros(1))

    def verifier(
        logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        position: torch.Tensor,
        *,
        q_ids: torch.Tensor | None = None,
        q_counts: torch.Tensor | None = None,
        denominator: int | None = None,
        q_dense: torch.Tensor | None = None,
    ) -> ChainResult:
        seen.update(
            logits=logits,
            draft_tokens=draft_tokens,
            temperature=temperature,
            seed=seed,
            position=position,
            q_ids=q_ids,
            q_counts=q_counts,
            denominator=denominator,
            q_dense=q_dense,
        )
        return done

    assert inputs.verify_with(verifier) is done
    assert seen.keys() == {f.name for f in dataclasses.fields(inputs)}
    for name, value in seen.items():
        assert value is getattr(inputs, name), name


def test_a_batch_is_immutable() -> None:
    """Whoever holds a batch (qualify, the oracle, the battery) passes the same object to
    several verifiers: none of them may rebind a field of it."""
    inputs = _inputs(sparse=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.seed = torch.zeros(3, dtype=torch.int64)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("0", False), ("", False), (None, False)]
)
def test_is_interpreter_reads_triton_interpret(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool
) -> None:
    """ "1" runs Triton's interpreter; "0", empty or unset compile for the GPU (Triton's
    own reading of these values)."""
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert is_interpreter() is expected
