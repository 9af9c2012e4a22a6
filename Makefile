# mg: one non-recursive Makefile. Every output goes under build/.
#
#   make            build mglaunch, libmg, train, the test programs
#   make test       install/check dependencies, build, run the whole suite under prove
#   make demo       the README's main job: 2 workers train the CNN on Fashion-MNIST
#                   (builds only mglaunch and train)
#   make bench      benchmarks against torchrun / PyTorch DDP / memcpy (tests/bench/)
#   make fuzz       libFuzzer over every parser of outside input (clang; FUZZ_SECONDS=60 each)
#   make soak       workers killed at random during training (SOAK_FAULTS=100), then
#                   worker kills and node losses of a 3-node job (SOAK_NODE_FAULTS=20); checks the outcome
#   make install    PREFIX=/usr/local (DESTDIR=, COMPLETIONDIR=): programs, man pages, bash completions
#   make clean
#
#   make test-gpu   the GPU suite alone (it skips, saying why, without a usable GPU)
#
# Knobs: SANITIZE=address,undefined  DEBUG=1  V=1  T=<test files>  NVCC=<path> (empty: CPU-only)
#        MG_REQUIRE_CUDA=1 (fail unless the CUDA plugin can be built)  NVCC_ARCH=<-gencode flags>

PREFIX ?= /usr/local
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

comma := ,
# $(call uniq,words): the words in their first order, without repeats
uniq = $(if $(1),$(firstword $(1)) $(call uniq,$(filter-out $(firstword $(1)),$(1))))
# A clang build keeps its objects apart from gcc's.
CC_IS_CLANG := $(shell $(CC) --version 2>/dev/null | grep -q clang && echo 1)
ifneq ($(SANITIZE),)
BUILD ?= build/san-$(subst $(comma),-,$(SANITIZE))$(if $(CC_IS_CLANG),-clang)
else ifeq ($(DEBUG),1)
BUILD ?= build/debug
else
BUILD ?= build
endif

ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-6s %s\n' $(1) $(2)
endif

# Optimisation: -O2 everywhere, -O3 for the numeric kernels (they opt in with
# their own per-file flags below). Never -march=native: the binaries must run
# on any x86-64; hot kernels use target_clones for AVX2/AVX-512 instead.
ifeq ($(DEBUG),1)
OPT := -O0 -g3
else
OPT := -O2 -g
endif

WARN := -Wall -Wextra -Wshadow -Wformat=2 -Wno-unused-parameter -Wno-missing-field-initializers \
        -Wstrict-prototypes -Wmissing-prototypes -Werror
# Include paths per layer, so the layering is enforced by the compiler: the
# launcher and common code cannot even name a runtime header (tests/integration/layering.t).
CPPFLAGS += -D_GNU_SOURCE -I$(BUILD)/include
INC_common := -Icommon
INC_launcher := -Icommon -Ilauncher -Ilauncher/rdzv -Ilauncher/watchdog
INC_runtime := -Icommon -Iruntime -Iruntime/cpu -Iruntime/comm
INC_models := $(INC_runtime) -Imodels
INC_tests := $(INC_launcher) $(INC_models) -Iruntime/cuda -Itests/lib
CFLAGS += -std=gnu11 $(OPT) $(WARN) -pthread -fno-common -MMD -MP
LDFLAGS += -pthread
ifneq ($(SANITIZE),)
CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif
# make fuzz's own build: every object carries libFuzzer's coverage.
ifeq ($(FUZZ),1)
CFLAGS += -fsanitize=fuzzer-no-link
endif

