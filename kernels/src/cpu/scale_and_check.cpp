// CPU scale_and_check: scalar reference plus AVX2 and AVX-512 paths compiled with function
// target attributes, so the library itself needs no -mavx2 and runs on any x86-64 CPU; the
// wide paths are entered only after a runtime check (cpuIsaAvailable()).
//
// Non-finite tests look at the exponent bits rather than calling std::isfinite so they stay
// correct even if someone builds with -ffast-math (which lets the compiler assume no inf/NaN).

#include "lathe/kernels/scale_and_check.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels {

namespace {

constexpr std::uint32_t kExpMask = 0x7f800000u;

inline bool nonFinite(float v) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return (bits & kExpMask) == kExpMask;
}

inline bool isNan(float v) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7fffffffu) > kExpMask;
}

inline float quieted(float v) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits |= 0x00400000u;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

// A NaN scale. Which payload x86 gives to NaN * NaN depends on operand order, and compilers
// may swap the operands of a multiplication, so this degenerate case gets one definition
// shared by every path: an input NaN keeps its (quieted) payload, anything else becomes the
// scale's quieted NaN. With a non-NaN scale at most one operand is NaN and no choice arises.
bool scaleByNan(float* x, std::size_t n, float nanScale) noexcept {
    const float s = quieted(nanScale);
    for (std::size_t i = 0; i < n; ++i) x[i] = isNan(x[i]) ? quieted(x[i]) : s;
    return n > 0;
}

// The reference: deliberately the obvious code. Tests hold every other path to it bit for bit.
bool scaleAndCheckScalar(float* x, std::size_t n, float invScale) noexcept {
    bool bad = false;
    for (std::size_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float r = v * invScale;
        bad |= nonFinite(v) | nonFinite(r);
        x[i] = r;
    }
    return bad;
}

#ifdef LATHE_KERNELS_X86
// The SIMD paths test only the scaled value: a non-finite input always gives a non-finite
// product (NaN*s = NaN, inf*0 = NaN, inf*finite = ±inf), so "before or after" equals "after".
// IEEE multiplication is exactly rounded, so the products equal the scalar ones bit for bit
// under the same MXCSR rounding/FTZ/DAZ state, which scalar and vector code share.

__attribute__((target("avx2"))) bool scaleAndCheckAvx2(float* x, std::size_t n, float invScale) noexcept {
    const __m256 s = _mm256_set1_ps(invScale);
    const __m256i exp = _mm256_set1_epi32(static_cast<int>(kExpMask));
    __m256i bad0 = _mm256_setzero_si256();
    __m256i bad1 = _mm256_setzero_si256();
    std::size_t i = 0;
    // Two independent vectors per iteration keep both load ports and multipliers busy.
    for (; i + 16 <= n; i += 16) {
        const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s);
        _mm256_storeu_ps(x + i, r0);
        _mm256_storeu_ps(x + i + 8, r1);
        bad0 = _mm256_or_si256(bad0, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r0), exp), exp));
        bad1 = _mm256_or_si256(bad1, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r1), exp), exp));
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        _mm256_storeu_ps(x + i, r);
        bad0 = _mm256_or_si256(bad0, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r), exp), exp));
    }
    const __m256i bad = _mm256_or_si256(bad0, bad1);
    bool any = !_mm256_testz_si256(bad, bad);
    for (; i < n; ++i) {
        const float r = x[i] * invScale;
        any |= nonFinite(r);
        x[i] = r;
    }
    return any;
}

__attribute__((target("avx512f"))) bool scaleAndCheckAvx512(float* x, std::size_t n,
                                                            float invScale) noexcept {
    const __m512 s = _mm512_set1_ps(invScale);
    const __m512i exp = _mm512_set1_epi32(static_cast<int>(kExpMask));
    __mmask16 bad = 0;
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 r0 = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
        const __m512 r1 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), s);
        _mm512_storeu_ps(x + i, r0);
        _mm512_storeu_ps(x + i + 16, r1);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(r0), exp), exp);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(r1), exp), exp);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
        _mm512_storeu_ps(x + i, r);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(r), exp), exp);
    }
    if (i < n) {
        // Masked tail: lanes past n are neither read nor written, and are excluded from the
        // check (0 * inf in a dead lane would otherwise look like a NaN).
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        const __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
        _mm512_mask_storeu_ps(x + i, m, r);
        bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_castps_si512(r), exp), exp);
    }
    return bad != 0;
}
#endif  // LATHE_KERNELS_X86

}  // namespace

bool scaleAndCheck(float* x, std::size_t n, float invScale, CpuIsa isa) noexcept {
    if (isNan(invScale)) return scaleByNan(x, n, invScale);
#ifdef LATHE_KERNELS_X86
    if (isa == CpuIsa::Avx512 && cpuIsaAvailable(CpuIsa::Avx512)) return scaleAndCheckAvx512(x, n, invScale);
    if (isa == CpuIsa::Avx2 && cpuIsaAvailable(CpuIsa::Avx2)) return scaleAndCheckAvx2(x, n, invScale);
#else
    (void)isa;
#endif
    return scaleAndCheckScalar(x, n, invScale);
}

bool scaleAndCheck(float* x, std::size_t n, float invScale) noexcept {
    return scaleAndCheck(x, n, invScale, bestCpuIsa());
}

}  // namespace lathe::kernels
