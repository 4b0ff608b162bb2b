"""Host-side Philox behaviour a mutation campaign over ``pp3kernels/philox.py`` found unpinned.

The default counter index of a per-row draw, the shape and device checks of the Triton
known-answer wrapper, a batch of one counter through it, and the mismatch report.
"""

from __future__ import annotations

import pytest
import torch

import pp3kernels.philox as philox
from pp3kernels.contract import STREAM_ACCEPT
from pp3kernels.philox import KAT_VECTORS, row_counter, triton_philox4x32
from pp3kernels.runtime import is_interpreter


def _device() -> str:
    if is_interpreter():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("needs TRITON_INTERPRET=1 or a CUDA GPU")


def test_a_per_row_counter_has_index_0() -> None:
    """contract.py: "index = 0 for a per-row draw", so row_counter's default index is 0
    (counter (0, rowpos mod 2^32, rowpos >> 32, stream))."""
    c0, c1, c2, c3 = row_counter(torch.tensor([2**32 + 3]), 2, STREAM_ACCEPT)
    assert [c0.tolist(), c1.tolist(), c2.tolist(), c3.tolist()] == [[0], [5], [1], [1]]


def test_one_counter_through_triton_is_computed() -> None:
    """N = 1 is a real batch (only N = 0 skips the launch): each Random123 vector alone
    gives its known answer."""
    device = _device()
    for counter, key, expected in KAT_VECTORS:
        got = triton_philox4x32(
            torch.tensor([counter], device=device), torch.tensor([key], device=device)
        )
        assert got.cpu().tolist() == [list(expected)]
    empty = triton_philox4x32(
        torch.zeros((0, 4), dtype=torch.int64), torch.zeros((0, 2), dtype=torch.int64)
    )
    assert empty.shape == (0, 4)


@pytest.mark.parametrize(
    ("counters", "keys"),
    [((3, 3), (3, 2)), ((3, 4), (3, 3)), ((3, 4), (2, 2)), ((12,), (3, 2)), ((3, 4, 1), (3, 2))],
)
def test_triton_philox_refuses_each_malformed_shape(
    counters: tuple[int, ...], keys: tuple[int, ...]
) -> None:
    """Any one of the three shape rules broken (counters [N, 4], keys [N, 2]) is refused
    before launch with a ValueError naming both shapes."""
    with pytest.raises(ValueError) as refusal:
        triton_philox4x32(
            torch.zeros(counters, dtype=torch.int64), torch.zeros(keys, dtype=torch.int64)
        )
    assert str(refusal.value) == (
        f"expected counters [N, 4] and keys [N, 2], got {counters} and {keys}"
    )


def test_triton_philox_refuses_keys_on_another_device() -> None:
    """Counters and keys on different devices are refused by name, before launch."""
    with pytest.raises(ValueError, match="^counters on cpu but keys on meta$"):
        triton_philox4x32(
            torch.zeros((2, 4), dtype=torch.int64),
            torch.zeros((2, 2), dtype=torch.int64, device="meta"),
        )


def test_a_kat_mismatch_names_counter_key_and_both_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong answer is reported as one line per vector, words in 8-digit hex; vectors
    that match give no line."""
    (counter, key, right), *others = KAT_VECTORS
    wrong = (right[0] ^ 1, *right[1:])
    monkeypatch.setattr(philox, "KAT_VECTORS", ((counter, key, wrong), *others))
    assert philox.torch_philox_kat() == [
        "philox4x32-10 counter 00000000 00000000 00000000 00000000 key 00000000 00000000: "
        "got 6627e8d5 e169c58d bc57ac4c 9b00dbd8, expected 6627e8d4 e169c58d bc57ac4c 9b00dbd8"
    ]
