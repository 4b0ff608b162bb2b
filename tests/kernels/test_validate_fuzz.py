"""Fuzzing verify_chain's host validation: malformed inputs always raise SelectorInputError.

A well-formed base call (random B, K, V, S, a sparse or dense q, T0 and T1 rows) is broken
in one way drawn from the contract's rules; the selector must refuse it before launch with
``SelectorInputError``, never a torch, Triton or Python error. Derandomized and bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pp3kernels import verify_chain
from pp3kernels.contract import SelectorInputError

FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
Call = dict[str, Any]


def base_call(data: st.DataObject) -> Call:
    """A valid call: drafts drawn from a sparse point-or-spread q (or a dense q)."""
    batch = data.draw(st.integers(1, 4), label="B")
    drafts = data.draw(st.integers(1, 3), label="K")
    vocab = data.draw(st.integers(4, 12), label="V")
    slots = data.draw(st.integers(1, 3), label="S")
    denominator = 1 << data.draw(st.integers(2, 8), label="log2 C")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    logits = torch.randn(batch, drafts + 1, vocab, generator=generator)
    q_ids = (
        torch.stack(
            [torch.randperm(vocab, generator=generator)[:slots] for _ in range(batch * drafts)]
        )
        .view(batch, drafts, slots)
        .to(torch.int32)
    )
    q_counts = torch.zeros(batch, drafts, slots, dtype=torch.int32)
    q_counts[..., 0] = denominator - (slots - 1)
    q_counts[..., 1:] = 1
    draft_tokens = q_ids[..., 0].clone()
    temperature = torch.tensor(
        [data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]), label="tau") for _ in range(batch)],
        dtype=torch.float32,
    )
    temperature[0] = 1.0  # at least one T1 request, so that q matters
    call: Call = {
        "logits": logits,
        "draft_tokens": draft_tokens,
        "temperature": temperature,
        "seed": torch.arange(batch, dtype=torch.int64),
        "position": torch.zeros(batch, dtype=torch.int64),
    }
    if data.draw(st.booleans(), label="dense"):
        dense = torch.zeros(batch, drafts, vocab, dtype=torch.float32)
        dense.scatter_(-1, q_ids.long(), q_counts.float() / denominator)
        call["q_dense"] = dense
    else:
        call.update(q_ids=q_ids, q_counts=q_counts, denominator=denominator)
    return call


def _row(call: Call, data: st.DataObject) -> tuple[int, int]:
    """A (request, row) made T1, so that every q rule applies to it."""
    batch, drafts = call["draft_tokens"].shape
    b = data.draw(st.integers(0, batch - 1), label="b")
    i = data.draw(st.integers(0, drafts - 1), label="i")
    call["temperature"][b] = 1.0
    return b, i


def logits_rank(call: Call, data: st.DataObject) -> None:
    logits = call["logits"]
    call["logits"] = logits[0] if data.draw(st.booleans()) else logits[None]


def wrong_dtype(call: Call, data: st.DataObject) -> None:
    name = data.draw(
        st.sampled_from(["logits", "draft_tokens", "temperature", "seed", "position"]
                        + [n for n in ("q_ids", "q_counts", "q_dense") if n in call])
    )  # fmt: skip
    wrong = {"logits": torch.int32, "draft_tokens": torch.int64, "temperature": torch.float64,
             "seed": torch.int32, "position": torch.float32, "q_ids": torch.int64,
             "q_counts": torch.float32, "q_dense": torch.int32}  # fmt: skip
    call[name] = call[name].to(wrong[name])


def wrong_shape(call: Call, data: st.DataObject) -> None:
    name = data.draw(
        st.sampled_from(["draft_tokens", "temperature", "seed", "position"]
                        + [n for n in ("q_ids", "q_counts", "q_dense") if n in call])
    )  # fmt: skip
    tensor = call[name]
    call[name] = torch.cat([tensor, tensor[:1]]) if data.draw(st.booleans()) else tensor[..., :0]


def not_a_tensor(call: Call, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["logits", "draft_tokens", "temperature", "seed"]))
    call[name] = data.draw(st.sampled_from([None, 3, "x"])) if name != "logits" else [[0.0]]


def bad_temperature(call: Call, data: st.DataObject) -> None:
    b, _ = _row(call, data)
    call["temperature"][b] = data.draw(st.sampled_from([float("nan"), float("inf"), -0.5]))


def draft_out_of_range(call: Call, data: st.DataObject) -> None:
    b, i = _row(call, data)
    vocab = call["logits"].shape[-1]
    call["draft_tokens"][b, i] = data.draw(st.sampled_from([-2, vocab, vocab + 7, -(2**31)]))


def missing_q(call: Call, data: st.DataObject) -> None:
    _row(call, data)
    for name in ("q_ids", "q_counts", "denominator", "q_dense"):
        call.pop(name, None)


def incomplete_or_double_q(call: Call, data: st.DataObject) -> None:
    if "q_dense" in call:
        batch, drafts, _ = call["q_dense"].shape
        call["q_ids"] = torch.zeros(batch, drafts, 1, dtype=torch.int32)  # no counts: incomplete
    else:
        drop = data.draw(st.sampled_from(["q_ids", "q_counts", "denominator", None]))
        if drop is None:  # both forms
            call["q_dense"] = torch.full(call["logits"].shape, 0.0)[:, 1:]
        else:
            del call[drop]


def bad_denominator(call: Call, data: st.DataObject) -> None:
    if "q_dense" in call:
        call["denominator"] = 8  # without q_ids/q_counts: incomplete sparse q
        return
    call["denominator"] = data.draw(
        st.sampled_from([0, -4, 3, 12, 1 << 25, 2.0, True, "8", None, 1 << 70])
    )
    if call["denominator"] is None:
        del call["q_ids"]


def bad_sparse_q(call: Call, data: st.DataObject) -> None:
    if "q_dense" in call:
        return bad_dense_q(call, data)
    b, i = _row(call, data)
    ids, counts, vocab = call["q_ids"], call["q_counts"], call["logits"].shape[-1]
    slots = ids.shape[-1]
    rule = data.draw(
        st.sampled_from(["negative", "padding", "id_range", "duplicate", "mass", "outside"])
    )
    if rule == "negative":
        counts[b, i, 0] = -counts[b, i, 0]
    elif rule == "padding" and slots > 1:  # a zero count whose id is not -1; mass kept
        counts[b, i, 0] += counts[b, i, 1]
        counts[b, i, 1] = 0
    elif rule == "id_range":
        ids[b, i, 0] = data.draw(st.sampled_from([vocab, -1, -3, 2**31 - 1]))
    elif rule == "duplicate" and slots > 1:
        ids[b, i, 1] = ids[b, i, 0]
    elif rule == "outside" and slots < vocab:
        outside = [v for v in range(vocab) if v not in ids[b, i].tolist()]
        call["draft_tokens"][b, i] = outside[0]
    else:
        counts[b, i, 0] += data.draw(st.sampled_from([1, -1, 2**20]))


def bad_dense_q(call: Call, data: st.DataObject) -> None:
    if "q_dense" not in call:
        return bad_sparse_q(call, data)
    b, i = _row(call, data)
    dense, draft = call["q_dense"], int(call["draft_tokens"][b, i])
    rule = data.draw(st.sampled_from(["nan", "inf", "negative", "sum", "zero_at_draft"]))
    if rule == "nan":
        dense[b, i, draft] = float("nan")
    elif rule == "inf":
        dense[b, i, 0] = float("inf")
    elif rule == "negative":
        dense[b, i, (draft + 1) % dense.shape[-1]] = -0.25
    elif rule == "sum":
        dense[b, i] *= 1.5
    else:
        dense[b, i] = 0.0
        dense[b, i, (draft + 1) % dense.shape[-1]] = 1.0


BREAKERS: list[Callable[[Call, st.DataObject], None]] = [
    logits_rank, wrong_dtype, wrong_shape, not_a_tensor, bad_temperature, draft_out_of_range,
    missing_q, incomplete_or_double_q, bad_denominator, bad_sparse_q, bad_dense_q,
]  # fmt: skip


@FUZZ
@given(data=st.data())
def test_malformed_inputs_raise_selector_input_error(data: st.DataObject) -> None:
    call = base_call(data)
    breaker = data.draw(st.sampled_from(BREAKERS), label="breaker")
    breaker(call, data)
    arguments = [call.pop(name) for name in ("logits", "draft_tokens", "temperature", "seed",
                                             "position")]  # fmt: skip
    with pytest.raises(SelectorInputError):
        verify_chain(*arguments, **call)
