// CPU optimizer steps and the gradient pass (optim.h): one element-wise body per op, written
// once over a small vector interface (Scalar, Avx2, Avx512 below), so that every path performs
// the same operations in the same order. Built with -ffp-contract=off (kernels/CMakeLists.txt):
// the only fused multiply-adds are the ones spelled out, which are torch::optim's.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lathe/kernels/optim.h"
#include "lathe/kernels/scale_and_check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels {

namespace {

// ---- the vector interface --------------------------------------------------------------------

struct Scalar {
    using V = float;
    static constexpr std::size_t kWidth = 1;
    static V set1(float x) { return x; }
    static V load(const float* p) { return *p; }
    static void store(float* p, V x) { *p = x; }
    static V add(V a, V b) { return a + b; }
    static V mul(V a, V b) { return a * b; }
    static V div(V a, V b) { return a / b; }
    static V sqrt(V a) { return std::sqrt(a); }
    static V fma(V a, V b, V c) { return std::fma(a, b, c); }  // a·b + c, rounded once
};

#ifdef LATHE_KERNELS_X86
#define LATHE_T2 __attribute__((target("avx2,fma"), always_inline))
#define LATHE_T512 __attribute__((target("avx512f"), always_inline))

struct Avx2 {
    using V = __m256;
    static constexpr std::size_t kWidth = 8;
    LATHE_T2 static V set1(float x) { return _mm256_set1_ps(x); }
    LATHE_T2 static V load(const float* p) { return _mm256_loadu_ps(p); }
    LATHE_T2 static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
    LATHE_T2 static V add(V a, V b) { return _mm256_add_ps(a, b); }
    LATHE_T2 static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    LATHE_T2 static V div(V a, V b) { return _mm256_div_ps(a, b); }
    LATHE_T2 static V sqrt(V a) { return _mm256_sqrt_ps(a); }
    LATHE_T2 static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

struct Avx512 {
    using V = __m512;
    static constexpr std::size_t kWidth = 16;
    LATHE_T512 static V set1(float x) { return _mm512_set1_ps(x); }
    LATHE_T512 static V load(const float* p) { return _mm512_loadu_ps(p); }
    LATHE_T512 static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
    LATHE_T512 static V add(V a, V b) { return _mm512_add_ps(a, b); }
    LATHE_T512 static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    LATHE_T512 static V div(V a, V b) { return _mm512_div_ps(a, b); }
    LATHE_T512 static V sqrt(V a) { return _mm512_sqrt_ps(a); }
    LATHE_T512 static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

// ---- the element-wise bodies, once per path ---------------------------------------------------

namespace scalar_path {
#include "optim_body.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace scalar_path

#ifdef LATHE_KERNELS_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_path {
#include "optim_body.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace avx2_path
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512_path {
#include "optim_body.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace avx512_path
#pragma GCC pop_options
#endif

// ---- the gradient pass -----------------------------------------------------------------------

constexpr std::uint32_t kExpMask = 0x7f800000u;
constexpr std::size_t kLanes = 16;

inline bool nonFinite(float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return (bits & kExpMask) == kExpMask;
}

inline double sumLanes(const double* lanes) {
    double s = 0;
    for (std::size_t l = 0; l < kLanes; ++l) s += lanes[l];
    return s;
}

// The reference. `from`: where the SIMD paths left off (their tail), lanes carried over.
template <bool kScale>
bool gradTail(float* g, std::size_t from, std::size_t n, float inv, double* lanes) {
    bool bad = false;
    for (std::size_t i = from; i < n; ++i) {
        float r = g[i];
        if (kScale) {
            const float x = r;
            r = x * inv;
            bad |= nonFinite(x);
            g[i] = r;
        }
        bad |= nonFinite(r);
        const double d = static_cast<double>(r);
        lanes[i % kLanes] += d * d;  // exact product: the same as a fused multiply-add
    }
    return bad;
}

template <bool kScale>
GradStats gradScalar(float* g, std::size_t n, float inv) {
    double lanes[kLanes] = {};
    GradStats s;
    s.nonFinite = gradTail<kScale>(g, 0, n, inv, lanes);
    s.sumSquares = sumLanes(lanes);
    return s;
}

#ifdef LATHE_KERNELS_X86
// A non-finite input always gives a non-finite product (see scale_and_check.cpp), so the SIMD
// paths test the scaled value only.
template <bool kScale>
__attribute__((target("avx2,fma"))) GradStats gradAvx2(float* g, std::size_t n, float inv) {
    const __m256 s = _mm256_set1_ps(inv);
    const __m256i exp = _mm256_set1_epi32(static_cast<int>(kExpMask));
    __m256i bad = _mm256_setzero_si256();
    // Lanes 0-3, 4-7, 8-11, 12-15 of the 16.
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        __m256 r0 = _mm256_loadu_ps(g + i), r1 = _mm256_loadu_ps(g + i + 8);
        if (kScale) {
            r0 = _mm256_mul_ps(r0, s);
            r1 = _mm256_mul_ps(r1, s);
            _mm256_storeu_ps(g + i, r0);
            _mm256_storeu_ps(g + i + 8, r1);
        }
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r0), exp), exp));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r1), exp), exp));
        const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(r0));
        const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(r0, 1));
        const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(r1));
        const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(r1, 1));
        a0 = _mm256_fmadd_pd(d0, d0, a0);
        a1 = _mm256_fmadd_pd(d1, d1, a1);
        a2 = _mm256_fmadd_pd(d2, d2, a2);
        a3 = _mm256_fmadd_pd(d3, d3, a3);
    }
    alignas(32) double lanes[kLanes];
    _mm256_store_pd(lanes, a0);
    _mm256_store_pd(lanes + 4, a1);
    _mm256_store_pd(lanes + 8, a2);
    _mm256_store_pd(lanes + 12, a3);
    GradStats st;
    st.nonFinite = !_mm256_testz_si256(bad, bad);
    st.nonFinite |= gradTail<kScale>(g, i, n, inv, lanes);
    st.sumSquares = sumLanes(lanes);
    return st;
}

