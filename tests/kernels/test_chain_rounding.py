"""The rounding test used on the GPU (``chain_rounding``) separates rounding from errors.

On CPU with the torch reference: every reference row is explained against the fp64
procedure (distance ~ 0), while a one-token slip of the emitted token, or a flipped
acceptance, is not explained on almost every row.
"""

from __future__ import annotations

import pytest
from chain_rounding import EPSILON, rounding_distance
from test_selector_gpu import _make_large

from pp3kernels.contract import STATUS_OK
from pp3kernels.reference import reference_verify_chain

VOCAB = 3001


@pytest.mark.parametrize("q", ["point", "sparse", "dense"])
def test_reference_is_explained_and_slips_are_not(q: str) -> None:
    args = _make_large(batch=192, drafts=3, vocab=VOCAB, seed=17, q=q, device="cpu")
    ref = reference_verify_chain(**args, validate=False)
    rows = ((args["temperature"] > 0) & (ref.status == STATUS_OK)).nonzero().flatten().tolist()
    assert len(rows) > 100
    own, slipped, flipped = [], [], []
    for b in rows:
        tokens, accepted = ref.tokens[b].tolist(), int(ref.accepted[b])
        own.append(rounding_distance(args, b, (tokens, accepted), (tokens, accepted)))
        slip = list(tokens)
        slip[accepted] = (slip[accepted] + 1) % VOCAB
        slipped.append(rounding_distance(args, b, (slip, accepted), (tokens, accepted)))
        if accepted < 3 and int(args["draft_tokens"][b, accepted]) >= 0:
            flipped.append(rounding_distance(args, b, (tokens, accepted + 1), (tokens, accepted)))
    assert all(kind == "emit" and d <= EPSILON for kind, d in own), max(d for _, d in own)
    caught = sum(d > EPSILON for _, d in slipped) / len(slipped)
    assert caught >= 0.9, f"a one-token slip passed as rounding on {1 - caught:.0%} of rows"
    assert len(flipped) > 20
    assert all(kind == "accept" for kind, _ in flipped)
    caught = sum(d > EPSILON for _, d in flipped) / len(flipped)
    assert caught >= 0.9, f"a flipped acceptance passed as rounding on {1 - caught:.0%} of rows"


@pytest.mark.parametrize("q", ["point", "dense"])
def test_interpreted_kernel_disagreements_are_all_rounding(q: str) -> None:
    """The GPU test's comparison, run on CPU with the real kernel in the interpreter."""
    from test_selector_gpu import _compare_with_reference

    t1_rows, mismatches, distances = _compare_with_reference(
        batch=16, drafts=2, q=q, requests=128, vocab=1531, device="cpu", seed=3
    )
    assert t1_rows > 50
    assert len(distances) == len(mismatches)
    assert all(distance <= EPSILON for _, distance in distances), mismatches
