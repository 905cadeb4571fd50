// CPU scale_and_check: the scalar reference against an independent expectation, and every
// SIMD path against the scalar reference bit for bit (NaN payloads included).

#include <catch2/catch.hpp>

#include "isa_test_cases.h"
#include "lathe/kernels/scale_and_check.h"
#include "skip.h"
#include "test_inputs.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

using namespace lathe::kernels;
using namespace lathe::kernels::test;

namespace {

constexpr std::size_t kGuard = 32;                // sentinel floats on each side of the buffer
constexpr std::uint32_t kSentinel = 0x7fbadbadu;  // a signalling-NaN pattern nobody produces

struct Run {
    std::vector<float> out;
    bool flag;
    bool guardsIntact;
};

// Runs one path on a copy of `in` placed `offset` floats into a guarded buffer, so unaligned
// starts are exercised and any write outside [0, n) is caught.
Run runPath(const std::vector<float>& in, float scale, CpuIsa isa, std::size_t offset) {
    std::vector<float> buf(kGuard + offset + in.size() + kGuard, fromBits(kSentinel));
    float* x = buf.data() + kGuard + offset;
    std::copy(in.begin(), in.end(), x);
    Run r;
    r.flag = scaleAndCheck(x, in.size(), scale, isa);
    r.out.assign(x, x + in.size());
    r.guardsIntact = true;
    for (std::size_t i = 0; i < buf.size(); ++i) {
        const bool inside = i >= kGuard + offset && i < kGuard + offset + in.size();
        if (!inside && bitsOf(buf[i]) != kSentinel) r.guardsIntact = false;
    }
    return r;
}

std::string describe(InputKind kind, std::size_t n, float scale, std::size_t offset) {
    std::ostringstream os;
    os << kindName(kind) << " n=" << n << " scale=" << scale << " offset=" << offset;
    return os.str();
}

void compareWithScalar(CpuIsa isa) {
    std::mt19937 rng(1234);
    std::size_t cases = 0;
    for (InputKind kind : allKinds())
        for (std::size_t n : allLengths())
            for (float scale : allScales())
                for (std::size_t offset : {0, 1, 3}) {
                    const std::vector<float> in = makeInput(kind, n, rng);
                    const Run ref = runPath(in, scale, CpuIsa::Scalar, offset);
                    const Run got = runPath(in, scale, isa, offset);
                    INFO(cpuIsaName(isa) << ": " << describe(kind, n, scale, offset));
                    REQUIRE(got.guardsIntact);
                    REQUIRE(got.flag == ref.flag);
                    for (std::size_t i = 0; i < n; ++i) {
                        if (bitsOf(got.out[i]) != bitsOf(ref.out[i])) {
                            INFO("element " << i << ": in=" << std::hex << bitsOf(in[i]) << " ref="
                                            << bitsOf(ref.out[i]) << " got=" << bitsOf(got.out[i]));
                            REQUIRE(bitsOf(got.out[i]) == bitsOf(ref.out[i]));
                        }
                    }
                    ++cases;
                }
    CHECK(cases > 0);
}

}  // namespace

TEST_CASE("scalar reference scales every element and flags non-finite values", "[kernels][scale_and_check]") {
    std::mt19937 rng(42);
    for (InputKind kind : allKinds())
        for (std::size_t n : allLengths())
            for (float scale : allScales()) {
                const std::vector<float> in = makeInput(kind, n, rng);
                const Run r = runPath(in, scale, CpuIsa::Scalar, 1);
                INFO(describe(kind, n, scale, 1));
                REQUIRE(r.guardsIntact);
                REQUIRE(r.flag == expectedFlag(in, scale));
                for (std::size_t i = 0; i < n; ++i) {
                    const float want = in[i] * scale;
                    if (std::isnan(want))
                        REQUIRE(std::isnan(r.out[i]));
                    else
                        REQUIRE(bitsOf(r.out[i]) == bitsOf(want));
                }
            }
}

