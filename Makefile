# mg: one non-recursive Makefile. Every output goes under build/.
#
#   make            build mglaunch, libmg, train, the test programs
#   make test       install/check dependencies, build, run the whole suite under prove
#   make demo       the README's main job: 2 workers train the CNN on Fashion-MNIST
#   make bench      benchmarks against torchrun / PyTorch DDP / memcpy (tests/bench/)
#   make fuzz       libFuzzer over every parser of outside input (clang; FUZZ_SECONDS=60 each)
#   make soak       workers killed at random during training (SOAK_FAULTS=100); checks the outcome
#   make install    PREFIX=/usr/local
#   make clean
#
# Knobs: SANITIZE=address,undefined  DEBUG=1  V=1  T=<test files>  NVCC=<path>

PREFIX ?= /usr/local
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

comma := ,
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
INC_launcher := -Icommon -Ilauncher -Ilauncher/rdzv
INC_runtime := -Icommon -Iruntime -Iruntime/cpu -Iruntime/comm
INC_models := $(INC_runtime) -Imodels
INC_tests := $(INC_launcher) $(INC_models) -Itests/lib
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
HAVE_NCCL := $(if $(NVCC),$(shell test -e $(CUDA_HOME)/include/nccl.h -o -e /usr/include/nccl.h && echo 1))
CU_SRC := $(if $(NVCC),$(wildcard runtime/cuda/*.cu))

ifeq ($(MAKELEVEL),0)
ifeq ($(filter clean format,$(MAKECMDGOALS)),)
$(info mg build: $(BUILD)  cc: $(CC) $(shell $(CC) -dumpfullversion 2>/dev/null))
$(info mg build: openblas: $(if $(HAVE_OPENBLAS),found,MISSING (apt-get install libopenblas-dev)))
$(info mg build: nvcc: $(if $(NVCC),$(NVCC) -> $(if $(CU_SRC),$(words $(CU_SRC)) CUDA source(s) built,no CUDA sources yet),not found -> CPU-only build))
$(info mg build: nccl: $(if $(HAVE_NCCL),found,not found))
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
LAUNCHER_SRC := $(filter-out launcher/main.c,$(wildcard launcher/*.c launcher/*/*.c))
RUNTIME_SRC := $(filter-out runtime/cuda/%,$(wildcard runtime/*.c runtime/*/*.c))
# The train program: its main and its command line; the rest of models/ is a library.
TRAIN_SRC := models/train.c models/train_args.c
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
RUNTIME_OBJ := $(call obj,$(RUNTIME_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
MODELS_OBJ := $(call obj,$(MODELS_SRC))

LIBCOMMON := $(BUILD)/lib/libmgcommon.a
LIBLAUNCH := $(BUILD)/lib/libmglaunch.a
LIBMG := $(BUILD)/lib/libmg.a
LIBMODELS := $(BUILD)/lib/libmgmodels.a
CONFIG_H := $(BUILD)/include/mg_config.h

MGLAUNCH := $(BUILD)/bin/mglaunch
TRAIN := $(BUILD)/bin/train
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
HELPER_BIN := $(patsubst tests/helpers/%.c,$(BUILD)/tests/helpers/%,$(HELPER_SRC))
FUZZ_REPLAY_BIN := $(patsubst %,$(BUILD)/tests/fuzz/replay_%,$(FUZZ_NAMES))
FUZZ_BIN := $(patsubst %,$(BUILD)/tests/fuzz/fuzz_%,$(FUZZ_NAMES))

CUDA_LIBS := $(if $(CU_SRC),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcudart -lcublas $(if $(HAVE_NCCL),-lnccl))
# The launcher links only what it needs: no BLAS, no CUDA (libcurl is loaded at run time by the etcd backend).
LAUNCH_LIBS := -ldl -lm
# libmg loads OpenBLAS at run time (runtime/cpu/blas.h) so it can set its threads
# and kernels before OpenBLAS starts.
MG_LIBS := -lz -lm -ldl $(CUDA_LIBS)

ALL_BIN := $(if $(wildcard launcher/main.c),$(MGLAUNCH)) $(if $(wildcard models/train.c),$(TRAIN))

.SECONDARY:
.PHONY: all test check unit demo bench install clean format format-check deps fuzz fuzz-bins soak
all: $(ALL_BIN) $(UNIT_BIN) $(HELPER_BIN) $(FUZZ_REPLAY_BIN)

# ---- rules -------------------------------------------------------------------
$(CONFIG_H): Makefile
	$(Q)mkdir -p $(@D)
	$(Q){ echo '/* generated by the Makefile: what this build found */'; \
	   echo '#define MG_HAVE_CUDA $(if $(CU_SRC),1,0)'; \
	   echo '#define MG_HAVE_NCCL $(if $(and $(CU_SRC),$(HAVE_NCCL)),1,0)'; \
	   echo '#define MG_VERSION "$(shell cat VERSION 2>/dev/null || echo 0.0.0)"'; } > $@.tmp && \
	 { cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@; }

$(BUILD)/obj/%.o: %.c | $(CONFIG_H)
	$(call say,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(INC_$(firstword $(subst /, ,$<))) $(CFLAGS) $(CFLAGS_$(subst /,_,$(basename $<))) -c -o $@ $<

$(BUILD)/obj/%.o: %.cu | $(CONFIG_H)
	$(call say,NVCC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) -O2 -std=c++17 $(CPPFLAGS) $(INC_runtime) -Xcompiler -fPIC -c -o $@ $<

$(LIBCOMMON): $(COMMON_OBJ)
$(LIBLAUNCH): $(LAUNCHER_OBJ)
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
T ?= $(UNIT_BIN) $(sort $(wildcard tests/integration/*.t))
test: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) prove -j$(or $(J),2) --timer --exec tests/lib/run-test $(T)
check: test

unit: all
	$(Q)MG_BUILD=$(BUILD) prove -j2 --exec tests/lib/run-test $(UNIT_BIN)

demo: deps
	$(Q)$(MAKE) --no-print-directory all
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
# SIGSEGV and SIGTERM of training workers under mglaunch with restarts.
SOAK_FAULTS ?= 100
soak:
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) scripts/soak.sh $(SOAK_FAULTS)

bench: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)MG_BUILD=$(BUILD) tests/bench/run-all.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 $(ALL_BIN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(wildcard docs/man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1/

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)
format-check:
	$(Q)clang-format --dry-run -Werror $(FORMAT_SRC)

clean:
	rm -rf build
