// Compression kernels: the scalar reference against independent expectations (round-trip
// bounds, non-finite chunks, packing, IEEE/PyTorch conversions, unbiased stochastic rounding,
// bounded error feedback), and every SIMD path against the scalar reference byte for byte.
// Whatever runs per instruction set is one test case per set (isa_test_cases.h): a CPU that lacks
// one reports that case skipped instead of passing without having compared anything.

#include <catch2/catch.hpp>

#include "isa_test_cases.h"
#include "lathe/kernels/compress.h"
#include "skip.h"
#include "test_inputs.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace lathe::kernels;
using namespace lathe::kernels::test;

namespace {

const std::vector<std::size_t> kLengths{0, 1, 2, 7, 15, 16, 17, 31, 33, 100, 1000, 4099};
// Odd chunks of 17 and more: an int4 chunk that starts mid-byte and still has vector loops.
const std::vector<std::size_t> kChunks{1, 3, 16, 33, 97, 100, 4096, 0};
constexpr float kInf = std::numeric_limits<float>::infinity();

// Extra adversarial shapes on top of test_inputs.h's kinds.
std::vector<std::vector<float>> inputsFor(std::size_t n, std::mt19937& rng) {
    std::vector<std::vector<float>> out;
    for (InputKind k : allKinds()) out.push_back(makeInput(k, n, rng));
    std::vector<float> equal(n, -2.75f), wide(n), ties(n), tiny(n), dscale8(n), dscale4(n);
    // Denormal scales whose reciprocal is still finite, where x * (1 / scale) strays furthest
    // from x / scale: amax 5e-37 for int8 (scale ~3.9e-39), 5e-38 for int4 (~7.1e-39).
    std::uniform_real_distribution<float> unit(-1.f, 1.f);
    std::uniform_real_distribution<float> ex(-30.f, 30.f);
    for (std::size_t i = 0; i < n; ++i) {
        wide[i] = (i & 1 ? -1.f : 1.f) * std::pow(10.f, ex(rng));           // 1e-30 .. 1e30 in one chunk
        ties[i] = static_cast<float>(static_cast<int>(i % 15) - 7) + 0.5f;  // x/scale lands on .5
        tiny[i] = fromBits(1u + static_cast<std::uint32_t>(i % 3));         // amax/127 underflows to 0
        dscale8[i] = 5e-37f * (i % 5 == 0 ? (i & 1 ? -1.f : 1.f) : unit(rng));
        dscale4[i] = 5e-38f * (i % 5 == 0 ? (i & 1 ? -1.f : 1.f) : unit(rng));
    }
    if (n) ties[0] = 127.f;  // scale exactly 1 for int8, so the others are ties
    out.push_back(equal);
    out.push_back(wide);
    out.push_back(ties);
    out.push_back(tiny);
    out.push_back(dscale8);
    out.push_back(dscale4);
    return out;
}

template <typename T>
bool sameBytes(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

struct Quantized {
    std::vector<std::uint8_t> codes;
    std::vector<float> scales;
    std::vector<float> residual;
};

// Guard bytes after the outputs catch writes past the end.
Quantized runQuantize(const std::vector<float>& x, const std::vector<float>* residual, bool int4,
                      const QuantizeParams& p, CpuIsa isa) {
    const std::size_t n = x.size();
    Quantized q;
    q.codes.assign(codeBytes(n, int4 ? CompressFormat::Int4 : CompressFormat::Int8) + 8, 0xa5);
    q.scales.assign(chunkCount(n, p.chunk) + 2, fromBits(0x7fbadbadu));
    // Unaligned input: copy one float in.
    std::vector<float> buf(n + 1);
    std::copy(x.begin(), x.end(), buf.begin() + 1);
    if (residual) {
        q.residual = *residual;
        if (int4)
            quantizeInt4ErrorFeedback(buf.data() + 1, q.residual.data(), n, q.codes.data(), q.scales.data(),
                                      p, isa);
        else
            quantizeInt8ErrorFeedback(buf.data() + 1, q.residual.data(), n,
                                      reinterpret_cast<std::int8_t*>(q.codes.data()), q.scales.data(), p,
                                      isa);
    } else if (int4) {
        quantizeInt4(buf.data() + 1, n, q.codes.data(), q.scales.data(), p, isa);
    } else {
        quantizeInt8(buf.data() + 1, n, reinterpret_cast<std::int8_t*>(q.codes.data()), q.scales.data(), p,
                     isa);
    }
    return q;
}

std::vector<float> runDequantize(const Quantized& q, std::size_t n, std::size_t chunk, bool int4, bool add,
                                 const std::vector<float>& init, CpuIsa isa) {
    std::vector<float> out = init;
    out.resize(n + 4, fromBits(0x7fbadbadu));
    if (int4) {
        if (add)
            dequantizeAddInt4(q.codes.data(), q.scales.data(), n, chunk, out.data(), isa);
        else
            dequantizeInt4(q.codes.data(), q.scales.data(), n, chunk, out.data(), isa);
    } else {
        auto* c = reinterpret_cast<const std::int8_t*>(q.codes.data());
        if (add)
            dequantizeAddInt8(c, q.scales.data(), n, chunk, out.data(), isa);
        else
            dequantizeInt8(c, q.scales.data(), n, chunk, out.data(), isa);
    }
    return out;
}

int codeAt(const Quantized& q, std::size_t i, bool int4) {
    if (!int4) return static_cast<std::int8_t>(q.codes[i]);
    const int nib = (q.codes[i / 2] >> ((i & 1) * 4)) & 0xf;
    return nib >= 8 ? nib - 16 : nib;
}

}  // namespace

TEST_CASE("size helpers give wire bytes", "[kernels][compress]") {
    REQUIRE(chunkCount(0, 16) == 0);
    REQUIRE(chunkCount(17, 16) == 2);
    REQUIRE(chunkCount(17, 0) == 1);
    REQUIRE(compressedBytes(1000, 100, CompressFormat::Int8) == 1000 + 40);
    REQUIRE(compressedBytes(7, 4, CompressFormat::Int4) == 4 + 8);
    REQUIRE(compressedBytes(10, 4, CompressFormat::Fp16) == 20);
    REQUIRE(compressedBytes(10, 4, CompressFormat::None) == 40);
    const std::size_t n = 1u << 24;
    CHECK(4.0 * n / compressedBytes(n, kDefaultCompressChunk, CompressFormat::Int8) >= 3.9);
    CHECK(4.0 * n / compressedBytes(n, kDefaultCompressChunk, CompressFormat::Int4) >= 7.5);
    for (auto f : {CompressFormat::None, CompressFormat::Fp16, CompressFormat::Bf16, CompressFormat::Int8,
                   CompressFormat::Int4})
        REQUIRE(parseCompressFormat(compressFormatName(f)) == f);
    REQUIRE_FALSE(parseCompressFormat("int2").has_value());
}

TEST_CASE("scalar quantization meets its definition", "[kernels][compress]") {
    std::mt19937 rng(7);
    for (bool int4 : {false, true})
        for (std::size_t n : kLengths)
            for (std::size_t chunk : kChunks)
                for (const auto& x : inputsFor(n, rng)) {
                    const float qmax = int4 ? 7.f : 127.f;
                    QuantizeParams p;
                    p.chunk = chunk;
                    const Quantized q = runQuantize(x, nullptr, int4, p, CpuIsa::Scalar);
                    const std::vector<float> d = runDequantize(q, n, chunk, int4, false, {}, CpuIsa::Scalar);
                    const std::size_t c = chunk ? chunk : std::max<std::size_t>(n, 1);
                    INFO((int4 ? "int4" : "int8") << " n=" << n << " chunk=" << chunk);
                    REQUIRE(bitsOf(q.scales[chunkCount(n, chunk)]) == 0x7fbadbadu);  // nothing past the end
                    for (std::size_t b = 0; b < n; b += c) {
                        const std::size_t e = std::min(n, b + c);
                        float amax = 0.f;
                        bool finite = true;
                        for (std::size_t i = b; i < e; ++i) {
                            finite &= std::isfinite(x[i]);
                            if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
                        }
                        const float scale = q.scales[b / c];
                        if (!finite) {
                            REQUIRE(bitsOf(scale) == 0x7fc00000u);
                            for (std::size_t i = b; i < e; ++i) {
                                REQUIRE(codeAt(q, i, int4) == 0);
                                REQUIRE(std::isnan(d[i]));  // the receiver sees non-finite
                            }
                            continue;
                        }
                        REQUIRE(bitsOf(scale) == bitsOf(amax / qmax));
                        for (std::size_t i = b; i < e; ++i) {
                            const int code = codeAt(q, i, int4);
                            REQUIRE(std::abs(code) <= qmax);
                            if (scale == 0.f) {
                                REQUIRE(code == 0);
                                continue;
                            }
                            // A denormal scale is itself coarsely rounded, so only the code range holds.
                            if (scale < std::numeric_limits<float>::min()) continue;
                            // The definition: v = x * fl(1 / scale) in fp32, rounded to nearest even.
                            const float inv = 1.f / scale;
                            REQUIRE(std::isfinite(inv));
                            const float vf = std::clamp(x[i] * inv, -qmax, qmax);
                            REQUIRE(code == static_cast<int>(std::nearbyint(vf)));
                            // Against the exact quotient: half a step, plus the two fp32 roundings
                            // of the reciprocal and the product (2^-23 relative).
                            const double v = std::clamp(double(x[i]) / scale, -double(qmax), double(qmax));
                            REQUIRE(std::fabs(v - code) <= 0.5 + qmax * 0x1p-23);
                            // Round-trip error within half a step (plus the final fp32 rounding).
                            REQUIRE(std::fabs(double(x[i]) - d[i]) <=
                                    0.5 * scale * (1 + 1e-5) + 1e-6 * std::fabs(x[i]));
                        }
                    }
                    if (int4 && (n & 1)) REQUIRE((q.codes[n / 2] >> 4) == 0);  // padding nibble
                    if (n)
                        REQUIRE(q.codes[codeBytes(n, int4 ? CompressFormat::Int4 : CompressFormat::Int8)] ==
                                0xa5);
                }
}

TEST_CASE("ties round to even, int4 packs low nibble first", "[kernels][compress]") {
    // One chunk with amax 127: scale 1, so x/scale is x exactly.
    const std::vector<float> x{127.f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f};
    QuantizeParams p;
    p.chunk = 0;
    const Quantized q8 = runQuantize(x, nullptr, false, p, CpuIsa::Scalar);
    const int want8[] = {127, 0, 2, 2, 0, -2, -2};
    for (int i = 0; i < 7; ++i) REQUIRE(codeAt(q8, i, false) == want8[i]);
    // int4: amax 7 -> scale 1. Seven values, so four bytes with a zero top nibble at the end.
    const std::vector<float> y{7.f, -7.f, 1.f, -1.f, 3.5f, -3.5f, 0.f};
    const Quantized q4 = runQuantize(y, nullptr, true, p, CpuIsa::Scalar);
    REQUIRE(q4.codes[0] == 0x97);  // 7 low, -7 (0x9) high
    REQUIRE(q4.codes[1] == 0xf1);  // 1, -1
    REQUIRE(q4.codes[2] == 0xc4);  // 4 (3.5 -> 4), -4 (0xc)
    REQUIRE(q4.codes[3] == 0x00);
}

namespace {

// amax 1e-37: scale = amax / 127 (or / 7) is a denormal (~7.9e-40, ~1.4e-38 is normal for int4,
// so int4 uses amax 1e-39) and 1 / scale overflows to inf. The scalar reference against the
// definition, then `isa` against the reference, byte for byte (trivially so for the scalar case).
void checkReciprocalOverflow(CpuIsa isa) {
    for (bool int4 : {false, true}) {
        const float qmax = int4 ? 7.f : 127.f;
        const float amax = int4 ? 1e-39f : 1e-37f;
        std::vector<float> x(101);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = amax * (static_cast<float>(i % 21) - 10.f) / 10.f;
        QuantizeParams p;
        p.chunk = 0;
        const Quantized ref = runQuantize(x, nullptr, int4, p, CpuIsa::Scalar);
        const float scale = ref.scales[0];
        INFO((int4 ? "int4" : "int8"));
        REQUIRE(scale > 0.f);
        REQUIRE(std::isinf(1.f / scale));
        for (std::size_t i = 0; i < x.size(); ++i)
            REQUIRE(codeAt(ref, i, int4) ==
                    static_cast<int>(std::nearbyint(std::clamp(x[i] / scale, -qmax, qmax))));
        REQUIRE(codeAt(ref, 0, int4) == -static_cast<int>(qmax));
        std::vector<float> r0(x.size());
        for (std::size_t i = 0; i < r0.size(); ++i) r0[i] = amax * 0.01f * static_cast<float>(i % 7);
        for (int mode = 0; mode < 4; ++mode) {  // bit 0: stochastic, bit 1: error feedback
            p.stochastic = mode & 1;
            p.seed = 5;
            const std::vector<float>* res = (mode & 2) ? &r0 : nullptr;
            const Quantized want = runQuantize(x, res, int4, p, CpuIsa::Scalar);
            INFO(cpuIsaName(isa) << " mode=" << mode);
            const Quantized got = runQuantize(x, res, int4, p, isa);
            REQUIRE(sameBytes(got.codes, want.codes));
            REQUIRE(sameBytes(got.residual, want.residual));
        }
    }
}

}  // namespace

LATHE_EVERY_ISA_TEST_CASES("a scale whose reciprocal overflows is coded by division on every path",
                           "[kernels][compress][simd]", checkReciprocalOverflow)

namespace {

void checkDirectedRounding(CpuIsa isa) {
    // The code is rint(v) in the current rounding mode. Upward (or downward for negative values),
    // x * (1 / scale) for x = amax can round to just above Q and then to Q + 1 unless clamped.
    struct RoundingMode {
        int mode;
        const char* name;
    };
    std::mt19937 rng(23);
    const int saved = std::fegetround();
    for (const RoundingMode m : {RoundingMode{FE_UPWARD, "upward"}, RoundingMode{FE_DOWNWARD, "downward"},
                                 RoundingMode{FE_TOWARDZERO, "toward zero"}}) {
        std::vector<std::vector<float>> inputs = inputsFor(1000, rng);
        // amax 381 gives scale 3 exactly; upward, 1/3 rounds up and 381 * inv to 127.00001.
        std::vector<float> edge(1000);
        for (std::size_t i = 0; i < edge.size(); ++i)
            edge[i] = (i % 2 ? -381.f : 381.f) * (i % 3 ? 1.f : 0.5f);
        inputs.push_back(edge);
        std::vector<float> edge4(edge);
        for (float& v : edge4) v *= 21.f / 381.f;  // amax 21: scale 3 for int4
        inputs.push_back(edge4);
        for (bool int4 : {false, true})
            for (int mode = 0; mode < 4; ++mode)
                for (const auto& x : inputs) {
                    QuantizeParams p;
                    p.chunk = 100;
                    p.stochastic = mode & 1;
                    p.seed = 77;
                    std::vector<float> r0(x.size(), 0.f);
                    const std::vector<float>* res = (mode & 2) ? &r0 : nullptr;
                    std::fesetround(m.mode);
                    const Quantized want = runQuantize(x, res, int4, p, CpuIsa::Scalar);
                    const Quantized got = runQuantize(x, res, int4, p, isa);
                    std::fesetround(saved);
                    INFO(m.name << " " << cpuIsaName(isa) << (int4 ? " int4" : " int8") << " mode=" << mode);
                    REQUIRE(sameBytes(got.codes, want.codes));
                    REQUIRE(sameBytes(got.scales, want.scales));
                    REQUIRE(sameBytes(got.residual, want.residual));
                }
    }
    std::fesetround(saved);
}

}  // namespace

LATHE_SIMD_TEST_CASES("SIMD quantization equals the reference under directed rounding modes",
                      "[kernels][compress][simd]", checkDirectedRounding)

namespace {

void checkQuantizePaths(CpuIsa isa) {
    std::mt19937 rng(11);
    for (bool int4 : {false, true})
        for (std::size_t n : kLengths)
            for (std::size_t chunk : kChunks)
                for (const auto& x : inputsFor(n, rng))
                    for (int mode = 0; mode < 4; ++mode) {  // bit 0: stochastic, bit 1: error feedback
                        QuantizeParams p;
                        p.chunk = chunk;
                        p.stochastic = mode & 1;
                        p.seed = 1234 + n;
                        p.indexOffset = n * 3;
                        std::vector<float> r0(n);
                        std::normal_distribution<float> nd(0.f, 0.1f);
                        for (float& v : r0) v = nd(rng);
                        const std::vector<float>* res = (mode & 2) ? &r0 : nullptr;
                        const Quantized ref = runQuantize(x, res, int4, p, CpuIsa::Scalar);
                        const Quantized got = runQuantize(x, res, int4, p, isa);
                        INFO(cpuIsaName(isa) << (int4 ? " int4" : " int8") << " n=" << n << " chunk=" << chunk
                                             << " mode=" << mode);
                        REQUIRE(sameBytes(got.codes, ref.codes));
                        REQUIRE(sameBytes(got.scales, ref.scales));
                        REQUIRE(sameBytes(got.residual, ref.residual));
                        for (bool add : {false, true}) {
                            const std::vector<float> init = makeInput(InputKind::AnyBits, n, rng);
                            const auto dr = runDequantize(ref, n, chunk, int4, add, init, CpuIsa::Scalar);
                            const auto dg = runDequantize(ref, n, chunk, int4, add, init, isa);
                            INFO("dequantize add=" << add);
                            REQUIRE(sameBytes(dg, dr));
                        }
                    }
}

}  // namespace

LATHE_SIMD_TEST_CASES("every SIMD quantize/dequantize path equals the scalar reference byte for byte",
                      "[kernels][compress][simd]", checkQuantizePaths)

namespace {

void checkNonFiniteChunk(CpuIsa isa) {
    for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> g(40, 0.25f), r(40, 0.125f);
        g[37] = bad;  // second chunk of 32, in the tail
        QuantizeParams p;
        p.chunk = 32;
        const Quantized q = runQuantize(g, &r, false, p, isa);
        INFO(cpuIsaName(isa) << " bad=" << bad);
        REQUIRE(std::isfinite(q.scales[0]));
        REQUIRE(bitsOf(q.scales[1]) == 0x7fc00000u);
        for (std::size_t i = 32; i < 40; ++i) {
            REQUIRE(q.codes[i] == 0);
            REQUIRE(q.residual[i] == 0.125f);
        }
        std::vector<float> acc(40, 1.f);
        acc = runDequantize(q, 40, 32, false, true, acc, isa);
        REQUIRE(std::isfinite(acc[0]));
        REQUIRE(bitsOf(acc[33]) == 0x7fc00000u);  // canonical NaN from accumulation
    }
}

}  // namespace

