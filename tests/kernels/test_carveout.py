"""pp3kernels.carveout: which kernels ask CUDA for a carveout, with what, and how often
(the driver call itself is replaced by a recorder; test_selector_gpu checks it on a GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pp3kernels import carveout


@dataclass
class _Driver:
    """Stands in for libcuda: records cuFuncSetAttribute's arguments, returns ``status``."""

    status: int = 0
    calls: list[tuple[int, int, int]] = field(default_factory=list)

    def cuFuncSetAttribute(self, function: object, attribute: int, value: object) -> int:  # noqa: N802
        self.calls.append((function.value, attribute, value.value))  # type: ignore[attr-defined]
        return self.status


@dataclass
class _Launched:
    function: object


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> _Driver:
    fake = _Driver()
    monkeypatch.setattr(carveout, "_libcuda", lambda: fake)
    monkeypatch.setattr(carveout, "_asked", {})
    return fake


def test_asks_when_a_kernels_value_changes(driver: _Driver) -> None:
    carveout.prefer_carveout(_Launched(0x1234), 100)
    carveout.prefer_carveout(_Launched(0x1234), 100)
    carveout.prefer_carveout(_Launched(0x5678), 100)
    carveout.prefer_carveout(_Launched(0x1234), 25)
    carveout.prefer_carveout(_Launched(0x1234), 100)
    carveout.prefer_carveout(_Launched(0x1234), -1)
    carveout.prefer_carveout(_Launched(0x9ABC), -1)
    # attribute 9: CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    assert driver.calls == [
        (0x1234, 9, 100),
        (0x5678, 9, 100),
        (0x1234, 9, 25),
        (0x1234, 9, 100),
        (0x1234, 9, -1),
    ]


@pytest.mark.parametrize(
    ("launched", "percent"),
    [(_Launched(0x1234), -1), (_Launched(None), 100), (None, 100), (_Launched("0x1"), 50)],
)
def test_driver_choice_or_no_cuda_function_asks_nothing(
    driver: _Driver, launched: object, percent: int
) -> None:
    carveout.prefer_carveout(launched, percent)
    assert driver.calls == []


def test_driver_error_is_raised_and_asked_again(driver: _Driver) -> None:
    driver.status = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="preferred carveout 50%.*failed: 1"):
        carveout.prefer_carveout(_Launched(0x1234), 50)
    driver.status = 0
    carveout.prefer_carveout(_Launched(0x1234), 50)
    assert len(driver.calls) == 2
