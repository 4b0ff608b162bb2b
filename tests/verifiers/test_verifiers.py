"""``--verifier`` beyond pp3's own: MODULE:FUNCTION, the vLLM MRV2 and FlashInfer adapters
(against pure-torch stand-ins with the real signatures), the edge battery's "differs", and
``--pair-with``. All on the smoke profile, pure torch (no Triton), seconds each."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pp3cli.evidence.family import recompute_qualification
from pp3cli.evidence.pairing import homogeneity_tests
from pp3cli.evidence.profiles import PROFILES, Profile
from pp3cli.evidence.qualify import QualificationReport, run_qualification
from pp3cli.evidence.stats import g_test_homogeneity
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.verifiers import flashinfer as flashinfer_adapter
from pp3cli.verifiers import vllm_mrv2
from pp3cli.verifiers.external import check_signature, is_module_spec, load_module_verifier
from pp3cli.verifiers.flashinfer import flashinfer_arguments, flashinfer_verifier
from pp3cli.verifiers.registry import resolve_spec
from pp3cli.verifiers.slices import in_slices
from pp3cli.verifiers.vllm_mrv2 import draft_logits_from_q, point_mass_drafts, vllm_verifier
from pp3kernels import ChainInputs, ChainResult, ChainVerifier, reference_verify_chain

HERE = Path(__file__).resolve().parent
SMOKE = PROFILES["smoke"]
PAIRED = Profile("paired-test", requests=1000, tv=None, batch=512, n_greedy=400, repeats=8)
ALPHA = 1e-5


@pytest.fixture(scope="module", autouse=True)
def importable() -> Iterator[None]:
    """tests/verifiers on sys.path, as a user's module folder would be."""
    sys.path.insert(0, str(HERE))
    yield
    sys.path.remove(str(HERE))


def _qualify(
    verifier: ChainVerifier, profile: Profile = SMOKE, **kwargs: Any
) -> QualificationReport:
    return run_qualification(
        profile, verifier=verifier, device="cpu", alpha=ALPHA, seed=5, **kwargs
    )


def _predicate(report: QualificationReport) -> dict[str, Any]:
    return {"data": report.to_json(), "parameters": {"alpha": ALPHA}, "verdict": report.verdict}


# ---------------------------------------------------------------- MODULE:FUNCTION


def test_module_spec_form() -> None:
    assert is_module_spec("pkg.mod:verify") and is_module_spec("m:f")
    for text in ("m", "m:", ":f", "m:f:g", "m.:f", "1m:f", "m:f()"):
        assert not is_module_spec(text), text


