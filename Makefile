# qshare: `make demo` runs the main job, `make test` passes the tests. Both set up
# everything they need (venv, Python packages, native build) and are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CC ?= cc
CFLAGS_COMMON := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Inative/include -pthread
NATIVE_SRC := $(wildcard native/src/*.c)
NATIVE_HDR := $(wildcard native/include/*.h native/src/*.h)
BUILD := native/build
FFI_STAMP := $(BUILD)/.ffi

.PHONY: all setup native image-install test test-c test-tsan test-py lint demo bench clean

all: setup

setup: $(STAMP) native

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) native/python/write_paths_pth.py
	touch $@

native: $(BUILD)/libqshare.so $(FFI_STAMP)
	$(MAKE) -s -C native/cuda CC=$(CC)

$(BUILD)/libqshare.so: $(NATIVE_SRC) $(NATIVE_HDR)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_COMMON) -O2 -fPIC -shared -o $@ $(NATIVE_SRC)

$(FFI_STAMP): $(STAMP) $(NATIVE_SRC) $(NATIVE_HDR) native/build_ffi.py
	@mkdir -p $(BUILD)
	$(PY) native/build_ffi.py
	touch $@

# The container image's install, run by the root Dockerfile: the cffi module and the CUDA
# interposer are built first, so that a plain (not editable) install carries the module.
# Nothing here touches a venv: the distribution goes under IMAGE_ROOT only.
IMAGE_ROOT ?= /
PIP_FLAGS ?=
image-install:
	$(PYTHON) native/build_ffi.py
	$(MAKE) -s -C native/cuda CC=$(CC) ../build/libqshare-cuda.so
	$(PYTHON) -m pip install -q --no-cache-dir --no-warn-script-location --ignore-installed \
		$(PIP_FLAGS) --root '$(IMAGE_ROOT)' '.[gpu]'
	install -D -m 0644 $(BUILD)/libqshare-cuda.so '$(IMAGE_ROOT)/usr/lib/qshare/libqshare-cuda.so'

test: setup lint test-py test-tsan

test-c: $(STAMP)
	$(MAKE) -C native test CC=$(CC)

# The driver's threaded race tests under ThreadSanitizer.
test-tsan: $(STAMP)
	$(MAKE) -C native tsan CC=$(CC)

test-py: setup
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check services native/python native/build_ffi.py tests
	$(VENV)/bin/ruff format --check services native/python native/build_ffi.py tests
	$(VENV)/bin/mypy services/common/qshare native/python/qshare_driver $(wildcard services/*/qshare_*)

demo: setup
	$(VENV)/bin/qshare demo

bench: setup
	@mkdir -p .bench
	$(VENV)/bin/qshare bench gate --json .bench/gate.json

clean:
	rm -rf $(BUILD) $(VENV)
