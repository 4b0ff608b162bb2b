"""The pinned vLLM overlay: pins, refusal on mismatch, never overwritten, engine-free import."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from pp3cli.run.errors import CheckFailed, EnvironmentProblem, UsageProblem
from pp3cli.run.scratch import repo_root
from pp3cli.verifiers import overlay
from pp3cli.verifiers.vllm_mrv2 import chain_from_vllm, vllm_arguments
from pp3kernels import ChainInputs

# A tiny stand-in for the wheel: same import structure, trivially small, no vLLM code.
FAKE_ENTRY = """import torch

from vllm.triton_utils import tl, tldevice, triton
from vllm.v1.worker.gpu.sample.gumbel import helper


def rejection_sample(target_logits, draft_logits, num_speculative_steps: int):
    return helper(target_logits)
"""
FAKE_GUMBEL = """from vllm.triton_utils import tl, triton


def helper(x):
    return x.argmax(-1)
"""
FAKE_FILES = {
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py": FAKE_ENTRY.encode(),
    "vllm/v1/worker/gpu/sample/gumbel.py": FAKE_GUMBEL.encode(),
    "vllm/v1/worker/gpu/sample/__init__.py": b"import vllm.config  # engine code\n",
    "vllm/triton_utils/__init__.py": b"import vllm.envs  # engine code\n",
    "vllm/unrelated.py": b"x = 1\n",
}
FAKE_PINS = {
    path: hashlib.sha256(FAKE_FILES[path]).hexdigest()
    for path in (
        "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
        "vllm/v1/worker/gpu/sample/gumbel.py",
    )
}
EXPECTED_PARAMETERS = [
    "target_logits",
    "draft_logits",
    "draft_sampled",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "temperature",
    "seed",
    "num_speculative_steps",
    "synthetic_conditional_rates",
    "use_fp64",
    "use_block_verification",
    "contexts",
    "watermarking",
    "watermarking_skip_mask",
    "watermark_key",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
]


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


@pytest.fixture
def no_vllm_modules() -> Iterator[None]:
    """Each overlay import starts and ends without any ``vllm`` module loaded."""

    def purge() -> None:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]

    purge()
    yield
    purge()


def test_transitive_sources_follow_imports_and_skip_shims() -> None:
    files = overlay.transitive_sources(FAKE_FILES.get)
    assert files == sorted(FAKE_PINS)


def test_fetch_writes_pinned_files_shims_and_manifest(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    target = overlay.fetch_overlay(tmp_path / "scratch", wheel=wheel, pins=FAKE_PINS)
    assert target == tmp_path / "scratch" / "overlay" / "vllm-0.33.0"
    for path, data in FAKE_FILES.items():
        if path in FAKE_PINS:
            assert (target / path).read_bytes() == data
    # Package inits are pp3's empty shims, never the wheel's engine code.
    assert b"vllm.config" not in (target / "vllm/v1/worker/gpu/sample/__init__.py").read_bytes()
    assert b"vllm.envs" not in (target / "vllm/triton_utils/__init__.py").read_bytes()
    assert not (target / "vllm/unrelated.py").exists()
    manifest = overlay.verify_overlay(target, FAKE_PINS)
    assert manifest["files"] == FAKE_PINS


def test_pin_mismatch_is_refused_with_the_file_name(tmp_path: Path) -> None:
    tampered = dict(FAKE_FILES)
    tampered["vllm/v1/worker/gpu/sample/gumbel.py"] += b"# changed\n"
    wheel = make_wheel(tmp_path / "tampered.whl", tampered)
    with pytest.raises(CheckFailed, match="vllm/v1/worker/gpu/sample/gumbel.py: sha256"):
        overlay.fetch_overlay(tmp_path / "scratch", wheel=wheel, pins=FAKE_PINS)
    assert not (tmp_path / "scratch" / "overlay" / "vllm-0.33.0").exists()


def test_tampered_overlay_on_disk_is_refused_before_import(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    target = overlay.fetch_overlay(
        tmp_path, dest=tmp_path / ".overlay", wheel=wheel, pins=FAKE_PINS
    )
    assert target == tmp_path / ".overlay" / "vllm-0.33.0"
    entry = target / "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
    entry.write_bytes(entry.read_bytes() + b"\n")
    with pytest.raises(CheckFailed, match="rejection_sampler_utils.py: sha256"):
        overlay.load_vllm_rejection_sample(target, FAKE_PINS)


def test_existing_overlay_is_never_overwritten(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    first = overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS)
    marker = first / "vllm/v1/worker/gpu/sample/gumbel.py"
    before = marker.stat().st_mtime_ns
    with pytest.raises(UsageProblem, match=str(first)):
        overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS)
    assert marker.stat().st_mtime_ns == before
    second = overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS, force_new=True)
    third = overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS, force_new=True)
    assert (second.name, third.name) == ("vllm-0.33.0.2", "vllm-0.33.0.3")


def test_shims_import_a_fake_entry_without_the_engine(
    tmp_path: Path, no_vllm_modules: None
) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    target = overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS)
    function = overlay.load_vllm_rejection_sample(target, FAKE_PINS)
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    assert function(logits, None, 1).tolist() == [1]
    assert str(target) not in sys.path


def test_adapter_builds_vllm_arguments_from_chain_tensors() -> None:
    logits = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(2, 3, 5)
    drafts = torch.tensor([[4, 1], [-1, 2]], dtype=torch.int32)
    temperature = torch.tensor([0.0, 2.0])
    seed = torch.tensor([7, 8])
    position = torch.tensor([100, 200])
    kwargs = vllm_arguments(ChainInputs(logits, drafts, temperature, seed, position))
    assert kwargs["target_logits"].shape == (6, 5)
    # Request 0 is T0 (unscaled); request 1 at tau = 2 is divided by 2.
    assert torch.equal(kwargs["target_logits"][:3], logits[0])
    assert torch.equal(kwargs["target_logits"][3:], logits[1] / 2)
    assert kwargs["draft_sampled"].tolist() == [0, 4, 1, 0, -1, 2]
    assert kwargs["cu_num_logits"].tolist() == [0, 3, 6]
    assert kwargs["pos"].tolist() == [100, 101, 102, 200, 201, 202]
    assert kwargs["idx_mapping"].tolist() == [0, 1]
    assert kwargs["expanded_idx_mapping"].tolist() == [0, 0, 0, 1, 1, 1]
    assert kwargs["expanded_local_pos"].tolist() == [0, 1, 2, 0, 1, 2]
    assert kwargs["num_speculative_steps"] == 2
    assert kwargs["draft_logits"] is None
    assert kwargs["seed"].dtype == torch.int64


def test_chain_from_vllm_masks_uninitialised_entries() -> None:
    sampled = torch.tensor([[5, 6, 99], [7, 123456, -42]])
    tokens, accepted = chain_from_vllm(sampled, torch.tensor([3, 1], dtype=torch.int32))
    assert tokens.tolist() == [[5, 6, 99], [7, -1, -1]]
    assert accepted.tolist() == [2, 0]


def _local_overlay() -> Path | None:
    """``PP3_VLLM_OVERLAY``, else ``<repo>/.overlay/vllm-0.33.0``, when it holds a manifest."""
    given = os.environ.get("PP3_VLLM_OVERLAY")
    candidate = Path(given) if given else repo_root() / ".overlay" / overlay.OVERLAY_NAME
    return candidate if (candidate / overlay.MANIFEST_NAME).is_file() else None


@pytest.fixture(scope="module")
def real_overlay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real vLLM 0.33.0 overlay, never downloaded here (CI must not fetch 336 MB per run).

    From the wheel at ``PP3_VLLM_WHEEL``, else the overlay at ``PP3_VLLM_OVERLAY`` or
    ``<repo>/.overlay/vllm-0.33.0`` (`pp3 overlay fetch --dest .overlay`); skipped when
    there is none. The GPU run checks the real overlay (`pp3 qualify --verifier vllm-mrv2`).
    """
    wheel = os.environ.get("PP3_VLLM_WHEEL")
    if wheel:
        return overlay.fetch_overlay(tmp_path_factory.mktemp("real"), wheel=Path(wheel))
    found = _local_overlay()
    if found is None:
        pytest.skip("no vLLM overlay here (PP3_VLLM_WHEEL, PP3_VLLM_OVERLAY or .overlay/)")
    return found


