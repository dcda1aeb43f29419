/* dispatch.c - read the CPU's features once, build one kernel table per
 * instruction set it supports, and pick the best (or the one PYENGINE_ISA
 * names).  Hot loops call through pe_kern and never test features. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if defined(PE_ARCH_X86)
#if defined(_MSC_VER)
#include <intrin.h>
static void cpuid(int leaf, int sub, int r[4]) { __cpuidex(r, leaf, sub); }
static unsigned long long xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(int leaf, int sub, int r[4]) {
    unsigned a, b, c, d;
    __cpuid_count(leaf, sub, a, b, c, d);
    r[0] = (int)a; r[1] = (int)b; r[2] = (int)c; r[3] = (int)d;
}
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif
#endif

#if defined(PE_ARCH_ARM) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif
#if defined(PE_ARCH_ARM) && defined(_WIN32)
#include <windows.h>
#endif

/* in order of preference: the best one available is the last */
enum { ISA_SCALAR, ISA_AVX2, ISA_AVXVNNI, ISA_AVX512, ISA_NEON_NODOT, ISA_NEON, ISA_COUNT };
static const char *isa_names[ISA_COUNT] = {"scalar", "avx2", "avxvnni", "avx512", "neon_nodot", "neon"};

static pe_kernels tables[ISA_COUNT];
static bool       have[ISA_COUNT];
static int        best = ISA_SCALAR;
static int        current = ISA_SCALAR;
static bool       initialised;

const pe_kernels *pe_kern = &tables[ISA_SCALAR];

static void detect(void) {
    have[ISA_SCALAR] = true;
#if defined(PE_ARCH_X86)
    int r[4];
    cpuid(0, 0, r);
    const int max_leaf = r[0];
    cpuid(1, 0, r);
    const bool osxsave = (r[2] >> 27) & 1, fma = (r[2] >> 12) & 1, f16c = (r[2] >> 29) & 1;
    if (!osxsave || max_leaf < 7) return;
    const unsigned long long xcr0 = xgetbv0();
    const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    cpuid(7, 0, r);
    const int max_sub7 = r[0];
    const bool avx2 = (r[1] >> 5) & 1, bmi2 = (r[1] >> 8) & 1;
    const bool avx512f = (r[1] >> 16) & 1, avx512dq = (r[1] >> 17) & 1;
    const bool avx512bw = (r[1] >> 30) & 1, avx512vl = (r[1] >> 31) & 1;
    const bool vnni = (r[2] >> 11) & 1;
    have[ISA_AVX2] = ymm && avx2 && fma && f16c && bmi2;
#if defined(PE_HAVE_AVXVNNI)   /* the compiler built avxvnni_gemm.c */
    if (max_sub7 >= 1) {
        cpuid(7, 1, r);
        have[ISA_AVXVNNI] = have[ISA_AVX2] && ((r[0] >> 4) & 1);
    }
#else
    (void)max_sub7;
#endif
    have[ISA_AVX512] = have[ISA_AVX2] && zmm && avx512f && avx512dq && avx512bw && avx512vl && vnni;
#elif defined(PE_ARCH_ARM)
#if defined(__APPLE__)
    /* every arm64 Mac has the dot product; the build has no second table there */
    have[ISA_NEON] = true;
#elif defined(__linux__)
    const unsigned long hwcap = getauxval(AT_HWCAP);
    have[ISA_NEON_NODOT] = (hwcap & HWCAP_ASIMD) != 0;
    /* the dotprod build is compiled for armv8.2-a with fp16 too */
    have[ISA_NEON] = have[ISA_NEON_NODOT] && (hwcap & HWCAP_ASIMDDP) && (hwcap & HWCAP_ASIMDHP);
#elif defined(_WIN32)
    have[ISA_NEON_NODOT] = true;
    have[ISA_NEON] = IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE) != 0;
#endif
#endif
}

