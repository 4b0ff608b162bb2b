"""The guard: lock, affinity, nice, threads, read-only NVML, detach into a private tmux."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pynvml
import pytest
import torch

from pp3cli.cli.options import RUN_PARAMETERS
from pp3cli.receipts.write import canonical_json
from pp3cli.run.detach import _detach_environment, start_detached
from pp3cli.run.errors import EnvironmentProblem, UsageProblem
from pp3cli.run.guard import (
    GuardOptions,
    format_cpu_list,
    guard_options,
    guarded,
    parse_cpu_list,
)
from pp3cli.run.locks import device_lock_name, hold_scratch, lock_dir
from pp3cli.run.power import PowerReading, read_power
from pp3cli.run.scratch import (
    MARKER_NAME,
    RUN_TAG,
    RUNS_DIR,
    ensure_scratch,
    has_marker,
    new_run_dir,
    tmux_socket,
)
from pp3cli.run.settings import Settings

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pp3cli.run.guard import GuardOptions, guarded
    from pp3cli.run.settings import Settings
    settings = Settings(scratch=Path(sys.argv[1]), receipts=Path("r"))
    with guarded("holder-command", settings, GuardOptions(threads=1), require_gpu=False):
        print("held", flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(scratch=tmp_path / "scratch", receipts=tmp_path / "receipts")


def quiet_options(**overrides: Any) -> GuardOptions:
    """Options that do not renice the test process (the guard can never lower it again)."""
    return GuardOptions(nice=os.nice(0), threads=2, **overrides)


@pytest.fixture
def lock_holder(settings: Settings) -> Iterator[subprocess.Popen[str]]:
    """A second process running guarded (holding this host's device lock) until stdin closes.

    Its scratch root is its own, not ``settings.scratch``: the device lock does not depend
    on the scratch folder.
    """
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(settings.scratch.parent / "holder-scratch")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held", "lock holder did not start"
    yield holder
    holder.stdin.close()
    holder.wait(timeout=30)


class FakeNvml:
    """A fake NVML: fixed readings, and every setter recorded and refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit_mw: int) -> None:
        self.setter_calls: list[str] = []
        self.limit_mw = limit_mw  # what every later reading returns
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        for name in dir(pynvml):
            if name.startswith(("nvmlDeviceSet", "nvmlSet")):
                monkeypatch.setattr(pynvml, name, self._refuse(name))
        readings = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda index: f"handle-{index}",
            "nvmlSystemGetDriverVersion": lambda: "555.42",
            "nvmlDeviceGetName": lambda handle: "Fake H200",
            "nvmlDeviceGetPowerManagementLimit": lambda handle: self.limit_mw,
            "nvmlDeviceGetEnforcedPowerLimit": lambda handle: self.limit_mw,
        }
        for name, function in readings.items():
            monkeypatch.setattr(pynvml, name, function)

    def _refuse(self, name: str) -> Any:
        def setter(*args: Any, **kwargs: Any) -> None:
            self.setter_calls.append(name)
            raise AssertionError(f"pp3 called the NVML setter {name}")

        return setter


def test_cpu_list_syntax() -> None:
    assert parse_cpu_list("0-6:3, 1") == [0, 1, 3, 6]
    assert parse_cpu_list("3-3") == [3]
    assert parse_cpu_list("0-6:3, 1") == [0, 1, 3, 6]
    assert format_cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    for bad in ("a-b", "3-1", "", "-2", "0-4:0"):
        with pytest.raises(UsageProblem) as err:
            parse_cpu_list(bad)
        assert err.value.exit_code == 2, err.value


def test_cpus_that_do_not_exist_are_refused_with_exit_2(settings: Settings) -> None:
    missing = max(os.sched_getaffinity(0)) + 4096
    with pytest.raises(UsageProblem) as err:
        guard_options(f"0,{missing}", 19, 8, None, False)
    assert err.value.exit_code == 2
    assert str(missing) in str(err.value), str(err.value)
    ran = []
    with pytest.raises(UsageProblem) as err:
        with guarded("test", settings, quiet_options(cpus=str(missing)), require_gpu=False):
            ran.append(True)
    assert err.value.exit_code == 2 and not ran, str(err.value)


