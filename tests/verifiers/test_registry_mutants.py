"""``pp3cli.verifiers.registry``: the names pp3 knows and the clear errors that list them.

From the mutation campaign over ``registry.py``: an unknown name is a UsageProblem that
names the value and every name pp3 accepts (docs/verifiers.md's ``--verifier`` table).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pp3cli.run.errors import EXIT_USAGE, UsageProblem
from pp3cli.verifiers.registry import known_names, resolve_spec, resolve_verifier

HERE = Path(__file__).resolve().parent


def test_known_names_are_pp3s_own_then_the_peers() -> None:
    """Every ``--verifier`` name of docs/verifiers.md's table besides MODULE:FUNCTION."""
    assert known_names() == ["selector", "reference", "vllm-mrv2", "flashinfer"]


@pytest.mark.parametrize("name", ["nope", "vllm-mrv2", "Selector", ""])
def test_resolve_verifier_refuses_an_unknown_name_listing_its_own(name: str) -> None:
    """Only pp3's own verifiers resolve here; the error names the value and lists them."""
    expected = f"verifier {name!r} is not known; expected one of selector, reference"
    with pytest.raises(UsageProblem, match=f"^{re.escape(expected)}$") as caught:
        resolve_verifier(name)
    assert caught.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("spec", ["not a verifier", "vllm", "m:f:g", "selector "])
def test_an_unknown_spec_is_refused_naming_it_and_every_accepted_form(spec: str) -> None:
    expected = (
        f"--verifier {spec!r} is not known; expected one of "
        "selector, reference, vllm-mrv2, flashinfer or MODULE:FUNCTION"
    )
    with pytest.raises(UsageProblem, match=f"^{re.escape(expected)}$"):
        resolve_spec(spec, root=HERE)
