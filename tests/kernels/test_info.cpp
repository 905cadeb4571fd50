#include <catch2/catch.hpp>

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/info.h"

#include <string>

using namespace lathe::kernels;

TEST_CASE("cpu feature string agrees with the dispatcher", "[kernels][info]") {
    const std::string features = " " + cpuFeatures() + " ";
    INFO("cpuFeatures() = '" << cpuFeatures() << "', best path = " << cpuIsaName(bestCpuIsa()));
    CHECK((features.find(" avx2 ") != std::string::npos) == cpuIsaAvailable(CpuIsa::Avx2));
    CHECK((features.find(" avx512f ") != std::string::npos) == cpuIsaAvailable(CpuIsa::Avx512));
    CHECK(cpuIsaAvailable(CpuIsa::Scalar));
    CHECK(cpuIsaAvailable(bestCpuIsa()));
    CHECK(std::string(cpuIsaName(CpuIsa::Avx2)) == "avx2");
}

TEST_CASE("CUDA availability queries never throw", "[kernels][info]") {
#ifdef LATHE_WITH_CUDA
    CHECK(cudaCompiled());
#else
    CHECK_FALSE(cudaCompiled());
#endif
    int count = -1;
    REQUIRE_NOTHROW(count = cudaDeviceCount());
    CHECK(count >= 0);
    CHECK(count == cuda::deviceCount());
    if (!cudaCompiled()) CHECK(count == 0);
    WARN("CUDA compiled: " << cudaCompiled() << ", devices: " << count);
}
