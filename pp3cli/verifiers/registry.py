"""Verifiers by name: the ones ``pp3 qualify`` and ``pp3 oracle`` can judge, and the controls.

Every entry is a ``pp3kernels.ChainVerifier``. ``selector`` is the Triton kernel
(``pp3kernels.verify_chain``), ``reference`` the plain torch implementation of the same
contract. ``planted_defect_controls`` gives the negative controls: the reference with one
planted defect each (``pp3kernels.DEFECTS``), which a qualification must catch.
"""

from __future__ import annotations

import enum
import functools

from pp3cli.run.errors import UsageProblem
from pp3kernels import ChainVerifier


class VerifierName(str, enum.Enum):
    """The verifiers pp3 knows by name."""

    selector = "selector"
    reference = "reference"


def resolve_verifier(name: str) -> ChainVerifier:
    """The verifier called ``name``; UsageProblem listing the known names otherwise."""
    if name == VerifierName.selector:
        from pp3kernels import verify_chain

        return verify_chain
    if name == VerifierName.reference:
        from pp3kernels import reference_verify_chain

        return reference_verify_chain
    known = ", ".join(member.value for member in VerifierName)
    raise UsageProblem(f"verifier {name!r} is not known; expected one of {known}")


def planted_defect_controls() -> dict[str, ChainVerifier]:
    """{defect: the torch reference with that one defect planted}, in ``DEFECTS`` order."""
    from pp3kernels import DEFECTS, reference_verify_chain

    return {defect: functools.partial(reference_verify_chain, defect=defect) for defect in DEFECTS}
