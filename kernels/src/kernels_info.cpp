// CPU feature detection for the dispatchers and the CUDA availability queries.

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/info.h"

#include <cstdlib>
#include <cstring>

namespace lathe::kernels {

namespace {

// __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV), so a
// "true" here means the instructions are actually usable, not just present.
bool hwAvx2() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

bool hwAvx512() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

CpuIsa detectBest() noexcept {
    CpuIsa best = hwAvx512() ? CpuIsa::Avx512 : hwAvx2() ? CpuIsa::Avx2 : CpuIsa::Scalar;
    if (const char* cap = std::getenv("LATHE_KERNELS_ISA")) {
        CpuIsa wanted = best;
        if (std::strcmp(cap, "scalar") == 0)
            wanted = CpuIsa::Scalar;
        else if (std::strcmp(cap, "avx2") == 0)
            wanted = CpuIsa::Avx2;
        else if (std::strcmp(cap, "avx512") == 0)
            wanted = CpuIsa::Avx512;
        if (static_cast<int>(wanted) < static_cast<int>(best)) best = wanted;
    }
    return best;
}

}  // namespace

const char* cpuIsaName(CpuIsa isa) noexcept {
    switch (isa) {
        case CpuIsa::Scalar:
            return "scalar";
        case CpuIsa::Avx2:
            return "avx2";
        case CpuIsa::Avx512:
            return "avx512";
    }
    return "unknown";
}

bool cpuIsaAvailable(CpuIsa isa) noexcept {
    static const bool avx2 = hwAvx2();
    static const bool avx512 = hwAvx512();
    switch (isa) {
        case CpuIsa::Scalar:
            return true;
        case CpuIsa::Avx2:
            return avx2;
        case CpuIsa::Avx512:
            return avx512;
    }
    return false;
}

CpuIsa bestCpuIsa() noexcept {
    static const CpuIsa best = detectBest();
    return best;
}

std::string cpuFeatures() {
    std::string out;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    auto add = [&out](bool present, const char* name) {
        if (!present) return;
        if (!out.empty()) out += ' ';
        out += name;
    };
    // __builtin_cpu_supports needs string literals, hence no table.
    add(__builtin_cpu_supports("sse4.2"), "sse4.2");
    add(__builtin_cpu_supports("avx"), "avx");
    add(__builtin_cpu_supports("avx2"), "avx2");
    add(__builtin_cpu_supports("fma"), "fma");
    add(__builtin_cpu_supports("f16c"), "f16c");
    add(__builtin_cpu_supports("avx512f"), "avx512f");
    add(__builtin_cpu_supports("avx512bw"), "avx512bw");
    add(__builtin_cpu_supports("avx512vl"), "avx512vl");
    add(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    add(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
#endif
#endif
    return out;
}

bool cudaCompiled() noexcept {
#ifdef LATHE_WITH_CUDA
    return true;
#else
    return false;
#endif
}

int cudaDeviceCount() noexcept { return cuda::deviceCount(); }

}  // namespace lathe::kernels
