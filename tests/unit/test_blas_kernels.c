/* The choice of OpenBLAS kernels from the processor's features (cpu_features.h):
 * the decision as a pure function of recorded cpuid/xgetbv bits and of the
 * family OpenBLAS picked itself, for CPUs this machine is not; then the real
 * loader on this machine (its result never below what the CPU runs, the
 * environment left as it was, a product that adds up), and the banner.
 * timeout: 30 */
#include "blas.h"
#include "cpu_features.h"
#include "mg_err.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* cpuid leaves 1 and 7 and XCR0 as these CPUs report them */
static const struct mg_cpu_id
    /* the machine this was written on: Intel family 6 model 167, AVX-512 with
     * BF16, VNNI, FP16, and AMX */
    xeon_167 = {"GenuineIntel", 0xa0671,    0xfffa3203, 0x1f8bfbff, 0xf1bf2ffb,
                0x1a415f46,     0x23c14010, 0x1c30,     0x600e7},
    /* family 6 model 207 (Emerald Rapids), which OpenBLAS 0.3.21 does not know:
     * the same instruction sets */
    xeon_207 = {"GenuineIntel", 0xc06f2,    0xfffa3203, 0x1f8bfbff, 0xf1bf2ffb,
                0x1a415f46,     0x23c14010, 0x1c30,     0x600e7},
    /* the same CPU under an OS (or hypervisor) that does not save zmm state */
    xeon_207_no_zmm = {"GenuineIntel", 0xc06f2,    0xfffa3203, 0x1f8bfbff, 0xf1bf2ffb,
                       0x1a415f46,     0x23c14010, 0x1c30,     0x7},
    /* Core i7-4770 (Haswell): AVX2 + FMA */
    haswell = {"GenuineIntel", 0x306c3, 0x7ffafbff, 0xbfebfbff, 0x27ab, 0, 0x9c000400, 0, 0x7},
    /* Ryzen 3000 (Zen 2): AVX2 + FMA */
    zen2 = {"AuthenticAMD", 0x870f10, 0x7ed8320b, 0x178bfbff, 0x219c91a9, 0x400004, 0, 0, 0x207},
    /* Core i7-2600 (Sandy Bridge): AVX, no FMA */
    sandy = {"GenuineIntel", 0x206a7, 0x1fbae3ff, 0xbfebfbff, 0, 0, 0, 0, 0x7},
    /* Core 2 Duo E8400 (Penryn): SSE4.1, no XSAVE */
    core2 = {"GenuineIntel", 0x10676, 0x0008e3fd, 0xbfebfbff, 0, 0, 0, 0, 0},
    /* off x86 */
    none = {"", 0, 0, 0, 0, 0, 0, 0, 0};

static const char *choice(const char *s)
{
    return s ? s : "(keep)";
}