LATHE_EVERY_ISA_TEST_CASES("a non-finite chunk gets a NaN scale and leaves the residual alone",
                           "[kernels][compress][simd]", checkNonFiniteChunk)

namespace {

// Chunks of 64 holding 1.0 once (scale 1/127) and 0.3 elsewhere: 0.3 * 127 = 38.1 is not a
// code, so each element rounds to 38 or 39 independently.
std::vector<float> stochasticInput() {
    std::vector<float> x(64 * 2000, 0.3f);
    for (std::size_t i = 0; i < x.size(); i += 64) x[i] = 1.f;
    return x;
}

void checkStochasticUnbiased(CpuIsa isa) {
    const std::vector<float> x = stochasticInput();
    const std::size_t n = x.size();
    QuantizeParams p;
    p.chunk = 64;
    p.stochastic = true;
    double sum = 0;
    std::size_t count = 0;
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
        p.seed = seed;
        const Quantized q = runQuantize(x, nullptr, false, p, isa);
        const auto d = runDequantize(q, n, 64, false, false, {}, isa);
        for (std::size_t i = 0; i < n; ++i)
            if (i % 64) {
                sum += d[i];
                ++count;
            }
    }
    INFO(cpuIsaName(isa));
    CHECK(std::fabs(sum / count - 0.3) < 2e-4);  // nearest would give 38/127 = 0.2992
}

}  // namespace