template <bool kScale>
__attribute__((target("avx512f"))) GradStats gradAvx512(float* g, std::size_t n, float inv) {
    const __m512 s = _mm512_set1_ps(inv);
    const __m512i exp = _mm512_set1_epi32(static_cast<int>(kExpMask));
    __mmask16 bad = 0;
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;  // lanes 0-7 and 8-15
    std::size_t i = 0;
    for (; i < n; i += kLanes) {
        // The tail is a masked vector: absent lanes read as 0, add 0 and are not checked.
        const __mmask16 m =
            n - i >= kLanes ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
        __m512 r = _mm512_maskz_loadu_ps(m, g + i);
        if (kScale) {
            r = _mm512_mul_ps(r, s);
            _mm512_mask_storeu_ps(g + i, m, r);
        }
        bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_castps_si512(r), exp), exp);
        const __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(r));
        const __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
        a0 = _mm512_fmadd_pd(d0, d0, a0);
        a1 = _mm512_fmadd_pd(d1, d1, a1);
    }
    alignas(64) double lanes[kLanes];
    _mm512_store_pd(lanes, a0);
    _mm512_store_pd(lanes + 8, a1);
    GradStats st;
    st.nonFinite = bad != 0;
    st.sumSquares = sumLanes(lanes);
    return st;
}

__attribute__((target("avx2,fma"))) void adamAvx2(const AdamHyper& h, const OptimTensor* t, std::size_t c) {
    avx2_path::adamDispatch<Avx2>(h, t, c);
}
__attribute__((target("avx512f"))) void adamAvx512(const AdamHyper& h, const OptimTensor* t, std::size_t c) {
    avx512_path::adamDispatch<Avx512>(h, t, c);
}
__attribute__((target("avx2,fma"))) void sgdAvx2(const SgdHyper& h, const OptimTensor* t, std::size_t c) {
    avx2_path::sgdDispatch<Avx2>(h, t, c);
}
__attribute__((target("avx512f"))) void sgdAvx512(const SgdHyper& h, const OptimTensor* t, std::size_t c) {
    avx512_path::sgdDispatch<Avx512>(h, t, c);
}
#endif  // LATHE_KERNELS_X86

// The AVX2 path also needs FMA (every AVX2 CPU has it, but the two are separate CPUID bits).
bool fmaAvailable() {
#ifdef LATHE_KERNELS_X86
    static const bool fma = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("fma") != 0;
    }();
    return fma;
#else
    return false;
#endif
}

}  // namespace

void adamStep(const AdamHyper& h, const OptimTensor* t, std::size_t count, CpuIsa isa) noexcept {
#ifdef LATHE_KERNELS_X86
    if (isa == CpuIsa::Avx512 && cpuIsaAvailable(CpuIsa::Avx512)) return adamAvx512(h, t, count);
    if (isa == CpuIsa::Avx2 && cpuIsaAvailable(CpuIsa::Avx2) && fmaAvailable()) return adamAvx2(h, t, count);
#else
    (void)isa;
#endif
    scalar_path::adamDispatch<Scalar>(h, t, count);
}

void adamStep(const AdamHyper& h, const OptimTensor* t, std::size_t count) noexcept {
    adamStep(h, t, count, bestCpuIsa());
}

void sgdStep(const SgdHyper& h, const OptimTensor* t, std::size_t count, CpuIsa isa) noexcept {
#ifdef LATHE_KERNELS_X86
    if (isa == CpuIsa::Avx512 && cpuIsaAvailable(CpuIsa::Avx512)) return sgdAvx512(h, t, count);
    if (isa == CpuIsa::Avx2 && cpuIsaAvailable(CpuIsa::Avx2) && fmaAvailable()) return sgdAvx2(h, t, count);
#else
    (void)isa;
#endif
    scalar_path::sgdDispatch<Scalar>(h, t, count);
}

void sgdStep(const SgdHyper& h, const OptimTensor* t, std::size_t count) noexcept {
    sgdStep(h, t, count, bestCpuIsa());
}

GradStats gradStats(float* g, std::size_t n, float invScale, CpuIsa isa) noexcept {
    if (std::isnan(invScale)) {
        GradStats s;
        s.nonFinite = scaleAndCheck(g, n, invScale, isa);
        s.sumSquares = n > 0 ? static_cast<double>(NAN) : 0.0;
        return s;
    }
    const bool scale = invScale != 1.0f;
#ifdef LATHE_KERNELS_X86
    if (isa == CpuIsa::Avx512 && cpuIsaAvailable(CpuIsa::Avx512))
        return scale ? gradAvx512<true>(g, n, invScale) : gradAvx512<false>(g, n, invScale);
    if (isa == CpuIsa::Avx2 && cpuIsaAvailable(CpuIsa::Avx2) && fmaAvailable())
        return scale ? gradAvx2<true>(g, n, invScale) : gradAvx2<false>(g, n, invScale);
#else
    (void)isa;
#endif
    return scale ? gradScalar<true>(g, n, invScale) : gradScalar<false>(g, n, invScale);
}

GradStats gradStats(float* g, std::size_t n, float invScale) noexcept {
    return gradStats(g, n, invScale, bestCpuIsa());
}

}  // namespace lathe::kernels
