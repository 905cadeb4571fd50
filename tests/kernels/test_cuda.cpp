// CUDA scale_and_check against the CPU reference. Needs a GPU; skips with a reason otherwise.

#include <catch2/catch.hpp>

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/scale_and_check.h"
#include "skip.h"
#include "test_inputs.h"

#include <cmath>
#include <limits>
#include <random>

using namespace lathe::kernels;
using namespace lathe::kernels::test;

namespace {

// Returns an empty string when a device can be used, else why not.
std::string whyNoDevice() {
    if (!cudaCompiled()) return "lathe_kernels built without CUDA";
    if (cuda::deviceCount() == 0) return "no CUDA device";
    return {};
}

struct GpuRun {
    std::vector<float> out;
    bool flag;
};

GpuRun runGpu(const std::vector<float>& in, float scale) {
    const std::size_t n = in.size();
    cuda::DeviceBuffer x(n * sizeof(float));
    cuda::DeviceBuffer flag(sizeof(int));
    cuda::deviceMemset(flag.get(), 0, sizeof(int));
    if (n) cuda::copyHostToDevice(x.get(), in.data(), n * sizeof(float));
    cuda::scaleAndCheck(x.as<float>(), n, scale, flag.as<int>());
    cuda::synchronize();
    GpuRun r;
    r.out.resize(n);
    if (n) cuda::copyDeviceToHost(r.out.data(), x.get(), n * sizeof(float));
    int f = 0;
    cuda::copyDeviceToHost(&f, flag.get(), sizeof(int));
    r.flag = f != 0;
    return r;
}

}  // namespace

TEST_CASE("CUDA scale_and_check matches the CPU reference", "[kernels][scale_and_check][cuda]") {
    if (const std::string why = whyNoDevice(); !why.empty()) LATHE_SKIP(why);
    WARN("device 0: " << cuda::deviceDescription(0));
    std::mt19937 rng(99);
    std::vector<std::size_t> lengths = allLengths();
    lengths.push_back(3'000'001);  // more than one full grid: exercises the grid-stride loop
    for (InputKind kind : allKinds())
        for (std::size_t n : lengths)
            for (float scale : allScales()) {
                const std::vector<float> in = makeInput(kind, n, rng);
                std::vector<float> ref = in;
                const bool refFlag = scaleAndCheck(ref.data(), n, scale, CpuIsa::Scalar);
                const GpuRun got = runGpu(in, scale);
                INFO(kindName(kind) << " n=" << n << " scale=" << scale);
                REQUIRE(got.flag == refFlag);
                for (std::size_t i = 0; i < n; ++i) {
                    // GPUs return a canonical NaN rather than propagating the payload, so NaNs
                    // compare as "both NaN"; everything else must match bit for bit.
                    if (std::isnan(ref[i])) {
                        if (!std::isnan(got.out[i])) REQUIRE(std::isnan(got.out[i]));
                    } else if (bitsOf(got.out[i]) != bitsOf(ref[i])) {
                        INFO("element " << i << std::hex << " in=" << bitsOf(in[i])
                                        << " cpu=" << bitsOf(ref[i]) << " gpu=" << bitsOf(got.out[i]));
                        REQUIRE(bitsOf(got.out[i]) == bitsOf(ref[i]));
                    }
                }
            }
}

TEST_CASE("CUDA flag accumulates across buffers and is never cleared", "[kernels][scale_and_check][cuda]") {
    if (const std::string why = whyNoDevice(); !why.empty()) LATHE_SKIP(why);
    std::vector<float> bad(1000, 1.f);
    bad[999] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> good(1000, 1.f);
    cuda::DeviceBuffer a(bad.size() * sizeof(float)), b(good.size() * sizeof(float)), flag(sizeof(int));
    cuda::deviceMemset(flag.get(), 0, sizeof(int));
    cuda::copyHostToDevice(a.get(), bad.data(), bad.size() * sizeof(float));
    cuda::copyHostToDevice(b.get(), good.data(), good.size() * sizeof(float));
    cuda::scaleAndCheck(b.as<float>(), good.size(), 0.5f, flag.as<int>());
    int f = -1;
    cuda::synchronize();
    cuda::copyDeviceToHost(&f, flag.get(), sizeof(int));
    REQUIRE(f == 0);
    cuda::scaleAndCheck(a.as<float>(), bad.size(), 0.5f, flag.as<int>());
    cuda::scaleAndCheck(b.as<float>(), good.size(), 0.5f, flag.as<int>());
    cuda::synchronize();
    cuda::copyDeviceToHost(&f, flag.get(), sizeof(int));
    REQUIRE(f == 1);
    // n == 0 launches nothing and must not touch the pointers.
    REQUIRE_NOTHROW(cuda::scaleAndCheck(nullptr, 0, 1.f, nullptr));
}

TEST_CASE("CUDA entry points report a missing build or device clearly", "[kernels][cuda]") {
    if (cudaCompiled()) {
        if (cuda::deviceCount() == 0) {
            // With no device, allocation must fail with a CudaError, not crash.
            REQUIRE_THROWS_AS(cuda::deviceAlloc(16), cuda::CudaError);
        }
    } else {
        REQUIRE_THROWS_AS(cuda::deviceAlloc(16), cuda::CudaError);
        REQUIRE_THROWS_WITH(cuda::scaleAndCheck(nullptr, 1, 1.f, nullptr), Catch::Contains("without CUDA"));
    }
}
