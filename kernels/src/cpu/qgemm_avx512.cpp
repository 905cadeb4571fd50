// AVX-512 VNNI int8 GEMM: vpdpbusd multiplies unsigned bytes by signed bytes and adds groups of
// four into int32 lanes without intermediate saturation. Activation codes a in [-127, 127] go in
// as a + 128 (an XOR with 0x80, done once per GEMM by biasCodesAvx512 before the blocks are
// split over threads), so each sum carries an extra 128 * sum_k w[n][k], subtracted at the end
// from the packed colSums. Exact.

#include "qgemm_internal.h"

#include <array>
#include <cstring>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_X86

#define LATHE_TVNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

namespace {

// acc += dot(u8 groups of a, s8 groups of b). GCC 12 compiles _mm512_dpbusd_epi32 with untied
// operands: every accumulator is copied to a fresh register (and spilled) on each step, which
// made the kernel about twice as slow. The instruction itself, accumulating in place:
LATHE_TVNNI __attribute__((always_inline)) inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) noexcept {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

// R rows (1..8) x NB blocks (1 or 2) of 16 columns: tile[r][0..16 * NB).
template <int R, int NB>
LATHE_TVNNI void microVnni(const std::int8_t* a, std::size_t lda, const std::int8_t* b,
                           std::size_t blockStride, std::size_t groups, const std::int32_t* colSums,
                           std::int32_t* tile) noexcept {
    __m512i acc[R][NB];
    for (int r = 0; r < R; ++r)
        for (int nb = 0; nb < NB; ++nb) acc[r][nb] = _mm512_setzero_si512();
    for (std::size_t g = 0; g < groups; ++g) {
        __m512i bv[NB];
        for (int nb = 0; nb < NB; ++nb) bv[nb] = _mm512_loadu_si512(b + nb * blockStride + g * 64);
        for (int r = 0; r < R; ++r) {
            std::int32_t four;
            std::memcpy(&four, a + r * lda + g * 4, 4);
            const __m512i av = _mm512_set1_epi32(four);
            for (int nb = 0; nb < NB; ++nb) acc[r][nb] = dpbusd(acc[r][nb], av, bv[nb]);
        }
    }
    for (int nb = 0; nb < NB; ++nb) {
        const __m512i comp = _mm512_slli_epi32(_mm512_loadu_si512(colSums + nb * 16), 7);
        for (int r = 0; r < R; ++r)
            _mm512_storeu_si512(tile + r * 16 * NB + nb * 16, _mm512_sub_epi32(acc[r][nb], comp));
    }
}

// The register tile: kMr rows x kNb blocks of 16 columns, kMr * kNb accumulators of the 32 zmm
// registers. 8 x 2, 6 x 4, 12 x 2 and 4 x 4 measured the same on Zen 5 (bench_qlinear).
constexpr int kMr = 8, kNb = 2;

template <int NB, std::size_t... R>
constexpr auto tailTable(std::index_sequence<R...>) {
    using Fn = decltype(&microVnni<1, NB>);
    return std::array<Fn, sizeof...(R)>{microVnni<static_cast<int>(R) + 1, NB>...};
}

// All rows of the job for the NB column blocks from nb: kMr rows at a time, then the rest.
template <int NB>
LATHE_TVNNI void rowsVnni(const GemmJob& j, std::size_t nb, const Epilogue& e, std::int32_t* tile) noexcept {
    const std::size_t groups = j.kp / 4, stride = groups * 64;
    const std::int8_t* b = j.packed + nb * stride;
    const std::int32_t* cs = j.colSums + nb * 16;
    std::size_t m = 0;
    for (; m + kMr <= j.m; m += kMr) {
        microVnni<kMr, NB>(j.a + m * j.kp, j.kp, b, stride, groups, cs, tile);
        e.apply(m, kMr, nb * 16, 16 * NB, tile, 16 * NB);
    }
    const std::size_t rest = j.m - m;  // 0 .. kMr - 1 rows left
    if (rest == 0) return;
    static constexpr auto tail = tailTable<NB>(std::make_index_sequence<kMr - 1>{});
    tail[rest - 1](j.a + m * j.kp, j.kp, b, stride, groups, cs, tile);
    e.apply(m, rest, nb * 16, 16 * NB, tile, 16 * NB);
}

}  // namespace

LATHE_TVNNI void biasCodesAvx512(const std::int8_t* a, std::size_t bytes, std::int8_t* out) noexcept {
    const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
    std::size_t i = 0;
    for (; i + 64 <= bytes; i += 64)
        _mm512_storeu_si512(out + i, _mm512_xor_si512(_mm512_loadu_si512(a + i), flip));
    for (; i < bytes; ++i) out[i] = static_cast<std::int8_t>(a[i] ^ 0x80);
}

LATHE_TVNNI void gemmRangeAvx512Vnni(const GemmJob& j, std::size_t nb0, std::size_t nb1,
                                     const Epilogue& e) noexcept {
    alignas(64) std::int32_t tile[kMr * 16 * kNb];
    std::size_t nb = nb0;
    for (; nb + kNb <= nb1; nb += kNb) rowsVnni<kNb>(j, nb, e, tile);
    if (nb < nb1) rowsVnni<1>(j, nb, e, tile);
}

#else

void biasCodesAvx512(const std::int8_t* a, std::size_t bytes, std::int8_t* out) noexcept {
    for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::int8_t>(a[i] ^ 0x80);
}

void gemmRangeAvx512Vnni(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    gemmRangeScalar(j, nb0, nb1, e);
}

#endif

}  // namespace lathe::kernels::detail