# What this machine has. Reported once per make invocation.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# train loads libopenblas.so.0 at run time (runtime/cpu/blas.c): nothing includes its headers.
HAVE_OPENBLAS := $(shell /sbin/ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0' && echo 1)
# The CUDA plugin (runtime/cuda/, docs/gpu.md) needs nvcc and the CUDA runtime, cuBLAS, cuDNN and
# NCCL headers and libraries. Each library is looked for in its own *_HOME when that is set (and
# only there), else in CUDA_HOME, then /usr, then in the site-packages of PyTorch's pip wheels
# (nvidia/cudnn, nvidia/nccl, nvidia/cu13 or nvidia/cublas and nvidia/cuda_runtime, each with
# include/ and lib/). The plugin links each by its versioned soname (libcudnn.so.9): the wheels
# ship no unversioned links.
NVCC_OK := $(if $(NVCC),$(shell test -x '$(NVCC)' && echo 1))
PYTHON ?= python3
# The site-packages directories of $(PYTHON) that hold NVIDIA's wheels: asked once, and only when
# a library is found nowhere else.
CUDA_WHEELS ?= $(eval CUDA_WHEELS := $$(shell $(PYTHON) -c 'import os, sys; print(" ".join(p for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))))' 2>/dev/null))$(CUDA_WHEELS)
# $(call cuda_find,HOME,header,wheel packages): the directory whose include/ holds header.
cuda_find = $(patsubst %/include/$(2),%,$(firstword $(if $(1),$(wildcard $(1)/include/$(2)),$(or \
  $(wildcard $(CUDA_HOME)/include/$(2) /usr/include/$(2)),$(wildcard $(foreach w,$(CUDA_WHEELS),$(patsubst %,$(w)/nvidia/%/include/$(2),$(3))))))))
CUDART_ROOT := $(if $(NVCC_OK),$(call cuda_find,,cuda_runtime_api.h,cu[0-9]* cuda_runtime))
CUBLAS_ROOT := $(if $(NVCC_OK),$(call cuda_find,$(CUBLAS_HOME),cublas_v2.h,cu[0-9]* cublas))
CUDNN_ROOT := $(if $(NVCC_OK),$(call cuda_find,$(CUDNN_HOME),cudnn_version.h,cudnn))
NCCL_ROOT := $(if $(NVCC_OK),$(call cuda_find,$(NCCL_HOME),nccl.h,nccl))
cuda_header = $(firstword $(wildcard $(CUDA_HOME)/include/$(1) /usr/include/$(1)))
CUDNN_H := $(if $(CUDNN_ROOT),$(CUDNN_ROOT)/include/cudnn_version.h)
NCCL_H := $(if $(NCCL_ROOT),$(NCCL_ROOT)/include/nccl.h)
CUBLAS_H := $(if $(CUBLAS_ROOT),$(CUBLAS_ROOT)/include/cublas_api.h)
CUDART_H := $(if $(CUDART_ROOT),$(CUDART_ROOT)/include/cuda_runtime_api.h)
header_version = $(shell sed -n 's/^\#define $(2)_$(3) *\([0-9]*\).*/\1/p' $(1) | head -n 1)
# $(call cuda_lib,ROOT,soname): the library's file under ROOT's lib64/ or lib/ (empty for /usr,
# where the linker and the loader look anyway).
cuda_lib = $(if $(filter /usr,$(1)),/usr,$(firstword $(wildcard $(addsuffix /$(2),$(1)/lib64 $(1)/lib))))
ifneq ($(and $(CUDART_ROOT),$(CUBLAS_ROOT),$(CUDNN_ROOT),$(NCCL_ROOT)),)
CUDA_MAJOR := $(shell sed -n 's/^\#define CUDART_VERSION *\([0-9]*\)[0-9][0-9][0-9].*/\1/p' $(CUDART_H))
CUBLAS_MAJOR := $(call header_version,$(CUBLAS_H),CUBLAS_VER,MAJOR)
CUDNN_MAJOR := $(call header_version,$(CUDNN_H),CUDNN,MAJOR)
NCCL_MAJOR := $(call header_version,$(NCCL_H),NCCL,MAJOR)
# In the order they load: libcublas needs libcublasLt.
CUDA_SONAMES := libcudart.so.$(CUDA_MAJOR) libcublasLt.so.$(CUBLAS_MAJOR) libcublas.so.$(CUBLAS_MAJOR) \
                libcudnn.so.$(CUDNN_MAJOR) libnccl.so.$(NCCL_MAJOR)
CUDA_LIB_FILES := $(call cuda_lib,$(CUDART_ROOT),libcudart.so.$(CUDA_MAJOR)) \
                  $(call cuda_lib,$(CUBLAS_ROOT),libcublas.so.$(CUBLAS_MAJOR)) \
                  $(call cuda_lib,$(CUDNN_ROOT),libcudnn.so.$(CUDNN_MAJOR)) \
                  $(call cuda_lib,$(NCCL_ROOT),libnccl.so.$(NCCL_MAJOR))
CUDA_LIB_MISSING := $(strip $(if $(call cuda_lib,$(CUDART_ROOT),libcudart.so.$(CUDA_MAJOR)),,libcudart.so.$(CUDA_MAJOR)) \
  $(if $(call cuda_lib,$(CUBLAS_ROOT),libcublas.so.$(CUBLAS_MAJOR)),,libcublas.so.$(CUBLAS_MAJOR)) \
  $(if $(call cuda_lib,$(CUDNN_ROOT),libcudnn.so.$(CUDNN_MAJOR)),,libcudnn.so.$(CUDNN_MAJOR)) \
  $(if $(call cuda_lib,$(NCCL_ROOT),libnccl.so.$(NCCL_MAJOR)),,libnccl.so.$(NCCL_MAJOR)))
# The directories the plugin is linked against, also its run path (not the system's own).
CUDA_LIB_DIRS := $(patsubst %/,%,$(sort $(dir $(filter-out /usr,$(CUDA_LIB_FILES)))))
endif
CUDA_MISSING := $(strip $(if $(NVCC_OK),$(if $(CUDART_ROOT),,CUDA-runtime),nvcc) $(if $(CUBLAS_ROOT),,cuBLAS) \
  $(if $(CUDNN_ROOT),,cuDNN) $(if $(NCCL_ROOT),,NCCL) $(CUDA_LIB_MISSING))
CUDA_PLUGIN := $(if $(CUDA_MISSING),,$(BUILD)/lib/libmg_cuda.so)
ifeq ($(MG_REQUIRE_CUDA),1)
ifneq ($(CUDA_MISSING),)
$(error MG_REQUIRE_CUDA=1 but the CUDA plugin cannot be built: $(CUDA_MISSING) not found (NVCC='$(NVCC)', CUDA_HOME='$(CUDA_HOME)'$(if $(CUDNN_HOME), CUDNN_HOME='$(CUDNN_HOME)')$(if $(NCCL_HOME), NCCL_HOME='$(NCCL_HOME)'), pip wheels: '$(CUDA_WHEELS)'))
endif
endif
# Machine code for the GPUs people rent (T4, A100, A10, L4, H100) and PTX for
# newer ones (compute_90's, so Blackwell compiles Hopper's code, not Turing's);
# one nvcc run compiles them all.
NVCC_ARCH ?= -gencode arch=compute_75,code=[sm_75,compute_75] -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_86,code=sm_86 -gencode arch=compute_89,code=sm_89 \
             -gencode arch=compute_90,code=[sm_90,compute_90]
cuda_versions = nvcc $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), \
  cuDNN $(call header_version,$(CUDNN_H),CUDNN,MAJOR).$(call header_version,$(CUDNN_H),CUDNN,MINOR).$(call header_version,$(CUDNN_H),CUDNN,PATCHLEVEL)$(call cuda_from,$(CUDNN_ROOT)), \
  NCCL $(call header_version,$(NCCL_H),NCCL,MAJOR).$(call header_version,$(NCCL_H),NCCL,MINOR).$(call header_version,$(NCCL_H),NCCL,PATCH)$(call cuda_from,$(NCCL_ROOT)); \
  $(filter sm_%,$(cuda_code)) $(addprefix + PTX ,$(filter compute_%,$(cuda_code)))
