# tpgen build. `make` builds build/tpgen and build/tpgen_tests with the CPU
# backend, plus the CUDA backend plugin build/libtpgen-cuda.so when nvcc is
# found (force with CUDA=1, disable with CUDA=0; the binaries dlopen it when
# a GPU is asked for, see kernels/cuda_plugin.c). `make asan` builds
# sanitized copies in build-asan/. `make test` runs the test suite, `make test-quick`
# its quick tier.

BUILD   ?= build
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin CUDA), undefined)
  CUDA := $(if $(NVCC),1,0)
endif

BLAS_DIR := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/$(shell uname -m)-linux-gnu/openblas-openmp))
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)

OPT     ?= -O2 -march=x86-64-v3
CFLAGS  += -std=c17 -D_GNU_SOURCE $(OPT) -g -fopenmp -Wall -Wextra -Wno-unused-parameter -I. $(MPI_CFLAGS) \
           -I/usr/include/x86_64-linux-gnu/openblas-openmp
LDLIBS  += $(if $(BLAS_DIR),-L$(BLAS_DIR) -Wl$(comma)-rpath$(comma)$(BLAS_DIR)) -lopenblas \
           -lyaml -ljansson -lpcre2-8 -lutf8proc -lnettle -lmicrohttpd -lpng -ljpeg -lz -lm -fopenmp -pthread $(MPI_LIBS)
# the CUDA plugin is dlopen'ed and calls back into the binary (kept apart from LDLIBS, which scripts override)
HOST_LDLIBS := -ldl -rdynamic
comma := ,

