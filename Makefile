# Front end for the CMake build. `make` builds the library and build/attn, `make demo` runs the
# walkthrough, `make test` builds and runs every test. BUILD, CMAKE_FLAGS and JOBS can be overridden.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all configure demo train-demo gpt2-demo test clean install

all: configure
	cmake --build $(BUILD) -j $(JOBS)

configure:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > /dev/null

demo: all
	./$(BUILD)/attn demo

# Trains a small causal attention model with AdamW (examples/train_recall.c), once without the
# attention for comparison; writes the loss curves as CSV and, with gnuplot or matplotlib, a PNG.
train-demo: all
	./$(BUILD)/examples/example_train_recall --csv $(BUILD)/train_recall.csv
	./$(BUILD)/examples/example_train_recall --no-attention --csv $(BUILD)/train_recall_no_attention.csv > /dev/null
	sh examples/plot_loss.sh $(BUILD)/train_recall.png $(BUILD)/train_recall.csv $(BUILD)/train_recall_no_attention.csv

# The attention layer of GPT-2 small decoding with a KV cache (examples/gpt2_decode.c): prefill a
# 128-token prompt, decode 128 tokens, check every step against the full causal attention, print
# tokens per second. Options go through GPT2_FLAGS, e.g. GPT2_FLAGS="--threads 2 --kv-dtype f16".
GPT2_FLAGS ?=
gpt2-demo: all
	./$(BUILD)/examples/example_gpt2_decode $(GPT2_FLAGS)

# A whole GPT-2 on attn (examples/gpt2_model.c): generates 32 tokens greedily after a 16-token random
# prompt and prints prefill and decode tokens per second. GPT2_MODEL=DIR (or a model.safetensors)
# loads a Hugging Face GPT-2 checkpoint; without it the weights are random, of GPT-2 small's shape.
# Options go through GPT2_MODEL_FLAGS, e.g. GPT2_MODEL_FLAGS="--threads 2 --top-k 40 --tokens 64".
GPT2_MODEL ?=
GPT2_MODEL_FLAGS ?=
.PHONY: gpt2-model-demo
gpt2-model-demo: all
	./$(BUILD)/examples/example_gpt2_model $(if $(GPT2_MODEL),--model $(GPT2_MODEL)) $(GPT2_MODEL_FLAGS)

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

install: all
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD)

# ---- other CPUs ------------------------------------------------------------------------------
# The library cross-built for 64-bit ARM (the portable kernels) with warnings as errors, and its C
# tests and examples run under qemu-aarch64 (Debian: gcc-aarch64-linux-gnu and qemu-user; slow, an
# emulator: it checks results, never speed). Python, parity and shell-script tests are left out
# (example_gpt2_model_files runs its program from a script, which needs qemu registered with binfmt).
.PHONY: test-aarch64
test-aarch64:
	@cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
	    -DATTN_WERROR=ON -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-aarch64 -j $(JOBS)
	cd build-aarch64 && ATTN_TEST_EMULATOR=qemu-aarch64 ctest --output-on-failure -j $(JOBS) -R '^(test_|example_)' \
	    -E '^example_gpt2_model_files$$'

# ---- hardening (see docs/reliability.md) ------------------------------------------------------
# The whole test suite under clang's AddressSanitizer + UndefinedBehaviorSanitizer.
SAN_CC ?= clang
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
.PHONY: test-asan test-tsan test-valgrind
test-asan:
	@cmake -S . -B build-asan -DCMAKE_C_COMPILER=$(SAN_CC) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DATTN_SANITIZE="address;undefined" -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)

# The tests that run threads, under ThreadSanitizer. Without BLAS: its threads are not instrumented
# and their spin-waits would be reported as races.
test-tsan:
	@cmake -S . -B build-tsan -DCMAKE_C_COMPILER=$(SAN_CC) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DATTN_SANITIZE=thread -DATTN_BLAS=OFF -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -L threads

# Python threads calling the binding (tests/python/test_threads.py) under ThreadSanitizer: libattn
# built with gcc in build-tsan-py, the interpreter started with gcc's libtsan preloaded (clang 14's
# shared runtime crashes when preloaded). A forbidden shared context is reported first, as a control.
.PHONY: test-tsan-python
test-tsan-python:
	@cmake -S . -B build-tsan-py -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DATTN_SANITIZE=thread -DATTN_BLAS=OFF -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-tsan-py -j $(JOBS) --target attn
	sh tests/python/tsan_python.sh build-tsan-py

# A fast subset of the tests under valgrind's memcheck.
test-valgrind:
	@cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_VALGRIND=ON -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-valgrind -j $(JOBS)
	cd build-valgrind && ctest --output-on-failure -j $(JOBS) -L valgrind

# The whole suite with the AVX-512 kernels compiled for AVX2 through SIMDe (libsimde-dev) and run as
# if the CPU had AVX-512F and AVX512-BF16 (src/cpu/x86/simd512.h), under ASan+UBSan: their logic and
# memory accesses checked on CPUs without AVX-512. Results only; never a timing.
.PHONY: test-emu512
test-emu512:
	@cmake -S . -B build-emu512 -DCMAKE_C_COMPILER=$(SAN_CC) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_EMULATE_AVX512=ON \
	    -DATTN_SANITIZE="address;undefined" -DATTN_CUDA=OFF $(CMAKE_FLAGS) > /dev/null
	cmake --build build-emu512 -j $(JOBS)
	cd build-emu512 && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)

