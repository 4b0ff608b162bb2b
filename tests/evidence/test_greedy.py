"""The greedy reference (pp3cli.evidence.greedy) against the T0 law written as a loop."""

from __future__ import annotations

import torch

from pp3cli.evidence.greedy import greedy_from_logits, greedy_path


def _loop(argmax: list[list[int]], drafts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Accept x_i while x_i == y_i; emit y at the first mismatch (or y_K); pad with -1."""
    tokens, accepted = [], []
    for y, x in zip(argmax, drafts, strict=True):
        a = 0
        while a < len(x) and x[a] == y[a]:
            a += 1
        tokens.append(y[: a + 1] + [-1] * (len(y) - a - 1))
        accepted.append(a)
    return tokens, accepted


def test_greedy_path_matches_the_law_on_random_chains() -> None:
    gen = torch.Generator().manual_seed(11)
    for batch, depth, vocab in [(1, 1, 2), (7, 5, 3), (64, 4, 2), (5, 0, 4)]:
        argmax = torch.randint(0, vocab, (batch, depth + 1), generator=gen, dtype=torch.int32)
        drafts = torch.randint(-1, vocab, (batch, depth), generator=gen, dtype=torch.int32)
        drafts[0, :] = argmax[0, :depth]  # one chain accepted whole: the bonus token
        tokens, accepted = greedy_path(argmax, drafts)
        want_tokens, want_accepted = _loop(argmax.tolist(), drafts.tolist())
        assert tokens.dtype == accepted.dtype == torch.int32
        assert tokens.tolist() == want_tokens and accepted.tolist() == want_accepted
        assert accepted[0] == depth


def test_a_match_after_a_mismatch_is_not_accepted() -> None:
    argmax = torch.tensor([[4, 5, 6, 7]], dtype=torch.int32)
    drafts = torch.tensor([[4, 9, 6]], dtype=torch.int32)
    tokens, accepted = greedy_path(argmax, drafts)
    assert tokens.tolist() == [[4, 5, -1, -1]] and accepted.tolist() == [1]


def test_greedy_from_logits_takes_the_lowest_id_on_ties_and_signed_zeros() -> None:
    logits = torch.tensor(
        [[[1.0, 3.0, 3.0], [-0.0, 0.0, -1.0], [2.0, 2.0, 2.0]]], dtype=torch.bfloat16
    )
    tokens, accepted = greedy_from_logits(logits, torch.tensor([[1, 0]], dtype=torch.int32))
    assert tokens.tolist() == [[1, 0, 0]] and accepted.tolist() == [2]
