"""A user's verifier by ``MODULE:FUNCTION``: import it, check its signature, name its source.

The contract a verifier must meet is in docs/verifiers.md: ``pp3kernels.ChainVerifier``'s
call signature (five positional tensors, then the keyword-only q arguments) and result
(``ChainResult`` or any ``(tokens, accepted, status)`` triple). This module is, with
``overlay``, one of the two places pp3 imports a module by name (``importlib``): both load
foreign code that pp3 cannot name statically.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3kernels import ChainResult, ChainVerifier

POSITIONAL = ("logits", "draft_tokens", "temperature", "seed", "position")
KEYWORDS = ("q_ids", "q_counts", "denominator", "q_dense")
SPEC = re.compile(r"(?P<module>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*):(?P<function>[A-Za-z_][\w]*)")


def is_module_spec(text: str) -> bool:
    """True when ``text`` has the ``MODULE:FUNCTION`` form (dotted module, one colon)."""
    return SPEC.fullmatch(text) is not None


def check_signature(function: Callable[..., Any], spec: str) -> None:
    """UsageProblem unless ``function`` accepts the ``ChainVerifier`` call.

    It must take the five inputs positionally and the four q arguments by keyword
    (``**kwargs`` counts); extra parameters must have defaults.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as err:
        raise UsageProblem(f"{spec}: cannot read its signature ({err})") from err
    try:
        signature.bind(*POSITIONAL, **{name: None for name in KEYWORDS})
    except TypeError as err:
        raise UsageProblem(
            f"{spec}{signature} does not accept the verifier call "
            f"f({', '.join(POSITIONAL)}, *, {'=None, '.join(KEYWORDS)}=None): {err}; "
            "see docs/verifiers.md"
        ) from err


class ModuleVerifier:
    """A ``ChainVerifier`` around a user's function: returns its result as a ``ChainResult``."""

    def __init__(self, spec: str, function: Callable[..., Any]) -> None:
        self.spec = spec
        self.function = function

    def __call__(
        self,
        logits: Any,
        draft_tokens: Any,
        temperature: Any,
        seed: Any,
        position: Any,
        *,
        q_ids: Any = None,
        q_counts: Any = None,
        denominator: int | None = None,
        q_dense: Any = None,
    ) -> ChainResult:
        """Call the user's function; its result must unpack to (tokens, accepted, status)."""
        result = self.function(
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
        try:
            tokens, accepted, status = result
        except (TypeError, ValueError) as err:
            raise UsageProblem(
                f"{self.spec} returned {type(result).__name__}; expected a ChainResult or a "
                "(tokens, accepted, status) triple (docs/verifiers.md)"
            ) from err
        return ChainResult(tokens, accepted, status)


def load_module_verifier(spec: str) -> tuple[ChainVerifier, Path | None]:
    """The verifier ``MODULE:FUNCTION`` and the file that defines it (None if not a file).

    UsageProblem for a malformed spec, a missing attribute, a non-callable or a wrong
    signature; EnvironmentProblem when the module cannot be imported (its error is quoted).
    The current directory is importable, as with ``python -m``.
    """
    matched = SPEC.fullmatch(spec)
    if matched is None:
        raise UsageProblem(
            f"--verifier {spec!r}: expected a name pp3 knows or MODULE:FUNCTION "
            "(a dotted module path, a colon, a function name)"
        )
    module_name, function_name = matched["module"], matched["function"]
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvironmentProblem(f"{spec}: cannot import {module_name} ({err})") from err
    function = getattr(module, function_name, None)
    if function is None:
        raise UsageProblem(f"{spec}: module {module_name} has no attribute {function_name!r}")
    if not callable(function):
        raise UsageProblem(f"{spec}: {function_name} is a {type(function).__name__}, not callable")
    check_signature(function, spec)
    source = getattr(module, "__file__", None)
    path = Path(source).resolve() if source else None
    return ModuleVerifier(spec, function), (path if path is not None and path.is_file() else None)
