// AVX-512 VNNI int8 GEMM: vpdpbusd multiplies unsigned bytes by signed bytes and adds groups of
// four into int32 lanes without intermediate saturation. Activation codes a in [-127, 127] go in
// as a + 128 (an XOR with 0x80), so each sum carries an extra 128 * sum_k w[n][k], subtracted at
// the end from the packed colSums. Exact.

#include "qgemm_internal.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_X86

#define LATHE_TVNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

namespace {

// R rows (1..8) x NB blocks (1 or 2) of 16 columns: tile[r][0..16 * NB).
template <int R, int NB>
LATHE_TVNNI void microVnni(const std::int8_t* a, std::size_t lda, const std::int8_t* b,
                           std::size_t blockStride, std::size_t groups, const std::int32_t* colSums,
                           std::int32_t* tile) noexcept {
    const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
    __m512i acc[R][NB];
    for (int r = 0; r < R; ++r)
        for (int nb = 0; nb < NB; ++nb) acc[r][nb] = _mm512_setzero_si512();
    for (std::size_t g = 0; g < groups; ++g) {
        __m512i bv[NB];
        for (int nb = 0; nb < NB; ++nb) bv[nb] = _mm512_loadu_si512(b + nb * blockStride + g * 64);
        for (int r = 0; r < R; ++r) {
            std::int32_t four;
            std::memcpy(&four, a + r * lda + g * 4, 4);
            const __m512i av = _mm512_xor_si512(_mm512_set1_epi32(four), flip);
            for (int nb = 0; nb < NB; ++nb) acc[r][nb] = _mm512_dpbusd_epi32(acc[r][nb], av, bv[nb]);
        }
    }
    for (int nb = 0; nb < NB; ++nb) {
        const __m512i comp = _mm512_slli_epi32(_mm512_loadu_si512(colSums + nb * 16), 7);
        for (int r = 0; r < R; ++r)
            _mm512_storeu_si512(tile + r * 16 * NB + nb * 16, _mm512_sub_epi32(acc[r][nb], comp));
    }
}

template <int NB>
LATHE_TVNNI void rowsVnni(const GemmJob& j, std::size_t nb, const Epilogue& e, std::int32_t* tile) noexcept {
    const std::size_t groups = j.kp / 4, stride = groups * 64;
    const std::int8_t* b = j.packed + nb * stride;
    const std::int32_t* cs = j.colSums + nb * 16;
    std::size_t m = 0;
    for (; m + 8 <= j.m; m += 8) {
        microVnni<8, NB>(j.a + m * j.kp, j.kp, b, stride, groups, cs, tile);
        e.apply(m, 8, nb * 16, 16 * NB, tile, 16 * NB);
    }
    const std::size_t rest = j.m - m;  // 0..7 rows left
    if (rest == 0) return;
    static constexpr decltype(&microVnni<1, NB>) tail[] = {
        microVnni<1, NB>, microVnni<2, NB>, microVnni<3, NB>, microVnni<4, NB>,
        microVnni<5, NB>, microVnni<6, NB>, microVnni<7, NB>};
    tail[rest - 1](j.a + m * j.kp, j.kp, b, stride, groups, cs, tile);
    e.apply(m, j.m - m, nb * 16, 16 * NB, tile, 16 * NB);
}

}  // namespace

LATHE_TVNNI void gemmRangeAvx512Vnni(const GemmJob& j, std::size_t nb0, std::size_t nb1,
                                     const Epilogue& e) noexcept {
    alignas(64) std::int32_t tile[8 * 32];
    std::size_t nb = nb0;
    for (; nb + 2 <= nb1; nb += 2) rowsVnni<2>(j, nb, e, tile);
    if (nb < nb1) rowsVnni<1>(j, nb, e, tile);
}

#else

void gemmRangeAvx512Vnni(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    gemmRangeScalar(j, nb0, nb1, e);
}

#endif

}  // namespace lathe::kernels::detail