static void build_tables(void) {
    pe_kernels *ref = &tables[ISA_SCALAR];
    memset(ref, 0, sizeof *ref);
    ref->isa = isa_names[ISA_SCALAR];
    pe_fill_ref_float(ref);
    pe_fill_ref_legacy(ref);
    pe_fill_ref_kquants(ref);
    pe_fill_ref_iquants(ref);
    pe_fill_ref_rows8(ref);
    pe_fill_vec_scalar(ref);
    pe_fill_ssm_scalar(ref);
#if defined(PE_ARCH_X86)
    if (have[ISA_AVX2]) {
        tables[ISA_AVX2] = *ref;
        tables[ISA_AVX2].isa = isa_names[ISA_AVX2];
        pe_fill_vec_avx2(&tables[ISA_AVX2]);
        pe_fill_ssm_avx2(&tables[ISA_AVX2]);
        pe_fill_avx2_legacy(&tables[ISA_AVX2]);
        pe_fill_avx2_kquants(&tables[ISA_AVX2]);
        pe_fill_avx2_iq2(&tables[ISA_AVX2]);
        pe_fill_avx2_iq13(&tables[ISA_AVX2]);
        pe_fill_avx2_iq_gemm(&tables[ISA_AVX2]);
        pe_fill_avx2_gemm(&tables[ISA_AVX2]);
        pe_fill_avx2_mxfp4(&tables[ISA_AVX2]);
    }
#if defined(PE_HAVE_AVXVNNI)
    if (have[ISA_AVXVNNI]) {
        tables[ISA_AVXVNNI] = tables[ISA_AVX2];
        tables[ISA_AVXVNNI].isa = isa_names[ISA_AVXVNNI];
        pe_fill_avxvnni_gemm(&tables[ISA_AVXVNNI]);
    }
#endif
    if (have[ISA_AVX512]) {
        tables[ISA_AVX512] = tables[ISA_AVX2];
        tables[ISA_AVX512].isa = isa_names[ISA_AVX512];
        pe_fill_vec_avx512(&tables[ISA_AVX512]);
        pe_fill_ssm_avx512(&tables[ISA_AVX512]);
        pe_fill_avx512_legacy(&tables[ISA_AVX512]);
        pe_fill_avx512_gemm(&tables[ISA_AVX512]);
        pe_fill_avx512_iq_gemm(&tables[ISA_AVX512]);
        pe_fill_avx512_mxfp4(&tables[ISA_AVX512]);
    }
#elif defined(PE_ARCH_ARM)
#if defined(PE_HAVE_NEON_NODOT)   /* the build compiled the NEON files a second time */
    if (have[ISA_NEON_NODOT]) {
        pe_kernels *t = &tables[ISA_NEON_NODOT];
        *t = *ref;
        t->isa = isa_names[ISA_NEON_NODOT];
        pe_fill_vec_neon_nodot(t);
        pe_fill_ssm_neon_nodot(t);
        pe_fill_neon_legacy_nodot(t);
        pe_fill_neon_kquants_nodot(t);
        pe_fill_neon_iquants_nodot(t);
        pe_fill_neon_iq_gemm_nodot(t);
        pe_fill_neon_mxfp4_nodot(t);
    }
#else
    have[ISA_NEON_NODOT] = false;
#endif
    if (have[ISA_NEON]) {
        tables[ISA_NEON] = *ref;
        tables[ISA_NEON].isa = isa_names[ISA_NEON];
        pe_fill_vec_neon(&tables[ISA_NEON]);
        pe_fill_ssm_neon(&tables[ISA_NEON]);
        pe_fill_neon_legacy(&tables[ISA_NEON]);
        pe_fill_neon_kquants(&tables[ISA_NEON]);
        pe_fill_neon_iquants(&tables[ISA_NEON]);
        pe_fill_neon_iq_gemm(&tables[ISA_NEON]);
        pe_fill_neon_mxfp4(&tables[ISA_NEON]);
    }
#endif
    for (int i = 0; i < ISA_COUNT; i++)
        if (have[i]) best = i;
}

static int isa_index(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (name && strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

void pe_init(void) {
    if (initialised) return;
    initialised = true;
    pe_gelu_table_init();
    detect();
    build_tables();
    current = best;
    const char *forced = getenv("PYENGINE_ISA");
    if (forced && *forced) {
        const int i = isa_index(forced);
        /* an unavailable request falls back to the best available; Python
         * checks the variable and reports the problem to the user */
        if (i >= 0 && have[i]) current = i;
    }
    pe_kern = &tables[current];
}

const pe_kernels *pe_kernels_ref(void) { pe_init(); return &tables[ISA_SCALAR]; }
const char *pe_isa_current(void) { pe_init(); return isa_names[current]; }
const char *pe_isa_best(void) { pe_init(); return isa_names[best]; }

int pe_isa_available(const char *name) {
    pe_init();
    const int i = isa_index(name);
    return i >= 0 && have[i];
}

int pe_isa_select(const char *name) {
    pe_init();
    const int i = isa_index(name);
    if (i < 0) return pe_fail("unknown instruction set '%s' (scalar, avx2, avxvnni, avx512, neon_nodot, neon)", name ? name : "");
    if (!have[i]) return pe_fail("instruction set '%s' is not available on this CPU (best: %s)", name, isa_names[best]);
    current = i;
    pe_kern = &tables[current];
    return 0;
}
