#pragma once
// One Catch2 test case per CPU instruction set, so that a CPU without one reports that case
// skipped (LATHE_SKIP, support/skip.h) instead of passing without having run it:
//   LATHE_SIMD_TEST_CASES("name", "[tags]", check)       "name (AVX2)", "name (AVX-512F)"
//   LATHE_EVERY_ISA_TEST_CASES("name", "[tags]", check)  the same and "name (scalar)"
// each calling check(CpuIsa). Include catch.hpp first.

#include "lathe/kernels/info.h"
#include "skip.h"

#define LATHE_ISA_TEST_CASE(name, tags, isa, label, check)                                 \
    TEST_CASE(name " (" label ")", tags) {                                                 \
        if (!::lathe::kernels::cpuIsaAvailable(isa)) LATHE_SKIP("this CPU has no " label); \
        check(isa);                                                                        \
    }
#define LATHE_SIMD_TEST_CASES(name, tags, check)                                   \
    LATHE_ISA_TEST_CASE(name, tags, ::lathe::kernels::CpuIsa::Avx2, "AVX2", check) \
    LATHE_ISA_TEST_CASE(name, tags, ::lathe::kernels::CpuIsa::Avx512, "AVX-512F", check)
#define LATHE_EVERY_ISA_TEST_CASES(name, tags, check)                                  \
    LATHE_ISA_TEST_CASE(name, tags, ::lathe::kernels::CpuIsa::Scalar, "scalar", check) \
    LATHE_SIMD_TEST_CASES(name, tags, check)