namespace {

void checkSingleBadValue(CpuIsa isa) {
    const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(), fromBits(0xffc00001u)};
    for (std::size_t n : allLengths()) {
        if (n == 0) continue;
        std::vector<float> clean(n, 1.5f);
        INFO(cpuIsaName(isa) << " n=" << n);
        REQUIRE_FALSE(runPath(clean, 0.5f, isa, 0).flag);
        for (std::size_t pos : {std::size_t{0}, n / 2, n - 1})
            for (float b : bad) {
                std::vector<float> in = clean;
                in[pos] = b;
                INFO("pos=" << pos << " bad=" << std::hex << bitsOf(b));
                REQUIRE(runPath(in, 0.5f, isa, 0).flag);
            }
    }
}

void checkScalingOverflow(CpuIsa isa) {
    std::vector<float> in(37, 1.0f);
    in[35] = std::numeric_limits<float>::max();  // finite in, inf out
    INFO(cpuIsaName(isa));
    const Run r = runPath(in, 2.0f, isa, 0);
    REQUIRE(r.flag);
    REQUIRE(std::isinf(r.out[35]));
    REQUIRE(r.out[0] == 2.0f);
    // A NaN scale poisons everything, even zeros.
    REQUIRE(runPath(std::vector<float>(9, 0.f), std::numeric_limits<float>::quiet_NaN(), isa, 0).flag);
    // 0 * inf = NaN
    REQUIRE(runPath(std::vector<float>(9, 0.f), std::numeric_limits<float>::infinity(), isa, 0).flag);
}

}  // namespace

// One test case per instruction set (isa_test_cases.h): a CPU without one reports it skipped.
LATHE_EVERY_ISA_TEST_CASES("flag reports a single bad value at any position, including SIMD tails",
                           "[kernels][scale_and_check]", checkSingleBadValue)

LATHE_EVERY_ISA_TEST_CASES("overflow caused by scaling is flagged", "[kernels][scale_and_check]",
                           checkScalingOverflow)

TEST_CASE("empty buffer: no flag and no access", "[kernels][scale_and_check]") {
    for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
        REQUIRE_FALSE(scaleAndCheck(nullptr, 0, std::numeric_limits<float>::quiet_NaN(), isa));
    REQUIRE_FALSE(scaleAndCheck(nullptr, 0, 1.0f));
}

TEST_CASE("AVX2 path is bit-identical to the scalar reference", "[kernels][scale_and_check][simd]") {
    if (!cpuIsaAvailable(CpuIsa::Avx2)) LATHE_SKIP("this CPU has no AVX2");
    compareWithScalar(CpuIsa::Avx2);
}

TEST_CASE("AVX-512 path is bit-identical to the scalar reference", "[kernels][scale_and_check][simd]") {
    if (!cpuIsaAvailable(CpuIsa::Avx512)) LATHE_SKIP("this CPU has no AVX-512F");
    compareWithScalar(CpuIsa::Avx512);
}

TEST_CASE("dispatching entry point matches the scalar reference", "[kernels][scale_and_check]") {
    std::mt19937 rng(7);
    for (std::size_t n : allLengths()) {
        const std::vector<float> in = makeInput(InputKind::AnyBits, n, rng);
        std::vector<float> a = in, b = in;
        const bool fa = scaleAndCheck(a.data(), n, 0.25f);
        const bool fb = scaleAndCheck(b.data(), n, 0.25f, CpuIsa::Scalar);
        INFO("n=" << n << " best=" << cpuIsaName(bestCpuIsa()));
        REQUIRE(fa == fb);
        for (std::size_t i = 0; i < n; ++i) REQUIRE(bitsOf(a[i]) == bitsOf(b[i]));
    }
}

TEST_CASE("requesting an unavailable path falls back to scalar", "[kernels][scale_and_check]") {
    // Whatever this CPU lacks, the call must still be correct (no SIGILL).
    std::vector<float> in{1.f, 2.f, std::numeric_limits<float>::infinity()};
    for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}) {
        std::vector<float> x = in;
        REQUIRE(scaleAndCheck(x.data(), x.size(), 0.5f, isa));
        REQUIRE(x[0] == 0.5f);
        REQUIRE(x[1] == 1.0f);
    }
}
