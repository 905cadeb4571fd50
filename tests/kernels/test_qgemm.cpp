// The int8 GEMM (qgemm.h): every CPU path the machine has against an exact integer reference
// computed here from the unpacked matrices, on random and adversarial inputs (saturating codes,
// odd sizes, unaligned rows); the fp32 epilogue and row quantization bit for bit against the
// scalar path; the thread pool; the CUDA kernel against the CPU when a GPU is present.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/info.h"
#include "lathe/kernels/qgemm.h"
#include "skip.h"

using namespace lathe::kernels;

namespace {

#define LATHE_GEMM_ISA_CASE(name, tags, isa, label, check)                                  \
    TEST_CASE(name " (" label ")", tags) {                                                  \
        if (!::lathe::kernels::gemmIsaAvailable(isa)) LATHE_SKIP("this CPU has no " label); \
        check(isa);                                                                         \
    }
#define LATHE_EVERY_GEMM_ISA(name, tags, check)                                 \
    LATHE_GEMM_ISA_CASE(name, tags, GemmIsa::Scalar, "scalar", check)           \
    LATHE_GEMM_ISA_CASE(name, tags, GemmIsa::Avx2, "AVX2", check)               \
    LATHE_GEMM_ISA_CASE(name, tags, GemmIsa::Avx512Vnni, "AVX-512 VNNI", check) \
    LATHE_GEMM_ISA_CASE(name, tags, GemmIsa::Amx, "AMX", check)

enum class Fill { Random, AllMax, AllMin, Alternating, SparseExtremes };

std::vector<std::int8_t> codes(std::size_t count, Fill fill, std::mt19937& rng) {
    std::vector<std::int8_t> v(count);
    std::uniform_int_distribution<int> any(-127, 127), coin(0, 9);
    for (std::size_t i = 0; i < count; ++i) {
        switch (fill) {
            case Fill::Random:
                v[i] = static_cast<std::int8_t>(any(rng));
                break;
            case Fill::AllMax:
                v[i] = 127;
                break;
            case Fill::AllMin:
                v[i] = -127;
                break;
            case Fill::Alternating:
                v[i] = (i & 1) ? -127 : 127;
                break;
            case Fill::SparseExtremes:
                v[i] = coin(rng) == 0 ? static_cast<std::int8_t>(coin(rng) < 5 ? 127 : -127) : 0;
                break;
        }
    }
    return v;
}

// a: m x k (stride k), w: n x k (stride k).
std::vector<std::int32_t> reference(const std::vector<std::int8_t>& a, const std::vector<std::int8_t>& w,
                                    std::size_t m, std::size_t n, std::size_t k) {
    std::vector<std::int32_t> c(m * n);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            std::int64_t s = 0;
            for (std::size_t t = 0; t < k; ++t) s += std::int64_t{a[i * k + t]} * w[j * k + t];
            c[i * n + j] = static_cast<std::int32_t>(s);
        }
    return c;
}

// Packs w and lays a out as the GEMM reads it (stride qPaddedK, zero tail), both one byte past an
// aligned address, and returns the GEMM's C.
std::vector<std::int32_t> viaGemm(const std::vector<std::int8_t>& a, const std::vector<std::int8_t>& w,
                                  std::size_t m, std::size_t n, std::size_t k, GemmIsa isa) {
    const std::size_t kp = qPaddedK(k);
    std::vector<std::int8_t> packedBuf(packedWeightBytes(n, k) + 1);
    std::int8_t* packed = packedBuf.data() + 1;
    std::vector<std::int32_t> colSums(qPaddedN(n));
    packWeights(w.data(), n, k, k, packed, colSums.data());
    std::vector<std::int8_t> aBuf(m * kp + 1, 0);
    for (std::size_t i = 0; i < m; ++i) std::memcpy(aBuf.data() + 1 + i * kp, a.data() + i * k, k);
    std::vector<std::int32_t> c(m * n, 0x5a5a5a5a);
    gemmS8S32(aBuf.data() + 1, m, k, packed, colSums.data(), n, c.data(), n, isa);
    return c;
}

void exactOnRandomSizes(GemmIsa isa) {
    std::mt19937 rng(1234);
    std::uniform_int_distribution<std::size_t> dm(1, 70), dn(1, 70), dk(1, 300);
    for (int trial = 0; trial < 60; ++trial) {
        const std::size_t m = dm(rng), n = dn(rng), k = dk(rng);
        const auto a = codes(m * k, Fill::Random, rng), w = codes(n * k, Fill::Random, rng);
        INFO("m=" << m << " n=" << n << " k=" << k);
        REQUIRE(viaGemm(a, w, m, n, k, isa) == reference(a, w, m, n, k));
    }
}
LATHE_EVERY_GEMM_ISA("int8 GEMM equals the integer reference on odd sizes", "[kernels][qgemm]",
                     exactOnRandomSizes)

