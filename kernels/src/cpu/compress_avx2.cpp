// AVX2 compression paths (fp16 conversion additionally needs F16C, checked by the dispatcher).
// Bit-identical to the scalar reference in compress.cpp: the same IEEE operations in the same
// order, with heads and tails handed to the scalar element helpers.

#include "compress_internal.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_X86

#define LATHE_T256 __attribute__((target("avx2")))
#define LATHE_T256H __attribute__((target("avx2,f16c")))

namespace {

LATHE_T256 inline __m256 loadS(const float* g, const float* r, std::size_t i) noexcept {
    const __m256 s = _mm256_loadu_ps(g + i);
    return r ? _mm256_add_ps(s, _mm256_loadu_ps(r + i)) : s;
}

LATHE_T256 inline __m256i mix(__m256i x) noexcept {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

LATHE_T256 inline __m256i streamBits8(__m256i key, std::uint32_t ctr0) noexcept {
    const __m256i ctr = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(ctr0)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return mix(_mm256_add_epi32(mix(_mm256_xor_si256(ctr, key)), key));
}

LATHE_T256 std::uint32_t chunkAmax(const QuantArgs& a, std::size_t b, std::size_t e) noexcept {
    const __m256i absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
    __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    std::size_t i = b;
    for (; i + 16 <= e; i += 16) {
        m0 = _mm256_max_epu32(m0,
                              _mm256_and_si256(_mm256_castps_si256(loadS(a.grad, a.residual, i)), absMask));
        m1 = _mm256_max_epu32(
            m1, _mm256_and_si256(_mm256_castps_si256(loadS(a.grad, a.residual, i + 8)), absMask));
    }
    for (; i + 8 <= e; i += 8)
        m0 = _mm256_max_epu32(m0,
                              _mm256_and_si256(_mm256_castps_si256(loadS(a.grad, a.residual, i)), absMask));
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
    std::uint32_t amax = *std::max_element(lanes, lanes + 8);
    for (; i < e; ++i) {
        const float s = a.residual ? a.grad[i] + a.residual[i] : a.grad[i];
        amax = std::max(amax, bits(s) & kAbsMask);
    }
    return amax;
}

// One chunk's codes, as in compress_avx512.cpp: specialised on format, rounding and error
// feedback, arguments in registers, no clamp on the nearest path (the proof is there), and max |x|
// of the next chunk [nb, ne) folded in while this one is coded; returned as bits.
template <bool Int4, bool Stochastic, bool Feedback>
LATHE_T256 std::uint32_t quantizeChunkT(const QuantArgs& a, std::size_t b, std::size_t e, float scale,
                                        std::size_t nb, std::size_t ne) noexcept {
    constexpr float qmax = Int4 ? 7.f : 127.f;
    const float inv = reciprocal(scale);
    if (nonFinite(inv)) {  // a denormal scale: coded by division (see reciprocal)
        quantizeElementsScalar(a, b, e, scale);
        return chunkAmax(a, nb, ne);
    }
    const float* __restrict g = a.grad;
    float* __restrict r = Feedback ? a.residual : nullptr;
    const std::uint64_t offset = a.offset;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256 vs = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
    const __m256 two24 = _mm256_set1_ps(16777216.f);
    const __m256i key = _mm256_set1_epi32(static_cast<int>(a.key));
    const __m256i nib = _mm256_set1_epi32(0xf), absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
    // Byte 0 and byte 8 of each 128-bit lane: the packed pair at the bottom of each qword.
    const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                          0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    auto* c8 = static_cast<std::int8_t*>(a.codes);
    auto* c4 = static_cast<std::uint8_t*>(a.codes);
    __m256i nextMax = _mm256_setzero_si256();
    std::size_t j = nb;  // next chunk: [nb, j) folded into nextMax
    std::size_t i = b;
    if (Int4 && (i & 1) && i < e) {  // finish the byte the previous chunk started
        quantizeElementsScalar(a, i, i + 1, scale);
        ++i;
    }
    for (; i + 8 <= e; i += 8) {
        const __m256 s = loadS(g, r, i);
        __m256i q;
        if (Stochastic) {
            const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(s, vinv), lo), hi);
            const __m256 fl = _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            const __m256 frac = _mm256_sub_ps(v, fl);
            const __m256i h = streamBits8(key, static_cast<std::uint32_t>(offset + i));
            const __m256 u = _mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8));
            const __m256 up = _mm256_cmp_ps(u, _mm256_mul_ps(frac, two24), _CMP_LT_OQ);
            q = _mm256_sub_epi32(_mm256_cvttps_epi32(fl), _mm256_castps_si256(up));  // true lanes are -1
        } else {
            // Clamped as an integer after the conversion (see compress_avx512.cpp).
            q = _mm256_cvtps_epi32(_mm256_mul_ps(s, vinv));
            q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-static_cast<int>(qmax))),
                                 _mm256_set1_epi32(static_cast<int>(qmax)));
        }
        if (Int4) {
            const __m256i t = _mm256_and_si256(q, nib);
            const __m256i y = _mm256_shuffle_epi8(_mm256_or_si256(t, _mm256_srli_epi64(t, 28)), pick);
            const __m128i packed =
                _mm_unpacklo_epi16(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
            const int w = _mm_cvtsi128_si32(packed);
            std::memcpy(c4 + i / 2, &w, 4);
        } else {
            const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(c8 + i), _mm_packs_epi16(p16, p16));
        }
        if (Feedback) _mm256_storeu_ps(r + i, _mm256_sub_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(q), vs)));
        if (j + 8 <= ne) {
            nextMax =
                _mm256_max_epu32(nextMax, _mm256_and_si256(_mm256_castps_si256(loadS(g, r, j)), absMask));
            j += 8;
        }
    }
    quantizeElementsScalar(a, i, e, scale);
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), nextMax);
    const std::uint32_t folded = *std::max_element(lanes, lanes + 8);
    return std::max(folded, j < ne ? chunkAmax(a, j, ne) : 0u);
}

