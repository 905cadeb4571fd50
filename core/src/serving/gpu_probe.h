#pragma once
// GPU utilisation and memory for the server's /metrics, through nvidia-smi (NVML's header is not
// in the toolkit here), read at most every 2 s and only on machines with a CUDA device.
#include <chrono>
#include <mutex>

#include "server_metrics.h"

namespace lathe::core::serving {

struct GpuProbe {
    GpuProbe();
    bool present;
    std::chrono::steady_clock::time_point last{};
    std::mutex mutex;
    /// Sets `m.gpuUtil` and `m.gpuMem` when the last reading is 2 s old or more.
    void refresh(Metrics& m);
};

}  // namespace lathe::core::serving
