# pp3 — every target works on a fresh machine; `make install` is idempotent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PP3 := $(VENV)/bin/pp3
# CPU machines run the real kernels in Triton's interpreter; set before Python starts.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_GPU),)
export TRITON_INTERPRET := 1
endif

.PHONY: install qualify test test-gpu lint fmt clean

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)
	bash .ci/install-system.sh
	# torch first, pinned for CPU machines (a GPU user's torch is left alone: see README).
	@if [ -z "$(HAS_GPU)" ]; then $(PY) -m pip install -q -c .ci/constraints.txt torch triton; fi
	$(PY) -m pip install -q -e '.[dev]' $(if $(HAS_GPU),,-c .ci/constraints.txt)

qualify: install
	$(PP3) qualify

test: install
	$(PY) -m pytest -q tests

test-gpu: install
	$(PY) -m pytest -q -m gpu tests

lint: install
	$(VENV)/bin/ruff check pp3cli kernels tests
	$(VENV)/bin/ruff format --check pp3cli kernels tests
	$(VENV)/bin/mypy --strict pp3cli

fmt: install
	$(VENV)/bin/ruff format pp3cli kernels tests
	$(VENV)/bin/ruff check --fix pp3cli kernels tests

clean:
	rm -rf build dist *.egg-info
