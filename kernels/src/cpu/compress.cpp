// Compression kernels: the scalar reference (deliberately the obvious per-element code, which
// the SIMD paths in compress_avx2.cpp / compress_avx512.cpp are held to bit for bit), the size
// helpers and the run-time dispatch. Definitions are in compress.h.
//
// This file and the SIMD ones are compiled with -ffp-contract=off: a fused multiply-add in one
// path and not in another would break bit-identity of dequantize-add and error feedback.

#include "compress_internal.h"

#include <algorithm>

namespace lathe::kernels {

namespace detail {

namespace {

inline float loadS(const QuantArgs& a, std::size_t i) noexcept {
    return a.residual ? a.grad[i] + a.residual[i] : a.grad[i];
}

void quantizeScalar(const QuantArgs& a) noexcept {
    const float qmax = a.int4 ? 7.f : 127.f;
    for (std::size_t b = 0; b < a.n; b += a.chunk) {
        const std::size_t e = std::min(a.n, b + a.chunk);
        std::uint32_t amax = 0;
        for (std::size_t i = b; i < e; ++i) amax = std::max(amax, bits(loadS(a, i)) & kAbsMask);
        const float scale = chunkScale(amax, qmax);
        a.scales[b / a.chunk] = scale;
        if (isNan(scale) || scale == 0.f)
            zeroCodes(a, b, e);
        else
            quantizeElementsScalar(a, b, e, scale);
    }
}

void dequantizeScalar(const DequantArgs& a) noexcept {
    for (std::size_t b = 0; b < a.n; b += a.chunk)
        dequantizeElementsScalar(a, b, std::min(a.n, b + a.chunk), a.scales[b / a.chunk]);
}

}  // namespace

void quantizeElementsScalar(const QuantArgs& a, std::size_t b, std::size_t e, float scale) noexcept {
    const float qmax = a.int4 ? 7.f : 127.f;
    const float inv = reciprocal(scale);
    for (std::size_t i = b; i < e; ++i) {
        const float s = loadS(a, i);
        const int q =
            quantOne(s, scale, inv, qmax, a.stochastic, a.key, static_cast<std::uint32_t>(a.offset + i));
        if (a.int4)
            storeInt4(static_cast<std::uint8_t*>(a.codes), i, q);
        else
            static_cast<std::int8_t*>(a.codes)[i] = static_cast<std::int8_t>(q);
        if (a.residual) a.residual[i] = s - static_cast<float>(q) * scale;
    }
}

// All-zero codes for [b, e). With a zero scale the residual becomes s (s - 0 * 0); with a NaN
// scale (non-finite chunk) the residual is left as it was.
void zeroCodes(const QuantArgs& a, std::size_t b, std::size_t e) noexcept {
    const bool nanChunk = isNan(a.scales[b / a.chunk]);
    if (a.int4) {
        auto* c = static_cast<std::uint8_t*>(a.codes);
        std::size_t i = b;
        if (i < e && (i & 1)) storeInt4(c, i++, 0);
        const std::size_t pairsEnd = i + ((e - i) & ~std::size_t{1});
        if (pairsEnd > i) std::memset(c + i / 2, 0, (pairsEnd - i) / 2);
        if (pairsEnd < e) storeInt4(c, pairsEnd, 0);
    } else if (e > b) {
        std::memset(static_cast<std::int8_t*>(a.codes) + b, 0, e - b);
    }
    if (a.residual && !nanChunk)
        for (std::size_t i = b; i < e; ++i) a.residual[i] = a.grad[i] + a.residual[i];
}

void dequantizeElementsScalar(const DequantArgs& a, std::size_t b, std::size_t e, float scale) noexcept {
    for (std::size_t i = b; i < e; ++i) {
        const int q = a.int4 ? loadInt4(static_cast<const std::uint8_t*>(a.codes), i)
                             : static_cast<const std::int8_t*>(a.codes)[i];
        const float d = static_cast<float>(q) * scale;
        a.out[i] = a.accumulate ? canonicalIfNan(a.out[i] + d) : d;
    }
}

void to16Scalar(const To16Args& a, std::size_t b, std::size_t e) noexcept {
    for (std::size_t i = b; i < e; ++i) {
        const float s = a.residual ? a.x[i] + a.residual[i] : a.x[i];
        const std::uint16_t h = a.bf16 ? floatToBf16One(s) : floatToHalfOne(s);
        a.out[i] = h;
        if (a.residual) {
            const float back = a.bf16 ? bf16ToFloatOne(h) : halfToFloatOne(h);
            if (!nonFinite(back)) a.residual[i] = s - back;
        }
    }
}

void from16Scalar(const From16Args& a, std::size_t b, std::size_t e) noexcept {
    for (std::size_t i = b; i < e; ++i) {
        const float v = a.bf16 ? bf16ToFloatOne(a.x[i]) : halfToFloatOne(a.x[i]);
        a.out[i] = a.accumulate ? canonicalIfNan(a.out[i] + v) : v;
    }
}

}  // namespace detail

using namespace detail;

namespace {

#if defined(__x86_64__) || defined(__i386__)
bool hasF16c() noexcept {
    static const bool f16c = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("f16c") != 0;
    }();
    return f16c;
}
#else
bool hasF16c() noexcept { return false; }
#endif

// The path actually taken for a request: unavailable paths fall back to Scalar.
CpuIsa effective(CpuIsa isa) noexcept {
#if defined(__x86_64__) || defined(__i386__)
    if (isa == CpuIsa::Avx512 && cpuIsaAvailable(CpuIsa::Avx512)) return CpuIsa::Avx512;
    if (isa == CpuIsa::Avx2 && cpuIsaAvailable(CpuIsa::Avx2)) return CpuIsa::Avx2;
#else
    (void)isa;
#endif
    return CpuIsa::Scalar;
}

void runQuantize(const float* g, float* r, std::size_t n, void* codes, float* scales, const QuantizeParams& p,
                 bool int4, CpuIsa isa) noexcept {
    if (n == 0) return;
    const QuantArgs a{
        g, r, n, p.chunk ? p.chunk : n, codes, scales, int4, p.stochastic, streamKey(p.seed), p.indexOffset};
    switch (effective(isa)) {
        case CpuIsa::Avx512:
            quantizeAvx512(a);
            return;
        case CpuIsa::Avx2:
            quantizeAvx2(a);
            return;
        case CpuIsa::Scalar:
            quantizeScalar(a);
            return;
    }
}

void runDequantize(const void* codes, const float* scales, std::size_t n, std::size_t chunk, float* out,
                   bool int4, bool accumulate, CpuIsa isa) noexcept {
    if (n == 0) return;
    const DequantArgs a{codes, scales, n, chunk ? chunk : n, out, int4, accumulate};
    switch (effective(isa)) {
        case CpuIsa::Avx512:
            dequantizeAvx512(a);
            return;
        case CpuIsa::Avx2:
            dequantizeAvx2(a);
            return;
        case CpuIsa::Scalar:
            dequantizeScalar(a);
            return;
    }
}

void runTo16(const float* x, float* r, std::size_t n, std::uint16_t* out, bool bf16, CpuIsa isa) noexcept {
    if (n == 0) return;
    const To16Args a{x, r, n, out, bf16};
    CpuIsa eff = effective(isa);
    if (eff == CpuIsa::Avx2 && !bf16 && !hasF16c()) eff = CpuIsa::Scalar;
    switch (eff) {
        case CpuIsa::Avx512:
            to16Avx512(a);
            return;
        case CpuIsa::Avx2:
            to16Avx2(a);
            return;
        case CpuIsa::Scalar:
            to16Scalar(a, 0, n);
            return;
    }
}

void runFrom16(const std::uint16_t* x, std::size_t n, float* out, bool bf16, bool accumulate,
               CpuIsa isa) noexcept {
    if (n == 0) return;
    const From16Args a{x, n, out, bf16, accumulate};
    CpuIsa eff = effective(isa);
    if (eff == CpuIsa::Avx2 && !bf16 && !hasF16c()) eff = CpuIsa::Scalar;
    switch (eff) {
        case CpuIsa::Avx512:
            from16Avx512(a);
            return;
        case CpuIsa::Avx2:
            from16Avx2(a);
            return;
        case CpuIsa::Scalar:
            from16Scalar(a, 0, n);
            return;
    }
}

}  // namespace

