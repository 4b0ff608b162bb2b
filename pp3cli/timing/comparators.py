"""The probe's inputs and comparators: what is timed, on which inputs, and how it is checked.

Every comparator gets the same ``ProbeInputs`` (one ``pp3kernels.ChainInputs`` plus the
greedy path and vLLM's arguments, built once per input set) and is checked before it is
timed: statuses OK, tokens in [0, V) then -1 padding, accepted prefix = drafts, and T0 rows
equal to the greedy path (``pp3cli.evidence.greedy``), bit for bit.

Inputs (per case, see ``pp3cli.timing.cases``): synthetic already-conditioned logits
``randn * LOGIT_SCALE`` cast to the dtype, from a seeded generator on the device. Drafts
equal each row's argmax except in every third request, whose draft at position b mod K is
off by one: greedy rows accept all K drafts or stop at that mismatch. Point drafts are a
point mass (S = 1, count = C); sparse drafts spread q evenly over S ids (the draft and
S - 1 others); dense drafts are the same law as a [B, K, V] fp32 q.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pp3cli.evidence.greedy import greedy_path
from pp3cli.run.errors import EnvironmentProblem
from pp3cli.timing.cases import (
    COMPARATORS,
    LOGIT_SCALE,
    POINT_DENOMINATOR,
    SPARSE_COUNT,
    SUPPORT_STRIDE,
    ProbeCase,
    t0_mask_list,
)
from pp3kernels import (
    STATUS_OK,
    ChainInputs,
    ChainVerifier,
    reference_verify_chain,
    verify_chain,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class ProbeInputs:
    """One input set: the verifier's inputs, the T0 rows' greedy path, vLLM's arguments."""

    chain: ChainInputs
    t0_mask: torch.Tensor
    greedy_tokens: torch.Tensor
    greedy_accepted: torch.Tensor
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)


def make_inputs(case: ProbeCase, *, device: torch.device, seed: int, set_index: int) -> ProbeInputs:
    """Synthetic inputs for ``case`` (see the module docstring)."""
    from pp3cli.verifiers.vllm_mrv2 import vllm_arguments

    b, k, v = case.batch, case.depth, case.vocab
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1_000_003 + set_index)
    logits = torch.randn(b, k + 1, v, generator=generator, device=device) * LOGIT_SCALE
    logits = logits.to(DTYPES[case.dtype])
    argmax = torch.argmax(logits, dim=-1)
    drafts = argmax[:, :k].clone()
    for request in range(1, b, 3):
        step = request % k
        drafts[request, step] = (drafts[request, step] + 1) % v
    drafts = drafts.to(torch.int32)
    t0_mask = torch.tensor(t0_mask_list(b, case.t0_rows), device=device)
    temperature = torch.where(
        t0_mask, torch.zeros((), device=device), torch.ones((), device=device)
    ).to(torch.float32)
    seeds = torch.arange(b, dtype=torch.int64, device=device) + (seed << 20) + set_index * b
    position = 1000 + 7 * torch.arange(b, dtype=torch.int64, device=device)
    greedy_tokens, greedy_accepted = greedy_path(argmax, drafts)

    q_ids = q_counts = q_dense = draft_probs = None
    denominator: int | None = None
    if case.draft == "point":
        q_ids = drafts[:, :, None].contiguous()
        denominator = POINT_DENOMINATOR
        q_counts = torch.full_like(q_ids, POINT_DENOMINATOR)
    else:
        s = case.support
        offsets = torch.arange(s, dtype=torch.int64, device=device) * SUPPORT_STRIDE
        ids = (drafts.to(torch.int64)[:, :, None] + offsets) % v
        if case.draft == "sparse":
            q_ids = ids.to(torch.int32)
            denominator = s * SPARSE_COUNT
            q_counts = torch.full_like(q_ids, SPARSE_COUNT)
        draft_probs = torch.zeros(b, k, v, dtype=torch.float32, device=device)
        draft_probs.scatter_(2, ids, 1.0 / s)
        if case.draft == "dense":
            q_dense = draft_probs
    chain = ChainInputs(
        logits,
        drafts,
        temperature,
        seeds,
        position,
        q_ids=q_ids,
        q_counts=q_counts,
        denominator=denominator,
        q_dense=q_dense,
    )
    return ProbeInputs(
        chain=chain,
        t0_mask=t0_mask,
        greedy_tokens=greedy_tokens,
        greedy_accepted=greedy_accepted,
        vllm_kwargs=vllm_arguments(
            chain, draft_logits=None if draft_probs is None else torch.log(draft_probs)
        ),
    )


def check_chain(
    inputs: ProbeInputs, tokens: torch.Tensor, accepted: torch.Tensor, status: torch.Tensor | None
) -> dict[str, bool]:
    """Correctness flags of one verifier's outputs (all must be True).

    - ``status_ok``: every status is OK; vacuously True when the verifier has none.
    - ``accepted_in_range``: 0 <= accepted <= K.
    - ``tokens_valid``: the first accepted + 1 tokens are in [0, V), the rest are -1.
    - ``accepted_prefix_is_drafts``: tokens before the stop equal the drafts.
    - ``t0_equals_greedy``: T0 rows equal the greedy path, bit for bit.
    """
    vocab = inputs.chain.logits.shape[-1]
    tokens = tokens.to(torch.int64).cpu()
    accepted = accepted.to(torch.int64).cpu()
    drafts = inputs.chain.draft_tokens.to(torch.int64).cpu()
    mask = inputs.t0_mask.to(torch.bool).cpu()
    depth = drafts.shape[1]
    columns = torch.arange(depth + 1)[None, :]
    emitted = columns <= accepted[:, None]
    in_vocab = (tokens >= 0) & (tokens < vocab)
    before_stop = columns[:, :depth] < accepted[:, None]
    greedy_tokens = inputs.greedy_tokens.to(torch.int64).cpu()
    greedy_accepted = inputs.greedy_accepted.to(torch.int64).cpu()
    return {
        "status_ok": True if status is None else bool((status.cpu() == STATUS_OK).all()),
        "accepted_in_range": bool(((accepted >= 0) & (accepted <= depth)).all()),
        "tokens_valid": bool(torch.where(emitted, in_vocab, tokens == -1).all()),
        "accepted_prefix_is_drafts": bool(
            torch.where(before_stop, tokens[:, :depth] == drafts, True).all()
        ),
        "t0_equals_greedy": bool(
            (tokens[mask] == greedy_tokens[mask]).all()
            and (accepted[mask] == greedy_accepted[mask]).all()
        ),
    }


