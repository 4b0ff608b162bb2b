"""FlashInfer 0.7.2.post1's chain sampler, called in request slices: a ``MODULE:FUNCTION``
verifier for ``pp3 qualify --verifier bench.flashinfer_sliced:verify``.

Why this file exists. ``pp3 qualify --verifier flashinfer`` (``pp3cli.verifiers.flashinfer``)
hands FlashInfer one call's requests at once, and FlashInfer takes dense probabilities:
target [B, K+1, V+1] and draft [B, K, V+1] in fp32. The strict profile's ``split_vocab``
target calls with B = 2^19 requests at V = 32768, K = 2: about 200 GB of target
probabilities, more than an H200 holds. The adapter's fix (slicing, as the vLLM adapter
does) changes a file under ``pp3cli/``, which every receipt of this round binds by hash;
this wrapper measures FlashInfer's law now without touching those sources.

What it does. The same mapping as ``pp3cli.verifiers.flashinfer`` (imported, not copied),
applied to slices of at most ``SLICE_ELEMENTS`` target-probability elements. Slicing
changes which Philox subsequence a request gets (FlashInfer keys it by the row's index in
the call) but not the law: every request still gets its own subsequence within a call and
its own offset (its position) across calls.

What it binds. Importing it refuses any FlashInfer other than ``PINNED_VERSION`` whose
chain-law files (``LAW_FILES``) differ from ``PINNED_LAW_DIGESTS``; this file is hashed
into the receipt as the verifier's source, so the pins are part of what a reviewer checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pp3cli.verifiers.flashinfer import (
    LAW_FILES,
    flashinfer_verifier,
    law_digests,
    load_chain_speculative_sampling,
)
from pp3kernels import ChainInputs, ChainResult

PINNED_VERSION = "0.7.2.post1"
PINNED_LAW_DIGESTS = {
    "sampling.py": "ce794984221a9909499799d5723cd49867339ff7405bac9de98af0f70711c6d3",
    "data/csrc/sampling.cu": "41df79df3c8a3ed6a07101c599977d413e9c9e2df555d977ca83f714cc04361c",
    "data/include/flashinfer/sampling.cuh": (
        "28d40dfdbfe07d7c0ddf9ca6464c2f24ef9bbb7e2b732283e6c24ccd7a8e7f9a"
    ),
}
# At most this many fp32 elements of target probabilities per FlashInfer call (512 MiB).
SLICE_ELEMENTS = 1 << 27

_function, _found = load_chain_speculative_sampling()
_digests = law_digests(Path(_found["file"]).parent)
if _found["version"] != PINNED_VERSION or _digests != PINNED_LAW_DIGESTS:
    raise ImportError(
        f"bench.flashinfer_sliced is pinned to FlashInfer {PINNED_VERSION} with law files "
        f"{sorted(PINNED_LAW_DIGESTS)} at the digests it lists; found {_found['version']} "
        f"with {_digests} ({LAW_FILES})"
    )
_whole_call = flashinfer_verifier(_function)
print(f"bench.flashinfer_sliced: FlashInfer {_found['version']} from {_found['file']}", flush=True)


def verify(
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
    """FlashInfer's chain sampler over slices of the batch, outputs concatenated in order."""
    inputs = ChainInputs(
        logits,
        draft_tokens,
        temperature,
        seed,
        position,
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=denominator,
        q_dense=q_dense,
    )
    batch, rows, vocab = (int(size) for size in logits.shape)
    step = max(1, SLICE_ELEMENTS // (rows * (vocab + 1)))
    parts: list[Any] = []
    for start in range(0, max(batch, 1), step):
        parts.append(inputs.select(slice(start, start + step)).verify_with(_whole_call))
    return ChainResult(
        torch.cat([part.tokens for part in parts]),
        torch.cat([part.accepted for part in parts]),
        torch.cat([part.status for part in parts]),
    )