LATHE_EVERY_ISA_TEST_CASES("stochastic rounding is unbiased", "[kernels][compress][simd]",
                           checkStochasticUnbiased)

TEST_CASE("stochastic rounding is reproducible and split-independent", "[kernels][compress]") {
    const std::vector<float> x = stochasticInput();
    const std::size_t n = x.size();
    QuantizeParams p;
    p.chunk = 64;
    p.stochastic = true;
    // Same seed: same codes; a split at a chunk boundary with indexOffset equals one call.
    p.seed = 99;
    const Quantized whole = runQuantize(x, nullptr, false, p, CpuIsa::Scalar);
    const std::vector<float> tail(x.begin() + 640, x.end());
    p.indexOffset = 640;
    const Quantized part = runQuantize(tail, nullptr, false, p, bestCpuIsa());
    REQUIRE(std::memcmp(part.codes.data(), whole.codes.data() + 640, n - 640) == 0);
    p.indexOffset = 0;
    p.seed = 100;
    const Quantized other = runQuantize(x, nullptr, false, p, CpuIsa::Scalar);
    REQUIRE_FALSE(sameBytes(other.codes, whole.codes));
}

TEST_CASE("error feedback: transmitted sum tracks the gradient sum", "[kernels][compress]") {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (bool int4 : {false, true}) {
        const std::size_t n = 1000, chunk = 100;
        std::vector<float> r(n, 0.f);
        std::vector<double> sumG(n, 0), sumT(n, 0);
        float maxScale = 0;
        QuantizeParams p;
        p.chunk = chunk;
        for (int step = 0; step < 300; ++step) {
            std::vector<float> g(n);
            for (std::size_t i = 0; i < n; ++i)
                g[i] = nd(rng) * (i % 7 == 0 ? 1e-3f : 1.f);  // some tiny coords
            Quantized q = runQuantize(g, &r, int4, p, bestCpuIsa());
            r = q.residual;
            const auto d = runDequantize(q, n, chunk, int4, false, {}, bestCpuIsa());
            for (std::size_t i = 0; i < n; ++i) {
                sumG[i] += g[i];
                sumT[i] += d[i];
            }
            for (std::size_t c = 0; c < n / chunk; ++c) maxScale = std::max(maxScale, q.scales[c]);
        }
        INFO((int4 ? "int4" : "int8"));
        for (std::size_t i = 0; i < n; ++i) {
            // What was not sent is exactly the residual, which stays within half a step.
            REQUIRE(std::fabs(r[i]) <= 0.5f * maxScale * 1.001f);
            REQUIRE(std::fabs(sumG[i] - sumT[i] - r[i]) < 1e-3);
        }
    }
}

