// AVX2 int8 GEMM and row quantization. Products use vpmaddubsw on |a| (unsigned, <= 127) and
// w * sign(a) (vpsignb): each 16-bit pair sum is at most 2 * 127 * 127 = 32258, so nothing
// saturates and the int32 sums (vpmaddwd with ones) are exact.

#include "qgemm_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_X86

#define LATHE_TAVX2 __attribute__((target("avx2,fma")))

namespace {

// R rows (1..4) of C for one 16-column block: tile[r][0..16).
template <int R>
LATHE_TAVX2 void microAvx2(const std::int8_t* a, std::size_t lda, const std::int8_t* b, std::size_t groups,
                           std::int32_t* tile) noexcept {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (std::size_t g = 0; g < groups; ++g) {
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + g * 64));
        const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + g * 64 + 32));
        for (int r = 0; r < R; ++r) {
            std::int32_t four;
            std::memcpy(&four, a + r * lda + g * 4, 4);
            const __m256i av = _mm256_set1_epi32(four);
            const __m256i ua = _mm256_abs_epi8(av);
            const __m256i p0 = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(b0, av));
            const __m256i p1 = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(b1, av));
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + r * 16), acc[r][0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + r * 16 + 8), acc[r][1]);
    }
}

// Eight codes: clamp(x * inv) rounded by vcvtps2dq (nearest even in the default mode, as rint).
LATHE_TAVX2 inline __m256i codes8(const float* x, __m256 inv, __m256 lo, __m256 hi) noexcept {
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), lo), hi));
}

}  // namespace

LATHE_TAVX2 void gemmRangeAvx2(const GemmJob& j, std::size_t nb0, std::size_t nb1,
                               const Epilogue& e) noexcept {
    const std::size_t groups = j.kp / 4;
    alignas(32) std::int32_t tile[4 * 16];
    for (std::size_t nb = nb0; nb < nb1; ++nb) {
        const std::int8_t* b = j.packed + nb * groups * 64;
        std::size_t m = 0;
        for (; m + 4 <= j.m; m += 4) {
            microAvx2<4>(j.a + m * j.kp, j.kp, b, groups, tile);
            e.apply(m, 4, nb * 16, 16, tile, 16);
        }
        if (const std::size_t rest = j.m - m) {  // 1..3 rows left
            static constexpr decltype(&microAvx2<1>) tail[] = {microAvx2<1>, microAvx2<2>, microAvx2<3>};
            tail[rest - 1](j.a + m * j.kp, j.kp, b, groups, tile);
            e.apply(m, rest, nb * 16, 16, tile, 16);
        }
    }
}

LATHE_TAVX2 void quantizeRowsAvx2(const float* x, std::size_t m, std::size_t k, std::size_t ldx,
                                  std::int8_t* q, std::size_t ldq, float* scales, float fixedScale) noexcept {
    const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kAbsMask)));
    const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (std::size_t r = 0; r < m; ++r) {
        const float* row = x + r * ldx;
        std::int8_t* out = q + r * ldq;
        // max |x| as bits: integer max on the absolute bit patterns orders every finite value
        // below inf and NaN, as the scalar definition does.
        __m256i mx = _mm256_setzero_si256();
        std::size_t i = 0;
        for (; i + 8 <= k; i += 8)
            mx = _mm256_max_epu32(mx, _mm256_castps_si256(_mm256_and_ps(_mm256_loadu_ps(row + i), absMask)));
        alignas(32) std::uint32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), mx);
        std::uint32_t amaxBits = 0;
        for (auto l : lanes) amaxBits = std::max(amaxBits, l);
        for (; i < k; ++i) amaxBits = std::max(amaxBits, bits(row[i]) & kAbsMask);
        float inv = 0.f;
        bool divide = false;
        if (!beginRow(amaxBits, fixedScale, out, ldq, scales[r], inv, divide)) continue;
        if (divide) {  // a tiny row: the division form, element by element
            quantizeRowsScalar(row, 0, 1, k, ldx, out, ldq, &scales[r], fixedScale);
            continue;
        }
        const __m256 vinv = _mm256_set1_ps(inv);
        i = 0;
        for (; i + 32 <= k; i += 32) {
            const __m256i ab =
                _mm256_packs_epi32(codes8(row + i, vinv, lo, hi), codes8(row + i + 8, vinv, lo, hi));
            const __m256i cd =
                _mm256_packs_epi32(codes8(row + i + 16, vinv, lo, hi), codes8(row + i + 24, vinv, lo, hi));
            const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
        }
        for (; i < k; ++i) out[i] = codeOf(row[i] * inv);
    }
}

#else  // not x86: never dispatched (gemmIsaAvailable is false)

void gemmRangeAvx2(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    gemmRangeScalar(j, nb0, nb1, e);
}
void quantizeRowsAvx2(const float* x, std::size_t m, std::size_t k, std::size_t ldx, std::int8_t* q,
                      std::size_t ldq, float* scales, float fixedScale) noexcept {
    quantizeRowsScalar(x, 0, m, k, ldx, q, ldq, scales, fixedScale);
}

#endif

}  // namespace lathe::kernels::detail
