/* The processor's instruction sets and the OpenBLAS family they call for (see
 * cpu_features.h). */
#include "cpu_features.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void mg_cpu_id_read(struct mg_cpu_id *id)
{
    unsigned a, b, c, d, max;
    memset(id, 0, sizeof(*id));
    if (!__get_cpuid(0, &max, &b, &c, &d))
        return;
    memcpy(id->vendor, &b, 4);
    memcpy(id->vendor + 4, &d, 4);
    memcpy(id->vendor + 8, &c, 4);
    __cpuid(1, a, b, c, d);
    id->leaf1_eax = a;
    id->leaf1_ecx = c;
    id->leaf1_edx = d;
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        id->leaf7_ebx = b;
        id->leaf7_ecx = c;
        id->leaf7_edx = d;
        if (a >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            id->leaf7_1_eax = a;
        }
    }
    /* xgetbv faults unless the OS turned XSAVE on */
    if (id->leaf1_ecx & (1u << 27))
        id->xcr0 = read_xcr0();
}
#else
void mg_cpu_id_read(struct mg_cpu_id *id)
{
    memset(id, 0, sizeof(*id));
}
#endif

#define BIT(r, n) (((r) >> (n)) & 1u)

enum mg_isa mg_cpu_isa(const struct mg_cpu_id *id)
{
    if (!BIT(id->leaf1_edx, 26)) /* SSE2 */
        return MG_ISA_NONE;
    /* xmm and ymm state (bits 1, 2), and for AVX-512 opmask and zmm (5, 6, 7):
     * an instruction set whose registers the OS does not save cannot be used */
    int os_ymm = BIT(id->leaf1_ecx, 27) && (id->xcr0 & 0x6) == 0x6;
    int os_zmm = os_ymm && (id->xcr0 & 0xe0) == 0xe0;
    int avx = os_ymm && BIT(id->leaf1_ecx, 28);
    int avx2 = avx && BIT(id->leaf7_ebx, 5) && BIT(id->leaf1_ecx, 12); /* AVX2, FMA */
    /* F (16), DQ (17), CD (28), BW (30), VL (31): what OpenBLAS's SkylakeX kernels use */
    uint32_t avx512_bits = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
    if (avx2 && os_zmm && (id->leaf7_ebx & avx512_bits) == avx512_bits)
        return MG_ISA_AVX512;
    if (avx2)
        return MG_ISA_AVX2;
    if (avx)
        return MG_ISA_AVX;
    if (BIT(id->leaf1_ecx, 0))
        return MG_ISA_SSE3;
    return MG_ISA_SSE2;
}

const char *mg_isa_name(enum mg_isa isa)
{
    switch (isa) {
    case MG_ISA_AVX512:
        return "AVX-512";
    case MG_ISA_AVX2:
        return "AVX2+FMA";
    case MG_ISA_AVX:
        return "AVX";
    case MG_ISA_SSE3:
        return "SSE3";
    case MG_ISA_SSE2:
        return "SSE2";
    case MG_ISA_NONE:
        break;
    }
    return "no known ISA";
}

int mg_isa_flops_per_cycle(enum mg_isa isa)
{
    switch (isa) {
    case MG_ISA_AVX512:
        return 64;
    case MG_ISA_AVX2:
        return 32;
    case MG_ISA_AVX:
        return 16;
    case MG_ISA_SSE3:
    case MG_ISA_SSE2:
        return 8;
    case MG_ISA_NONE:
        break;
    }
    return 0;
}

unsigned mg_cpu_family(const struct mg_cpu_id *id)
{
    unsigned f = (id->leaf1_eax >> 8) & 0xf;
    return f == 0xf ? f + ((id->leaf1_eax >> 20) & 0xff) : f;
}

unsigned mg_cpu_model(const struct mg_cpu_id *id)
{
    unsigned f = (id->leaf1_eax >> 8) & 0xf, m = (id->leaf1_eax >> 4) & 0xf;
    return f == 6 || f == 0xf ? m | (((id->leaf1_eax >> 16) & 0xf) << 4) : m;
}

/* OpenBLAS's x86-64 families (its driver/others/dynamic.c) and the instruction
 * set their kernels use. */
static const struct {
    const char *name;
    enum mg_isa isa;
} cores[] = {
    {"Katmai", MG_ISA_SSE2},       {"Coppermine", MG_ISA_SSE2},
    {"Northwood", MG_ISA_SSE2},    {"Banias", MG_ISA_SSE2},
    {"Athlon", MG_ISA_SSE2},       {"Opteron", MG_ISA_SSE2},
    {"Prescott", MG_ISA_SSE3},     {"Atom", MG_ISA_SSE3},
    {"Core2", MG_ISA_SSE3},        {"Penryn", MG_ISA_SSE3},
    {"Dunnington", MG_ISA_SSE3},   {"Nehalem", MG_ISA_SSE3},
    {"Opteron_SSE3", MG_ISA_SSE3}, {"Barcelona", MG_ISA_SSE3},
    {"Nano", MG_ISA_SSE3},         {"Bobcat", MG_ISA_SSE3},
    {"Sandybridge", MG_ISA_AVX},   {"Bulldozer", MG_ISA_AVX},
    {"Piledriver", MG_ISA_AVX},    {"Steamroller", MG_ISA_AVX},
    {"Haswell", MG_ISA_AVX2},      {"Excavator", MG_ISA_AVX2},
    {"Zen", MG_ISA_AVX2},          {"SkylakeX", MG_ISA_AVX512},
    {"Cooperlake", MG_ISA_AVX512}, {"SapphireRapids", MG_ISA_AVX512},
};

const char *mg_openblas_core_name(const char *core)
{
    for (size_t i = 0; core && i < sizeof(cores) / sizeof(cores[0]); i++)
        if (strcasecmp(core, cores[i].name) == 0)
            return cores[i].name;
    return NULL;
}

int mg_openblas_core_isa(const char *core)
{
    for (size_t i = 0; core && i < sizeof(cores) / sizeof(cores[0]); i++)
        if (strcasecmp(core, cores[i].name) == 0)
            return (int)cores[i].isa;
    return -1;
}

const char *mg_openblas_core_for(const struct mg_cpu_id *id, const char *library_core)
{
    int have = mg_openblas_core_isa(library_core);
    enum mg_isa isa = mg_cpu_isa(id);
    if (have < 0 || have >= (int)isa) /* a family newer than this table, or good enough */
        return NULL;
    int amd = strcmp(id->vendor, "AuthenticAMD") == 0 || strcmp(id->vendor, "HygonGenuine") == 0;
    switch (isa) {
    case MG_ISA_AVX512:
        return "SkylakeX";
    case MG_ISA_AVX2:
        return amd ? "Zen" : "Haswell";
    case MG_ISA_AVX:
        return "Sandybridge";
    case MG_ISA_SSE3:
        return "Prescott";
    case MG_ISA_SSE2:
    case MG_ISA_NONE:
        break;
    }
    return NULL;
}