@pytest.mark.parametrize(
    ("nice", "threads", "power", "fragment"),
    [
        (20, 8, None, "--nice 20"),
        (-21, 8, None, "--nice -21"),
        (19, 0, None, "--threads 0"),
        (19, 8, -5.0, "-5.0"),
        (19, 8, 0.0, "--expect-power-limit 0.0"),
    ],
)
def test_bad_guard_options_exit_2(
    nice: int, threads: int, power: float | None, fragment: str
) -> None:
    with pytest.raises(UsageProblem) as err:
        guard_options(None, nice, threads, power, False)
    assert err.value.exit_code == 2 and fragment in str(err.value), str(err.value)


def test_guard_options_at_their_edges_are_kept() -> None:
    assert guard_options("0", -20, 1, 0.5, True) == GuardOptions("0", -20, 1, 0.5, True)
    assert guard_options(None, 19, 1, None, False) == GuardOptions(threads=1)


def test_guard_options_default_to_the_commands_defaults() -> None:
    """A guard built in code (a distributed rank's, a test's) runs as the CLI's would."""
    defaults = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    keys = ("cpus", "nice", "threads", "expect_power_limit", "detach")
    assert GuardOptions() == guard_options(*(defaults[key] for key in keys))


@pytest.mark.parametrize(("expected_w", "passes"), [(700.5, True), (699.6, True), (700.6, False)])
def test_the_power_limit_matches_within_half_a_watt(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, expected_w: float, passes: bool
) -> None:
    FakeNvml(monkeypatch, limit_mw=700_000)
    ran = []
    options = quiet_options(expect_power_limit=expected_w)
    if passes:
        with guarded("power", settings, options, require_gpu=False):
            ran.append(True)
        assert ran == [True]
    else:
        with pytest.raises(EnvironmentProblem, match="GPU power limit is 700 W, expected 700.6 W"):
            with guarded("power", settings, options, require_gpu=False):
                ran.append(True)
        assert ran == []


def test_a_detached_parents_run_folder_is_used_only_if_it_is_this_commands_in_runs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PP3_RUN_DIR names the folder a detached parent prepared; a folder of another command,
    or a marked copy outside the scratch root's runs, is not written into."""
    prepared = new_run_dir(settings, "probe")
    other_command = new_run_dir(settings, "oracle")
    elsewhere = tmp_path / "elsewhere" / prepared.name
    shutil.copytree(prepared, elsewhere)
    assert has_marker(elsewhere, RUN_TAG)
    for inherited, used in [(prepared, True), (other_command, False), (elsewhere, False)]:
        monkeypatch.setenv("PP3_RUN_DIR", str(inherited))
        with guarded("probe", settings, quiet_options(), require_gpu=False) as record:
            run_dir = record.run_dir
        assert (run_dir == inherited) is used, (inherited, run_dir)
        assert run_dir.parent == ensure_scratch(settings) / RUNS_DIR


def test_a_rank_without_the_host_lock_records_the_lock_its_local_rank_0_holds(
    settings: Settings,
) -> None:
    with guarded("qualify", settings, quiet_options(lock=False), require_gpu=False) as record:
        name = device_lock_name(None, cuda_available=record.cuda_available)
        assert record.lock_path == lock_dir() / f"{name}.lock"


def test_guarded_runs_share_the_scratch_root(settings: Settings) -> None:
    """A run holds the scratch root shared: a second rank's guard (no host lock) runs beside
    it; only clean-scratch, which holds it exclusive, is refused meanwhile."""
    with guarded("qualify", settings, quiet_options(), require_gpu=False) as first:
        with guarded("qualify", settings, quiet_options(lock=False), require_gpu=False) as rank:
            assert rank.run_dir != first.run_dir
        with pytest.raises(EnvironmentProblem, match="another pp3 is running"):
            with hold_scratch(ensure_scratch(settings), "clean-scratch", exclusive=True):
                pass


