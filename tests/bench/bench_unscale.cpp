// bench_unscale: the loss scaler's fused unscale-and-check (kernels/scale_and_check, one pass)
// against what LibTorch 1.13 offers on the CPU without a fused kernel (mul_ then a separate
// isfinite().all() pass), side by side on the same gradient buffers.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "lathe/kernels/info.h"
#include "lathe/kernels/scale_and_check.h"

using Clock = std::chrono::steady_clock;

template <typename F>
double medianMs(F&& f, int reps) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char** argv) {
    std::string out;
    for (int i = 1; i + 1 < argc; ++i)
        if (std::string(argv[i]) == "--out") out = argv[i + 1];
    torch::set_num_threads(1);
    std::printf("bench_unscale: CPU paths %s (best: %s), 1 thread\n", lathe::kernels::cpuFeatures().c_str(),
                lathe::kernels::cpuIsaName(lathe::kernels::bestCpuIsa()));
    std::printf("%-10s %14s %14s %14s %9s\n", "floats", "fused (ms)", "scalar (ms)", "torch (ms)",
                "torch/fused");
    std::string json = "[";
    for (int64_t n : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
        auto g = torch::randn({n});
        const int reps = n >= (1 << 24) ? 15 : 101;
        bool sink = false;
        // Scale by 1.0: values stay the same across repetitions, and the work is identical.
        const double fused =
            medianMs([&] { sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, 1.0f); }, reps);
        const double scalar = medianMs(
            [&] {
                sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, 1.0f,
                                                      lathe::kernels::CpuIsa::Scalar);
            },
            reps);
        const double aten = medianMs(
            [&] {
                g.mul_(1.0f);
                sink ^= !torch::isfinite(g).all().item<bool>();
            },
            reps);
        std::printf("%-10lld %14.3f %14.3f %14.3f %8.2fx\n", static_cast<long long>(n), fused, scalar, aten,
                    aten / fused);
        json += std::string(json.size() > 1 ? "," : "") + "{\"floats\":" + std::to_string(n) +
                ",\"fused_ms\":" + std::to_string(fused) + ",\"scalar_ms\":" + std::to_string(scalar) +
                ",\"torch_ms\":" + std::to_string(aten) + "}";
        if (sink) std::printf("(non-finite found)\n");
    }
    json += "]";
    if (!out.empty()) std::ofstream(out + "/bench_unscale.json") << json << "\n";
    return 0;
}
