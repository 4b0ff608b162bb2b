"""``pp3cli.verifiers.external``: a user's ``MODULE:FUNCTION`` adapter, loaded and checked.

From the mutation campaign over ``external.py``. Grounded in docs/verifiers.md ("The
contract for MODULE:FUNCTION") and the module's docstrings: the signature is checked with
``inspect.signature`` before anything runs, every refusal is a clear error naming the
value, the current directory is importable as with ``python -m``, the result may be a
``ChainResult`` or any ``(tokens, accepted, status)`` triple, and the source is the file
that defines the module (None if not a file).
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pp3cli.run.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentProblem, UsageProblem
from pp3cli.verifiers.external import ModuleVerifier, check_signature, load_module_verifier
from pp3kernels import ChainResult

CALL = (
    "f(logits, draft_tokens, temperature, seed, position, *, "
    "q_ids=None, q_counts=None, denominator=None, q_dense=None)"
)


def _exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def _documented(
    logits: Any,
    draft_tokens: Any,
    temperature: Any,
    seed: Any,
    position: Any,
    *,
    q_ids: Any = None,
    q_counts: Any = None,
    denominator: Any = None,
    q_dense: Any = None,
) -> Any:
    return None


@pytest.fixture
def in_memory(monkeypatch: pytest.MonkeyPatch) -> Callable[..., types.ModuleType]:
    """Registers a module object in ``sys.modules`` (undone after the test)."""

    def make(name: str, **attributes: Any) -> types.ModuleType:
        module = types.ModuleType(name)
        for key, value in attributes.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    return make


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("already", ["", "cwd"])
def test_an_importable_current_folder_is_not_added_again(
    already: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_memory: Callable[..., types.ModuleType],
) -> None:
    """The current directory is made importable only when it is not already: ``""`` on
    ``sys.path`` (as with ``python -m``) or its own path there leaves ``sys.path`` alone."""
    in_memory("users_sampler_cwd_once", verify=_documented)
    monkeypatch.chdir(tmp_path)
    entry = "" if already == "" else str(tmp_path)
    others = [p for p in sys.path if p not in ("", str(tmp_path))]
    monkeypatch.setattr(sys, "path", [entry, *others])
    before = list(sys.path)
    load_module_verifier("users_sampler_cwd_once:verify")
    assert sys.path == before


def test_a_module_whose_file_is_not_a_file_binds_no_source(
    tmp_path: Path, in_memory: Callable[..., types.ModuleType]
) -> None:
    """``(None if not a file)``: a ``__file__`` that names no file binds nothing."""
    in_memory("users_sampler_gone", verify=_documented, __file__=str(tmp_path / "gone.py"))
    verifier, path = load_module_verifier("users_sampler_gone:verify")
    assert path is None and callable(verifier)
    (tmp_path / "gone.py").write_text("")
    assert load_module_verifier("users_sampler_gone:verify")[1] == tmp_path / "gone.py"


@pytest.mark.parametrize("spec", ["not a verifier", "m:f:g", "1m:f", "m.:f", ":f"])
def test_a_malformed_spec_is_a_usage_problem_naming_it(spec: str) -> None:
    expected = (
        f"--verifier {spec!r}: expected a name pp3 knows or MODULE:FUNCTION "
        "(a dotted module path, a colon, a function name)"
    )
    with pytest.raises(UsageProblem, match=_exactly(expected)):
        load_module_verifier(spec)


def test_an_unimportable_module_is_an_environment_problem_quoting_its_error(
    in_memory: Callable[..., types.ModuleType],
) -> None:
    expected = (
        "no_such_module_pp3_x:verify: cannot import no_such_module_pp3_x "
        "(No module named 'no_such_module_pp3_x')"
    )
    with pytest.raises(EnvironmentProblem, match=_exactly(expected)) as caught:
        load_module_verifier("no_such_module_pp3_x:verify")
    assert caught.value.exit_code == EXIT_ENVIRONMENT


def test_a_missing_or_uncallable_attribute_is_a_usage_problem_naming_it(
    in_memory: Callable[..., types.ModuleType],
) -> None:
    in_memory("users_sampler_attrs", verify=_documented, DENOMINATOR=1 << 16, nothing=None)
    with pytest.raises(
        UsageProblem,
        match=_exactly(
            "users_sampler_attrs:missing: module users_sampler_attrs has no attribute 'missing'"
        ),
    ) as caught:
        load_module_verifier("users_sampler_attrs:missing")
    assert caught.value.exit_code == EXIT_USAGE
    with pytest.raises(
        UsageProblem,
        match=_exactly("users_sampler_attrs:DENOMINATOR: DENOMINATOR is a int, not callable"),
    ):
        load_module_verifier("users_sampler_attrs:DENOMINATOR")


# ---------------------------------------------------------------- the signature


def test_a_wrong_signature_is_refused_showing_it_and_the_documented_call() -> None:
    def two(logits: Any, drafts: Any) -> None:
        return None

    expected = (
        f"m:two{inspect.signature(two)} does not accept the verifier call {CALL}: "
        "too many positional arguments; see docs/verifiers.md"
    )
    with pytest.raises(UsageProblem, match=_exactly(expected)):
        check_signature(two, "m:two")


def test_an_unreadable_signature_is_a_usage_problem() -> None:
    class Opaque:
        __signature__ = "not a signature"

        def __call__(self, *args: Any, **kwargs: Any) -> None:
            return None

    with pytest.raises(UsageProblem, match=r"^m:opaque: cannot read its signature \(.+\)$"):
        check_signature(Opaque(), "m:opaque")


def test_extra_parameters_need_defaults_and_q_arguments_may_not_be_positional_only() -> None:
    def extra_default(
        a: Any, b: Any, c: Any, d: Any, e: Any, *args: Any, tag: str = "x", **q: Any
    ) -> None:
        return None

    def extra_required(a: Any, b: Any, c: Any, d: Any, e: Any, *, tag: str, **q: Any) -> None:
        return None

    def positional_only_q(
        a: Any, b: Any, c: Any, d: Any, e: Any, q_ids: Any = None, /, **rest: Any
    ) -> None:
        return None

    check_signature(extra_default, "m:extra_default")
    check_signature(_documented, "m:documented")
    with pytest.raises(UsageProblem, match="missing a required argument: 'tag'"):
        check_signature(extra_required, "m:extra_required")
    with pytest.raises(UsageProblem, match="does not accept the verifier call"):
        check_signature(positional_only_q, "m:positional_only_q")


# ---------------------------------------------------------------- calling it


def test_the_call_passes_every_argument_and_wraps_a_triple_as_a_chain_result() -> None:
    seen: dict[str, Any] = {}
    tokens, accepted, status = torch.zeros(1, 2), torch.zeros(1), torch.zeros(1)

    def record(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seen["args"], seen["kwargs"] = args, kwargs
        return tokens, accepted, status

    result = ModuleVerifier("m:record", record)(1, 2, 3, 4, 5, q_ids=6, q_counts=7, q_dense=9)
    assert seen == {
        "args": (1, 2, 3, 4, 5),
        "kwargs": {"q_ids": 6, "q_counts": 7, "denominator": None, "q_dense": 9},
    }
    assert type(result) is ChainResult
    assert result.tokens is tokens and result.accepted is accepted and result.status is status
    ModuleVerifier("m:record", record)(1, 2, 3, 4, 5, denominator=8)
    assert seen["kwargs"]["denominator"] == 8


@pytest.mark.parametrize(
    ("returned", "kind"), [(None, "NoneType"), ((1, 2), "tuple"), ([1, 2, 3, 4], "list")]
)
def test_a_result_that_is_not_a_triple_is_a_usage_problem_naming_its_type(
    returned: Any, kind: str
) -> None:
    def bad(*args: Any, **kwargs: Any) -> Any:
        return returned

    expected = (
        f"m:bad returned {kind}; expected a ChainResult or a (tokens, accepted, status) "
        "triple (docs/verifiers.md)"
    )
    with pytest.raises(UsageProblem, match=_exactly(expected)):
        ModuleVerifier("m:bad", bad)(1, 2, 3, 4, 5)