TEST_CASE("fp16 and bf16 conversions follow IEEE and PyTorch", "[kernels][compress]") {
    auto h = [](float f) {
        std::uint16_t o;
        floatToHalf(&f, 1, &o, CpuIsa::Scalar);
        return o;
    };
    auto b = [](float f) {
        std::uint16_t o;
        floatToBf16(&f, 1, &o, CpuIsa::Scalar);
        return o;
    };
    REQUIRE(h(1.f) == 0x3c00);
    REQUIRE(h(65504.f) == 0x7bff);
    REQUIRE(h(65519.f) == 0x7bff);
    REQUIRE(h(65520.f) == 0x7c00);  // tie rounds to even = inf
    REQUIRE(h(-kInf) == 0xfc00);
    REQUIRE(h(std::ldexp(1.f, -24)) == 0x0001);  // smallest denormal
    REQUIRE(h(std::ldexp(1.f, -25)) == 0x0000);  // tie to even: 0
    REQUIRE(h(std::ldexp(1.5f, -25)) == 0x0001);
    REQUIRE(h(std::ldexp(3.f, -25)) == 0x0002);  // 1.5 ulp tie -> 2
    REQUIRE(h(-1e-40f) == 0x8000);
    REQUIRE((h(std::numeric_limits<float>::quiet_NaN()) & 0x7e00) == 0x7e00);
    REQUIRE(b(1.f) == 0x3f80);
    REQUIRE(b(fromBits(0x3f808000u)) == 0x3f80);  // tie to even (down)
    REQUIRE(b(fromBits(0x3f818000u)) == 0x3f82);  // tie to even (up)
    REQUIRE(b(fromBits(0x00008001u)) == 0x0001);  // denormals kept
    REQUIRE(b(std::numeric_limits<float>::max()) == 0x7f80);
    REQUIRE(b(fromBits(0xffc01234u)) == 0x7fc0);  // any NaN -> 0x7fc0
    // Every half converts back exactly and round-trips.
    for (std::uint32_t v = 0; v < 65536; ++v) {
        float f;
        const auto hv = static_cast<std::uint16_t>(v);
        halfToFloat(&hv, 1, &f, CpuIsa::Scalar);
        if ((v & 0x7c00) == 0x7c00 && (v & 0x3ff)) {
            REQUIRE(std::isnan(f));
            continue;
        }
        REQUIRE(h(f) == hv);
        float bf;
        bf16ToFloat(&hv, 1, &bf, CpuIsa::Scalar);
        REQUIRE(bitsOf(bf) == v << 16);
    }
}

