# tpgen build. `make` builds build/tpgen and build/tpgen_tests with the CPU
# backend, plus the CUDA backend plugin build/libtpgen-cuda.so when nvcc is
# found (force with CUDA=1, disable with CUDA=0; the binaries dlopen it when
# a GPU is asked for, see kernels/cuda_plugin.c). `make asan` builds
# sanitized copies in build-asan/. `make test` runs the test suite.

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
           -lyaml -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lz -lm -fopenmp -pthread $(MPI_LIBS)
# the CUDA plugin is dlopen'ed and calls back into the binary (kept apart from LDLIBS, which scripts override)
HOST_LDLIBS := -ldl -rdynamic
comma := ,

LIB_SRC  := $(wildcard core/*.c core/models/*.c plans/*.c kernels/*.c kernels/cpu/*.c) \
            $(filter-out cli/main.c,$(wildcard cli/*.c))
TEST_SRC := $(wildcard tests/*.c)

ifeq ($(CUDA),1)
  CUDA_CU  := $(wildcard kernels/cuda/*.cu)
  CUDA_C   := $(wildcard kernels/cuda/*.c)
  NVFLAGS  ?= -O2 -std=c++17 -I. $(MPI_CFLAGS) -Xcompiler -Wall \
              -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  CFLAGS   += -DTPGEN_CUDA -I$(CUDA_HOME)/include
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++ $(MPI_LIBS)
  PLUGIN   := $(BUILD)/libtpgen-cuda.so
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CUDA_OBJ := $(CUDA_C:%.c=$(BUILD)/%.o) $(CUDA_CU:%.cu=$(BUILD)/%.cu.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

all: $(BUILD)/tpgen $(BUILD)/tpgen_tests $(PLUGIN)

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

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Xcompiler -fPIC -MMD -MP -c -o $@ $<

asan:
	$(MAKE) BUILD=build-asan CUDA=0 OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined"

# the README's test command: normal build, sanitized build, whole suite
test: all asan
	tests/run.sh

clean:
	rm -rf build build-asan

.PHONY: all asan test clean
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