void exactOnSaturatingCodes(GemmIsa isa) {
    std::mt19937 rng(99);
    const Fill fills[] = {Fill::AllMax, Fill::AllMin, Fill::Alternating, Fill::SparseExtremes, Fill::Random};
    // k = 4100: 127 * 127 * k = 66,131,290 (every pair sum at the 16-bit edge, large int32 sums).
    for (const std::size_t k :
         {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{4100}})
        for (const Fill fa : fills)
            for (const Fill fw : fills) {
                const std::size_t m = 33, n = 35;
                const auto a = codes(m * k, fa, rng), w = codes(n * k, fw, rng);
                INFO("k=" << k << " fills " << static_cast<int>(fa) << "/" << static_cast<int>(fw));
                REQUIRE(viaGemm(a, w, m, n, k, isa) == reference(a, w, m, n, k));
            }
}
LATHE_EVERY_GEMM_ISA("int8 GEMM is exact on saturating and extreme codes", "[kernels][qgemm]",
                     exactOnSaturatingCodes)

struct Layer {
    std::size_t n, k;
    std::vector<std::int8_t> packed;
    std::vector<std::int32_t> colSums;
    std::vector<float> scales, bias;
    QLinear view(bool withBias) const {
        return QLinear{packed.data(), colSums.data(), scales.data(), withBias ? bias.data() : nullptr, n, k};
    }
};

Layer makeLayer(std::size_t n, std::size_t k, std::mt19937& rng) {
    std::normal_distribution<float> g(0.f, 0.05f);
    std::vector<float> w(n * k);
    for (auto& x : w) x = g(rng);
    Layer l{n,
            k,
            std::vector<std::int8_t>(packedWeightBytes(n, k)),
            std::vector<std::int32_t>(qPaddedN(n)),
            std::vector<float>(n),
            std::vector<float>(n)};
    std::vector<std::int8_t> q(n * k);
    quantizeWeights(w.data(), n, k, k, q.data(), l.scales.data());
    packWeights(q.data(), n, k, k, l.packed.data(), l.colSums.data());
    for (auto& b : l.bias) b = g(rng);
    return l;
}

bool sameBits(const std::vector<float>& x, const std::vector<float>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i]) && std::isnan(y[i])) continue;
        if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return false;
    }
    return true;
}

void linearMatchesScalar(GemmIsa isa) {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.f, 1.f);
    for (const auto& [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 10, 64},
                                  {5, 33, 100},
                                  {32, 64, 256},
                                  {37, 130, 513},
                                  {128, 96, 1024}}) {
        const Layer l = makeLayer(n, k, rng);
        std::vector<float> x(m * (k + 3));
        for (auto& v : x) v = g(rng);
        // Special rows: all zeros, one NaN, one inf, denormals only.
        if (m > 4) {
            std::fill(x.begin(), x.begin() + k, 0.f);
            x[(k + 3) + 1] = std::numeric_limits<float>::quiet_NaN();
            x[2 * (k + 3) + 2] = std::numeric_limits<float>::infinity();
            for (std::size_t i = 0; i < k; ++i) x[3 * (k + 3) + i] = 1e-42f * static_cast<float>(i % 7);
        }
        for (const bool relu : {false, true})
            for (const bool bias : {false, true})
                for (const float fixed : {0.f, 0.02f}) {
                    std::vector<float> want(m * n), got(m * n, -1.f);
                    qlinear(x.data(), m, k + 3, l.view(bias), want.data(), n, relu, fixed, GemmIsa::Scalar);
                    qlinear(x.data(), m, k + 3, l.view(bias), got.data(), n, relu, fixed, isa);
                    INFO("m=" << m << " n=" << n << " k=" << k << " relu=" << relu << " bias=" << bias
                              << " fixed=" << fixed);
                    REQUIRE(sameBits(got, want));
                    if (m > 4) {
                        REQUIRE(std::isnan(got[n]));      // the NaN row
                        REQUIRE(std::isnan(got[2 * n]));  // the inf row
                        REQUIRE(got[0] == (bias ? (relu ? std::max(0.f, l.bias[0]) : l.bias[0]) : 0.f));
                    }
                }
    }
}
LATHE_EVERY_GEMM_ISA("int8 linear layer gives the scalar path's bits", "[kernels][qgemm]",
                     linearMatchesScalar)