int main(void)
{
    /* what each CPU runs */
    is_int(mg_cpu_isa(&xeon_167), MG_ISA_AVX512, "family 6 model 167: AVX-512");
    is_int(mg_cpu_family(&xeon_167), 6, "family 6");
    is_int(mg_cpu_model(&xeon_167), 167, "model 167");
    is_int(mg_cpu_model(&xeon_207), 207, "model 207");
    is_int(mg_cpu_isa(&xeon_207), MG_ISA_AVX512, "model 207: AVX-512");
    is_int(mg_cpu_isa(&xeon_207_no_zmm), MG_ISA_AVX2,
           "AVX-512 in cpuid but the OS does not save zmm: AVX2");
    is_int(mg_cpu_isa(&haswell), MG_ISA_AVX2, "Haswell: AVX2+FMA");
    is_int(mg_cpu_isa(&zen2), MG_ISA_AVX2, "Zen 2: AVX2+FMA");
    is_int(mg_cpu_isa(&sandy), MG_ISA_AVX, "Sandy Bridge: AVX");
    is_int(mg_cpu_isa(&core2), MG_ISA_SSE3, "Core 2: SSE3 level");
    is_int(mg_cpu_isa(&none), MG_ISA_NONE, "no cpuid: nothing known");
    is_str(mg_isa_name(MG_ISA_AVX512), "AVX-512", "the level's name");
    struct mg_cpu_id osxsave_off = haswell;
    osxsave_off.leaf1_ecx &= ~(1u << 27);
    is_int(mg_cpu_isa(&osxsave_off), MG_ISA_SSE3, "AVX without OSXSAVE cannot be used");

    /* the library's recorded answers and what mg does with them */
    is_str(choice(mg_openblas_core_for(&xeon_207, "Prescott")), "SkylakeX",
           "unknown AVX-512 CPU, library fell back to Prescott: SkylakeX");
    is_str(choice(mg_openblas_core_for(&xeon_167, "SkylakeX")), "(keep)",
           "library picked SkylakeX on AVX-512: kept");
    is_str(choice(mg_openblas_core_for(&xeon_167, "Cooperlake")), "(keep)",
           "library picked Cooperlake on AVX-512: kept");
    is_str(choice(mg_openblas_core_for(&xeon_207, "Haswell")), "SkylakeX",
           "library picked Haswell on AVX-512: SkylakeX");
    is_str(choice(mg_openblas_core_for(&xeon_207, "SapphireRapids")), "(keep)",
           "a family newer than the table: kept");
    is_str(choice(mg_openblas_core_for(&xeon_207, "neoversen1")), "(keep)",
           "a name the table does not know: kept");
    is_str(choice(mg_openblas_core_for(&xeon_207_no_zmm, "Prescott")), "Haswell",
           "no OS zmm state, library fell back: Haswell, never SkylakeX");
    is_str(choice(mg_openblas_core_for(&xeon_207_no_zmm, "Haswell")), "(keep)",
           "no OS zmm state, library picked Haswell: kept");
    is_str(choice(mg_openblas_core_for(&haswell, "Prescott")), "Haswell", "AVX2 Intel: Haswell");
    is_str(choice(mg_openblas_core_for(&haswell, "Haswell")), "(keep)", "Haswell recognised: kept");
    is_str(choice(mg_openblas_core_for(&zen2, "Prescott")), "Zen", "AVX2 AMD: Zen");
    is_str(choice(mg_openblas_core_for(&zen2, "Zen")), "(keep)", "Zen recognised: kept");
    is_str(choice(mg_openblas_core_for(&sandy, "Nehalem")), "Sandybridge", "AVX only: Sandybridge");
    is_str(choice(mg_openblas_core_for(&core2, "Prescott")), "(keep)",
           "SSE-only CPU, Prescott: nothing better");
    is_str(choice(mg_openblas_core_for(&core2, "Core2")), "(keep)", "SSE-only CPU, Core2: kept");
    is_str(choice(mg_openblas_core_for(&none, "Prescott")), "(keep)", "off x86: kept");
    is_str(choice(mg_openblas_core_name("skylakex")), "SkylakeX", "names are case-insensitive");
    ok(!mg_openblas_core_name("bogus"), "an unknown name is not a family");

    /* the real library on this machine */
    struct mg_cpu_id here;
    mg_cpu_id_read(&here);
    diag("this CPU: %s family %u model %u, %s", here.vendor, mg_cpu_family(&here),
         mg_cpu_model(&here), mg_isa_name(mg_cpu_isa(&here)));
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("MG_BLAS_CORETYPE");
    const struct mg_blas *b;
    char err[MG_ERRMSG_LEN] = "";
    if (mg_blas_load(1, &b, err) < 0)
        BAIL_OUT("no BLAS: %s", err);
    ok(!getenv("OPENBLAS_CORETYPE") && !getenv("OPENBLAS_NUM_THREADS"),
       "the load leaves the environment as it was");
    char desc[256];
    mg_blas_describe(b, 1, desc, sizeof(desc));
    diag("kernels: %s", desc);
    if (b->core[0] && mg_openblas_core_isa(b->core) >= 0) {
        ok(mg_openblas_core_isa(b->core) >= (int)mg_cpu_isa(&here) ||
               b->origin == MG_BLAS_FROM_LIBRARY_ONLY,
           "the kernels that run use the CPU's level (%s)", b->core);
        ok(b->library_core[0], "the library's own choice is recorded (%s)", b->library_core);
        ok(b->origin == MG_BLAS_FROM_LIBRARY || b->origin == MG_BLAS_FROM_FEATURES ||
               b->origin == MG_BLAS_FROM_LIBRARY_ONLY,
           "nobody forced a family");
    }
    float a[4] = {1, 2, 3, 4}, x[4] = {5, 6, 7, 8}, c[4];
    b->sgemm(MG_BLAS_ROW_MAJOR, MG_BLAS_NO_TRANS, MG_BLAS_NO_TRANS, 2, 2, 2, 1.0f, a, 2, x, 2, 0.0f,
             c, 2);
    ok(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50, "sgemm through the chosen kernels");

    /* the banner for each origin, from recorded loads */
    struct mg_blas rec = {.library = "libopenblas.so.0",
                          .core = "SkylakeX",
                          .library_core = "Prescott",
                          .requested = "SkylakeX",
                          .origin = MG_BLAS_FROM_FEATURES,
                          .cpu_isa = MG_ISA_AVX512};
    mg_blas_describe(&rec, 1, desc, sizeof(desc));
    is_str(desc,
           "OpenBLAS SkylakeX kernels chosen for AVX-512, 1 thread; the library picked Prescott "
           "for this CPU",
           "banner: chosen from the features");
    rec = (struct mg_blas){.library = "libopenblas.so.0",
                           .core = "Prescott",
                           .requested = "Prescott",
                           .origin = MG_BLAS_FROM_OPENBLAS_ENV,
                           .cpu_isa = MG_ISA_AVX512};
    mg_blas_describe(&rec, 2, desc, sizeof(desc));
    is_str(desc, "OpenBLAS Prescott set by OPENBLAS_CORETYPE, 2 threads; this CPU has AVX-512",
           "banner: the user's OPENBLAS_CORETYPE, below the CPU");
    rec = (struct mg_blas){.library = "libopenblas.so.0",
                           .core = "Haswell",
                           .library_core = "Haswell",
                           .origin = MG_BLAS_FROM_LIBRARY,
                           .cpu_isa = MG_ISA_AVX2};
    mg_blas_describe(&rec, 1, desc, sizeof(desc));
    is_str(desc, "OpenBLAS Haswell, 1 thread", "banner: the library's own choice");
    rec = (struct mg_blas){.library = "libopenblas.so.0",
                           .core = "Prescott",
                           .library_core = "Prescott",
                           .origin = MG_BLAS_FROM_LIBRARY_ONLY,
                           .cpu_isa = MG_ISA_AVX512,
                           .no_reload = "this OpenBLAS was built with one kernel family"};
    mg_blas_describe(&rec, 1, desc, sizeof(desc));
    is_str(desc,
           "OpenBLAS Prescott, 1 thread; this CPU has AVX-512, but this OpenBLAS was built with "
           "one kernel family",
           "banner: below the CPU and no way to change it");
    rec = (struct mg_blas){.library = "libblas.so.3", .cpu_isa = MG_ISA_AVX2};
    mg_blas_describe(&rec, 1, desc, sizeof(desc));
    is_str(desc, "libblas.so.3, 1 thread", "banner: another BLAS");
    return done_testing();
}
