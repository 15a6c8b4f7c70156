# `make demo` and `make test` set everything up on a fresh machine. Where python3 already has
# torch (the GPU machines), that torch is used; otherwise a .venv gets torch 2.13 (CPU build).
SYSTEM_HAS_TORCH := $(shell python3 -c "import torch" >/dev/null 2>&1 && echo yes)
ifeq ($(SYSTEM_HAS_TORCH),yes)
PY := python3
else
PY := $(CURDIR)/.venv/bin/python
endif

.PHONY: setup browser demo test test-oldest-triton test-gpu bench-cpu bench-cpu-models clean

setup: .setup-done

.setup-done: pyproject.toml
ifneq ($(SYSTEM_HAS_TORCH),yes)
	python3 -m venv .venv
	# The CPU build by name, from PyTorch's CPU index (or a local copy of that wheel): PyPI's
	# plain torch==2.13.0 is the CUDA build, gigabytes more for a machine without a GPU.
	.venv/bin/python -m pip install -q --retries 0 --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
endif
	$(PY) -m pip install -q -e ".[test,models]"
	# timm for the model suite's CNNs and ViTs, without its torchvision requirement: PyPI's
	# torchvision is built for another torch and would replace this one. Its other needs
	# (pyyaml, huggingface_hub, safetensors) come with transformers (the "models" extra).
	$(PY) -m pip install -q --no-deps "timm>=1.0"
	touch $@

demo: setup
	$(PY) -m smelt demo

# The compile report's browser test (tests/test_report.py) runs Debian's Chromium: installed here
# where apt can (as root); elsewhere that one test is skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "make: no Chromium (apt-get install chromium): the report's browser test will be skipped"

# Two pytest workers: the suite is compile-bound, one process per core (CI has 2).
TEST_JOBS ?= 2
# The Triton pass leaves out the tests marked cpu_backend_independent (they ran in the Halide pass)
# and takes the even OpInfo ops; test-oldest-triton takes the odd ones. CI's budget is 25 minutes.
# Each pass lists its 15 slowest tests: where CI's time goes, from its own log.
test: setup browser
	$(PY) -m pytest -q -n $(TEST_JOBS) --durations=15 tests --ignore=tests/gpu
	SMELT_CPU_BACKEND=triton SMELT_TEST_SECOND_BACKEND=1 OPINFO_EVERY=2 OPINFO_FIRST=0 \
	  $(PY) -m pytest -q -n $(TEST_JOBS) --durations=15 tests --ignore=tests/gpu
	$(MAKE) --no-print-directory test-oldest-triton

# Triton's semantics move between the versions smelt supports (3.6 spells -x as 0 - x: +0 stays +0,
# which only the GPU run showed): the op-semantics files run again under the oldest one's
# interpreter, installed beside the newest (about 2 minutes on 2 cores; the odd OpInfo ops, which the
# newest Triton's pass of `make test` leaves to this one).
OLDEST_TRITON ?= 3.6.0
OLDEST_TRITON_DIR := .triton-$(OLDEST_TRITON)
OLDEST_TRITON_TESTS := tests/test_halide_math_edges.py tests/test_pointwise.py tests/test_reductions.py \
	tests/test_scans.py tests/test_opinfo.py tests/test_cuda_rounding.py tests/test_unsupported_dtypes.py
test-oldest-triton: setup
	@[ -d $(OLDEST_TRITON_DIR) ] || $(PY) -m pip install -q --no-deps --target $(OLDEST_TRITON_DIR) "triton==$(OLDEST_TRITON)"
	PYTHONPATH=$(CURDIR)/$(OLDEST_TRITON_DIR) $(PY) -c "import triton; assert triton.__version__ == '$(OLDEST_TRITON)', triton.__version__"
	OPINFO_EVERY=2 OPINFO_FIRST=1 SMELT_CPU_BACKEND=triton PYTHONPATH=$(CURDIR)/$(OLDEST_TRITON_DIR) $(PY) -m pytest -q -n $(TEST_JOBS) $(OLDEST_TRITON_TESTS)

test-gpu:
	scripts/gpu_check

# Eager, Inductor (its C++ backend) and smelt (Halide) on the CPU rows; a markdown table last.
# BENCH_ARGS passes options on, e.g. BENCH_ARGS="--only softmax --no-compile-time".
bench-cpu: setup
	SMELT_CPU_BACKEND=halide $(PY) -m benchmarks.run --device cpu $(BENCH_ARGS)
	SMELT_CPU_BACKEND=halide $(PY) -m benchmarks.cpu_models $(MODEL_BENCH_ARGS)

# Small models only (issue 23): eager, Inductor's C++ backend and smelt, steady and compile times.
bench-cpu-models: setup
	SMELT_CPU_BACKEND=halide $(PY) -m benchmarks.cpu_models $(MODEL_BENCH_ARGS)

clean:
	rm -rf .venv .setup-done *.egg-info