# where a library was found, when not with nvcc
cuda_from = $(if $(filter $(CUDA_HOME),$(1)),, in $(1))
cuda_code = $(patsubst code=%,%,$(filter-out -gencode arch=%,$(subst $(comma), ,$(subst [,,$(subst ],,$(NVCC_ARCH))))))
# mglaunch dashboard's server is a program of its own, linked with libmicrohttpd,
# built when its header is there: mglaunch itself needs no HTTP library.
HAVE_MHD := $(shell printf '\043include <microhttpd.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)

ifeq ($(MAKELEVEL),0)
ifeq ($(filter clean format,$(MAKECMDGOALS)),)
$(info mg build: $(BUILD)  cc: $(CC) $(shell $(CC) -dumpfullversion 2>/dev/null))
$(info mg build: openblas: $(if $(HAVE_OPENBLAS),found,MISSING (apt-get install libopenblas-dev)))
$(info mg build: cuda plugin: $(if $(CUDA_PLUGIN),$(CUDA_PLUGIN) ($(strip $(cuda_versions))),not built: $(CUDA_MISSING) not found -> CPU-only build))
$(info mg build: libmicrohttpd: $(if $(HAVE_MHD),found -> mglaunch-dashboard,MISSING (apt-get install libmicrohttpd-dev): no mglaunch dashboard))
endif
endif

# libmg's numeric kernels: -O3, and no FMA contraction so that the AVX2 and
# baseline clones (target_clones) give identical bits; and no memcpy calls for
# the short copies the compiler would otherwise turn into them.
# (clang has no -fno-tree-loop-distribute-patterns; -fno-builtin keeps its loop
# idiom pass from making the same calls.)
NO_LOOP_CALLS := $(if $(CC_IS_CLANG),-fno-builtin-memcpy -fno-builtin-memset,-fno-tree-loop-distribute-patterns)
ifneq ($(DEBUG),1)
CFLAGS_runtime_cpu_cpu_kernels := -O3 -ffp-contract=off -fno-math-errno $(NO_LOOP_CALLS)
# The collectives' reduction kernel: vectorized, same bits in every clone.
CFLAGS_runtime_comm_comm_reduce := -O3 -ffp-contract=off
endif

# ---- sources ---------------------------------------------------------------
COMMON_SRC := $(wildcard common/*.c)
LAUNCHER_SRC := $(filter-out launcher/main.c launcher/dashboard/%,$(wildcard launcher/*.c launcher/*/*.c))
DASH_SRC := $(wildcard launcher/dashboard/*.c)
RUNTIME_SRC := $(filter-out runtime/cuda/%,$(wildcard runtime/*.c runtime/*/*.c))
# The train program's own files (train.c and its parts, train_*.c); the rest of models/ is a library.
TRAIN_SRC := $(wildcard models/train*.c)
MODELS_SRC := $(filter-out $(TRAIN_SRC),$(wildcard models/*.c))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
HELPER_SRC := $(wildcard tests/helpers/*.c)

# Fuzz harnesses (tests/fuzz/fuzz_NAME.c): replay_NAME runs one over files
# with any compiler (make test replays the seed corpora), fuzz_NAME is its
# libFuzzer build (make fuzz, clang only).
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(FUZZ_SRC))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ := $(call obj,$(COMMON_SRC))
LAUNCHER_OBJ := $(call obj,$(LAUNCHER_SRC))
RUNTIME_OBJ := $(call obj,$(RUNTIME_SRC))
MODELS_OBJ := $(call obj,$(MODELS_SRC))

LIBCOMMON := $(BUILD)/lib/libmgcommon.a
LIBLAUNCH := $(BUILD)/lib/libmglaunch.a
LIBMG := $(BUILD)/lib/libmg.a
LIBMODELS := $(BUILD)/lib/libmgmodels.a
CONFIG_H := $(BUILD)/include/mg_config.h

MGLAUNCH := $(BUILD)/bin/mglaunch
DASHBOARD := $(BUILD)/bin/mglaunch-dashboard
TRAIN := $(BUILD)/bin/train
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
HELPER_BIN := $(patsubst tests/helpers/%.c,$(BUILD)/tests/helpers/%,$(HELPER_SRC))
FUZZ_REPLAY_BIN := $(patsubst %,$(BUILD)/tests/fuzz/replay_%,$(FUZZ_NAMES))
FUZZ_BIN := $(patsubst %,$(BUILD)/tests/fuzz/fuzz_%,$(FUZZ_NAMES))

# The launcher links only what it needs: no BLAS, no CUDA (libcurl is loaded at run time by the
# etcd backend); libm for the plot of `mglaunch logs --plot`.
LAUNCH_LIBS := -ldl -lm
# libmg loads OpenBLAS at run time (runtime/cpu/blas.h) so it can set its threads
# and kernels before OpenBLAS starts, and the CUDA plugin (runtime/gpu_plugin.c)
# only when a run asks for a GPU: nothing here names a CUDA library.
MG_LIBS := -lz -lm -ldl

ALL_BIN := $(if $(wildcard launcher/main.c),$(MGLAUNCH)) $(if $(wildcard models/train.c),$(TRAIN)) \
           $(if $(and $(HAVE_MHD),$(DASH_SRC)),$(DASHBOARD))

.SECONDARY:
.PHONY: all test test-gpu check unit demo bench install clean format format-check deps fuzz fuzz-bins soak FORCE
all: $(ALL_BIN) $(UNIT_BIN) $(HELPER_BIN) $(FUZZ_REPLAY_BIN)

# ---- rules -------------------------------------------------------------------
# Remade on every run, but rewritten only when its text changes: objects then
# rebuild when CUDA appears or disappears, and not otherwise.
$(CONFIG_H): FORCE
	$(Q)mkdir -p $(@D)
	$(Q){ echo '/* generated by the Makefile: what this build found */'; \
	   echo '#define MG_HAVE_CUDA $(if $(CUDA_PLUGIN),1,0) /* this build made libmg_cuda.so */'; \
	   echo '#define MG_HAVE_NCCL $(if $(CUDA_PLUGIN),1,0) /* the plugin holds the NCCL communicator */'; \
	   echo '#define MG_CUDA_VERSION $(if $(CUDA_PLUGIN),$(CUDA_MAJOR)000,0) /* the driver must support it */'; \
	   echo '#define MG_CUDA_LIBS "$(if $(CUDA_PLUGIN),$(CUDA_SONAMES))" /* what the plugin needs, in load order */'; \
	   echo '#define MG_VERSION "$(shell cat VERSION 2>/dev/null || echo 0.0.0)"'; } > $@.tmp && \
	 { cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@; }

$(BUILD)/obj/%.o: %.c $(CONFIG_H)
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(INC_$(firstword $(subst /, ,$<))) $(CFLAGS) $(CFLAGS_$(subst /,_,$(basename $<))) -c -o $@ $<

$(LIBCOMMON): $(COMMON_OBJ)
$(LIBLAUNCH): $(LAUNCHER_OBJ) $(BUILD)/obj/gen/pytb_hook.o
$(LIBMG): $(RUNTIME_OBJ)
$(LIBMODELS): $(MODELS_OBJ)
$(LIBCOMMON) $(LIBLAUNCH) $(LIBMG) $(LIBMODELS):
	$(call say,AR,$@)
	$(Q)mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(MGLAUNCH): $(call obj,launcher/main.c) $(LIBLAUNCH) $(LIBCOMMON)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LAUNCH_LIBS)