namespace {

void checkHalfPaths(CpuIsa isa) {
    std::mt19937 rng(3);
    // All 65536 16-bit patterns, and float inputs that hit every rounding case.
    std::vector<std::uint16_t> all(65536 + 5);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i * 40503u);
    std::vector<std::vector<float>> floats;
    for (std::size_t n : kLengths)
        for (const auto& x : inputsFor(n, rng)) floats.push_back(x);
    std::vector<float> sweep(1 << 20);  // consecutive bit patterns around fp16's range edges
    for (std::size_t i = 0; i < sweep.size(); ++i)
        sweep[i] = fromBits(0x33000000u + static_cast<std::uint32_t>(i * 4099u));
    floats.push_back(sweep);
    for (bool bf16 : {false, true}) {
        INFO(cpuIsaName(isa) << (bf16 ? " bf16" : " fp16"));
        for (bool add : {false, true}) {
            std::vector<float> a(all.size(), 0.5f), bq(all.size(), 0.5f);
            if (bf16) {
                if (add)
                    addBf16ToFloat(all.data(), all.size(), a.data(), CpuIsa::Scalar),
                        addBf16ToFloat(all.data(), all.size(), bq.data(), isa);
                else
                    bf16ToFloat(all.data(), all.size(), a.data(), CpuIsa::Scalar),
                        bf16ToFloat(all.data(), all.size(), bq.data(), isa);
            } else {
                if (add)
                    addHalfToFloat(all.data(), all.size(), a.data(), CpuIsa::Scalar),
                        addHalfToFloat(all.data(), all.size(), bq.data(), isa);
                else
                    halfToFloat(all.data(), all.size(), a.data(), CpuIsa::Scalar),
                        halfToFloat(all.data(), all.size(), bq.data(), isa);
            }
            REQUIRE(sameBytes(a, bq));
        }
        for (const auto& x : floats) {
            const std::size_t n = x.size();
            std::vector<std::uint16_t> o1(n + 3, 0xabcd), o2(n + 3, 0xabcd);
            std::vector<float> r1 = makeInput(InputKind::Normal, n, rng), r2 = r1;
            if (bf16) {
                floatToBf16(x.data(), n, o1.data(), CpuIsa::Scalar);
                floatToBf16(x.data(), n, o2.data(), isa);
            } else {
                floatToHalf(x.data(), n, o1.data(), CpuIsa::Scalar);
                floatToHalf(x.data(), n, o2.data(), isa);
            }
            INFO("n=" << n);
            REQUIRE(sameBytes(o1, o2));
            if (bf16) {
                floatToBf16ErrorFeedback(x.data(), r1.data(), n, o1.data(), CpuIsa::Scalar);
                floatToBf16ErrorFeedback(x.data(), r2.data(), n, o2.data(), isa);
            } else {
                floatToHalfErrorFeedback(x.data(), r1.data(), n, o1.data(), CpuIsa::Scalar);
                floatToHalfErrorFeedback(x.data(), r2.data(), n, o2.data(), isa);
            }
            REQUIRE(sameBytes(o1, o2));
            REQUIRE(sameBytes(r1, r2));
            for (float v : r1) REQUIRE(!std::isinf(v));  // overflow never poisons the residual
        }
    }
}

}  // namespace

LATHE_SIMD_TEST_CASES("every SIMD fp16/bf16 path equals the scalar reference byte for byte",
                      "[kernels][compress][simd]", checkHalfPaths)
