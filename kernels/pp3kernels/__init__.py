"""pp3kernels: an exact Triton chain verifier for speculative decoding, and its references.

Public API (see docs/selector.md and ``pp3kernels.contract`` for the exact law):

- ``verify_chain``            the Triton selector (row-tiled in the interpreter, vocabulary
                              split across programs on a GPU; one kernel source)
- ``reference_verify_chain``  plain torch implementation of the same contract
- ``ChainInputs``, ``ChainResult``, ``ChainVerifier``  the one verifier interface
- ``sample_drafts``           draws proposals from integer q with its own Philox stream
- ``quantise_q``              float draft probabilities -> integer counts with exact mass C
- ``validate_chain_inputs``   the host validation both verifiers run before launch

The contract's constants and the interface types load without torch or Triton; the
functions that need them are imported on first use (PEP 562 ``__getattr__``), so that
``from pp3kernels import NO_TOKEN`` works on a machine that only verifies receipts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pp3kernels.contract import (
    MAX_DENOMINATOR,
    NO_TOKEN,
    STATUS_ALL_MASKED,
    STATUS_BAD_DRAFT,
    STATUS_NAMES,
    STATUS_NAN,
    STATUS_OK,
    STATUS_POSINF,
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_SAMPLE,
    SelectorInputError,
    check_denominator,
    is_power_of_two_denominator,
)
from pp3kernels.interface import ChainInputs, ChainResult, ChainVerifier

if TYPE_CHECKING:
    from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts
    from pp3kernels.reference import DEFECTS, reference_verify_chain
    from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain
    from pp3kernels.validate import validate_chain_inputs

__all__ = [
    "DEFECTS",
    "MAX_DENOMINATOR",
    "NO_TOKEN",
    "STATUS_ALL_MASKED",
    "STATUS_BAD_DRAFT",
    "STATUS_NAMES",
    "STATUS_NAN",
    "STATUS_OK",
    "STATUS_POSINF",
    "STREAM_ACCEPT",
    "STREAM_DRAFT",
    "STREAM_SAMPLE",
    "ChainInputs",
    "ChainResult",
    "ChainVerifier",
    "LaunchPlan",
    "SelectorInputError",
    "check_denominator",
    "is_power_of_two_denominator",
    "plan_launch",
    "point_mass_q",
    "quantise_q",
    "reference_verify_chain",
    "sample_drafts",
    "validate_chain_inputs",
    "verify_chain",
]


def __getattr__(name: str) -> object:
    """Load the torch/Triton half of the API on first use of one of its names."""
    if name in ("point_mass_q", "quantise_q", "sample_drafts"):
        from pp3kernels import drafts

        return getattr(drafts, name)
    if name in ("DEFECTS", "reference_verify_chain"):
        from pp3kernels import reference

        return getattr(reference, name)
    if name in ("LaunchPlan", "plan_launch", "verify_chain"):
        from pp3kernels import selector

        return getattr(selector, name)
    if name == "validate_chain_inputs":
        from pp3kernels import validate

        return getattr(validate, name)
    raise AttributeError(f"module 'pp3kernels' has no attribute {name!r}")