# Files built into a program: each a C array SYM (and SYM_len) made from a text file: the
# dashboard's page, and the Python hook mglaunch gives Python workers (launcher/watchdog/pytb.h).
DASH_PAGE_C := $(BUILD)/gen/dashboard_page.c
PYTB_HOOK_C := $(BUILD)/gen/pytb_hook.c
$(DASH_PAGE_C): SYM := mg_dash_page
$(DASH_PAGE_C): launcher/dashboard/page.html
$(PYTB_HOOK_C): SYM := mg_pytb_hook
$(PYTB_HOOK_C): launcher/watchdog/sitecustomize.py
$(DASH_PAGE_C) $(PYTB_HOOK_C):
	$(call say,GEN,$@)
	$(Q)mkdir -p $(@D)
	$(Q){ echo '/* generated by the Makefile from $< */'; echo '#include <stddef.h>'; \
	   echo 'extern const unsigned char $(SYM)[];'; echo 'extern const size_t $(SYM)_len;'; \
	   echo 'const unsigned char $(SYM)[] = {'; \
	   od -An -v -tx1 $< | sed 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'; echo '0};'; \
	   echo "const size_t $(SYM)_len = $$(wc -c <$<);"; } >$@.tmp && mv $@.tmp $@
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(DASHBOARD): $(call obj,$(DASH_SRC)) $(BUILD)/obj/gen/dashboard_page.o $(LIBLAUNCH) $(LIBCOMMON)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lmicrohttpd $(LAUNCH_LIBS)