# the layers, top to bottom (docs/architecture.md): front ends, pipeline and
# models, formats / dist / image I/O, plans, kernels
LIB_SRC  := $(filter-out cli/main.c,$(wildcard cli/*.c cli/bench/*.c)) \
            $(wildcard core/*.c core/models/*.c core/models/*/*.c core/formats/*.c core/dist/*.c core/image/*.c) \
            $(wildcard plans/*.c kernels/*.c kernels/cpu/*.c)
TEST_SRC := $(wildcard tests/*.c)

ifeq ($(CUDA),1)
  CUDA_CU  := $(wildcard kernels/cuda/*.cu)
  CUDA_C   := $(wildcard kernels/cuda/*.c)
  # SASS for every architecture of CUDA_SM_WANT that this nvcc knows
  # (nvcc --list-gpu-arch), and PTX for the newest of them, so that later GPUs
  # run it through the driver's JIT. Override with CUDA_SM="80 90".
  CUDA_SM_WANT ?= 80 89 90 100 120
  NV_ARCHS := $(shell $(NVCC) --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p')
  CUDA_SM  ?= $(or $(filter $(NV_ARCHS),$(CUDA_SM_WANT)),80 90)
  CUDA_PTX := $(lastword $(CUDA_SM))
  GENCODE  := $(foreach a,$(CUDA_SM),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
  NVFLAGS  ?= -O2 -std=c++17 -I. $(MPI_CFLAGS) -Xcompiler -Wall $(GENCODE)
  CFLAGS   += -DTPGEN_CUDA -I$(CUDA_HOME)/include
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++ $(MPI_LIBS)
  PLUGIN   := $(BUILD)/libtpgen-cuda.so
endif

# the page of tpgen serve (cli/ui/), compiled in as C arrays (scripts/embed-ui.sh)
UI_FILES := cli/ui/index.html cli/ui/style.css cli/ui/app.js
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/cli/ui_assets.o

# test data kept compressed in git (the device tool sends the tracked tree,
# 64 MiB at most: scripts/gpu-check.sh --size), unpacked beside it by `make`
# and by tests/unpack-golden.sh; the unpacked files are git-ignored
TEST_DATA := tests/data/qwen3-tokenizer/tokenizer.json
tests/data/%: tests/data/%.xz
	xz -dc $< > $@.tmp && mv $@.tmp $@

# The CPU check runs before anything else, so it is compiled for the baseline
# ISA and told which extensions OPT lets the rest of the build use.
ISA_NEEDS := $(shell echo | $(CC) $(OPT) -dM -E - 2>/dev/null | sed -n 's/^\#define __\(AVX\|AVX2\|FMA\|BMI2\|AVX512F\)__ 1$$/-DNEED_\1/p')
ifneq ($(filter x86_64 i%86,$(shell uname -m)),)
  CHECK_ARCH := -march=x86-64 -mtune=generic
endif
$(BUILD)/core/dist/cpu_check.o: CFLAGS += $(CHECK_ARCH) $(ISA_NEEDS) -DTPGEN_BUILD_OPT='"$(OPT)"'
# the ggml dequantisers must round multiply and add separately, as gguf-py's
# reference does (kernels/quant.c)
$(BUILD)/kernels/quant.o: CFLAGS += -ffp-contract=off
CUDA_OBJ := $(CUDA_C:%.c=$(BUILD)/%.o) $(CUDA_CU:%.cu=$(BUILD)/%.cu.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

all: $(BUILD)/tpgen $(BUILD)/tpgen_tests $(PLUGIN) $(TEST_DATA)

# the CUDA backend plugin: position-independent objects + the CUDA libraries
$(CUDA_OBJ): CFLAGS += -fPIC
$(PLUGIN): $(CUDA_OBJ)
	$(CC) -shared -o $@ $^ $(CUDA_LIBS)

$(BUILD)/tpgen: $(BUILD)/cli/main.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(HOST_LDLIBS)

$(BUILD)/tpgen_tests: $(TEST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(HOST_LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/cli/ui_assets.c: $(UI_FILES) scripts/embed-ui.sh
	@mkdir -p $(dir $@)
	scripts/embed-ui.sh $(UI_FILES) > $@.tmp && mv $@.tmp $@
$(BUILD)/cli/ui_assets.o: $(BUILD)/cli/ui_assets.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Xcompiler -fPIC -MMD -MP -c -o $@ $<

asan:
	$(MAKE) BUILD=build-asan CUDA=0 OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined"

# the README's test command: normal and sanitized builds side by side, then the
# whole suite (tests/run.sh runs its jobs side by side too); test-quick is the
# edit-compile-test tier: the normal build, unit tests, MPI tests at 2 ranks
# and one end-to-end render per family (tests/sh files marked `# tier: quick`)
NPROC := $(shell nproc 2>/dev/null || echo 2)
test:
	$(MAKE) -j$(NPROC) all asan
	tests/run.sh
test-quick:
	$(MAKE) -j$(NPROC) all
	tests/run.sh --quick

clean:
	rm -rf build build-asan build-fuzz

# the CUDA code targets of this build (tests/sh/portable.sh reads them)
print-cuda-gencode:
	@echo $(GENCODE)
print-opt:
	@echo '$(OPT)'

.PHONY: all asan test test-quick clean print-cuda-gencode print-opt
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- fuzzing (fuzz/): libFuzzer harnesses built with clang, ASan + UBSan ----
# `make fuzz FUZZ_TIME=60` builds them in build-fuzz/ and runs each for
# FUZZ_TIME seconds on a copy of its seed corpus (fuzz/corpus/NAME); a crash
# fails with the reproducer (see fuzz/run.sh).
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 30
FUZZ_BUILD := build-fuzz
FUZZ_NAMES := safetensors runspec tokenizer config gguf image serve_json serve_form lora fp8
FUZZ_FLAGS := -std=c17 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer -fopenmp -I. $(MPI_CFLAGS) \
              -I/usr/include/x86_64-linux-gnu/openblas-openmp -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_OBJ   := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o) $(FUZZ_BUILD)/cli/ui_assets.o

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

$(FUZZ_BUILD)/cli/ui_assets.c: $(UI_FILES) scripts/embed-ui.sh
	@mkdir -p $(dir $@)
	scripts/embed-ui.sh $(UI_FILES) > $@.tmp && mv $@.tmp $@
$(FUZZ_BUILD)/cli/ui_assets.o: $(FUZZ_BUILD)/cli/ui_assets.c
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS) $(HOST_LDLIBS)

fuzz-build: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)

fuzz: fuzz-build
	fuzz/run.sh $(FUZZ_TIME) $(FUZZ_NAMES)

.PHONY: fuzz fuzz-build
.SECONDARY: $(FUZZ_OBJ)
