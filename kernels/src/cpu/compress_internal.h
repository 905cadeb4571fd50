#pragma once
// Shared pieces of the compression kernels: the per-element scalar definitions that every path
// (and every SIMD tail) uses, and the argument bundles passed from the dispatcher to the
// per-ISA implementations (compress.cpp, compress_avx2.cpp, compress_avx512.cpp).
//
// Bit tests instead of std::isnan/isfinite so -ffast-math builds keep the semantics.

#include "lathe/kernels/compress.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lathe::kernels::detail {

constexpr std::uint32_t kExpMask = 0x7f800000u;
constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kCanonicalNan = 0x7fc00000u;

inline std::uint32_t bits(float v) noexcept {
    std::uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}
inline float fromBits(std::uint32_t b) noexcept {
    float v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}
inline bool nonFinite(float v) noexcept { return (bits(v) & kExpMask) == kExpMask; }
inline bool isNan(float v) noexcept { return (bits(v) & kAbsMask) > kExpMask; }
inline float canonicalIfNan(float v) noexcept { return isNan(v) ? fromBits(kCanonicalNan) : v; }

// Scale of a chunk from max |x| as bits (the bit patterns of non-negative floats order like
// unsigned integers, and every inf/NaN pattern is above every finite one).
inline float chunkScale(std::uint32_t amaxBits, float qmax) noexcept {
    if (amaxBits >= kExpMask) return fromBits(kCanonicalNan);
    return fromBits(amaxBits) / qmax;
}

// 1 / scale, by which every SIMD lane multiplies instead of dividing (a division per element
// costs more than the rest of the coding). Non-finite for a scale below about 2.9e-39 (a chunk
// whose amax is a tiny denormal): such a chunk is coded by division, element by element.
inline float reciprocal(float scale) noexcept { return 1.f / scale; }

// x / scale as the definition computes it: s * (1 / scale), or s / scale where 1 / scale is not
// finite. Both roundings are IEEE fp32, so every path gets the same bits.
inline float scaledOne(float s, float scale, float inv) noexcept {
    return nonFinite(inv) ? s / scale : s * inv;
}

// One code, for a finite scale > 0 and inv = reciprocal(scale). Exact operations apart from the
// reciprocal, the multiplication and rint.
inline int quantOne(float s, float scale, float inv, float qmax, bool stochastic, std::uint32_t key,
                    std::uint32_t ctr) noexcept {
    float v = scaledOne(s, scale, inv);
    v = v < -qmax ? -qmax : (v > qmax ? qmax : v);
    if (!stochastic) return static_cast<int>(std::nearbyint(v));
    const float fl = std::floor(v);
    const float frac = v - fl;
    const float u = static_cast<float>(streamBits(key, ctr) >> 8);
    return static_cast<int>(fl) + (u < frac * 16777216.f ? 1 : 0);
}

inline void storeInt4(std::uint8_t* codes, std::size_t i, int q) noexcept {
    const auto nib = static_cast<std::uint8_t>(q & 0xf);
    if (i & 1)
        codes[i / 2] = static_cast<std::uint8_t>(codes[i / 2] | (nib << 4));
    else
        codes[i / 2] = nib;
}
inline int loadInt4(const std::uint8_t* codes, std::size_t i) noexcept {
    const int nib = (codes[i / 2] >> ((i & 1) * 4)) & 0xf;
    return nib >= 8 ? nib - 16 : nib;
}

// fp32 -> fp16, round-to-nearest-even, matching vcvtps2ph (imm = nearest).
inline std::uint16_t floatToHalfOne(float f) noexcept {
    const std::uint32_t u = bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    std::uint32_t a = u & kAbsMask;
    if (a > kExpMask) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
    if (a >= 0x38800000u) {                                                   // normal half
        a += 0xc8000fffu + ((a >> 13) & 1u);                                  // rebias, round
        return static_cast<std::uint16_t>(sign | (a >> 13));
    }
    const std::uint32_t e = a >> 23;
    if (e < 102) return static_cast<std::uint16_t>(sign);  // below half of the smallest denormal
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | r);
}

// fp16 -> fp32, exact; NaNs quieted like vcvtph2ps.
inline float halfToFloatOne(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu;
    const std::uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return fromBits(sign);
        return fromBits(sign | bits(static_cast<float>(m) * 5.9604644775390625e-8f));  // m * 2^-24, exact
    }
    if (e == 31) return fromBits(sign | kExpMask | (m << 13) | (m ? 0x400000u : 0u));
    return fromBits(sign | ((e + 112u) << 23) | (m << 13));
}

