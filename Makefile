# pp3 — every target works on a fresh machine; `make install` is idempotent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PP3 := $(VENV)/bin/pp3
# A reviewer's machine: pp3 without torch or triton, only its light dependencies.
REVIEW_VENV ?= .venv-review
LIGHT_DEPENDENCIES := typer rich numpy scipy orjson filelock
# CPU machines run the real kernels in Triton's interpreter; set before Python starts.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_GPU),)
export TRITON_INTERPRET := 1
endif
SOURCES := pp3cli kernels tests bench

.PHONY: install qualify test test-gpu review lint fmt clean

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

# pp3 verify-receipts where torch and triton are not installed at all.
review:
	test -x $(REVIEW_VENV)/bin/python || $(PYTHON) -m venv $(REVIEW_VENV)
	$(REVIEW_VENV)/bin/python -m pip install -q --no-deps -e .
	$(REVIEW_VENV)/bin/python -m pip install -q -c .ci/constraints.txt $(LIGHT_DEPENDENCIES)
	$(REVIEW_VENV)/bin/python .ci/assert_absent.py torch triton
	$(REVIEW_VENV)/bin/pp3 verify-receipts

lint: install
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/mypy pp3cli kernels/pp3kernels tests bench

fmt: install
	$(VENV)/bin/ruff format $(SOURCES)
	$(VENV)/bin/ruff check --fix $(SOURCES)

clean:
	rm -rf build dist *.egg-info