def test_real_wheel_pins_and_signature(real_overlay: Path) -> None:
    """Imports the real module in a fresh interpreter (its `vllm` must not leak here)."""
    code = (
        "import sys, inspect; from pathlib import Path; from pp3cli.verifiers import overlay;"
        "f = overlay.load_vllm_rejection_sample(Path(sys.argv[1]));"
        "print(','.join(inspect.signature(f).parameters));"
        "print('vllm.config' in sys.modules, 'vllm.envs' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(real_overlay)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    names, engine = done.stdout.strip().splitlines()
    assert names.split(",") == EXPECTED_PARAMETERS
    assert engine == "False False"
    manifest = overlay.read_manifest(real_overlay)
    assert manifest["files"] == overlay.VLLM_PINS
    overlay.verify_overlay(real_overlay)


def test_adapter_matches_the_real_signature() -> None:
    """Every argument the adapter builds is a parameter of rejection_sample, and every
    parameter without a default is built."""
    zeros = torch.zeros(1)
    kwargs = vllm_arguments(
        ChainInputs(torch.zeros(1, 2, 3), torch.zeros(1, 1), zeros, zeros, zeros)
    )
    required = EXPECTED_PARAMETERS[:11]
    assert sorted(kwargs) == sorted(required)


REAL_IN_SUBPROCESS = """
import sys, torch
from pathlib import Path
from pp3cli.evidence.edge import check_nan_logits
from pp3cli.evidence.pairing import pair_t0
from pp3cli.verifiers.registry import resolve_spec
from pp3kernels import reference_verify_chain
from pp3kernels.runtime import is_interpreter
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
assert device.type == "cuda" or is_interpreter(), "needs a GPU or TRITON_INTERPRET=1"
vllm = resolve_spec("vllm-mrv2", root=Path("."), overlay_dir=Path(sys.argv[1])).verifier
mismatches, examples = pair_t0(reference_verify_chain, vllm, 48, device=device, seed=3, batch=48)
print(mismatches, examples)
nan = check_nan_logits(vllm, device, 0)
print(nan.passed, nan.detail)
"""


def test_real_vllm_through_the_adapter(real_overlay: Path) -> None:
    """vLLM's own Triton kernels (in Triton's interpreter on a CPU, ~0.1 s per request):
    T0 requests equal pp3's reference; a NaN row still emits a token with no status, where
    pp3's contract refuses the row (the edge battery records it as "differs")."""
    env = dict(os.environ)
    if not torch.cuda.is_available():
        from pp3cli.verifiers.vllm_mrv2 import interpreter_blocker

        blocker = interpreter_blocker()
        if blocker is not None:
            pytest.skip(blocker)
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", REAL_IN_SUBPROCESS, str(real_overlay)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    paired, nan = done.stdout.strip().splitlines()
    assert paired == "0 ()"
    assert nan.startswith("False poisoned requests report ['ok', 'ok', 'ok', 'ok']")


# ---- Tests that kill mutants a campaign over verifiers/overlay.py found surviving


class FakePip:
    """``subprocess.run`` for ``pip download``: records the call, writes the named wheels."""

    def __init__(self, code: int, stdout: str = "", stderr: str = "", wheels: tuple[str, ...] = ()):
        self.code, self.stdout, self.stderr, self.wheels = code, stdout, stderr, wheels
        self.calls: list[tuple[list[str], dict[str, object]]] = []

    def __call__(self, command: list[str], **options: object) -> subprocess.CompletedProcess[str]:
        self.calls.append((command, options))
        folder = Path(command[command.index("-d") + 1])
        for name in self.wheels:
            (folder / name).write_bytes(b"wheel")
        return subprocess.CompletedProcess(command, self.code, self.stdout, self.stderr)


def test_the_wheel_is_downloaded_alone_as_a_binary_and_the_first_one_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = FakePip(0, wheels=("vllm-0.33.0-cp38-abi3-b.whl", "vllm-0.33.0-cp38-abi3-a.whl"))
    monkeypatch.setattr("pp3cli.verifiers.overlay.subprocess.run", pip)
    assert overlay.download_wheel(tmp_path) == tmp_path / "vllm-0.33.0-cp38-abi3-a.whl"
    ((command, options),) = pip.calls
    assert command == [
        sys.executable, "-m", "pip", "download", "vllm==0.33.0", "--no-deps",
        "--only-binary=:all:", "-q", "-d", str(tmp_path),
    ]  # fmt: skip
    assert options == {"capture_output": True, "text": True, "check": False}


@pytest.mark.parametrize(
    ("pip", "shown"),
    [
        (FakePip(1, stderr="x" * 1000 + "END"), "(exit 1): " + "x" * 797 + "END;"),
        (FakePip(2, stdout="from stdout\n"), "(exit 2): from stdout;"),
        (FakePip(0), "(exit 0): ;"),  # pip said nothing and wrote no wheel
        (FakePip(1, stderr="partial", wheels=("vllm-0.33.0-x.whl",)), "(exit 1): partial;"),
    ],
    ids=["long-error", "stdout-only", "no-wheel", "failed-with-a-wheel"],
)
def test_a_failed_download_names_pips_exit_and_the_end_of_what_it_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip: FakePip, shown: str
) -> None:
    monkeypatch.setattr("pp3cli.verifiers.overlay.subprocess.run", pip)
    with pytest.raises(EnvironmentProblem) as caught:
        overlay.download_wheel(tmp_path)
    message = str(caught.value)
    assert message.startswith("pip could not download vllm==0.33.0 " + shown), message
    assert "x" * 798 not in message and message.endswith("you already have")