TEST_CASE("row quantization: SIMD equals the scalar definition, error within half a step",
          "[kernels][qgemm]") {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.f, 3.f);
    const std::size_t m = 9, k = 77, ldq = qPaddedK(k);
    std::vector<float> x(m * k);
    for (auto& v : x) v = g(rng);
    x[3 * k] = 1e-40f;  // row 3: tiny values, 127 / amax overflows
    for (std::size_t i = 1; i < k; ++i) x[3 * k + i] = 0.f;
    x[4 * k + 5] = -std::numeric_limits<float>::infinity();
    x[5 * k + 70] = 0.5f + 127.f;  // a tie region after scaling is exercised by random rows
    for (const float fixed : {0.f, 0.01f, 1e30f}) {
        std::vector<std::int8_t> qs(m * ldq, 1), qv(m * ldq, 2);
        std::vector<float> ss(m), sv(m);
        quantizeRows(x.data(), m, k, k, qs.data(), ldq, ss.data(), fixed, GemmIsa::Scalar);
        quantizeRows(x.data(), m, k, k, qv.data(), ldq, sv.data(), fixed, bestGemmIsa());
        REQUIRE(qs == qv);
        REQUIRE(sameBits(ss, sv));
        for (std::size_t r = 0; r < m; ++r) {
            for (std::size_t i = k; i < ldq; ++i) REQUIRE(qs[r * ldq + i] == 0);  // padding zeroed
            if (r == 4) {
                REQUIRE(std::isnan(ss[r]));
                continue;
            }
            if (fixed == 0.f) {
                for (std::size_t i = 0; i < k; ++i) {
                    const float back = static_cast<float>(qs[r * ldq + i]) * ss[r];
                    REQUIRE(std::fabs(back - x[r * k + i]) <= ss[r] * 0.5001f);
                }
            }
        }
        if (fixed == 0.f) REQUIRE(qs[3 * ldq] == 127);  // the tiny row, coded by division
    }
}

TEST_CASE("the thread pool gives the same results with 1 and many threads, and under concurrent callers",
          "[kernels][qgemm]") {
    std::mt19937 rng(11);
    const std::size_t m = 64, n = 256, k = 512;
    const Layer l = makeLayer(n, k, rng);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<float> x(m * k);
    for (auto& v : x) v = g(rng);
    std::vector<float> one(m * n), many(m * n);
    setThreads(1);
    qlinear(x.data(), m, k, l.view(true), one.data(), n);
    setThreads(4);
    qlinear(x.data(), m, k, l.view(true), many.data(), n);
    REQUIRE(sameBits(one, many));
    std::vector<std::vector<float>> outs(3, std::vector<float>(m * n));
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t)
        callers.emplace_back([&, t] {
            for (int rep = 0; rep < 20; ++rep) qlinear(x.data(), m, k, l.view(true), outs[t].data(), n);
        });
    for (auto& c : callers) c.join();
    for (const auto& o : outs) REQUIRE(sameBits(o, one));
    setThreads(0);
    REQUIRE(threads() >= 1);
}

TEST_CASE("AMX availability follows the CPU and the OS grant", "[kernels][qgemm]") {
    // On a CPU with AMX the dispatcher must have obtained tile state, so the AMX cases above ran.
    if (gemmIsaAvailable(GemmIsa::Amx)) REQUIRE(bestGemmIsa() == GemmIsa::Amx);
    REQUIRE(std::string(gemmIsaName(bestGemmIsa())).size() > 0);
}

TEST_CASE("CUDA int8 GEMM equals the CPU", "[kernels][qgemm][cuda]") {
    if (!cudaCompiled()) LATHE_SKIP("lathe_kernels built without CUDA");
    if (cuda::deviceCount() == 0) LATHE_SKIP("no CUDA device");
    std::mt19937 rng(5);
    const std::size_t m = 37, n = 70, k = 300, kp = qPaddedK(k);
    const auto a = codes(m * k, Fill::Random, rng), w = codes(n * k, Fill::Random, rng);
    std::vector<std::int8_t> packed(packedWeightBytes(n, k));
    std::vector<std::int32_t> colSums(qPaddedN(n));
    packWeights(w.data(), n, k, k, packed.data(), colSums.data());
    std::vector<std::int8_t> aPadded(m * kp, 0);
    for (std::size_t i = 0; i < m; ++i) std::memcpy(aPadded.data() + i * kp, a.data() + i * k, k);
    cuda::DeviceBuffer da(aPadded.size()), dp(packed.size()), dc(m * n * 4);
    cuda::copyHostToDevice(da.get(), aPadded.data(), aPadded.size());
    cuda::copyHostToDevice(dp.get(), packed.data(), packed.size());
    cuda::gemmS8S32(static_cast<std::int8_t*>(da.get()), m, k, static_cast<std::int8_t*>(dp.get()), n,
                    static_cast<std::int32_t*>(dc.get()), n);
    cuda::synchronize(nullptr);
    std::vector<std::int32_t> c(m * n);
    cuda::copyDeviceToHost(c.data(), dc.get(), c.size() * 4);
    REQUIRE(c == reference(a, w, m, n, k));
}

}  // namespace