$(TRAIN): $(call obj,$(TRAIN_SRC)) $(LIBMODELS) $(LIBMG) $(LIBCOMMON)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(MG_LIBS)

# Test programs link everything; static archives pull in only what each uses.
TEST_LINK := $(LIBMODELS) $(LIBLAUNCH) $(LIBMG) $(LIBCOMMON)
$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(TEST_LINK)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(MG_LIBS) $(LAUNCH_LIBS)
$(BUILD)/tests/helpers/%: $(BUILD)/obj/tests/helpers/%.o $(TEST_LINK)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(MG_LIBS) $(LAUNCH_LIBS)
# A helper of several files keeps the rest in a folder of its own.
$(BUILD)/tests/helpers/rdzv_swarm: $(call obj,$(wildcard tests/helpers/swarm/*.c))

# ---- CUDA: the plugin, and its kernels built for the host tests (docs/gpu.md) ----
# Everything that includes a CUDA header is in runtime/cuda/ and goes into
# libmg_cuda.so, which libmg dlopens (runtime/gpu_plugin.c). The kernels' .cu
# is also built by g++ through runtime/cuda/simt.h, with or without nvcc, for
# tests/unit/test_cuda_kernels.
CU_SRC := $(wildcard runtime/cuda/*.cu)
CUDA_C_SRC := $(wildcard runtime/cuda/*.c)
CU_HOST_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.host.o,$(CU_SRC))
CUDA_PLUGIN_OBJ := $(call obj,$(CUDA_C_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
CU_PTX := $(patsubst %.cu,$(BUILD)/obj/%.ptx,$(CU_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.compute_90.ptx,$(CU_SRC))
CUDA_ALL := $(if $(CUDA_PLUGIN),$(CUDA_PLUGIN) $(CU_PTX)) $(BUILD)/tests/helpers/fakecuda/libcuda.so.1 \
            $(BUILD)/tests/helpers/cudawaits/libcudawaits.so
INC_cuda := $(INC_runtime) -Iruntime/cuda $(addprefix -isystem ,$(addsuffix /include,$(filter-out /usr,$(call uniq,$(CUDART_ROOT) $(CUBLAS_ROOT) $(CUDNN_ROOT) $(NCCL_ROOT)))))
CU_HOST_FLAGS := -std=c++17 $(OPT) -ffp-contract=off -fno-exceptions -fno-rtti -fno-threadsafe-statics \
                 -Wall -Wextra -Wshadow -Werror -MMD -MP \
                 $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-sanitize=vptr -fno-omit-frame-pointer -fno-sanitize-recover=all)
# -fmad=false: no fused multiply-add, so the kernels round as the CPU's do (cuda_kernels.h).
NVCCFLAGS := -O3 -std=c++17 -fmad=false $(NVCC_ARCH) -Werror all-warnings \
             -Xcompiler -fPIC,-fvisibility=hidden,-fno-exceptions,-fno-threadsafe-statics,-ffp-contract=off,-Wall,-Wextra,-Werror
# By versioned soname (-l:libcudnn.so.9), with the directories they were found in as the run path;
# where that path is gone at run time, libmg looks for them itself (runtime/gpu_plugin.c).
CUDA_PLUGIN_LIBS := $(addprefix -L,$(CUDA_LIB_DIRS)) $(addprefix -Wl$(comma)-rpath$(comma),$(CUDA_LIB_DIRS)) \
                    $(addprefix -l:,libnccl.so.$(NCCL_MAJOR) libcudnn.so.$(CUDNN_MAJOR) libcublas.so.$(CUBLAS_MAJOR) \
                    libcudart.so.$(CUDA_MAJOR)) -ldl -lm -lpthread -lrt

$(BUILD)/obj/runtime/cuda/%.o: runtime/cuda/%.c $(CONFIG_H)
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(INC_cuda) $(CFLAGS) -fPIC -fvisibility=hidden -c -o $@ $<

$(BUILD)/obj/%.o: %.cu $(CONFIG_H)
	$(call say,NVCC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCCFLAGS) $(CPPFLAGS) $(INC_cuda) -MMD -MP -c -o $@ $<

# The PTX of the oldest target and of Hopper's, for the no-FMA check (tests/integration/cuda_build.t).
$(BUILD)/obj/%.compute_90.ptx: %.cu $(CONFIG_H)
	$(call say,PTX,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) -O3 -std=c++17 -fmad=false -arch=compute_90 $(CPPFLAGS) $(INC_cuda) -ptx -o $@ $<
$(BUILD)/obj/%.ptx: %.cu $(CONFIG_H)
	$(call say,PTX,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) -O3 -std=c++17 -fmad=false -arch=compute_75 $(CPPFLAGS) $(INC_cuda) -ptx -o $@ $<

$(BUILD)/obj/%.host.o: %.cu $(CONFIG_H)
	$(call say,CXX,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) -x c++ $(CU_HOST_FLAGS) -D_GNU_SOURCE -Iruntime/cuda -c -o $@ $<

# The plugin must leave nothing undefined, except under clang's sanitizers: clang
# links their runtime into the program that loads the plugin, not into the plugin.
PLUGIN_NO_UNDEFINED := $(if $(and $(SANITIZE),$(CC_IS_CLANG)),,-Wl,--no-undefined)
ifneq ($(CUDA_PLUGIN),)
$(CUDA_PLUGIN): $(CUDA_PLUGIN_OBJ)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -shared $(PLUGIN_NO_UNDEFINED) -o $@ $^ $(CUDA_PLUGIN_LIBS)
endif

all: $(CUDA_ALL)
# The kernels built for the host, and kernels that break the rules on purpose
# (the shim must catch them).
$(BUILD)/tests/unit/test_cuda_kernels: $(CU_HOST_OBJ) $(BUILD)/obj/tests/unit/simt_faults.host.o
$(CU_PTX): runtime/cuda/simt.h runtime/cuda/cuda_kernels.h

# A stand-in libcuda.so.1 (the driver API's device count only), so the GPU
# probe's "no device" paths run here (tests/integration/cuda_probe.t).
$(BUILD)/tests/helpers/fakecuda/libcuda.so.1: tests/helpers/fakecuda/libcuda.c
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $<

# Counts the CUDA runtime's host waits under LD_PRELOAD (tests/gpu/sync_free.t);
# never sanitized: it is preloaded into programs that are not.
$(BUILD)/tests/helpers/cudawaits/libcudawaits.so: tests/helpers/cudawaits/libcudawaits.c
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(filter-out -MMD -MP -fsanitize=% -fno-sanitize-recover=%,$(CFLAGS)) -fPIC -shared -o $@ $< -ldl

# A harness links its own file, tests/fuzz/util.c and the libraries (and
# train's command line, which is the program's own); objects before archives.
FUZZ_LINK := $(call obj,tests/fuzz/util.c) $(TEST_LINK)
$(BUILD)/tests/fuzz/replay_train_args $(BUILD)/tests/fuzz/fuzz_train_args: $(call obj,models/train_args.c)
$(BUILD)/tests/fuzz/replay_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(call obj,tests/fuzz/replay.c) $(FUZZ_LINK)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(MG_LIBS) $(LAUNCH_LIBS)
$(BUILD)/tests/fuzz/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LINK)
	$(call say,LINK,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $(filter %.o,$^) $(filter %.a,$^) $(MG_LIBS) $(LAUNCH_LIBS)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- user targets ------------------------------------------------------------
deps:
	$(Q)scripts/deps.sh

# The whole suite: unit tests (C, TAP) and integration tests (shell, TAP) under prove.
# T=... runs a subset. Each test runs under tests/lib/run-test, which applies its timeout.
T ?= $(UNIT_BIN) $(sort $(wildcard tests/integration/*.t)) $(GPU_T)
test: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) prove -j$(or $(J),2) --timer --exec tests/lib/run-test $(T)
check: test

# The GPU suite (docs/gpu.md): the CUDA backend against the CPU one, NCCL,
# and train on GPUs (tests/gpu/*.t, also in make test, where they skip
# without a GPU); tests/gpu/run.sh runs them all with time limits, memcheck
# and the benchmark, and keeps the logs.
GPU_T := $(sort $(wildcard tests/gpu/*.t))
test-gpu: deps
	$(Q)BUILD=$(BUILD) tests/gpu/run.sh

unit: all
	$(Q)MG_BUILD=$(BUILD) prove -j2 --exec tests/lib/run-test $(UNIT_BIN)

# Only what the demo runs: mglaunch and train (libmg is linked into train; the
# demo trains on the CPU, so no CUDA plugin, and no test or fuzz programs).
demo: deps
	$(Q)$(MAKE) --no-print-directory $(MGLAUNCH) $(TRAIN)
	$(Q)MG_BUILD=$(BUILD) scripts/demo.sh

# libFuzzer over every harness, FUZZ_SECONDS each, one after the other
# (tests/fuzz/run.sh: new inputs go to build/fuzz/corpus/, crashes to
# build/fuzz/crashes/; a table of executions and findings at the end).
FUZZ_SECONDS ?= 60
fuzz:
	$(Q)$(MAKE) --no-print-directory CC=clang SANITIZE=address,undefined BUILD=build/fuzz FUZZ=1 fuzz-bins
	$(Q)MG_BUILD=build/fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_NAMES)
fuzz-bins: $(FUZZ_BIN)

# The fault-injection soak (scripts/soak.sh): SOAK_FAULTS random SIGKILL,
# SIGSEGV and SIGTERM of training workers under mglaunch with restarts, then
# SOAK_NODE_FAULTS worker kills and node losses (with rejoins) of an elastic
# job of three agents, each run checked against the replay of its schedule.
SOAK_FAULTS ?= 100
SOAK_NODE_FAULTS ?= 20
soak:
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) scripts/soak.sh $(SOAK_FAULTS) $(SOAK_NODE_FAULTS)

bench: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) tests/bench/run-all.sh

# The programs, their man pages (docs/man) and their bash completions (scripts/completion).
COMPLETIONDIR ?= $(PREFIX)/share/bash-completion/completions
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(COMPLETIONDIR)
	install -m 755 $(ALL_BIN) $(DESTDIR)$(PREFIX)/bin/
	$(if $(CUDA_PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib && install -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/)
	install -m 644 $(wildcard docs/man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 scripts/completion/mglaunch.bash $(DESTDIR)$(COMPLETIONDIR)/mglaunch
	install -m 644 scripts/completion/train.bash $(DESTDIR)$(COMPLETIONDIR)/train

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)
format-check:
	$(Q)clang-format --dry-run -Werror $(FORMAT_SRC)

clean:
	rm -rf build
