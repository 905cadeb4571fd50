// The nvidia-smi probe behind the server's GPU gauges.
#include "gpu_probe.h"

#include <cstdio>

#include "lathe/kernels/info.h"

namespace lathe::core::serving {

GpuProbe::GpuProbe() : present(kernels::cudaDeviceCount() > 0) {}

void GpuProbe::refresh(Metrics& m) {
    if (!present) return;
    std::lock_guard<std::mutex> lk(mutex);
    if (std::chrono::steady_clock::now() - last < std::chrono::seconds(2)) return;
    last = std::chrono::steady_clock::now();
    FILE* p = ::popen(
        "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -i 0 "
        "2>/dev/null",
        "r");
    if (!p) return;
    double util = 0, memMiB = 0;
    if (std::fscanf(p, "%lf, %lf", &util, &memMiB) == 2) {
        m.gpuUtil.Add({}).Set(util);
        m.gpuMem.Add({}).Set(memMiB * 1024 * 1024);
    }
    ::pclose(p);
}

}  // namespace lathe::core::serving