struct Avx2 {
    static std::uint32_t amax(const QuantArgs& a, std::size_t b, std::size_t e) noexcept {
        return chunkAmax(a, b, e);
    }
    template <bool Int4, bool Stochastic, bool Feedback>
    static std::uint32_t code(const QuantArgs& a, std::size_t b, std::size_t e, float scale, std::size_t nb,
                              std::size_t ne) noexcept {
        return quantizeChunkT<Int4, Stochastic, Feedback>(a, b, e, scale, nb, ne);
    }
};

LATHE_T256 inline __m256 canonicalizeNan(__m256 d) noexcept {
    const __m256 nan = _mm256_cmp_ps(d, d, _CMP_UNORD_Q);
    return _mm256_blendv_ps(d, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNan))), nan);
}

}  // namespace

void quantizeAvx2(const QuantArgs& a) noexcept { quantizeChunks<Avx2>(a); }

LATHE_T256 void dequantizeAvx2(const DequantArgs& a) noexcept {
    const auto* c8 = static_cast<const std::int8_t*>(a.codes);
    const auto* c4 = static_cast<const std::uint8_t*>(a.codes);
    for (std::size_t b = 0; b < a.n; b += a.chunk) {
        const std::size_t e = std::min(a.n, b + a.chunk);
        const float scale = a.scales[b / a.chunk];
        const __m256 vs = _mm256_set1_ps(scale);
        std::size_t i = b;
        if (a.int4 && (i & 1) && i < e) {
            dequantizeElementsScalar(a, i, i + 1, scale);
            ++i;
        }
        for (; i + 8 <= e; i += 8) {
            __m256i q;
            if (a.int4) {
                int w;
                std::memcpy(&w, c4 + i / 2, 4);
                __m256i x = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
                x = _mm256_or_si256(x, _mm256_slli_epi64(x, 28));  // high nibble -> bits 32..35
                q = _mm256_srai_epi32(_mm256_slli_epi32(x, 28), 28);
            } else {
                q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c8 + i)));
            }
            __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(q), vs);
            if (a.accumulate) d = canonicalizeNan(_mm256_add_ps(_mm256_loadu_ps(a.out + i), d));
            _mm256_storeu_ps(a.out + i, d);
        }
        dequantizeElementsScalar(a, i, e, scale);
    }
}

LATHE_T256H void to16Avx2(const To16Args& a) noexcept {
    const __m256i absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
    const __m256i exp = _mm256_set1_epi32(static_cast<int>(kExpMask));
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                  bfNan = _mm256_set1_epi32(0x7fc0);
    std::size_t i = 0;
    for (; i + 8 <= a.n; i += 8) {
        const __m256 s = loadS(a.x, a.residual, i);
        __m128i h;
        __m256 back;
        if (a.bf16) {
            const __m256i u = _mm256_castps_si256(s);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absMask), exp);  // both non-negative
            __m256i r =
                _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
            r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), bfNan, nan);
            h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
            back = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
        } else {
            h = _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT);
            back = _mm256_cvtph_ps(h);
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.out + i), h);
        if (a.residual) {
            const __m256 bad = _mm256_castsi256_ps(
                _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(back), exp), exp));
            const __m256 old = _mm256_loadu_ps(a.residual + i);
            _mm256_storeu_ps(a.residual + i, _mm256_blendv_ps(_mm256_sub_ps(s, back), old, bad));
        }
    }
    to16Scalar(a, i, a.n);
}

LATHE_T256H void from16Avx2(const From16Args& a) noexcept {
    std::size_t i = 0;
    for (; i + 8 <= a.n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.x + i));
        __m256 v = a.bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                          : _mm256_cvtph_ps(h);
        if (a.accumulate) v = canonicalizeNan(_mm256_add_ps(_mm256_loadu_ps(a.out + i), v));
        _mm256_storeu_ps(a.out + i, v);
    }
    from16Scalar(a, i, a.n);
}

#else  // not x86: never dispatched to, but keep the symbols

void quantizeAvx2(const QuantArgs&) noexcept {}
void dequantizeAvx2(const DequantArgs&) noexcept {}
void to16Avx2(const To16Args&) noexcept {}
void from16Avx2(const From16Args&) noexcept {}

#endif

}  // namespace lathe::kernels::detail