const char* compressFormatName(CompressFormat f) noexcept {
    switch (f) {
        case CompressFormat::None:
            return "none";
        case CompressFormat::Fp16:
            return "fp16";
        case CompressFormat::Bf16:
            return "bf16";
        case CompressFormat::Int8:
            return "int8";
        case CompressFormat::Int4:
            return "int4";
    }
    return "unknown";
}

std::optional<CompressFormat> parseCompressFormat(std::string_view name) noexcept {
    for (CompressFormat f : {CompressFormat::None, CompressFormat::Fp16, CompressFormat::Bf16,
                             CompressFormat::Int8, CompressFormat::Int4})
        if (name == compressFormatName(f)) return f;
    return std::nullopt;
}

std::size_t chunkCount(std::size_t n, std::size_t chunk) noexcept {
    if (n == 0) return 0;
    if (chunk == 0) return 1;
    return n / chunk + (n % chunk != 0);
}

std::size_t codeBytes(std::size_t n, CompressFormat f) noexcept {
    switch (f) {
        case CompressFormat::None:
            return n * 4;
        case CompressFormat::Fp16:
        case CompressFormat::Bf16:
            return n * 2;
        case CompressFormat::Int8:
            return n;
        case CompressFormat::Int4:
            return n / 2 + (n & 1);
    }
    return 0;
}