@dataclass
class Comparator:
    """A timed verifier: ``call(inputs)`` launches it; ``check`` judges its outputs.

    ``eager_call`` is the checked first run (for the selector: with host validation);
    ``normalise`` maps an output to a tuple of tensors before equality checks; ``slow``
    marks a comparator that costs milliseconds a call (one graph of input sets, the
    config's ``slow_replays`` timed replays).
    """

    name: str
    call: Callable[[ProbeInputs], Any]
    eager_call: Callable[[ProbeInputs], Any]
    check: Callable[[ProbeInputs, Any], dict[str, bool]]
    note: str = ""
    normalise: Callable[[Any], Any] = tuple
    slow: bool = False


def _check_result(inputs: ProbeInputs, result: Any) -> dict[str, bool]:
    return check_chain(inputs, result.tokens, result.accepted, result.status)


def verifier_comparator(
    name: str, verifier: ChainVerifier, *, timed: ChainVerifier | None = None, slow: bool = False
) -> Comparator:
    """A chain verifier as a comparator: ``verifier`` checked eagerly, ``timed`` in graphs.

    ``timed`` defaults to ``verifier``; pp3's own verifiers are timed with
    ``validate=False`` (host validation cannot run inside a captured graph).
    """
    in_graph = timed or verifier
    return Comparator(
        name,
        call=lambda inputs: inputs.chain.verify_with(in_graph),
        eager_call=lambda inputs: inputs.chain.verify_with(verifier),
        check=_check_result,
        slow=slow,
    )


def selector_comparator() -> Comparator:
    """``pp3kernels.verify_chain``: validated when checked, ``validate=False`` when timed."""
    return verifier_comparator(
        "selector", verify_chain, timed=functools.partial(verify_chain, validate=False)
    )


def reference_comparator() -> Comparator:
    """The eager torch reference (``pp3kernels.reference_verify_chain``): a sanity anchor."""
    timed = functools.partial(reference_verify_chain, validate=False)
    return verifier_comparator("reference", reference_verify_chain, timed=timed, slow=True)


def argmax_comparator() -> Comparator:
    """torch.argmax over [B, K+1, V] (the seed's comparator); checked against the path."""

    def call(inputs: ProbeInputs) -> torch.Tensor:
        return torch.argmax(inputs.chain.logits, dim=-1)

    def check(inputs: ProbeInputs, argmax: torch.Tensor) -> dict[str, bool]:
        tokens, accepted = greedy_path(argmax, inputs.chain.draft_tokens)
        return {
            "greedy_path_matches": bool(
                torch.equal(tokens.cpu(), inputs.greedy_tokens.cpu())
                and torch.equal(accepted.cpu(), inputs.greedy_accepted.cpu())
            )
        }

    return Comparator("argmax", call, call, check, normalise=lambda output: (output,))


def vllm_comparator(rejection_sample: Callable[..., Any], note: str) -> Comparator:
    """vLLM MRV2 rejection_sample on ``inputs.vllm_kwargs``; no status output.

    Only ``rejection_sample`` itself is timed. Its ``sampled`` entries past ``num_sampled``
    are uninitialised, so outputs go through ``chain_from_vllm`` (tokens with -1 padding,
    accepted) before any check or comparison.
    """
    from pp3cli.verifiers.vllm_mrv2 import chain_from_vllm

    def call(inputs: ProbeInputs) -> Any:
        return rejection_sample(**inputs.vllm_kwargs)

    def check(inputs: ProbeInputs, result: Any) -> dict[str, bool]:
        tokens, accepted = chain_from_vllm(*result)
        return check_chain(inputs, tokens, accepted, None)

    return Comparator(
        "vllm", call, call, check, note, normalise=lambda result: chain_from_vllm(*result)
    )


def load_comparators(
    overlay_dir: Path | None, *, require_vllm: bool, names: Sequence[str] = COMPARATORS
) -> tuple[list[Comparator], dict[str, str]]:
    """The comparators ``names`` that are available and, for the others, why not
    ("not available: <reason>"); in the order of ``COMPARATORS``."""
    makers = {
        "selector": selector_comparator,
        "argmax": argmax_comparator,
        "reference": reference_comparator,
    }
    comparators = [makers[name]() for name in COMPARATORS if name in names and name in makers]
    missing: dict[str, str] = {}
    if "vllm" in names:
        if overlay_dir is None:
            missing["vllm"] = "not available: no overlay (run `pp3 overlay fetch`)"
        else:
            from pp3cli.verifiers.overlay import load_vllm_rejection_sample

            try:
                function = load_vllm_rejection_sample(overlay_dir)
                comparators.append(vllm_comparator(function, note=f"overlay {overlay_dir}"))
            except Exception as err:  # any import/pin failure is reported, not fatal
                missing["vllm"] = f"not available: {err}"
    if require_vllm and "vllm" in missing:
        raise EnvironmentProblem(f"--require-vllm: vLLM comparator {missing['vllm']}")
    return comparators, missing
