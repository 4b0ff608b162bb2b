"""Shared test helpers: the interpreter flag and the device fixture (Triton's own pattern)."""

from __future__ import annotations

import os

import pytest
import torch


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, set outside)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def device() -> str:
    """ "cuda" when a CUDA GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"