def test_resolve_module_verifier_names_its_source(tmp_path: Path) -> None:
    resolved = resolve_spec("toy_verifiers:exact", root=HERE.parent.parent)
    assert not resolved.own and resolved.details == {
        "kind": "module",
        "entry": "toy_verifiers:exact",
    }
    assert list(resolved.sources) == ["tests/verifiers/toy_verifiers.py"]
    outside = resolve_spec("toy_verifiers:exact", root=tmp_path)
    assert list(outside.sources) == [str(HERE / "toy_verifiers.py")]


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ("no_such_module_pp3:f", EnvironmentProblem, "cannot import no_such_module_pp3"),
        ("toy_verifiers:missing", UsageProblem, "has no attribute 'missing'"),
        ("toy_verifiers:DENOMINATOR", UsageProblem, "not callable"),
        ("os.path:join", UsageProblem, "does not accept the verifier call"),
        ("not a verifier", UsageProblem, "MODULE:FUNCTION"),
    ],
)
def test_bad_module_specs_are_refused(spec: str, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        resolve_spec(spec, root=HERE)


def test_signature_check_accepts_kwargs_and_refuses_missing_keywords() -> None:
    def loose(a: object, b: object, c: object, d: object, e: object, **rest: object) -> None:
        return None

    def no_q(logits: object, drafts: object, tau: object, seed: object, position: object) -> None:
        return None

    check_signature(loose, "loose")
    with pytest.raises(UsageProblem, match="q_ids"):
        check_signature(no_q, "no_q")


def test_exact_module_verifier_passes_and_edges_meet_the_contract() -> None:
    verifier = resolve_spec("toy_verifiers:exact", root=HERE).verifier
    report = _qualify(verifier, controls=None, edge_decides=False)
    assert report.verdict == "PASS", (report.family.rejected, report.greedy, report.edge)
    assert report.edge_summary()["differs"] == []
    assert recompute_qualification(_predicate(report)) == ("PASS", [])


def test_planted_bug_module_verifier_fails_on_the_law() -> None:
    """Ignoring q is caught by the G-tests (not by the edge battery, which does not decide)."""
    verifier = resolve_spec("toy_verifiers:ignores_q", root=HERE).verifier
    report = _qualify(verifier, controls=None, edge_decides=False)
    assert report.verdict == "FAIL"
    assert not report.family.passed and report.family.rejected
    assert recompute_qualification(_predicate(report))[0] == "FAIL"


# ---------------------------------------------------------------- peers' adapters


def test_vllm_adapter_on_the_stand_in_passes_and_records_what_differs() -> None:
    import stand_ins

    report = _qualify(vllm_verifier(stand_ins.rejection_sample), edge_decides=False)
    assert report.verdict == "PASS", (report.family.rejected, report.greedy)
    differs = report.edge_summary()["differs"]
    # No status output: poisoned logits still emit a token; its RNG is not per request.
    assert {"nan_logits", "posinf_logits", "all_masked_logits"} <= set(differs)
    data = report.to_json()
    assert data["edge_decides"] is False and data["edge_summary"]["differs"] == differs
    assert recompute_qualification(_predicate(report)) == ("PASS", [])
    # The same outcomes would FAIL a verifier whose edge battery decides (pp3's own).
    decided = _predicate(report)
    decided["data"]["edge_decides"] = True
    assert recompute_qualification(decided)[0] == "FAIL"


def test_vllm_adapter_that_dropped_q_would_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke battery sees an adapter that sends every draft as one-hot."""
    import stand_ins

    monkeypatch.setattr(vllm_mrv2, "point_mass_drafts", lambda inputs: True)
    report = _qualify(vllm_verifier(stand_ins.rejection_sample), edge_decides=False)
    assert report.verdict == "FAIL" and not report.family.passed


def test_vllm_draft_logits_are_tau_log_q() -> None:
    logits = torch.zeros(2, 3, 4)
    drafts = torch.tensor([[1, -1], [2, 3]], dtype=torch.int32)
    ids = torch.tensor([[[1, 2], [-1, -1]], [[2, 0], [3, 0]]], dtype=torch.int32)
    counts = torch.tensor([[[3, 1], [0, 0]], [[4, 0], [4, 0]]], dtype=torch.int32)
    inputs = ChainInputs(
        logits,
        drafts,
        torch.tensor([2.0, 0.0]),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
        q_ids=ids,
        q_counts=counts,
        denominator=4,
    )
    assert not point_mass_drafts(inputs)
    draft = draft_logits_from_q(inputs)
    assert draft.shape == (2, 2, 4) and draft.dtype == torch.float32
    expected = torch.tensor([-math_inf(), 2 * np.log(0.75), 2 * np.log(0.25), -math_inf()])
    assert torch.equal(draft[0, 0], expected.float())
    assert torch.equal(draft[1, 0], torch.tensor([-math_inf(), -math_inf(), 0.0, -math_inf()]))
    point = ChainInputs(*inputs.select(slice(1, 2)).__dict__.values())
    assert point_mass_drafts(point)


def math_inf() -> float:
    return float("inf")


def test_flashinfer_adapter_on_the_stand_in_passes() -> None:
    import stand_ins

    report = _qualify(flashinfer_verifier(stand_ins.chain_speculative_sampling), edge_decides=False)
    assert report.verdict == "PASS", (report.family.rejected, report.greedy)


def test_flashinfer_adapter_slices_large_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls above SLICE_ELEMENTS go to FlashInfer in slices, outputs back in request order
    (T0 rows are deterministic, so sliced and whole calls must agree exactly there)."""
    import stand_ins

    sizes: list[int] = []

    def counting(draft: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sizes.append(int(draft.shape[0]))
        return stand_ins.chain_speculative_sampling(draft, *args, **kwargs)

    batch, k, vocab = 11, 3, 20
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(batch, k + 1, vocab, generator=generator)
    drafts = logits[:, :k].argmax(-1).to(torch.int32)
    drafts[::3, 1] = (drafts[::3, 1] + 1) % vocab
    drafts[4, 0] = -1
    call = (
        logits,
        drafts,
        torch.zeros(batch),
        torch.arange(batch, dtype=torch.int64),
        torch.arange(batch, dtype=torch.int64) * 8,
    )
    whole = flashinfer_verifier(counting)(*call)
    assert sizes == [batch]
    monkeypatch.setattr(flashinfer_adapter, "SLICE_ELEMENTS", 4 * (k + 1) * (vocab + 1))
    sliced = flashinfer_verifier(counting)(*call)
    assert sizes[1:] == [4, 4, 3]
    for got, want in zip(sliced, whole, strict=True):
        assert torch.equal(got, want)
    reference = reference_verify_chain(*call)
    assert torch.equal(sliced.tokens, reference.tokens)
    assert torch.equal(sliced.accepted, reference.accepted)


def test_flashinfer_arguments_map_invalid_proposals_to_a_rejected_pad() -> None:
    logits = torch.tensor([[[0.0, 1.0, 1.0], [2.0, 0.0, 0.0]]])
    drafts = torch.tensor([[-1]], dtype=torch.int32)
    draft, proposals, target = flashinfer_arguments(
        logits.expand(2, 2, 3),
        drafts.expand(2, 1),
        torch.tensor([1.0, 0.0]),
        q_ids=None,
        q_counts=None,
        denominator=None,
        q_dense=None,
    )
    assert proposals.tolist() == [[3], [3]]  # the pad id V
    assert draft[:, 0].tolist() == [[0.0, 0.0, 0.0, 1.0]] * 2
    assert bool((target[..., 3] == 0).all())  # p(pad) = 0: rejected with certainty
    assert target[1].tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # T0: lowest id
    assert torch.allclose(target[0, 0, :3], torch.softmax(logits[0, 0], dim=-1))


def test_flashinfer_needs_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(EnvironmentProblem, match="flashinfer-python"):
        flashinfer_adapter.load_chain_speculative_sampling()


def test_vllm_without_an_overlay_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="pp3 overlay fetch"):
        resolve_spec("vllm-mrv2", root=HERE, overlay_candidates=[tmp_path / "none"])


# ---------------------------------------------------------------- --pair-with


def test_homogeneity_g_test_accepts_one_law_and_rejects_two() -> None:
    rng = np.random.default_rng(7)
    law = np.array([0.5, 0.3, 0.15, 0.05])
    a = np.bincount(rng.choice(4, 20_000, p=law), minlength=4)
    b = np.bincount(rng.choice(4, 20_000, p=law), minlength=4)
    c = np.bincount(rng.choice(4, 20_000, p=[0.45, 0.35, 0.15, 0.05]), minlength=4)
    same = g_test_homogeneity("same", a.tolist(), b.tolist())
    other = g_test_homogeneity("other", a.tolist(), c.tolist())
    assert same.df == 3 and same.p_value > 1e-3
    assert other.p_value < 1e-5
    # Sparse outcomes pool (in index order) until every arm expects >= 20.
    pooled = g_test_homogeneity("pooled", [100, 30, 2, 1, 0], [90, 35, 6, 2, 1])
    assert pooled.cells == 2 and pooled.df == 1


def test_pairing_with_an_exact_verifier_passes_and_joins_the_holm_family() -> None:
    import toy_verifiers

    report = _qualify(
        reference_verify_chain, PAIRED, controls=None, pair_with=("exact", toy_verifiers.exact)
    )
    assert report.pairing is not None and report.verdict == "PASS"
    assert report.pairing.t0 == PAIRED.n_greedy and report.pairing.t0_mismatches == 0
    names = {test.name for test in report.pairing.tests}
    assert "pair/sparse_tails/accepted" in names and "pair/sparse_tails/final" in names
    assert names <= set(report.family.adjusted)  # one Holm family
    assert len(report.family.adjusted) == len(report.members) + len(names)
    assert recompute_qualification(_predicate(report)) == ("PASS", [])
    _assert_pairing_statistic_held_to_1e_9(report, "p_value")  # identical arms: p = 1


def _assert_pairing_statistic_held_to_1e_9(report: QualificationReport, key: str) -> None:
    """A pairing test's stored G statistic or p-value is held to a relative 1e-9, as the
    members' are (docs/receipts.md): within it is float noise, beyond it a problem."""
    for scale, flagged in ((1 + 0.75e-9, False), (1 + 1.25e-9, True)):
        tampered = _predicate(report)
        test = next(t for t in tampered["data"]["pairing"]["tests"] if t["result"][key] > 0)
        test["result"][key] *= scale
        _, problems = recompute_qualification(tampered)
        assert any(f"stored {key}" in p for p in problems) is flagged, (key, scale, problems)


def test_pairing_catches_a_t0_tie_bug_and_tampered_counts() -> None:
    import toy_verifiers

    report = _qualify(reference_verify_chain, pair_with=("ties", toy_verifiers.highest_id_on_ties))
    assert report.pairing is not None and report.pairing.t0_mismatches > 0
    assert report.greedy.mismatches == 0  # the judged verifier itself is exact
    assert report.verdict == "FAIL"
    predicate = _predicate(report)
    verdict, problems = recompute_qualification(predicate)
    assert verdict == "FAIL" and problems == []
    _assert_pairing_statistic_held_to_1e_9(report, "statistic")
    tampered = _predicate(report)
    test = tampered["data"]["pairing"]["tests"][0]
    test["first"][0] += 50
    verdict, problems = recompute_qualification(tampered)
    assert verdict == "FAIL" and any("stored statistic" in p for p in problems)


def test_homogeneity_tests_pair_by_name() -> None:
    first = {"x": np.array([30, 30]), "only": np.array([1])}
    second = {"x": np.array([31, 29])}
    (record,) = homogeneity_tests(first, second)
    assert record.name == "x" and record.first == (30, 30) and record.second == (31, 29)


def test_flashinfer_law_files_are_digested(tmp_path: Path) -> None:
    (tmp_path / "data" / "csrc").mkdir(parents=True)
    (tmp_path / "sampling.py").write_bytes(b"py")
    (tmp_path / "data" / "csrc" / "sampling.cu").write_bytes(b"cu")
    digests = flashinfer_adapter.law_digests(tmp_path)
    assert digests == {
        "sampling.py": hashlib.sha256(b"py").hexdigest(),
        "data/csrc/sampling.cu": hashlib.sha256(b"cu").hexdigest(),
    }


def test_vllm_adapter_slices_large_batches_and_keeps_request_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapter calls vLLM on bounded slices of the batch; outputs come back in order."""
    calls: list[int] = []

    def per_request(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seed = kwargs["seed"]
        rows = kwargs["num_speculative_steps"] + 1
        calls.append(int(seed.shape[0]))
        sampled = (seed[:, None] + torch.arange(rows)) % kwargs["target_logits"].shape[1]
        return sampled, (seed % rows + 1).to(torch.int32)

    batch, depth, vocab = 23, 2, 5
    inputs = ChainInputs(
        torch.zeros(batch, depth + 1, vocab),
        torch.zeros(batch, depth, dtype=torch.int32),
        torch.ones(batch),
        torch.arange(batch, dtype=torch.int64) * 7,
        torch.zeros(batch, dtype=torch.int64),
    )
    whole = inputs.verify_with(vllm_verifier(per_request))
    assert calls == [batch]
    monkeypatch.setattr(vllm_mrv2, "ADAPTER_CHUNK_ELEMENTS", 4 * (depth + 1) * vocab)
    sliced = inputs.verify_with(vllm_verifier(per_request))
    assert calls[1:] == [4, 4, 4, 4, 4, 3]
    assert all(torch.equal(a, b) for a, b in zip(whole, sliced, strict=True))


def _numbered_inputs(batch: int) -> ChainInputs:
    """A batch whose seeds number its requests (the slicing tests read them back)."""
    return ChainInputs(
        torch.zeros(batch, 2, 3),
        torch.zeros(batch, 1, dtype=torch.int32),
        torch.ones(batch),
        torch.arange(batch, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
    )


@pytest.mark.parametrize(
    ("batch", "per_request", "budget", "sizes"),
    [
        (10, 3, 7, [2, 2, 2, 2, 2]),  # budget // elements = 2 requests a call
        (5, 8, 3, [1, 1, 1, 1, 1]),  # a budget below one request still calls one at a time
        (10, 0, 4, [4, 4, 2]),  # no elements stated: the budget counts requests
        (0, 8, 3, [0]),  # an empty batch is called once
        (3, 1, 100, [3]),
    ],
)
def test_in_slices_calls_consecutive_bounded_slices_in_order(
    batch: int, per_request: int, budget: int, sizes: list[int]
) -> None:
    seen: list[list[int]] = []

    def call(inputs: ChainInputs) -> ChainResult:
        ids = inputs.seed.tolist()
        seen.append(ids)
        n = len(ids)
        return ChainResult(
            inputs.seed[:, None].repeat(1, 2), inputs.seed.to(torch.int32) % 2, torch.zeros(n)
        )

    result = in_slices(
        _numbered_inputs(batch), call, elements_per_request=per_request, budget=budget
    )
    assert [len(ids) for ids in seen] == sizes
    assert [i for ids in seen for i in ids] == list(range(batch)), "every request once, in order"
    assert result.tokens.shape == (batch, 2) and result.tokens[:, 0].tolist() == list(range(batch))
    assert result.accepted.tolist() == [i % 2 for i in range(batch)]


def test_own_verifiers_resolve_to_their_own_functions() -> None:
    from pp3kernels import verify_chain

    for spec, function in (("selector", verify_chain), ("reference", reference_verify_chain)):
        resolved = resolve_spec(spec, root=HERE)
        assert resolved.verifier is function and resolved.own, spec
        assert resolved.sources == {} and resolved.details == {"kind": "pp3"}
        with pytest.raises(dataclasses.FrozenInstanceError):
            resolved.own = False  # type: ignore[misc]


def test_an_explicit_vllm_overlay_is_bound_file_by_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pp3cli.verifiers import overlay

    loaded: list[Path] = []

    def load(found: Path) -> Any:
        loaded.append(found)
        return reference_verify_chain

    monkeypatch.setattr(overlay, "load_vllm_rejection_sample", load)
    folder = tmp_path / "vllm-9.9.9"
    resolved = resolve_spec("vllm-mrv2", root=HERE, overlay_dir=folder)
    assert loaded == [folder], "the folder given is used, not searched for"
    assert not resolved.own and resolved.spec == "vllm-mrv2"
    assert resolved.sources == {
        f"overlay/vllm-9.9.9/{path}": folder / path for path in sorted(overlay.VLLM_PINS)
    }
    assert resolved.details["overlay"] == "vllm-9.9.9"
    assert resolved.details["pins"] == dict(sorted(overlay.VLLM_PINS.items()))


def test_flashinfer_is_a_peer_with_its_version_and_law_files_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "flashinfer"
    package.mkdir()
    name = flashinfer_adapter.LAW_FILES[-1]  # a law file in a subfolder; the others absent
    (package / name).parent.mkdir(parents=True)
    (package / name).write_bytes(b"law")
    found = {"version": "0.0.test", "file": str(package / "__init__.py")}
    monkeypatch.setattr(
        flashinfer_adapter, "load_chain_speculative_sampling", lambda: (print, found)
    )
    resolved = resolve_spec("flashinfer", root=HERE)
    assert not resolved.own and resolved.sources == {}
    assert resolved.details["version"] == "0.0.test"
    assert resolved.details["files"] == {name: hashlib.sha256(b"law").hexdigest()}


def test_a_module_in_the_current_folder_is_importable_as_with_python_m(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "users_sampler_here.py").write_text("from toy_verifiers import exact as verify\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        verifier, path = load_module_verifier("users_sampler_here:verify")
    finally:
        sys.modules.pop("users_sampler_here", None)
    assert callable(verifier) and path == tmp_path / "users_sampler_here.py"
    assert str(tmp_path) in sys.path


def test_a_module_without_a_file_binds_no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("users_sampler_in_memory")
    module.verify = reference_verify_chain  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "users_sampler_in_memory", module)
    verifier, path = load_module_verifier("users_sampler_in_memory:verify")
    assert path is None
    resolved = resolve_spec("users_sampler_in_memory:verify", root=HERE)
    assert resolved.sources == {} and resolved.details["kind"] == "module" and not resolved.own


def test_flashinfer_is_called_deterministically_per_request_in_slices_of_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each slice: deterministic mode, the requests' own seeds and positions as int64, target
    probabilities of V + 1 columns (the pad), and at most SLICE_ELEMENTS of them."""
    seen: list[tuple[bool, list[int], list[int], tuple[int, ...]]] = []

    def fake(
        draft: torch.Tensor,
        proposals: torch.Tensor,
        target: torch.Tensor,
        *,
        deterministic: bool,
        seed: torch.Tensor,
        offset: torch.Tensor,
    ) -> tuple[torch.Tensor, None, torch.Tensor]:
        assert seed.dtype == offset.dtype == torch.int64
        seen.append((deterministic, seed.tolist(), offset.tolist(), tuple(target.shape)))
        rows = proposals.shape[0]
        tokens = torch.zeros(rows, proposals.shape[1] + 1, dtype=torch.int32)
        return tokens, None, torch.zeros(rows, dtype=torch.int32)

    batch, k, vocab = 7, 3, 5
    monkeypatch.setattr(flashinfer_adapter, "SLICE_ELEMENTS", 3 * (k + 1) * (vocab + 1))
    flashinfer_verifier(fake)(
        torch.zeros(batch, k + 1, vocab),
        torch.zeros(batch, k, dtype=torch.int32),
        torch.ones(batch),
        torch.arange(batch, dtype=torch.int32) + 100,
        torch.arange(batch, dtype=torch.int32) * 8,
    )
    assert seen == [
        (True, [100, 101, 102], [0, 8, 16], (3, k + 1, vocab + 1)),
        (True, [103, 104, 105], [24, 32, 40], (3, k + 1, vocab + 1)),
        (True, [106], [48], (1, k + 1, vocab + 1)),
    ]