# `make soak`: the decode soak of tests/test_soak.c for SOAK_STEPS steps (make test runs 10 000).
SOAK_STEPS ?= 100000
.PHONY: soak
soak: all
	ATTN_SOAK_STEPS=$(SOAK_STEPS) ./$(BUILD)/tests/test_soak

# ---- fuzzing (see fuzz/ and docs/fuzzing-runs.md) ----------------------------------------------
# `make fuzz FUZZ_SECONDS=N`: builds the libFuzzer targets with clang in build-fuzz, runs each for N
# seconds over a copy of its corpus and merges what adds coverage into fuzz/corpus/<target>/.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz:
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_BUILD_FUZZ=ON \
	    $(CMAKE_FLAGS) > /dev/null
	cmake --build build-fuzz -j $(JOBS) --target fuzz_npy fuzz_safetensors fuzz_api fuzz_sdpa_diff fuzz_bwd_diff fuzz_cuda_plan
	sh fuzz/run.sh build-fuzz $(FUZZ_SECONDS) npy safetensors api sdpa_diff bwd_diff cuda_plan

# `make fuzz-python FUZZ_SECONDS=N ATHERIS_PYTHON=...`: the Python binding's fuzzer
# (fuzz/python/fuzz_binding.py, atheris from PyPI) for N seconds, merging new coverage into
# fuzz/python/corpus/ (which `make test` replays without atheris).
ATHERIS_PYTHON ?= python3
.PHONY: fuzz-python
fuzz-python: all
	sh fuzz/python/run.sh $(BUILD)/libattn.so $(FUZZ_SECONDS) $(ATHERIS_PYTHON)

# ---- PyTorch 2.x, transformers and the pip package (python/README.md) ----------------------------
# `make venv`: build-venv/ with torch 2.x and transformers from PyPI (tests/torch2_venv.sh);
# `make test-torch2`: make test with the tests that need them; `make test-pip`: pip install . into
# fresh virtual environments and the package's tests from outside the source tree.
VENV ?= build-venv
.PHONY: venv test-torch2 test-pip
venv:
	sh tests/torch2_venv.sh $(VENV)
test-torch2:
	$(MAKE) test CMAKE_FLAGS="$(CMAKE_FLAGS) -DATTN_TORCH2_PYTHON=$$(sh tests/torch2_venv.sh $(VENV))"
test-pip:
	sh tests/pip_install_test.sh $$(sh tests/torch2_venv.sh $(VENV))

# ---- NVIDIA GPUs (libattn_cuda; docs/cuda.md) -----------------------------------------------------
# The sanitizer builds above leave libattn_cuda out (-DATTN_CUDA=OFF): nvcc takes no -fsanitize, and
# compute-sanitizer checks the device code instead (test-cuda-sanitize).
# `make test-cuda`: build, run the CUDA tests (a GPU must be visible: ATTN_CUDA_REQUIRE_GPU turns a
# skip into a failure),
# time the forward on the target shapes and print a short table last.
.PHONY: test-cuda test-cuda-sanitize
test-cuda: all
	cd $(BUILD) && ATTN_CUDA_REQUIRE_GPU=1 ctest --output-on-failure -L cuda --no-tests=error
	sh bench/cuda_table.sh ./$(BUILD)/attn

# compute-sanitizer's four tools (memcheck, racecheck, initcheck, synccheck) over a case of every
# kernel family: the argument checks, prefill (every option, packed batches), split-KV decoding,
# contiguous and paged KV caches, the backward in both modes (and its two-slice form at head dim
# 256), the module (cuBLASLt) and the Hopper forward (ATTN_CUDA_KERNELS_SM90; on other GPUs its
# cases run the sm_80 kernels). A GPU must
# be visible (a skipped case fails).
SANITIZER ?= compute-sanitizer
SANITIZE_CASES = test_cuda_sdpa:test_bad_arguments test_cuda_sdpa:test_allocator test_cuda_sdpa:test_options_auto test_cuda_sdpa:test_varlen_auto \
	test_cuda_sdpa:test_decode test_cuda_kv_cache:test_against_reference test_cuda_sdpa:test_backward \
	test_cuda_sdpa:test_backward_deterministic test_cuda_sdpa:test_backward_dmask test_cuda_mha:test_f32_against_cpu \
	test_cuda_sdpa:test_sm90 test_cuda_sdpa:test_backward_d256 test_cuda_mha:test_refusals_change_nothing
test-cuda-sanitize: all
	@set -e; for tool in memcheck racecheck initcheck synccheck; do for c in $(SANITIZE_CASES); do \
	    echo "== compute-sanitizer --tool $$tool $${c%%:*} $${c#*:}"; \
	    ATTN_CUDA_REQUIRE_GPU=1 $(SANITIZER) --tool $$tool --error-exitcode 99 ./$(BUILD)/tests/cuda/$${c%%:*} $${c#*:}; \
	done; done
