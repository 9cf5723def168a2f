# Convenience targets over CMake.  `make demo` and `make test` are the
# README's two set-up commands.
BUILD ?= build
SAN_BUILD ?= build-san
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
# The project's own Python environment (scripts/venv.sh): every Python step
# runs its interpreter.  PYTHON=... picks another one that already has
# numpy and pytest (on a GPU machine without PyPI, say: PYTHON=python3).
VENV ?= $(BUILD)/venv
PYTHON ?= $(abspath $(VENV))/bin/python

WHEEL_DIR ?= $(BUILD)/wheelhouse
# Where the wheel's libraries (scripts/wheel_deps.sh) and the Debian 11 root (scripts/oldroot.sh) are kept between
# builds and clones: the machine's cache as root, the user's own otherwise.
SLUICE_BUILD_CACHE ?= $(shell [ "$$(id -u)" = 0 ] && echo /var/cache/sluice-build || echo "$${XDG_CACHE_HOME:-$$HOME/.cache}/sluice-build")

.PHONY: all deps venv demo test test-tsan test-python wheel gpu-test fuzz clean

all: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSLUICE_TESTS=ON -DSLUICE_SANITIZE=OFF -DSLUICE_TSAN=OFF >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@sh scripts/deps.sh

# Made only when PYTHON is the environment's own interpreter.
venv: deps
	@if [ "$(PYTHON)" = "$(abspath $(VENV))/bin/python" ]; then sh scripts/venv.sh $(VENV); fi

# Generates a 1 GiB file and benchmarks reading it into the GPU (host memory
# without one), cold and warm.
demo: all
	@sh bench/demo.sh $(BUILD)/sluice

# Every test, under AddressSanitizer + UndefinedBehaviorSanitizer, then the
# threaded tests under ThreadSanitizer, then the Python package's pytest
# suite.  GPU tests report SKIPPED without a GPU.  SLUICE_CONFIG= keeps a
# settings file of your own (sluice tune's) out of the tests.
test: venv
	@sh scripts/deps.sh test
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON -DSLUICE_PYTHON=$(PYTHON) >/dev/null
	cmake --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && SLUICE_CONFIG= ctest --output-on-failure -j 2
	$(MAKE) test-tsan
	$(MAKE) test-python

test-tsan: venv
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLUICE_TSAN=ON -DSLUICE_PYTHON=$(PYTHON) >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target t_io_psync t_checkpoint t_ckpt t_dsbatch t_loader t_s3 t_copy
	cd $(TSAN_BUILD) && SLUICE_CONFIG= ctest --output-on-failure -R 't_io|t_checkpoint|t_ckpt|t_dsbatch|t_loader|t_s3_server|t_copy'

# The Python package (python/sluice) against the plain build's libsluice.so; GPU tests skip without a GPU.
# The wheel too (tests/python/test_wheel.py): installed into an environment of its own, run from there, and in
# a Debian 11 root (scripts/oldroot.sh, made once per machine; as root only: elsewhere that test says it skipped).
test-python: all venv wheel
	SLUICE_CONFIG= SLUICE_LIB=$(BUILD)/libsluice.so SLUICE_BIN=$(BUILD)/sluice PYTHONPATH=python PYTHONNOUSERSITE=1 \
		SLUICE_WHEEL="$$(ls $(WHEEL_DIR)/sluice-*.whl)" SLUICE_WHEEL_ROOT="$$(SLUICE_BUILD_CACHE=$(SLUICE_BUILD_CACHE) sh scripts/oldroot.sh $(PYTHON))" \
		$(PYTHON) -m pytest -q -rs tests/python

# A manylinux_2_28 wheel with the libraries it links inside (scripts/wheel.sh; they are built once per machine,
# scripts/wheel_deps.sh): pip install build/wheelhouse/sluice-*.whl
wheel: venv
	@sh scripts/deps.sh wheel
	SLUICE_BUILD_CACHE=$(SLUICE_BUILD_CACHE) sh scripts/wheel.sh $(PYTHON) $(WHEEL_DIR)

# On a GPU machine: the GPU tests plain and under compute-sanitizer memcheck.
gpu-test: all
	cd $(BUILD) && ctest --output-on-failure -R 't_gpu|t_cuda_decls'
	compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 $(BUILD)/tests/t_gpu

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD)

# Runs each fuzz target (config, format) for FUZZ_SECONDS (default 600),
# growing a corpus under build-fuzz from the seeds in tests/fuzz.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= config format remote image
fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=ON >/dev/null
	for t in $(FUZZ_TARGETS); do \
		cmake --build build-fuzz -j $(JOBS) --target fuzz_$$t && mkdir -p build-fuzz/corpus_$$t && \
		build-fuzz/tests/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus_$$t tests/fuzz/corpus_$$t || exit 1; \
	done
