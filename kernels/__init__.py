"""pp3kernels: an exact Triton chain verifier for speculative decoding, and its references.

Public API (see docs/selector.md and pp3kernels.contract for the exact law):

- ``verify_chain``            the Triton selector (row-tiled in the interpreter, vocabulary
                              split across programs on a GPU; one kernel source)
- ``reference_verify_chain``  plain torch implementation of the same contract
- ``sample_drafts``           draws proposals from integer q with its own Philox stream
- ``quantise_q``              float draft probabilities -> integer counts with exact mass C
- ``validate_chain_inputs``   the host validation both verifiers run before launch
"""

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
    ChainResult,
)
from pp3kernels.drafts import point_mass_q, quantise_q, sample_drafts
from pp3kernels.reference import DEFECTS, reference_verify_chain
from pp3kernels.selector import LaunchPlan, plan_launch, verify_chain
from pp3kernels.validate import SelectorInputError, validate_chain_inputs

__all__ = [
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
    "ChainResult",
    "DEFECTS",
    "LaunchPlan",
    "SelectorInputError",
    "point_mass_q",
    "quantise_q",
    "reference_verify_chain",
    "sample_drafts",
    "plan_launch",
    "validate_chain_inputs",
    "verify_chain",
]
