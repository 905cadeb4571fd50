// AVX-512 (F + BW: every AVX-512 CPU since Skylake-SP; CpuIsa::Avx512 requires both) compression
// paths. Bit-identical to the scalar reference in compress.cpp: the same IEEE operations in the
// same order, with heads and tails handed to the scalar element helpers.

#include "compress_internal.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_KERNELS_X86 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_X86

#define LATHE_T512 __attribute__((target("avx512f")))
#define LATHE_T512BW __attribute__((target("avx512f,avx512bw")))

namespace {

LATHE_T512 inline __m512 loadS(const float* g, const float* r, std::size_t i) noexcept {
    const __m512 s = _mm512_loadu_ps(g + i);
    return r ? _mm512_add_ps(s, _mm512_loadu_ps(r + i)) : s;
}

LATHE_T512 inline __m512i mix(__m512i x) noexcept {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

LATHE_T512 inline __m512i streamBits16(__m512i key, std::uint32_t ctr0) noexcept {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i ctr = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(ctr0)), iota);
    return mix(_mm512_add_epi32(mix(_mm512_xor_si512(ctr, key)), key));
}

LATHE_T512 std::uint32_t chunkAmax(const QuantArgs& a, std::size_t b, std::size_t e) noexcept {
    const __m512i absMask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
    __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
    std::size_t i = b;
    for (; i + 32 <= e; i += 32) {
        m0 = _mm512_max_epu32(m0,
                              _mm512_and_si512(_mm512_castps_si512(loadS(a.grad, a.residual, i)), absMask));
        m1 = _mm512_max_epu32(
            m1, _mm512_and_si512(_mm512_castps_si512(loadS(a.grad, a.residual, i + 16)), absMask));
    }
    for (; i + 16 <= e; i += 16)
        m0 = _mm512_max_epu32(m0,
                              _mm512_and_si512(_mm512_castps_si512(loadS(a.grad, a.residual, i)), absMask));
    if (i < e) {
        // Dead lanes load as +0, which never raises the maximum.
        const __mmask16 k = static_cast<__mmask16>((1u << (e - i)) - 1u);
        __m512 s = _mm512_maskz_loadu_ps(k, a.grad + i);
        if (a.residual) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(k, a.residual + i));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_castps_si512(s), absMask));
    }
    return _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

// Codes of the 16 elements at i as int32 lanes; with error feedback, also their new residuals.
template <int Q, bool Stochastic, bool Feedback>
LATHE_T512 inline __m512i quantVec(const float* __restrict g, float* __restrict r, std::size_t i, __m512 vs,
                                   __m512 vinv, __m512 lo, __m512 hi, __m512i key,
                                   std::uint32_t ctr) noexcept {
    __m512 s = _mm512_loadu_ps(g + i);
    if (Feedback) s = _mm512_add_ps(s, _mm512_loadu_ps(r + i));
    __m512i q;
    if (Stochastic) {
        const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(s, vinv), lo), hi);
        const __m512 fl = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512 frac = _mm512_sub_ps(v, fl);
        const __m512 u = _mm512_cvtepi32_ps(_mm512_srli_epi32(streamBits16(key, ctr), 8));
        const __mmask16 up =
            _mm512_cmp_ps_mask(u, _mm512_mul_ps(frac, _mm512_set1_ps(16777216.f)), _CMP_LT_OQ);
        q = _mm512_cvttps_epi32(fl);
        q = _mm512_mask_add_epi32(q, up, q, _mm512_set1_epi32(1));
    } else {
        // The clamp on the integer code, after the conversion (MXCSR rounding, like nearbyint):
        // since +-Q are integers, clamp(rint(v)) == rint(clamp(v)) in every rounding mode, and
        // integer min/max are cheaper here than float ones. (|s * inv| can exceed Q by a few ulps,
        // and under a directed rounding mode that rounds to Q + 1.)
        q = _mm512_cvtps_epi32(_mm512_mul_ps(s, vinv));
        q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-static_cast<int>(Q))),
                             _mm512_set1_epi32(Q));
    }
    if (Feedback) _mm512_storeu_ps(r + i, _mm512_sub_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(q), vs)));
    return q;
}

// 64 int32 codes in [-127, 127] -> 64 bytes in element order. The packs work within 128-bit
// lanes, leaving dword j of lane L holding elements of q_j's lane L; one permute restores order.
LATHE_T512BW inline __m512i packCodes64(__m512i q0, __m512i q1, __m512i q2, __m512i q3) noexcept {
    const __m512i bytes = _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(order, bytes);
}

