"""Reading the kernel's two draws off its outputs: the Philox counter layout, end to end.

With equal logits over V = 2^k tokens, p(x) = 1/V exactly. A request that proposes x with
integer q count n over C is then accepted iff U(seed, position) * n < C / V (exact in fp64),
and after an accept the bonus row (rowpos = position + 1) emits floor(u(seed, position + 1)
* V), every sum being an exact integer. So both uniforms can be checked against
``pp3kernels.philox`` bit for bit, on the interpreter and on the GPU alike.
"""

from __future__ import annotations

import torch

from pp3kernels.interface import ChainResult
from pp3kernels.philox import acceptance_uniform, sample_uniform


def assert_uniform_layout(
    got: ChainResult,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    counts_x: torch.Tensor,
    denominator: int,
    vocab: int,
) -> None:
    """The accepts and the bonus tokens are exactly those the contract's uniforms give."""
    coin = acceptance_uniform(seeds, positions)
    expect_accept = coin * counts_x.double() < denominator / vocab
    assert 0 < int(expect_accept.sum()) < seeds.shape[0], "every request took one branch"
    assert got.accepted.tolist() == expect_accept.long().tolist()
    accepted = expect_accept.nonzero().flatten()
    bonus_u = sample_uniform(seeds[accepted], positions[accepted] + 1)
    assert got.tokens[accepted, 1].tolist() == (bonus_u * vocab).floor().long().tolist()
