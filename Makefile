# make test / make bench work from a fresh clone: they create .venv, install the pinned
# requirements, build the extension against that torch, then run. Stamps keep a second run from
# reinstalling or rebuilding what has not changed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
DEPS := $(VENV)/.deps-installed
BUILT := $(VENV)/.torchfeed-built
SOURCES := CMakeLists.txt pyproject.toml python/torchfeed/_build_config.py.in \
           $(shell find python -name "*.py" 2>/dev/null) \
           $(shell find csrc -type f 2>/dev/null)
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: all venv deps build test test-min-torch fuzz bench bench-pytest wheel lint format clean

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

venv: $(PY)

$(DEPS): requirements-dev.txt requirements-tools.txt | $(PY)
	$(PIP) install -q -r requirements-dev.txt
	touch $@

deps: $(DEPS)

$(BUILT): $(DEPS) $(SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(BUILT)

# Python: ruff (lint and format) and mypy; C++/CUDA: clang-format (.clang-format, 100 columns).
CXX_SOURCES = $(shell find csrc -name '*.h' -o -name '*.cpp' -o -name '*.cu' 2>/dev/null)
lint: $(DEPS)
	$(VENV)/bin/ruff check python tests bench examples scripts conftest.py
	$(VENV)/bin/ruff format --check python tests bench examples scripts conftest.py
	$(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES)
	$(VENV)/bin/mypy

format: $(DEPS)
	$(VENV)/bin/ruff format python tests bench examples scripts conftest.py
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

test: build lint
	$(PY) -m pytest tests $(PYTEST_ARGS)

# The suite against the oldest torch that pyproject.toml declares (torch 2.11, as on the GPU
# machine), in a venv of its own, with a non-editable install built in a directory of its own.
# This build is also the CPU-only configuration without libjpeg-turbo (torchfeed.decode falls back
# to Pillow): CI proves both build and pass. (The CUDA code against 2.11 is the GPU
# machine's build, scripts/gpu_check.sh.)
MIN_VENV ?= .venv-torch-min
MIN_PY := $(MIN_VENV)/bin/python
MIN_DEPS := $(MIN_VENV)/.deps-installed
MIN_BUILT := $(MIN_VENV)/.torchfeed-built

$(MIN_PY):
	$(PYTHON) -m venv $(MIN_VENV)

$(MIN_DEPS): requirements-min.txt requirements-tools.txt | $(MIN_PY)
	$(MIN_PY) -m pip --disable-pip-version-check install -q -r requirements-min.txt
	touch $@

$(MIN_BUILT): $(MIN_DEPS) $(SOURCES)
	TORCHFEED_CUDA=OFF TORCHFEED_JPEG=OFF $(MIN_PY) -m pip \
	    --disable-pip-version-check install -q --no-build-isolation --no-deps \
	    -C build-dir=build/torch-min/{wheel_tag} .
	touch $@

test-min-torch: $(MIN_BUILT)
	$(MIN_PY) -c "import torch, torchfeed; i = torchfeed.build_info(); \
	    assert not i['cuda_compiled'] and i['jpeg'] is None, i; print('torch', torch.__version__, i)"
	$(MIN_PY) -m pytest tests $(PYTEST_ARGS)

# A bounded fuzz run (FUZZ_SECONDS) of the JPEG window decoder, the image op's raw entry points
# and the ring, against a CPU-only build compiled with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report aborts: the run fails). Its own build directory and
# install target: the development build is untouched.
FUZZ_SECONDS ?= 60
SANITIZE := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
fuzz: $(DEPS)
	CFLAGS="$(SANITIZE_FLAGS)" CXXFLAGS="$(SANITIZE_FLAGS)" LDFLAGS="-fsanitize=address,undefined" \
	TORCHFEED_CUDA=OFF $(PIP) wheel -q --no-build-isolation --no-deps \
	    -C build-dir=$(SANITIZE)/build -C cmake.build-type=RelWithDebInfo -w $(SANITIZE)/dist .
	rm -rf $(SANITIZE)/site
	$(PIP) install -q --no-deps --target $(SANITIZE)/site $(SANITIZE)/dist/torchfeed-*.whl
	cd $(SANITIZE) && \
	    LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
	    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    ../../$(PY) ../../scripts/fuzz.py --seconds $(FUZZ_SECONDS) --site site

# The main job: the end-to-end pipeline benchmark on the built-in dataset.
bench: build
	$(VENV)/bin/torchfeed bench $(BENCH_ARGS)

# Kernel-level comparisons against the named baselines (pytest-benchmark); DALI and kornia are
# optional baselines, installed here and never needed at run time.
BENCH_DEPS := $(VENV)/.bench-deps-installed
$(BENCH_DEPS): requirements-bench.txt | $(DEPS)
	$(PIP) install -q -r requirements-bench.txt
	touch $@

bench-pytest: build $(BENCH_DEPS)
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=min,median,mean,iqr,rounds \
	    --benchmark-sort=name $(PYTEST_ARGS)

wheel: $(DEPS)
	$(PIP) wheel --no-build-isolation --no-deps -w dist .

clean:
	rm -rf build dist $(BUILT) $(MIN_BUILT)