std::size_t compressedBytes(std::size_t n, std::size_t chunk, CompressFormat f) noexcept {
    const bool scaled = f == CompressFormat::Int8 || f == CompressFormat::Int4;
    return codeBytes(n, f) + (scaled ? chunkCount(n, chunk) * sizeof(float) : 0);
}

std::uint32_t streamKey(std::uint64_t seed) noexcept {
    // splitmix64 finalizer: neighbouring seeds give unrelated keys.
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<std::uint32_t>(z ^ (z >> 31));
}

// ---- explicit-path entry points -------------------------------------------------------------

void quantizeInt8(const float* x, std::size_t n, std::int8_t* codes, float* scales, const QuantizeParams& p,
                  CpuIsa isa) noexcept {
    runQuantize(x, nullptr, n, codes, scales, p, false, isa);
}
void quantizeInt4(const float* x, std::size_t n, std::uint8_t* codes, float* scales, const QuantizeParams& p,
                  CpuIsa isa) noexcept {
    runQuantize(x, nullptr, n, codes, scales, p, true, isa);
}
void quantizeInt8ErrorFeedback(const float* grad, float* residual, std::size_t n, std::int8_t* codes,
                               float* scales, const QuantizeParams& p, CpuIsa isa) noexcept {
    runQuantize(grad, residual, n, codes, scales, p, false, isa);
}
void quantizeInt4ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint8_t* codes,
                               float* scales, const QuantizeParams& p, CpuIsa isa) noexcept {
    runQuantize(grad, residual, n, codes, scales, p, true, isa);
}
void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, CpuIsa isa) noexcept {
    runDequantize(codes, scales, n, chunk, out, false, false, isa);
}
void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, CpuIsa isa) noexcept {
    runDequantize(codes, scales, n, chunk, out, true, false, isa);
}
void dequantizeAddInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out, CpuIsa isa) noexcept {
    runDequantize(codes, scales, n, chunk, out, false, true, isa);
}
void dequantizeAddInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out, CpuIsa isa) noexcept {
    runDequantize(codes, scales, n, chunk, out, true, true, isa);
}
void floatToHalf(const float* x, std::size_t n, std::uint16_t* out, CpuIsa isa) noexcept {
    runTo16(x, nullptr, n, out, false, isa);
}
void halfToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept {
    runFrom16(x, n, out, false, false, isa);
}
void addHalfToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept {
    runFrom16(x, n, out, false, true, isa);
}
void floatToHalfErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out,
                              CpuIsa isa) noexcept {
    runTo16(grad, residual, n, out, false, isa);
}
void floatToBf16(const float* x, std::size_t n, std::uint16_t* out, CpuIsa isa) noexcept {
    runTo16(x, nullptr, n, out, true, isa);
}
void bf16ToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept {
    runFrom16(x, n, out, true, false, isa);
}
void addBf16ToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept {
    runFrom16(x, n, out, true, true, isa);
}
void floatToBf16ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out,
                              CpuIsa isa) noexcept {
    runTo16(grad, residual, n, out, true, isa);
}