// fp32 -> bf16 as c10::BFloat16 does (round_to_nearest_even).
inline std::uint16_t floatToBf16One(float f) noexcept {
    const std::uint32_t u = bits(f);
    if ((u & kAbsMask) > kExpMask) return 0x7fc0u;
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16ToFloatOne(std::uint16_t h) noexcept {
    return fromBits(static_cast<std::uint32_t>(h) << 16);
}

struct QuantArgs {
    const float* grad;
    float* residual;  // nullptr: no error feedback
    std::size_t n;
    std::size_t chunk;  // > 0
    void* codes;
    float* scales;
    bool int4;
    bool stochastic;
    std::uint32_t key;
    std::uint64_t offset;
};

struct DequantArgs {
    const void* codes;
    const float* scales;
    std::size_t n;
    std::size_t chunk;  // > 0
    float* out;
    bool int4;
    bool accumulate;
};

struct To16Args {
    const float* x;
    float* residual;  // nullptr: no error feedback
    std::size_t n;
    std::uint16_t* out;
    bool bf16;
};

struct From16Args {
    const std::uint16_t* x;
    std::size_t n;
    float* out;
    bool bf16;
    bool accumulate;
};

// Scalar pieces the SIMD paths reuse for heads and tails.
void quantizeElementsScalar(const QuantArgs& a, std::size_t b, std::size_t e, float scale) noexcept;
void zeroCodes(const QuantArgs& a, std::size_t b, std::size_t e) noexcept;  // also r = s
void dequantizeElementsScalar(const DequantArgs& a, std::size_t b, std::size_t e, float scale) noexcept;
void to16Scalar(const To16Args& a, std::size_t b, std::size_t e) noexcept;
void from16Scalar(const From16Args& a, std::size_t b, std::size_t e) noexcept;

void quantizeAvx2(const QuantArgs& a) noexcept;
void quantizeAvx512(const QuantArgs& a) noexcept;
void dequantizeAvx2(const DequantArgs& a) noexcept;
void dequantizeAvx512(const DequantArgs& a) noexcept;
void to16Avx2(const To16Args& a) noexcept;  // needs F16C for fp16
void to16Avx512(const To16Args& a) noexcept;
void from16Avx2(const From16Args& a) noexcept;
void from16Avx512(const From16Args& a) noexcept;

// The chunk loop the SIMD quantizers share. Isa (one per SIMD file, in its anonymous namespace)
// provides amax(a, b, e): max |x| of [b, e) as bits; and code<Int4, Stochastic, Feedback>(a, b,
// e, scale, nb, ne): codes (and residuals) of chunk [b, e), returning max |x| of the next chunk
// [nb, ne), read while this one is coded.
template <class Isa>
std::uint32_t codeChunk(const QuantArgs& a, std::size_t b, std::size_t e, float scale, std::size_t nb,
                        std::size_t ne) noexcept {
    switch ((a.int4 ? 4 : 0) | (a.stochastic ? 2 : 0) | (a.residual ? 1 : 0)) {
        case 0:
            return Isa::template code<false, false, false>(a, b, e, scale, nb, ne);
        case 1:
            return Isa::template code<false, false, true>(a, b, e, scale, nb, ne);
        case 2:
            return Isa::template code<false, true, false>(a, b, e, scale, nb, ne);
        case 3:
            return Isa::template code<false, true, true>(a, b, e, scale, nb, ne);
        case 4:
            return Isa::template code<true, false, false>(a, b, e, scale, nb, ne);
        case 5:
            return Isa::template code<true, false, true>(a, b, e, scale, nb, ne);
        case 6:
            return Isa::template code<true, true, false>(a, b, e, scale, nb, ne);
        default:
            return Isa::template code<true, true, true>(a, b, e, scale, nb, ne);
    }
}

template <class Isa>
void quantizeChunks(const QuantArgs& a) noexcept {
    const float qmax = a.int4 ? 7.f : 127.f;
    std::uint32_t amax = Isa::amax(a, 0, a.n < a.chunk ? a.n : a.chunk);
    for (std::size_t b = 0; b < a.n; b += a.chunk) {
        const std::size_t e = a.n - b < a.chunk ? a.n : b + a.chunk;
        const std::size_t ne = a.n - e < a.chunk ? a.n : e + a.chunk;
        const float scale = chunkScale(amax, qmax);
        a.scales[b / a.chunk] = scale;
        if (isNan(scale) || scale == 0.f) {
            zeroCodes(a, b, e);
            amax = Isa::amax(a, e, ne);
        } else {
            amax = codeChunk<Isa>(a, b, e, scale, e, ne);
        }
    }
}

}  // namespace lathe::kernels::detail
