# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and pinned. Why: an unpinned `torch` resolves to the newest
# release, which on Linux is a multi-GB CUDA build. Pinned, pip takes a local CPU wheel
# where one exists (CI, dev boxes) and PyPI's CUDA build on a GPU machine, which is right
# for GPU users. Override for another CUDA: make install TORCH_SPEC="torch==2.13.0 --index-url ..."
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-no-extension lint format bench bench-premerge clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py iolib/text/loops.c Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,s3,lab,report]"
	touch $@

demo: install
	$(VENV)/bin/iolib bench

# Rerun before each merge: iolib's image path against DALI's own reader (< 2 min).
bench-premerge: install
	$(VENV)/bin/python benchmarks/bench_images_vs_dali.py --quick

lint: install
	$(VENV)/bin/ruff check conftest.py setup.py iolib predictors benchmarks tests docs/examples
	$(VENV)/bin/ruff format --check conftest.py setup.py iolib predictors benchmarks tests docs/examples

format: install
	$(VENV)/bin/ruff format conftest.py setup.py iolib predictors benchmarks tests docs/examples
	$(VENV)/bin/ruff check --fix conftest.py setup.py iolib predictors benchmarks tests docs/examples

test: lint
	$(VENV)/bin/python -m pytest -q -ra

# The token tests again with the compiled loops switched off: what an install without a
# C compiler runs (iolib/text/kernels.py picks the NumPy loops).
TOKEN_TESTS := tests/test_packed_tokens.py tests/test_packed_reference.py \
	tests/test_streamed_tokens.py tests/test_golden_batches.py tests/test_loops_fallback.py \
	tests/test_shuffle_window.py tests/test_plan_ownership.py tests/test_resume_order.py
test-no-extension: install
	IOLIB_NO_EXTENSION=1 $(VENV)/bin/python -m pytest -q -ra $(TOKEN_TESTS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