// One chunk's codes (and residuals), specialised at compile time on the format, the rounding and
// error feedback so the loop carries no per-element branches, with the arguments in registers
// (stores through the int8 code pointer may alias anything, so reading them through `a` would
// reload them on every iteration).
//
// It also returns max |x| (as bits) of the next chunk [nb, ne), read while this one is coded: this
// chunk is in L1 since its own amax pass, so the loads of the next one from L2/L3 overlap with the
// coding arithmetic instead of stalling a separate amax loop.
template <bool Int4, bool Stochastic, bool Feedback>
LATHE_T512BW std::uint32_t quantizeChunkT(const QuantArgs& a, std::size_t b, std::size_t e, float scale,
                                          std::size_t nb, std::size_t ne) noexcept {
    constexpr int kQ = Int4 ? 7 : 127;
    constexpr float qmax = kQ;
    const float* __restrict g = a.grad;
    float* __restrict r = a.residual;
    const float inv = reciprocal(scale);
    if (nonFinite(inv)) {  // a denormal scale: coded by division (see reciprocal)
        quantizeElementsScalar(a, b, e, scale);
        return chunkAmax(a, nb, ne);
    }
    const __m512 vs = _mm512_set1_ps(scale), vinv = _mm512_set1_ps(inv);
    const __m512 lo = _mm512_set1_ps(-qmax), hi = _mm512_set1_ps(qmax);
    const __m512i key = _mm512_set1_epi32(static_cast<int>(a.key));
    const __m512i nib = _mm512_set1_epi32(0xf), absMask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
    const std::uint64_t offset = a.offset;
    auto* c8 = static_cast<std::int8_t*>(a.codes);
    auto* c4 = static_cast<std::uint8_t*>(a.codes);
    __m512i nextMax = _mm512_setzero_si512();
    std::size_t j = nb;  // next chunk: [nb, j) folded into nextMax
    // (A lambda would not inherit the target attribute its intrinsics need.)
#define LATHE_FOLD_NEXT()                                                                                  \
    if (j + 16 <= ne) {                                                                                    \
        nextMax = _mm512_max_epu32(                                                                        \
            nextMax, _mm512_and_si512(_mm512_castps_si512(loadS(g, Feedback ? r : nullptr, j)), absMask)); \
        j += 16;                                                                                           \
    }
    const auto ctr = [&](std::size_t k) { return static_cast<std::uint32_t>(offset + k); };
    std::size_t i = b;
    if (Int4 && (i & 1) && i < e) {  // finish the byte the previous chunk started
        quantizeElementsScalar(a, i, i + 1, scale);
        ++i;
    }
    if (!Int4) {
        for (; i + 64 <= e; i += 64) {
            const __m512i q0 = quantVec<kQ, Stochastic, Feedback>(g, r, i, vs, vinv, lo, hi, key, ctr(i));
            const __m512i q1 =
                quantVec<kQ, Stochastic, Feedback>(g, r, i + 16, vs, vinv, lo, hi, key, ctr(i + 16));
            const __m512i q2 =
                quantVec<kQ, Stochastic, Feedback>(g, r, i + 32, vs, vinv, lo, hi, key, ctr(i + 32));
            const __m512i q3 =
                quantVec<kQ, Stochastic, Feedback>(g, r, i + 48, vs, vinv, lo, hi, key, ctr(i + 48));
            _mm512_storeu_si512(c8 + i, packCodes64(q0, q1, q2, q3));
            LATHE_FOLD_NEXT()
            LATHE_FOLD_NEXT()
            LATHE_FOLD_NEXT()
            LATHE_FOLD_NEXT()
        }
    }
    for (; i + 16 <= e; i += 16) {
        const __m512i q = quantVec<kQ, Stochastic, Feedback>(g, r, i, vs, vinv, lo, hi, key, ctr(i));
        if (Int4) {
            const __m512i t = _mm512_and_si512(q, nib);
            const __m512i y = _mm512_or_si512(t, _mm512_srli_epi64(t, 28));  // pair -> low byte of each qword
            _mm_storel_epi64(reinterpret_cast<__m128i*>(c4 + i / 2), _mm512_cvtepi64_epi8(y));
        } else {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(c8 + i), _mm512_cvtepi32_epi8(q));
        }
        LATHE_FOLD_NEXT()
    }