def test_transitive_sources_take_package_imports_and_refuse_a_missing_module() -> None:
    files = {
        "vllm/a.py": b"from vllm.pkg import thing\nimport vllm.pkg.sub\n",
        "vllm/pkg/__init__.py": b"",
        "vllm/pkg/sub.py": b"from vllm.gone import x\n",
    }
    with pytest.raises(CheckFailed, match=r"vLLM module vllm\.gone \(vllm/gone\.py\) is not in"):
        overlay.transitive_sources(files.get, entry="vllm.a")
    files["vllm/pkg/sub.py"] = b"y = 2\n"
    assert overlay.transitive_sources(files.get, entry="vllm.a") == ["vllm/a.py", "vllm/pkg/sub.py"]


def test_pins_are_computed_from_the_wheels_bytes(tmp_path: Path) -> None:
    assert overlay.compute_pins(make_wheel(tmp_path / "fake.whl", FAKE_FILES)) == FAKE_PINS


def test_the_overlay_gets_a_shim_for_every_package_and_a_manifest_of_the_wheel(
    tmp_path: Path,
) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    dest = tmp_path / "deep" / "er" / "overlays"  # its parents do not exist yet
    target = overlay.fetch_overlay(tmp_path, dest=dest, wheel=wheel, pins=FAKE_PINS)
    manifest = overlay.read_manifest(target)
    assert sorted(manifest["shims"]) == [
        "vllm/__init__.py",
        "vllm/triton_utils/__init__.py",
        "vllm/v1/__init__.py",
        "vllm/v1/worker/__init__.py",
        "vllm/v1/worker/gpu/__init__.py",
        "vllm/v1/worker/gpu/sample/__init__.py",
        "vllm/v1/worker/gpu/spec_decode/__init__.py",
    ]
    assert manifest["wheel"] == {
        "name": "fake.whl",
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
    }
    written = (target / overlay.MANIFEST_NAME).read_bytes()
    assert written == orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)


