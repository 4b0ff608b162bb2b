"""Host validation: every refusal names the request, the row, the value and the expectation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pp3kernels.contract import SelectorInputError
from pp3kernels.interface import ChainInputs
from pp3kernels.validate import validate_chain_inputs

B, K, V, C = 3, 2, 8, 16


def _call(**overrides: Any) -> dict[str, Any]:
    """A well-formed sparse-q call: request 0 T1, request 1 T0, request 2 T1."""
    args: dict[str, Any] = {
        "logits": torch.zeros((B, K + 1, V), dtype=torch.bfloat16),
        "draft_tokens": torch.tensor([[1, 2], [3, -1], [5, 6]], dtype=torch.int32),
        "temperature": torch.tensor([1.0, 0.0, 0.7], dtype=torch.float32),
        "seed": torch.arange(B, dtype=torch.int64),
        "position": torch.arange(B, dtype=torch.int64) * 10,
        "q_ids": torch.tensor(
            [
                [[1, 4, -1], [2, -1, -1]],
                [[-1, -1, -1], [-1, -1, -1]],
                [[5, 0, -1], [6, 7, 1]],
            ],
            dtype=torch.int32,
        ),
        "q_counts": torch.tensor(
            [
                [[8, 8, 0], [16, 0, 0]],
                [[0, 0, 0], [0, 0, 0]],
                [[12, 4, 0], [4, 4, 8]],
            ],
            dtype=torch.int32,
        ),
        "denominator": C,
    }
    args.update(overrides)
    return args


def _run(args: dict[str, Any]) -> None:
    logits = args.pop("logits")
    drafts = args.pop("draft_tokens")
    temperature = args.pop("temperature")
    seed = args.pop("seed")
    position = args.pop("position")
    validate_chain_inputs(ChainInputs(logits, drafts, temperature, seed, position, **args))


def _refused(pattern: str, **overrides: Any) -> None:
    with pytest.raises(SelectorInputError, match=pattern):
        _run(_call(**overrides))


def _edit(name: str, index: tuple[int, ...], value: int | float) -> torch.Tensor:
    tensor: torch.Tensor = _call()[name].clone()
    tensor[index] = value
    return tensor


def test_valid_calls_pass() -> None:
    _run(_call())
    # expanded logits (batch stride 0) and fp16/fp32 logits are fine
    _run(_call(logits=torch.zeros((1, K + 1, V)).expand(B, -1, -1)))
    _run(_call(logits=torch.zeros((B, K + 1, V), dtype=torch.float16)))
    # no q when no T1 request proposes
    _run(
        _call(
            draft_tokens=torch.tensor([[-1, -1], [3, 3], [-1, -1]], dtype=torch.int32),
            q_ids=None,
            q_counts=None,
            denominator=None,
        )
    )
    # dense q
    dense = torch.zeros((B, K, V))
    dense[..., 1] = 0.5
    dense[..., 2] = 0.25
    dense[..., 5] = 0.125
    dense[..., 6] = 0.125
    _run(_call(q_ids=None, q_counts=None, denominator=None, q_dense=dense))
    # K = 0: only the bonus row
    _run(
        _call(
            logits=torch.zeros((B, 1, V)),
            draft_tokens=torch.zeros((B, 0), dtype=torch.int32),
            q_ids=None,
            q_counts=None,
            denominator=None,
        )
    )


def test_shapes_dtypes_and_devices() -> None:
    _refused(r"logits has 2 dimensions", logits=torch.zeros((B, V)))
    _refused(
        r"logits has dtype float64; expected bfloat16",
        logits=torch.zeros((B, K + 1, V), dtype=torch.float64),
    )
    _refused(
        r"draft_tokens has dtype int64; expected int32",
        draft_tokens=torch.zeros((B, K), dtype=torch.int64),
    )
    _refused(
        r"draft_tokens has shape \(3, 3\); expected \(3, 2\)",
        draft_tokens=torch.zeros((B, 3), dtype=torch.int32),
    )
    _refused(r"temperature has dtype float64", temperature=torch.ones(B, dtype=torch.float64))
    _refused(r"seed has shape \(2,\); expected \(3,\)", seed=torch.zeros(2, dtype=torch.int64))
    _refused(
        r"position has dtype int32; expected int64", position=torch.zeros(B, dtype=torch.int32)
    )
    _refused(r"q_counts has dtype int64", q_counts=_call()["q_counts"].long())
    _refused(
        r"q_ids has shape \(3, 1, 3\); expected \[B, K, S\] = \[3, 2, S\]",
        q_ids=_call()["q_ids"][:, :1],
    )
    _refused(
        r"seed is on meta but logits is on cpu",
        seed=torch.zeros(B, dtype=torch.int64, device="meta"),
    )


def test_q_form_rules() -> None:
    _refused(r"sparse q is incomplete: denominator missing", denominator=None)
    _refused(r"both sparse q .* and q_dense", q_dense=torch.zeros((B, K, V)))
    _refused(r"denominator 12 is not a power of two", denominator=12)
    _refused(r"denominator 33554432 is not a power of two in \[1, 16777216\]", denominator=2**25)
    _refused(
        r"request 0, row 0: T1 proposal 1 was given without q",
        q_ids=None,
        q_counts=None,
        denominator=None,
    )


@pytest.mark.parametrize("bad", [float("nan"), -0.5, float("inf")])
def test_temperature_refusals(bad: float) -> None:
    _refused(
        rf"request 2: temperature {bad!r} is invalid; expected a finite value >= 0",
        temperature=_edit("temperature", (2,), bad),
    )


def test_draft_range() -> None:
    _refused(
        r"request 1, row 0: draft token 8 is out of range; expected -1 .* \[0, 8\)",
        draft_tokens=_edit("draft_tokens", (1, 0), 8),
    )
    _refused(
        r"request 2, row 1: draft token -2 is out of range",
        draft_tokens=_edit("draft_tokens", (2, 1), -2),
    )


def test_sparse_q_rules() -> None:
    _refused(
        r"request 2, row 1: q count -4 at slot 0 is negative",
        q_counts=_edit("q_counts", (2, 1, 0), -4),
    )
    _refused(
        r"request 0, row 0: slot 2 has count 0 but id 3; expected padding id -1",
        q_ids=_edit("q_ids", (0, 0, 2), 3),
    )
    ids = _edit("q_ids", (2, 1, 2), 8)
    _refused(
        r"request 2, row 1: slot 2 has a positive count but id 8; expected an id in \[0, 8\)",
        q_ids=ids,
    )
    _refused(
        r"request 2, row 1: support id 6 appears more than once", q_ids=_edit("q_ids", (2, 1, 2), 6)
    )
    _refused(
        r"request 0, row 1: q mass 15 != denominator 16", q_counts=_edit("q_counts", (0, 1, 0), 15)
    )
    # zero mass is refused on a T1 row with a draft...
    counts = _edit("q_counts", (0, 1, 0), 0)
    ids = _edit("q_ids", (0, 1, 0), -1)
    _refused(r"request 0, row 1: q mass 0 != denominator 16", q_counts=counts, q_ids=ids)
    # ... but allowed where the draft is -1 or the request is T0
    drafts = _edit("draft_tokens", (0, 1), -1)
    _run(_call(q_counts=counts, q_ids=ids, draft_tokens=drafts))
    _run(_call(q_counts=counts, q_ids=ids, temperature=torch.tensor([0.0, 0.0, 0.7])))
    # T1 proposal outside the support
    _refused(
        r"request 2, row 0: T1 proposal 3 has q count 0 \(not in q's support\)",
        draft_tokens=_edit("draft_tokens", (2, 0), 3),
    )
    # ... is fine for T0 (q is not used)
    _run(
        _call(
            draft_tokens=_edit("draft_tokens", (1, 0), 0), temperature=torch.tensor([1.0, 0.0, 0.7])
        )
    )


def _dense_q() -> torch.Tensor:
    dense = torch.zeros((B, K, V))
    dense[..., 1] = 0.5
    dense[..., 2] = 0.25
    dense[..., 5] = 0.125
    dense[..., 6] = 0.125
    return dense


def _dense_refused(pattern: str, dense: torch.Tensor) -> None:
    _refused(pattern, q_ids=None, q_counts=None, denominator=None, q_dense=dense)


def test_dense_q_rules() -> None:
    dense = _dense_q()
    dense[2, 0, 3] = float("nan")
    _dense_refused(r"request 2, row 0: q_dense\[token 3\] = nan; expected finite", dense)
    dense = _dense_q()
    dense[0, 1, 0] = -0.25
    dense[0, 1, 7] = 0.25
    _dense_refused(
        r"request 0, row 1: q_dense\[token 0\] = -0.25; expected probabilities >= 0", dense
    )
    dense = _dense_q()
    dense[2, 1, 7] = 0.01
    _dense_refused(r"request 2, row 1: q_dense sums to 1.00999.*; expected 1 within 0.0001", dense)
    dense = _dense_q()
    dense[2, 0, 5] = 0.0
    dense[2, 0, 7] = 0.125
    _dense_refused(r"request 2, row 0: T1 proposal 5 has q_dense = 0.0; expected q\(x\) > 0", dense)
    # rows of a T0 request are not read: anything goes there
    dense = _dense_q()
    dense[1] = float("nan")
    _run(_call(q_ids=None, q_counts=None, denominator=None, q_dense=dense))
    _dense_refused(r"q_dense has shape \(3, 2, 7\)", _dense_q()[..., :7])


def _random_violations(seed: int) -> ChainInputs:
    """A batch whose rows break the sparse rules in random places (and many rows don't)."""
    generator = torch.Generator().manual_seed(seed)
    batch, drafts, vocab, slots = 64, 3, 40, 5
    ids = torch.stack(
        [torch.randperm(vocab, generator=generator)[:slots] for _ in range(batch * drafts)]
    ).reshape(batch, drafts, slots)
    counts = torch.full((batch, drafts, slots), 4, dtype=torch.int64)
    proposals = ids[..., 0].clone()
    edit = torch.randint(0, 6, (batch, drafts), generator=generator)
    ids[..., 1] = torch.where(edit == 1, ids[..., 2], ids[..., 1])  # duplicate id
    counts[..., 3] = torch.where(edit == 2, -4, counts[..., 3])  # negative count
    ids[..., 4] = torch.where(edit == 3, vocab + 3, ids[..., 4])  # id out of range
    counts[..., 2] = torch.where(edit == 4, 5, counts[..., 2])  # mass != C
    proposals = torch.where(edit == 5, (ids[..., 0] + 1) % vocab, proposals)  # outside q
    return ChainInputs(
        torch.zeros((batch, drafts + 1, vocab)),
        proposals.to(torch.int32),
        torch.ones(batch),
        torch.arange(batch, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        q_ids=ids.to(torch.int32),
        q_counts=counts.to(torch.int32),
        denominator=20,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sliced_validation_equals_one_piece(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation reads q in request slices; any slice size gives the same masks/message."""
    import pp3kernels.validate as validate

    inputs = _random_violations(seed)
    whole = [(v.kind, v.mask.clone()) for v in validate.draft_violations(inputs)]
    with pytest.raises(SelectorInputError) as one_piece:
        validate_chain_inputs(inputs)
    monkeypatch.setattr(validate, "VALIDATION_CHUNK_ELEMENTS", 7)  # one request per slice
    sliced = [(v.kind, v.mask) for v in validate.draft_violations(inputs)]
    assert [k for k, _ in whole] == [k for k, _ in sliced]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(whole, sliced, strict=True))
    assert sum(int(m.sum()) for _, m in sliced) > 10  # the batch really breaks rules
    with pytest.raises(SelectorInputError) as in_slices:
        validate_chain_inputs(inputs)
    assert str(in_slices.value) == str(one_piece.value)


_MEMORY_PROBE = """
import resource, sys, torch
from pp3kernels.interface import ChainInputs
from pp3kernels.validate import validate_chain_inputs
torch.set_num_threads(1)
form, batch, drafts, vocab, slots = sys.argv[1], *map(int, sys.argv[2:])
logits = torch.zeros((1, drafts + 1, vocab), dtype=torch.bfloat16).expand(batch, -1, -1)
ids = (torch.arange(slots, dtype=torch.int32) * 7 % vocab)[None, None].expand(batch, drafts, -1)
draft = ids[:, :, 0].contiguous()
common = (draft, torch.ones(batch), torch.arange(batch), torch.zeros(batch, dtype=torch.int64))
if form == "sparse":
    counts = torch.full((1, 1, slots), 4, dtype=torch.int32).expand(batch, drafts, -1)
    inputs = ChainInputs(logits, *common, q_ids=ids, q_counts=counts, denominator=4 * slots)
else:
    row = torch.zeros(vocab)
    row[draft[0, 0]] = 1.0
    inputs = ChainInputs(logits, *common, q_dense=row[None, None].expand(batch, drafts, -1))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
validate_chain_inputs(inputs)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.parametrize(
    ("form", "shape"),
    [("sparse", (10_000, 5, 2048, 1024)), ("dense", (200, 5, 129_280, 1))],
    ids=["sparse-broadcast", "dense-broadcast"],
)
def test_validation_of_broadcast_q_stays_in_bounded_memory(
    form: str, shape: tuple[int, int, int, int]
) -> None:
    """Stride-0 q of 5e7 (sparse) / 1.3e8 (dense) entries: validating it in one piece grew
    the peak RSS by ~2.7 / ~2.3 GiB (int64 / fp64 temporaries of the whole q); in slices
    it stays a few hundred MiB."""
    assert form == "dense" or shape[3] * 7 % shape[2] != 0  # distinct support ids
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, form, *map(str, shape)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    grown = int(result.stdout.split()[-1])
    assert grown < 600 << 20, f"validation grew the peak RSS by {grown / 2**20:.0f} MiB"