def test_the_power_limit_after_is_read_at_exit_and_then_kept(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml(monkeypatch, limit_mw=700_000)
    with guarded("power", settings, quiet_options(), require_gpu=False) as record:
        nvml.limit_mw = 650_000  # someone else changed it during the run
        assert record.environment()["power_limit_after_w"] == 650.0
        nvml.limit_mw = 600_000
    nvml.limit_mw = 500_000  # after the run: not this run's reading
    environment = record.environment()
    assert environment["power_limit_before_w"] == 700.0
    assert environment["power_limit_after_w"] == 600.0


def test_an_inherited_affinity_is_recorded_and_restored(settings: Settings) -> None:
    """Without --cpus the guard leaves the affinity this process has (here one CPU, narrower
    than what other processes may have), records it, and restores it on exit."""
    before = os.sched_getaffinity(0)
    cpu = max(before)
    os.sched_setaffinity(0, {cpu})
    try:
        with guarded("affinity", settings, quiet_options(), require_gpu=False) as record:
            assert record.environment()["affinity"] == [cpu]
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)


def test_lock_held_by_another_process_fails_at_once_naming_it(
    settings: Settings, lock_holder: subprocess.Popen[str]
) -> None:
    # The contender is a process of its own too, so that a guard that waited for the lock
    # fails this test by its timeout instead of hanging it.
    contender = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from pp3cli.run.errors import Pp3Error
        from pp3cli.run.guard import GuardOptions, guarded
        from pp3cli.run.settings import Settings
        settings = Settings(scratch=Path({str(settings.scratch)!r}), receipts=Path("r"))
        started = time.monotonic()
        try:
            with guarded("second", settings, GuardOptions(threads=1), require_gpu=False):
                print("RAN")
        except Pp3Error as err:
            print(err.exit_code, f"{{time.monotonic() - started:.3f}}", err, sep="\\n")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", contender], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    code, waited, message = done.stdout.strip().split("\n", 2)
    assert code == "3", done.stdout
    assert f"pid {lock_holder.pid}" in message and "holder-command" in message, message
    assert "RAN" not in done.stdout
    assert float(waited) < 5.0, f"the guard waited {waited} s for the lock instead of failing"


