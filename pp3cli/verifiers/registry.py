"""Verifiers by name: the ones ``pp3 qualify`` and ``pp3 oracle`` can judge, and the controls.

Every entry is a ``pp3kernels.ChainVerifier``. ``selector`` is the Triton kernel
(``pp3kernels.verify_chain``), ``reference`` the plain torch implementation of the same
contract. ``planted_defect_controls`` gives the negative controls: the reference with one
planted defect each (``pp3kernels.DEFECTS``), which a qualification must catch.

``resolve_spec`` also knows the peers' samplers (``PeerName``: vLLM MRV2 through the pinned
overlay, FlashInfer when installed) and a user's ``MODULE:FUNCTION``; it returns a
``ResolvedVerifier`` that names the files a receipt must bind (docs/verifiers.md).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3kernels import ChainVerifier

OVERLAY_SOURCE_PREFIX = "overlay/"
"""Receipt source names of pinned overlay files: ``overlay/<overlay name>/<path in wheel>``."""


class VerifierName(str, enum.Enum):
    """The verifiers pp3 knows by name."""

    selector = "selector"
    reference = "reference"


class PeerName(str, enum.Enum):
    """Other engines' samplers pp3 can judge through an adapter."""

    vllm_mrv2 = "vllm-mrv2"
    flashinfer = "flashinfer"


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


@dataclass(frozen=True)
class ResolvedVerifier:
    """A verifier ready to judge, and what its receipt must say about it.

    ``own`` is True for pp3's own verifiers (whose edge battery is part of their contract
    and decides with the law tests); peers and user modules are judged by the law tests
    alone, their edge checks recorded as "meets pp3's contract" or "differs".
    ``sources`` are files to hash into the receipt under the given names (the verifier's
    own code outside pp3's tree); ``details`` is the receipt's description.
    """

    spec: str
    verifier: ChainVerifier
    own: bool
    sources: Mapping[str, Path] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)


def known_names() -> list[str]:
    """Every name ``resolve_spec`` accepts besides MODULE:FUNCTION."""
    return [member.value for member in VerifierName] + [member.value for member in PeerName]


def _source_name(path: Path, root: Path) -> str:
    """Repo-relative posix path when ``path`` lies under ``root``, else its absolute path."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(root.resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def _vllm(overlay_dir: Path | None, candidates: Iterable[Path]) -> ResolvedVerifier:
    from pp3cli.verifiers.overlay import (
        ENTRY_FUNCTION,
        ENTRY_MODULE,
        VLLM_PINS,
        find_overlay,
        load_vllm_rejection_sample,
    )
    from pp3cli.verifiers.vllm_mrv2 import vllm_verifier

    found = overlay_dir or find_overlay(candidates)
    if found is None:
        raise EnvironmentProblem(
            "--verifier vllm-mrv2 needs the pinned vLLM overlay: run `pp3 overlay fetch` "
            "or pass --overlay DIR"
        )
    function = load_vllm_rejection_sample(found)  # verifies every pin first
    manifest_name = found.resolve().name
    sources = {
        f"{OVERLAY_SOURCE_PREFIX}{manifest_name}/{path}": found / path for path in sorted(VLLM_PINS)
    }
    details = {
        "kind": "vllm-overlay",
        "entry": f"{ENTRY_MODULE}.{ENTRY_FUNCTION}",
        "overlay": manifest_name,
        "pins": dict(sorted(VLLM_PINS.items())),
    }
    return ResolvedVerifier("vllm-mrv2", vllm_verifier(function), False, sources, details)


def _flashinfer() -> ResolvedVerifier:
    from pp3cli.verifiers.flashinfer import (
        ENTRY,
        flashinfer_verifier,
        law_digests,
        load_chain_speculative_sampling,
    )

    function, found = load_chain_speculative_sampling()
    # Recorded, not re-checked by verify-receipts (a reviewer need not have FlashInfer).
    details = {
        "kind": "flashinfer",
        "entry": ENTRY,
        "version": found["version"],
        "files": law_digests(Path(found["file"]).parent),
    }
    return ResolvedVerifier("flashinfer", flashinfer_verifier(function), False, {}, details)


def resolve_spec(
    spec: str,
    *,
    root: Path,
    overlay_dir: Path | None = None,
    overlay_candidates: Iterable[Path] = (),
) -> ResolvedVerifier:
    """The verifier ``spec`` names: a ``VerifierName``, a ``PeerName`` or ``MODULE:FUNCTION``.

    ``root`` is the source tree (a user module inside it is named repo-relative in the
    receipt, so that ``verify-receipts`` can re-hash it). UsageProblem for an unknown
    name; EnvironmentProblem when a peer is not available here.
    """
    if spec in (member.value for member in VerifierName):
        return ResolvedVerifier(spec, resolve_verifier(spec), True, {}, {"kind": "pp3"})
    if spec == PeerName.vllm_mrv2:
        return _vllm(overlay_dir, overlay_candidates)
    if spec == PeerName.flashinfer:
        return _flashinfer()
    from pp3cli.verifiers.external import is_module_spec, load_module_verifier

    if not is_module_spec(spec):
        raise UsageProblem(
            f"--verifier {spec!r} is not known; expected one of {', '.join(known_names())} "
            "or MODULE:FUNCTION"
        )
    verifier, path = load_module_verifier(spec)
    sources = {} if path is None else {_source_name(path, root): path}
    details = {"kind": "module", "entry": spec}
    return ResolvedVerifier(spec, verifier, False, sources, details)


def planted_defect_controls() -> dict[str, ChainVerifier]:
    """{defect: the torch reference with that one defect planted}, in ``DEFECTS`` order."""
    from pp3kernels import DEFECTS, reference_verify_chain

    return {defect: functools.partial(reference_verify_chain, defect=defect) for defect in DEFECTS}
