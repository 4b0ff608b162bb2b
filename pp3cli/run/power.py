"""Read the GPU's identity and power limits through NVML; never change any of them.

pp3 only ever *reads* NVML: it never sets a power limit, a clock, a mode or any other
device setting. A machine without NVML (or without a GPU) gives a reading whose fields are
None and whose ``error`` says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class PowerReading:
    gpu_name: str | None = None
    driver: str | None = None
    enforced_w: float | None = None
    management_w: float | None = None
    error: str | None = None

    @property
    def limit_w(self) -> float | None:
        """The limit in force: the enforced limit, else the management limit, else None."""
        return self.enforced_w if self.enforced_w is not None else self.management_w


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_handle(pynvml: Any, cuda_available: bool) -> Any:
    """The NVML handle of the CUDA device pp3 uses (cuda:0), matched by UUID when possible."""
    if cuda_available:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
        if uuid is not None:
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except pynvml.NVMLError:
                pass
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(first) if first.isdigit() else 0
    if index >= pynvml.nvmlDeviceGetCount():
        return None
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def read_power(cuda_available: bool) -> PowerReading:
    """Read (never set) the GPU name, driver and power limits in watts; None where unknown."""
    reading = PowerReading()
    try:
        import pynvml
    except ImportError as err:
        reading.error = f"nvidia-ml-py missing: {err}"
        return reading
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError or a missing libnvidia-ml: no NVML on this machine
        reading.error = f"NVML unavailable: {err}"
        return reading
    try:
        handle = _nvml_handle(pynvml, cuda_available)
        reading.driver = _text(pynvml.nvmlSystemGetDriverVersion())
        if handle is None:
            reading.error = "NVML sees no GPU"
            return reading
        reading.gpu_name = _text(pynvml.nvmlDeviceGetName(handle))
        try:
            reading.management_w = pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
        except pynvml.NVMLError as err:
            reading.error = f"power management limit unreadable: {err}"
        try:
            reading.enforced_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        except pynvml.NVMLError as err:
            reading.error = f"enforced power limit unreadable: {err}"
    except pynvml.NVMLError as err:
        reading.error = f"NVML query failed: {err}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return reading