def test_guard_applies_and_restores_affinity_threads_and_writes_lock_info(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    affinity_before = os.sched_getaffinity(0)
    threads_before = torch.get_num_threads()
    cpu = min(affinity_before)
    with guarded("apply", settings, quiet_options(cpus=str(cpu)), require_gpu=False) as record:
        assert os.sched_getaffinity(0) == {cpu}
        assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "2"
        assert torch.get_num_threads() == 2
        info = orjson.loads(record.lock_path.read_bytes())
        assert info["pid"] == os.getpid() and info["command"] == "apply", info
        assert info["holder"] and info["argv"] and info["device"].startswith(("host-", "gpu-"))
        assert has_marker(record.run_dir, "pp3-run"), record.run_dir
        environment = record.environment()
    assert os.sched_getaffinity(0) == affinity_before
    assert os.environ["OMP_NUM_THREADS"] == "5" and "MKL_NUM_THREADS" not in os.environ
    assert torch.get_num_threads() == threads_before
    assert record.lock_path.read_bytes() == b""  # emptied, never unlinked
    assert environment["affinity"] == [cpu] and environment["threads"] == 2
    assert environment["interpreter"] == (os.environ.get("TRITON_INTERPRET") == "1")
    assert environment["torch"] and environment["python"] and environment["lock_path"]
    canonical_json(environment)  # JSON-safe: raises on anything else


@pytest.mark.parametrize(("above_start", "above_target"), [(0, 19), (3, 8), (5, 5), (8, 3)])
def test_guard_raises_niceness_in_a_fresh_process_and_never_lowers_it(
    settings: Settings, above_start: int, above_target: int
) -> None:
    """A child starts this many steps above the niceness it inherits (the suite's own may
    already be raised: in-process commands run at --nice 19) and asks the guard for a target
    this many above it; inside, both the process and the record are at the larger of the two.
    Where the inherited niceness is 19 already, every case is 19."""
    inherited = os.nice(0)
    start, target = min(inherited + above_start, 19), min(inherited + above_target, 19)
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from pp3cli.run.guard import GuardOptions, guarded
        from pp3cli.run.settings import Settings
        os.nice({start} - os.nice(0))
        settings = Settings(scratch=Path({str(settings.scratch)!r}), receipts=Path("r"))
        options = GuardOptions(nice={target}, threads=1)
        with guarded("nice", settings, options, require_gpu=False) as rec:
            print(os.nice(0), rec.environment()["nice"])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    inside = str(max(start, target))
    assert done.stdout.split() == [inside, inside], (inherited, start, target, done.stdout)


def test_power_limit_mismatch_exits_3_before_work(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml(monkeypatch, limit_mw=700_000)
    ran = []
    with pytest.raises(EnvironmentProblem) as err:
        with guarded("power", settings, quiet_options(expect_power_limit=225.0), require_gpu=False):
            ran.append(True)
    message = str(err.value)
    assert err.value.exit_code == 3 and "700 W" in message and "225 W" in message, message
    assert not ran and nvml.setter_calls == []


def test_nvml_is_only_read_and_recorded(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml(monkeypatch, limit_mw=225_000)
    with guarded(
        "power", settings, quiet_options(expect_power_limit=225.0), require_gpu=False
    ) as record:
        inside = record.environment()
    after = record.environment()
    assert nvml.setter_calls == []
    assert inside["power_limit_before_w"] == 225.0 and inside["power_limit_after_w"] == 225.0
    assert after["power_limit_after_w"] == 225.0 and after["driver"] == "555.42"
    assert after["gpu_name"] == (
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "Fake H200"
    )


def test_without_nvml_the_power_limit_is_null(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with guarded("nonvml", settings, quiet_options(), require_gpu=False) as record:
        pass
    environment = record.environment()
    assert environment["power_limit_before_w"] is None
    assert environment["power_limit_after_w"] is None
    assert "NVML unavailable" in environment["nvml_error"], environment
    with pytest.raises(EnvironmentProblem) as err:
        with guarded(
            "nonvml", settings, quiet_options(expect_power_limit=225.0), require_gpu=False
        ):
            pass
    assert err.value.exit_code == 3 and "cannot be read" in str(err.value), str(err.value)


def test_require_gpu_without_a_gpu_exits_3(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    with pytest.raises(EnvironmentProblem) as err:
        with guarded("gpu-only", settings, quiet_options(), require_gpu=True):
            ran.append(True)
    assert err.value.exit_code == 3 and str(err.value).startswith("no GPU: "), str(err.value)
    assert not ran


def test_scratch_root_and_run_folders_carry_markers(settings: Settings, tmp_path: Path) -> None:
    root = ensure_scratch(settings)
    assert has_marker(root, "pp3-scratch-root")
    assert ensure_scratch(settings) == root  # idempotent
    run = new_run_dir(settings, "probe")
    assert run.parent == root / "runs" and run.name.startswith("probe-")
    assert has_marker(run, "pp3-run") and not has_marker(run, "pp3-scratch-root")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "theirs.txt").write_text("not pp3's")
    with pytest.raises(UsageProblem) as err:
        ensure_scratch(Settings(scratch=foreign, receipts=tmp_path))
    assert err.value.exit_code == 2 and MARKER_NAME in str(err.value), str(err.value)


def test_detach_runs_the_command_in_pp3s_private_tmux(settings: Settings) -> None:
    tmux = shutil.which("tmux")
    assert tmux is not None, "tmux is missing: run `bash .ci/install-system.sh` (it installs tmux)"
    settings.receipts.mkdir()
    printed = start_detached("verify-receipts", settings, ["verify-receipts", "--detach"])
    root = ensure_scratch(settings)
    socket = tmux_socket(root)
    (run,) = sorted((root / "runs").iterdir())
    session = f"pp3-{run.name}"
    try:
        assert f"attach -t {session}" in printed and str(run / "log") in printed, printed
        waited = subprocess.run(
            [tmux, "-S", str(socket), "wait-for", f"{session}-done"], timeout=120, check=False
        )
        assert waited.returncode == 0
        log = (run / "log").read_text()
        assert f"no receipts in {settings.receipts.resolve()}" in log, log
        assert "finished with exit status 0" in log, log
        assert (run / "exit_status").read_text().strip() == "0"
        killed = subprocess.run(
            [tmux, "-S", str(socket), "kill-session", "-t", session],
            capture_output=True,
            text=True,
            check=False,
        )
        assert killed.returncode == 0, killed.stderr
    finally:
        subprocess.run([tmux, "-S", str(socket), "kill-server"], capture_output=True, check=False)


# ---- Tests that kill mutants the suite missed (a mutation campaign, 2026-12-05)


def test_the_limit_in_force_is_the_enforced_one_else_the_management_one() -> None:
    assert PowerReading(enforced_w=650.0, management_w=700.0).limit_w == 650.0
    assert PowerReading(enforced_w=0.0, management_w=700.0).limit_w == 0.0
    assert PowerReading(management_w=700.0).limit_w == 700.0
    assert PowerReading().limit_w is None


def test_power_is_read_in_watts_from_the_device_cuda_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml(monkeypatch, limit_mw=700_000)
    asked: list[int] = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", lambda handle: 650_000)

    def by_index(index: int) -> str:
        asked.append(index)
        return f"h{index}"

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", by_index)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: f"Fake {handle}".encode())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 1 ,0")
    reading = read_power(cuda_available=False)
    assert (reading.gpu_name, reading.driver, reading.error) == ("Fake h1", "555.42", None)
    assert (reading.management_w, reading.enforced_w, reading.limit_w) == (700.0, 650.0, 650.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3c")  # a UUID: NVML's first device
    assert read_power(cuda_available=False).gpu_name == "Fake h0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # beyond NVML's two devices
    missing = read_power(cuda_available=False)
    assert missing.error == "NVML sees no GPU" and missing.gpu_name is None
    assert missing.driver == "555.42"
    assert asked == [1, 0], "no handle is asked for a device NVML does not have"
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: SimpleNamespace(uuid=f"{1111 * (index + 1)}"),  # cuda:0 is "1111"
    )
    by_uuid: list[str] = []

    def handle_by_uuid(uuid: str) -> str:
        by_uuid.append(uuid)
        return "by-uuid"

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", handle_by_uuid)
    assert read_power(cuda_available=True).gpu_name == "Fake by-uuid"
    assert by_uuid == ["GPU-1111"]

    def unknown(uuid: str) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", unknown)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert read_power(cuda_available=True).gpu_name == "Fake h1", "an unknown UUID: by index"
    assert fake.setter_calls == []


def test_an_unreadable_limit_is_named_and_the_other_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeNvml(monkeypatch, limit_mw=500_000)

    def unreadable(handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerManagementLimit", unreadable)
    reading = read_power(cuda_available=False)
    assert reading.management_w is None and reading.enforced_w == 500.0
    assert reading.error is not None and "management limit unreadable" in reading.error


def test_a_detached_run_takes_the_launching_shells_variables_and_pp3s_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/opt/bin:/usr/bin")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.setenv("PP3_ZETA", "kept")
    monkeypatch.setenv("PP3_SCRATCH", "/elsewhere")  # replaced by the run's own
    monkeypatch.setenv("OTHER_TOOL", "not forwarded")
    root, run_dir = tmp_path / "root", tmp_path / "root" / "runs" / "probe-1"
    args = _detach_environment(settings, root, run_dir)
    assert args[0] == "env"
    first_assignment = next(i for i, arg in enumerate(args) if "=" in arg)
    unset = args[1:first_assignment]
    assert unset[::2] == ["-u"] * (len(unset) // 2) and "LC_ALL" in unset[1::2]
    assert "PATH" not in unset and "PATH=/opt/bin:/usr/bin" in args
    assert "PP3_ZETA=kept" in args and not any(a.startswith("OTHER_TOOL") for a in args)
    assert [a for a in args if a.startswith("PP3_SCRATCH=")] == [f"PP3_SCRATCH={root}"]
    assert args[-4:] == [
        f"PP3_SCRATCH={root}",
        f"PP3_RECEIPTS={settings.receipts.resolve()}",
        f"PP3_RUN_DIR={run_dir}",
        "PYTHONUNBUFFERED=1",
    ]


class ReachedRunFolder(Exception):
    """Detach got past its checks to the run folder (``stop_at_the_run_folder``)."""


@pytest.fixture
def stop_at_the_run_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """``start_detached`` raises ReachedRunFolder where it would make the run's folder."""

    def stop(settings: Settings, command: str) -> Path:
        raise ReachedRunFolder

    monkeypatch.setattr("pp3cli.run.detach.new_run_dir", stop)


def test_detach_refuses_a_tmux_socket_path_over_100_bytes_and_makes_a_private_folder(
    tmp_path: Path, stop_at_the_run_folder: None
) -> None:
    """The socket path may be 100 bytes (Unix sockets take 107); a byte more is refused."""
    base = tmp_path.resolve()
    bare = len(os.fsencode(tmux_socket(base / "s")))
    assert bare < 100, "pytest's tmp_path is too long for this test"
    exact = Settings(scratch=base / ("s" * (100 - bare + 1)), receipts=tmp_path / "r")
    exact.receipts.mkdir()
    for _ in range(2):  # the socket folder may already exist
        with pytest.raises(ReachedRunFolder):
            start_detached("probe", exact, ["probe", "--detach"])
    sock = tmux_socket(exact.scratch.resolve())
    assert len(os.fsencode(sock)) == 100
    assert sock.parent.stat().st_mode & 0o777 == 0o700
    over = Settings(scratch=base / ("s" * (100 - bare + 2)), receipts=exact.receipts)
    with pytest.raises(EnvironmentProblem, match="over 100 bytes"):
        start_detached("probe", over, ["probe", "--detach"])


@pytest.mark.parametrize(
    ("script", "shown"),
    [
        ("echo 'no server here' >&2; echo ignored", "no server here"),
        ("echo on stdout", "on stdout"),
    ],
)
def test_a_tmux_that_cannot_start_the_session_is_named_with_what_it_said(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str, shown: str
) -> None:
    fake = tmp_path / "tmux"
    fake.write_text(f"#!/bin/sh\n{script}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr("pp3cli.run.detach.shutil.which", lambda name: str(fake))
    settings.receipts.mkdir()
    with pytest.raises(EnvironmentProblem) as caught:
        start_detached("probe", settings, ["probe", "--detach"])
    message = str(caught.value)
    assert re.fullmatch(rf"tmux could not start session pp3-probe-\S+: {shown}\n?", message), (
        message
    )


def test_detach_shares_the_scratch_with_runs_and_is_refused_while_it_is_cleaned(
    settings: Settings, stop_at_the_run_folder: None
) -> None:
    settings.receipts.mkdir()
    root = ensure_scratch(settings)
    with hold_scratch(root, "qualify", exclusive=False), pytest.raises(ReachedRunFolder):
        start_detached("probe", settings, ["probe", "--detach"])
    with hold_scratch(root, "clean-scratch", exclusive=True):
        with pytest.raises(EnvironmentProblem, match="is held by"):
            start_detached("probe", settings, ["probe", "--detach"])