def test_probe_looks_in_the_scratch_overlay_then_the_working_folders(tmp_path: Path) -> None:
    assert overlay.default_overlay_candidates(tmp_path) == [
        tmp_path / "overlay" / "vllm-0.33.0",
        Path(".overlay") / "vllm-0.33.0",
    ]


def test_the_overlay_comes_first_and_only_another_vllm_already_imported_is_refused(
    tmp_path: Path, no_vllm_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", FAKE_FILES)
    target = overlay.fetch_overlay(tmp_path, wheel=wheel, pins=FAKE_PINS)
    decoy = tmp_path / "decoy"
    (decoy / "vllm").mkdir(parents=True)
    (decoy / "vllm" / "__init__.py").write_text("raise ImportError('the decoy vllm')\n")
    monkeypatch.syspath_prepend(str(decoy))  # another vllm on the path: the overlay goes first
    first = overlay.load_vllm_rejection_sample(target, FAKE_PINS)
    again = overlay.load_vllm_rejection_sample(target, FAKE_PINS)  # its own vllm is loaded now
    assert again is first
    sys.modules["vllm"].__file__ = str(decoy / "vllm" / "__init__.py")
    with pytest.raises(EnvironmentProblem, match="a different vllm is already imported from"):
        overlay.load_vllm_rejection_sample(target, FAKE_PINS)


# ---- Tests that kill mutants a campaign over verifiers/vllm_mrv2.py found surviving


def _chain(
    logits: torch.Tensor, drafts: list[list[int]], tau: list[float], **q: object
) -> ChainInputs:
    batch = logits.shape[0]
    zeros = torch.zeros(batch, dtype=torch.int64)
    return ChainInputs(
        logits,
        torch.tensor(drafts, dtype=torch.int32),
        torch.tensor(tau),
        zeros,
        zeros,
        **q,  # type: ignore[arg-type]
    )


def test_vllm_gets_row_contiguous_logits_from_a_strided_view() -> None:
    base = torch.randn(2, 3, 5, 4)
    logits = base[..., 1]  # [2, 3, 5], last stride 4
    for tau in ([0.0, 1.0], [0.5, 1.0]):
        flat = vllm_arguments(_chain(logits, [[0, 1], [2, 3]], tau))["target_logits"]
        assert flat.stride(-1) == 1 and flat.shape == (6, 5)
        divisor = torch.tensor(tau).where(torch.tensor(tau) != 0, torch.ones(2))
        assert torch.equal(flat, (logits / divisor[:, None, None]).reshape(6, 5))


@pytest.mark.parametrize(
    ("version", "blocked"),
    [("2.4.0", True), ("2.3.9", False), ("3.0.0", True), ("1.26.4", False), ("2.10.1", True)],
)
def test_the_interpreter_blocker_starts_at_numpy_2_4(
    monkeypatch: pytest.MonkeyPatch, version: str, blocked: bool
) -> None:
    from pp3cli.verifiers.vllm_mrv2 import interpreter_blocker

    monkeypatch.setattr(np, "__version__", version)
    reason = interpreter_blocker()
    assert (reason is not None) == blocked
    assert reason is None or f"numpy {version} (runtime loop bounds" in reason


def test_point_mass_drafts_read_q_on_valid_proposals_only() -> None:
    from pp3cli.verifiers.vllm_mrv2 import point_mass_drafts

    logits = torch.zeros(2, 3, 4)
    assert point_mass_drafts(_chain(logits, [[0, 1], [2, -1]], [1.0, 1.0]))  # no q: one-hot
    dense = torch.zeros(2, 2, 4)
    dense[0, 0, 0] = dense[0, 1, 1] = dense[1, 0, 2] = 1.0
    dense[1, 1] = 0.25  # behind an invalid proposal: never read
    assert point_mass_drafts(_chain(logits, [[0, 1], [2, -1]], [1.0, 1.0], q_dense=dense))
    dense[0, 0, 0], dense[0, 0, 3] = 0.5, 0.5  # proposal 0 at half its mass
    assert not point_mass_drafts(_chain(logits, [[0, 1], [2, -1]], [1.0, 1.0], q_dense=dense))
    ids = torch.tensor([[[0, -1], [3, 1]], [[2, 1], [0, 3]]], dtype=torch.int32)
    counts = torch.tensor([[[8, 0], [0, 8]], [[8, 0], [4, 4]]], dtype=torch.int32)
    sparse = {"q_ids": ids, "q_counts": counts, "denominator": 8}
    assert point_mass_drafts(_chain(logits, [[0, 1], [2, -1]], [1.0, 1.0], **sparse))
    counts[0, 0] = torch.tensor([4, 0])
    ids[0, 0, 1] = 2
    counts[0, 0, 1] = 4  # proposal 0 at half, the rest on token 2
    assert not point_mass_drafts(_chain(logits, [[0, 1], [2, -1]], [1.0, 1.0], **sparse))
    unit = {"q_ids": ids[:, :, :1].clone(), "q_counts": torch.ones(2, 2, 1, dtype=torch.int32)}
    unit["q_ids"][0, 0, 0], unit["q_ids"][0, 1, 0], unit["q_ids"][1, 0, 0] = 0, 1, 2
    assert point_mass_drafts(  # C = 1: a count of one is the whole mass
        _chain(logits, [[0, 1], [2, -1]], [1.0, 1.0], **unit, denominator=1)
    )


def test_vllm_draft_logits_for_dense_q_and_for_one_hot_proposals() -> None:
    from pp3cli.verifiers.vllm_mrv2 import draft_logits_from_q

    logits = torch.zeros(2, 3, 4)
    dense = torch.zeros(2, 2, 4, dtype=torch.float64)
    dense[:, :, 1], dense[:, :, 3] = 0.5, 0.5
    got = draft_logits_from_q(_chain(logits, [[1, 3], [3, 1]], [2.0, 0.0], q_dense=dense))
    half = float(np.float32(np.log(0.5)))
    inf = float("inf")
    assert got.dtype == torch.float32 and got.shape == (2, 2, 4)
    assert got[0, 0].tolist() == [-inf, 2 * half, -inf, 2 * half]  # tau log q at tau = 2
    assert got[1, 1].tolist() == [-inf, half, -inf, half]  # T0: log q as it is
    one_hot = draft_logits_from_q(_chain(logits, [[1, 3], [0, 2]], [0.5, 1.0]))
    assert one_hot[0].tolist() == [[-inf, 0.0, -inf, -inf], [-inf, -inf, -inf, 0.0]]
    assert one_hot[1].tolist() == [[0.0, -inf, -inf, -inf], [-inf, -inf, 0.0, -inf]]


def test_untempered_logits_reach_vllm_as_a_view_and_only_tempered_ones_are_copied() -> None:
    """Module docstring: rows of requests with tau in {0, 1} go to vLLM as a view of pp3's
    logits (no [B*(K+1), V] copy, which is GiBs at a real vocabulary); only a call with some
    tau not in {0, 1} pays for the tempered copy, and that copy leaves pp3's logits alone."""
    logits = torch.randn(2, 3, 5)
    kept = logits.clone()
    for tau in ([0.0, 1.0], [1.0, 1.0], [0.0, 0.0]):
        flat = vllm_arguments(_chain(logits, [[0, 1], [2, 3]], tau))["target_logits"]
        assert flat.data_ptr() == logits.data_ptr(), tau
        assert torch.equal(flat, logits.reshape(6, 5))
    flat = vllm_arguments(_chain(logits, [[0, 1], [2, 3]], [0.5, 1.0]))["target_logits"]
    assert flat.data_ptr() != logits.data_ptr()
    assert torch.equal(flat[:3], logits[0] / 0.5) and torch.equal(flat[3:], logits[1])
    assert torch.equal(logits, kept)


def test_vllm_gets_row_contiguous_logits_from_any_vocabulary_stride() -> None:
    """pp3 takes logits of any strides: one value broadcast over V (stride 0) or every
    other column of a wider tensor (stride 2); vLLM reads rows with unit stride, so such
    logits are made contiguous, tempered or not, and keep their values."""
    broadcast = torch.randn(2, 3, 1).expand(2, 3, 5)
    every_other = torch.randn(2, 3, 10)[..., ::2]
    for logits in (broadcast, every_other):
        for tau in ([0.0, 1.0], [0.5, 1.0]):
            flat = vllm_arguments(_chain(logits, [[0, 1], [2, 3]], tau))["target_logits"]
            assert flat.stride(-1) == 1 and flat.shape == (6, 5), (logits.stride(), tau)
            divisor = torch.tensor(tau).where(torch.tensor(tau) != 0, torch.ones(2))
            assert torch.equal(flat, (logits / divisor[:, None, None]).reshape(6, 5))


def test_vllm_arguments_have_the_documented_dtypes() -> None:
    """Module docstring: vLLM's kernels get int64 tokens and positions, int32 row maps and
    cu_num_logits, fp32 temperature, int64 seeds, and the logits in their own dtype; pp3's
    int32 drafts are widened, not passed through."""
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    for tau in ([0.0, 1.0], [0.5, 2.0]):
        kwargs = vllm_arguments(_chain(logits, [[0, 1], [-1, 3]], tau))
        dtypes = {key: value.dtype for key, value in kwargs.items() if torch.is_tensor(value)}
        assert dtypes == {
            "target_logits": torch.bfloat16,
            "draft_sampled": torch.int64,
            "cu_num_logits": torch.int32,
            "pos": torch.int64,
            "idx_mapping": torch.int32,
            "expanded_idx_mapping": torch.int32,
            "expanded_local_pos": torch.int32,
            "temperature": torch.float32,
            "seed": torch.int64,
        }, tau


def test_the_vllm_verifier_returns_the_chain_result_dtypes() -> None:
    """``ChainResult``'s contract whatever vLLM's own dtypes (sampled int64, num_sampled
    int32): tokens [B, K+1] int32 padded with -1, accepted [B] int32 and status [B] int8,
    every row STATUS_OK (vLLM has no status output)."""
    from pp3cli.verifiers.vllm_mrv2 import vllm_verifier
    from pp3kernels import STATUS_OK

    def rejection_sample(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        sampled = torch.tensor([[4, 2, 7], [1, 9, 9]], dtype=torch.int64)
        return sampled, torch.tensor([3, 1], dtype=torch.int32)

    logits = torch.zeros(2, 3, 10)
    result = _chain(logits, [[4, 2], [3, 0]], [1.0, 0.0]).verify_with(
        vllm_verifier(rejection_sample)
    )
    assert result.tokens.dtype == torch.int32 and result.accepted.dtype == torch.int32
    assert result.status.dtype == torch.int8
    assert result.tokens.tolist() == [[4, 2, 7], [1, -1, -1]]
    assert result.accepted.tolist() == [2, 0]
    assert result.status.tolist() == [STATUS_OK, STATUS_OK]