// ---- dispatching entry points ---------------------------------------------------------------

void quantizeInt8(const float* x, std::size_t n, std::int8_t* codes, float* scales,
                  const QuantizeParams& p) noexcept {
    quantizeInt8(x, n, codes, scales, p, bestCpuIsa());
}
void quantizeInt4(const float* x, std::size_t n, std::uint8_t* codes, float* scales,
                  const QuantizeParams& p) noexcept {
    quantizeInt4(x, n, codes, scales, p, bestCpuIsa());
}
void quantizeInt8ErrorFeedback(const float* grad, float* residual, std::size_t n, std::int8_t* codes,
                               float* scales, const QuantizeParams& p) noexcept {
    quantizeInt8ErrorFeedback(grad, residual, n, codes, scales, p, bestCpuIsa());
}
void quantizeInt4ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint8_t* codes,
                               float* scales, const QuantizeParams& p) noexcept {
    quantizeInt4ErrorFeedback(grad, residual, n, codes, scales, p, bestCpuIsa());
}
void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out) noexcept {
    dequantizeInt8(codes, scales, n, chunk, out, bestCpuIsa());
}
void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out) noexcept {
    dequantizeInt4(codes, scales, n, chunk, out, bestCpuIsa());
}
void dequantizeAddInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out) noexcept {
    dequantizeAddInt8(codes, scales, n, chunk, out, bestCpuIsa());
}
void dequantizeAddInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out) noexcept {
    dequantizeAddInt4(codes, scales, n, chunk, out, bestCpuIsa());
}
void floatToHalf(const float* x, std::size_t n, std::uint16_t* out) noexcept {
    floatToHalf(x, n, out, bestCpuIsa());
}
void halfToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept {
    halfToFloat(x, n, out, bestCpuIsa());
}
void addHalfToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept {
    addHalfToFloat(x, n, out, bestCpuIsa());
}
void floatToHalfErrorFeedback(const float* grad, float* residual, std::size_t n,
                              std::uint16_t* out) noexcept {
    floatToHalfErrorFeedback(grad, residual, n, out, bestCpuIsa());
}
void floatToBf16(const float* x, std::size_t n, std::uint16_t* out) noexcept {
    floatToBf16(x, n, out, bestCpuIsa());
}
void bf16ToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept {
    bf16ToFloat(x, n, out, bestCpuIsa());
}
void addBf16ToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept {
    addBf16ToFloat(x, n, out, bestCpuIsa());
}
void floatToBf16ErrorFeedback(const float* grad, float* residual, std::size_t n,
                              std::uint16_t* out) noexcept {
    floatToBf16ErrorFeedback(grad, residual, n, out, bestCpuIsa());
}

}  // namespace lathe::kernels
