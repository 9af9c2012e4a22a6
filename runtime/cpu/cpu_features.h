/* What the processor can run, from cpuid and what the operating system enables
 * (xgetbv), and the OpenBLAS kernel family that fits it. The decision is a pure
 * function of those bits and of the family OpenBLAS picked by itself, so that
 * it can be tested with the recorded bits of CPUs this machine is not: OpenBLAS
 * chooses from a table of model numbers, and on a CPU newer than the library it
 * falls back to its SSE3 "Prescott" kernels (half the speed on an AVX-512
 * Xeon). mg never looks at model numbers: only at instruction sets. */
#ifndef MG_CPU_FEATURES_H
#define MG_CPU_FEATURES_H

#include <stdint.h>

/* The registers that say which instruction sets exist and are enabled. */
struct mg_cpu_id {
    char vendor[13];      /* "GenuineIntel", "AuthenticAMD", "" off x86 */
    uint32_t leaf1_eax;   /* family, model, stepping */
    uint32_t leaf1_ecx;   /* SSE3, SSSE3, FMA, SSE4.1/4.2, OSXSAVE, AVX */
    uint32_t leaf1_edx;   /* SSE, SSE2 */
    uint32_t leaf7_ebx;   /* AVX2, AVX-512 F/DQ/CD/BW/VL */
    uint32_t leaf7_ecx;   /* AVX-512 VNNI, ... */
    uint32_t leaf7_edx;   /* AVX-512 FP16, AMX */
    uint32_t leaf7_1_eax; /* AVX-512 BF16 */
    uint64_t xcr0;        /* register state the OS saves (0 without OSXSAVE) */
};

/* Instruction-set levels, in the order kernels get faster. */
enum mg_isa {
    MG_ISA_NONE = 0, /* not x86-64, or nothing known */
    MG_ISA_SSE2,     /* the x86-64 baseline */
    MG_ISA_SSE3,
    MG_ISA_AVX,
    MG_ISA_AVX2,   /* AVX2 + FMA */
    MG_ISA_AVX512, /* AVX-512 F, CD, BW, DQ, VL with the OS saving the zmm state */
};

/* This processor's bits (zeros off x86). */
void mg_cpu_id_read(struct mg_cpu_id *id);

/* The highest level the CPU has and the OS enables. */
enum mg_isa mg_cpu_isa(const struct mg_cpu_id *id);

/* "AVX-512", "AVX2+FMA", "AVX", "SSE3", "SSE2", "no known ISA". */
const char *mg_isa_name(enum mg_isa isa);

/* Single-precision FLOP per cycle and core at a level, for a machine's peak
 * (cores x clock x this): AVX-512 64 and AVX2 32 (two FMA units of 16 or 8
 * lanes; a part with one 512-bit unit reaches half), AVX 16 (a multiply and an
 * add of 8 lanes), SSE 8. */
int mg_isa_flops_per_cycle(enum mg_isa isa);

/* Family 6, model 167 style numbers, for messages. */
unsigned mg_cpu_family(const struct mg_cpu_id *id);
unsigned mg_cpu_model(const struct mg_cpu_id *id);

/* The level an OpenBLAS x86-64 kernel family needs (case-insensitive name:
 * "Prescott", "Haswell", "SkylakeX", ...); -1 for a name not in the table
 * (another architecture, or a family newer than this table). */
int mg_openblas_core_isa(const char *core);

/* The family name as OpenBLAS spells it, or NULL when core is not one. */
const char *mg_openblas_core_name(const char *core);

/* The family to force (OPENBLAS_CORETYPE) on this CPU when OpenBLAS picked
 * library_core by itself: NULL to keep the library's choice, which is whenever
 * its kernels use the CPU's level (or a family this table does not know, which
 * is newer than it). AVX-512 gives SkylakeX (OpenBLAS's Cooperlake differs
 * only in bfloat16 routines mg does not call), AVX2 Haswell (Zen on AMD and
 * Hygon), AVX Sandybridge, SSE3 Prescott. */
const char *mg_openblas_core_for(const struct mg_cpu_id *id, const char *library_core);

#endif