#undef LATHE_FOLD_NEXT
    quantizeElementsScalar(a, i, e, scale);
    return std::max(_mm512_reduce_max_epu32(nextMax), j < ne ? chunkAmax(a, j, ne) : 0u);
}

struct Avx512 {
    static std::uint32_t amax(const QuantArgs& a, std::size_t b, std::size_t e) noexcept {
        return chunkAmax(a, b, e);
    }
    template <bool Int4, bool Stochastic, bool Feedback>
    static std::uint32_t code(const QuantArgs& a, std::size_t b, std::size_t e, float scale, std::size_t nb,
                              std::size_t ne) noexcept {
        return quantizeChunkT<Int4, Stochastic, Feedback>(a, b, e, scale, nb, ne);
    }
};

LATHE_T512 inline __m512 canonicalizeNan(__m512 d) noexcept {
    const __mmask16 nan = _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(d, nan,
                              _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kCanonicalNan))));
}

}  // namespace

void quantizeAvx512(const QuantArgs& a) noexcept { quantizeChunks<Avx512>(a); }

LATHE_T512 void dequantizeAvx512(const DequantArgs& a) noexcept {
    const auto* c8 = static_cast<const std::int8_t*>(a.codes);
    const auto* c4 = static_cast<const std::uint8_t*>(a.codes);
    for (std::size_t b = 0; b < a.n; b += a.chunk) {
        const std::size_t e = std::min(a.n, b + a.chunk);
        const float scale = a.scales[b / a.chunk];
        const __m512 vs = _mm512_set1_ps(scale);
        std::size_t i = b;
        if (a.int4 && (i & 1) && i < e) {
            dequantizeElementsScalar(a, i, i + 1, scale);
            ++i;
        }
        for (; i + 16 <= e; i += 16) {
            __m512i q;
            if (a.int4) {
                __m512i x =
                    _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c4 + i / 2)));
                x = _mm512_or_si512(x, _mm512_slli_epi64(x, 28));  // high nibble -> bits 32..35
                q = _mm512_srai_epi32(_mm512_slli_epi32(x, 28), 28);
            } else {
                q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c8 + i)));
            }
            __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(q), vs);
            if (a.accumulate) d = canonicalizeNan(_mm512_add_ps(_mm512_loadu_ps(a.out + i), d));
            _mm512_storeu_ps(a.out + i, d);
        }
        dequantizeElementsScalar(a, i, e, scale);
    }
}

LATHE_T512 void to16Avx512(const To16Args& a) noexcept {
    const __m512i absMask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
    const __m512i exp = _mm512_set1_epi32(static_cast<int>(kExpMask));
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  bfNan = _mm512_set1_epi32(0x7fc0);
    std::size_t i = 0;
    for (; i + 16 <= a.n; i += 16) {
        const __m512 s = loadS(a.x, a.residual, i);
        __m256i h;
        __m512 back;
        if (a.bf16) {
            const __m512i u = _mm512_castps_si512(s);
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absMask), exp);
            __m512i r =
                _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
            r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, bfNan);
            h = _mm512_cvtepi32_epi16(r);
            back = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
        } else {
            h = _mm512_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT);
            back = _mm512_cvtph_ps(h);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i), h);
        if (a.residual) {
            const __mmask16 finite =
                _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(back), exp), exp);
            _mm512_mask_storeu_ps(a.residual + i, finite, _mm512_sub_ps(s, back));
        }
    }
    to16Scalar(a, i, a.n);
}

LATHE_T512 void from16Avx512(const From16Args& a) noexcept {
    std::size_t i = 0;
    for (; i + 16 <= a.n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.x + i));
        __m512 v = a.bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                          : _mm512_cvtph_ps(h);
        if (a.accumulate) v = canonicalizeNan(_mm512_add_ps(_mm512_loadu_ps(a.out + i), v));
        _mm512_storeu_ps(a.out + i, v);
    }
    from16Scalar(a, i, a.n);
}

#else  // not x86: never dispatched to, but keep the symbols

void quantizeAvx512(const QuantArgs&) noexcept {}
void dequantizeAvx512(const DequantArgs&) noexcept {}
void to16Avx512(const To16Args&) noexcept {}
void from16Avx512(const From16Args&) noexcept {}

#endif

}  // namespace lathe::kernels::detail
