"""NVML reading a mutation campaign over ``pp3cli/run/power.py`` found unpinned (2026-12-05):
each way NVML can be missing or fail gives a reading of None fields whose ``error`` names
the step, NVML is shut down exactly when it was started, and nothing is ever set.

No GPU needed: NVML is a fake (the real ``pynvml`` module with its functions replaced).
"""

from __future__ import annotations

import sys
from typing import Any

import pynvml
import pytest

from pp3cli.run.power import read_power


class Nvml:
    """A fake NVML with one GPU: readings in mW, init/shutdown counted, setters refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[str] = []
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        for name in dir(pynvml):
            if name.startswith(("nvmlDeviceSet", "nvmlSet")):
                monkeypatch.setattr(pynvml, name, self._setter(name))
        self.replace("nvmlInit", lambda: None)
        self.replace("nvmlShutdown", lambda: None)
        self.replace("nvmlDeviceGetCount", lambda: 1)
        self.replace("nvmlDeviceGetHandleByIndex", lambda index: f"h{index}")
        self.replace("nvmlSystemGetDriverVersion", lambda: b"580.159.04")
        self.replace("nvmlDeviceGetName", lambda handle: b"NVIDIA H200")
        self.replace("nvmlDeviceGetPowerManagementLimit", lambda handle: 700_000)
        self.replace("nvmlDeviceGetEnforcedPowerLimit", lambda handle: 650_500)

    def replace(self, name: str, function: Any) -> None:
        """``pynvml.name`` becomes ``function``, each call recorded by name."""

        def recorded(*args: Any) -> Any:
            self.calls.append(name)
            return function(*args)

        self.monkeypatch.setattr(pynvml, name, recorded)

    def fail(self, name: str, error: BaseException) -> None:
        """``pynvml.name`` raises ``error``."""

        def raises(*args: Any) -> None:
            raise error

        self.replace(name, raises)

    def _setter(self, name: str) -> Any:
        def setter(*args: Any) -> None:
            self.calls.append(name)
            raise AssertionError(f"pp3 called the NVML setter {name}")

        return setter

    def count(self, name: str) -> int:
        return self.calls.count(name)

    def setters(self) -> list[str]:
        return [c for c in self.calls if c.startswith(("nvmlDeviceSet", "nvmlSet"))]


def _not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_a_full_reading_starts_nvml_once_and_shuts_it_down_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Names and driver decoded from bytes, mW read as W; NVML's init is reference counted,
    so each init is paired with one shutdown."""
    nvml = Nvml(monkeypatch)
    reading = read_power(cuda_available=False)
    assert (reading.gpu_name, reading.driver, reading.error) == ("NVIDIA H200", "580.159.04", None)
    assert (reading.management_w, reading.enforced_w, reading.limit_w) == (700.0, 650.5, 650.5)
    assert (nvml.count("nvmlInit"), nvml.count("nvmlShutdown")) == (1, 1)
    assert nvml.setters() == []


def test_without_nvidia_ml_py_every_field_is_none_and_the_error_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine without the nvidia-ml-py package: a reading, not an exception."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    reading = read_power(cuda_available=False)
    assert reading.error is not None and reading.error.startswith("nvidia-ml-py missing: ")
    assert "pynvml" in reading.error, "the import's own message follows"
    assert (reading.gpu_name, reading.driver, reading.limit_w) == (None, None, None)


@pytest.mark.parametrize(
    "error",
    [pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), OSError("libnvidia-ml.so.1: no such")],
    ids=["nvml-error", "os-error"],
)
def test_an_nvml_that_does_not_start_is_unavailable_and_not_shut_down(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """nvmlInit failing with NVML's own error or any other (a missing libnvidia-ml): the
    error is named, and no shutdown is sent for an init that did not happen."""
    nvml = Nvml(monkeypatch)
    nvml.fail("nvmlInit", error)
    reading = read_power(cuda_available=False)
    assert reading.error == f"NVML unavailable: {error}"
    assert (reading.gpu_name, reading.driver, reading.limit_w) == (None, None, None)
    assert nvml.count("nvmlShutdown") == 0


@pytest.mark.parametrize("step", ["nvmlSystemGetDriverVersion", "nvmlDeviceGetCount"])
def test_a_failed_query_is_named_and_nvml_still_shut_down(
    monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """An NVML error while finding the device or reading the driver: "NVML query failed",
    nothing after it read, and the shutdown still sent."""
    nvml = Nvml(monkeypatch)
    nvml.fail(step, _not_supported())
    reading = read_power(cuda_available=False)
    assert reading.error == f"NVML query failed: {_not_supported()}"
    assert (reading.gpu_name, reading.management_w, reading.enforced_w) == (None, None, None)
    assert nvml.count("nvmlShutdown") == 1


def test_an_unreadable_enforced_limit_is_named_and_the_management_limit_is_in_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The enforced limit's own error message; the limit in force falls back to the
    management limit, the rest of the reading kept."""
    nvml = Nvml(monkeypatch)
    nvml.fail("nvmlDeviceGetEnforcedPowerLimit", _not_supported())
    reading = read_power(cuda_available=False)
    assert reading.error == f"enforced power limit unreadable: {_not_supported()}"
    assert (reading.enforced_w, reading.management_w, reading.limit_w) == (None, 700.0, 700.0)
    assert (reading.gpu_name, reading.driver) == ("NVIDIA H200", "580.159.04")


def test_an_unreadable_management_limit_is_named_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = Nvml(monkeypatch)
    nvml.fail("nvmlDeviceGetPowerManagementLimit", _not_supported())
    reading = read_power(cuda_available=False)
    assert reading.error == f"power management limit unreadable: {_not_supported()}"
    assert (reading.enforced_w, reading.management_w, reading.limit_w) == (650.5, None, 650.5)


def test_a_failing_shutdown_does_not_spoil_the_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = Nvml(monkeypatch)
    nvml.fail("nvmlShutdown", pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED))
    reading = read_power(cuda_available=False)
    assert (reading.gpu_name, reading.limit_w, reading.error) == ("NVIDIA H200", 650.5, None)
