// bench_optim: the fused optimizer steps (training/fused_optim.h on kernels/optim.h) against
// LibTorch's torch::optim step on the same parameters and gradients, side by side in one process
// with the same intra-op threads, for SGD with momentum, Adam and AdamW at three sizes:
//
//   26k   the digits MLP 64-128-128-10 (26,506 parameters in 6 tensors)
//   2M    an MLP 784-1024-1024-10 plus a 1024-wide layer (2.4M parameters in 8 tensors)
//   100M  four 25M-parameter tensors (a large model's step: memory-bound)
//
// Each pair of steps (LibTorch's, then the fused one, alternating which goes first) runs on
// its own copies of identical state; the median over the repeats is reported, and the ratio.
// For the memory-bound size the fused step's time is also set against this machine's memory
// bandwidth, measured in the same process by memcpy of 400 MB (bytes read plus bytes written):
// Adam reads four arrays and writes three (28 bytes per parameter), SGD with momentum reads
// three and writes two (20 bytes). "x bandwidth" = time / (bytes / copy bandwidth).
// The process keeps its heap as a training process does (core::keepHeapForTraining()), which
// spares both sides the page faults of LibTorch's per-op temporaries.
//
//   bench_optim [--out DIR] [--quick] [--threads N]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/trainer.h"
#include "lathe/kernels/info.h"
#include "training/fused_optim.h"

using Clock = std::chrono::steady_clock;
using lathe::core::FusedAdam;
using lathe::core::FusedAdamW;
using lathe::core::FusedSGD;

namespace {

double msSince(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

std::vector<torch::Tensor> makeParams(const std::vector<std::vector<int64_t>>& shapes) {
    torch::manual_seed(1);
    std::vector<torch::Tensor> ps;
    for (const auto& s : shapes) {
        auto p = torch::randn(s).requires_grad_(true);
        p.mutable_grad() = torch::randn(s) * 1e-2;
        ps.push_back(p);
    }
    return ps;
}

std::vector<torch::Tensor> copyParams(const std::vector<torch::Tensor>& ps) {
    std::vector<torch::Tensor> out;
    for (const auto& p : ps) {
        auto q = p.detach().clone().requires_grad_(true);
        q.mutable_grad() = p.grad().clone();
        out.push_back(q);
    }
    return out;
}

std::unique_ptr<torch::optim::Optimizer> make(const std::string& kind, std::vector<torch::Tensor> ps,
                                              bool fused) {
    if (kind == "sgd") {
        auto o = torch::optim::SGDOptions(0.01).momentum(0.9);
        if (fused) return std::make_unique<FusedSGD>(ps, o);
        return std::make_unique<torch::optim::SGD>(ps, o);
    }
    if (kind == "adam") {
        auto o = torch::optim::AdamOptions(1e-3);
        if (fused) return std::make_unique<FusedAdam>(ps, o);
        return std::make_unique<torch::optim::Adam>(ps, o);
    }
    auto o = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
    if (fused) return std::make_unique<FusedAdamW>(ps, o);
    return std::make_unique<torch::optim::AdamW>(ps, o);
}

// GB/s of memcpy over `bytes`-byte buffers, counting what it reads and what it writes; best of
// `reps` (glibc's memcpy is the machine's fastest one-thread copy: wide loads and stores).
double copyGBs(size_t bytes, int reps) {
    std::vector<char> a(bytes, 1), b(bytes, 2);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        std::memcpy(a.data(), b.data(), bytes);
        best = std::min(best, msSince(t0));
    }
    volatile char sink = a[bytes / 2];
    (void)sink;
    return 2.0 * static_cast<double>(bytes) / (best * 1e6);
}

struct Row {
    std::string size, kind;
    int64_t params = 0;
    double torchMs = 0, fusedMs = 0, ratio = 0, bandwidthMultiple = -1;
};

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    bool quick = false;
    int threads = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out = argv[++i];
        else if (a == "--quick")
            quick = true;
        else if (a == "--threads" && i + 1 < argc)
            threads = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_optim [--out DIR] [--quick] [--threads N]\n");
            return 2;
        }
    }
    torch::set_num_threads(threads);
    lathe::core::keepHeapForTraining();
    torch::NoGradGuard noGrad;
    std::printf(
        "bench_optim: fused optimizer steps vs torch::optim (LibTorch %s), %d intra-op thread(s), kernels "
        "%s%s\n",
        TORCH_VERSION, threads, lathe::kernels::cpuIsaName(lathe::kernels::bestCpuIsa()),
        quick ? ", quick" : "");

    struct Size {
        const char* name;
        std::vector<std::vector<int64_t>> shapes;
        int reps;
    };
    std::vector<Size> sizes{
        {"26k", {{128, 64}, {128}, {128, 128}, {128}, {10, 128}, {10}}, quick ? 300 : 2000},
        {"2M",
         {{1024, 784}, {1024}, {1024, 1024}, {1024}, {1024, 1024}, {1024}, {10, 1024}, {10}},
         quick ? 15 : 60},
        {"100M", {{25000000}, {25000000}, {25000000}, {25000000}}, quick ? 3 : 7},
    };
    const double gbs = copyGBs(size_t{400} << 20, quick ? 3 : 5);
    std::printf("memory bandwidth (memcpy of 400 MB, 1 thread, read + written bytes): %.1f GB/s\n\n", gbs);
    std::printf("%-6s %-6s %12s %14s %12s %9s %14s\n", "size", "optim", "parameters", "torch::optim ms",
                "fused ms", "ratio", "x bandwidth");
    std::vector<Row> rows;
    for (const auto& size : sizes) {
        for (const std::string kind : {"sgd", "adam", "adamw"}) {
            if (size.name == std::string("100M") && kind == "adamw")
                continue;  // Adam's traffic, once is enough
            auto pa = makeParams(size.shapes);
            auto pb = copyParams(pa);
            auto ref = make(kind, pa, false);
            auto fus = make(kind, pb, true);
            // One untimed step each: state allocation is not what is measured.
            ref->step();
            fus->step();
            std::vector<double> tr, tf;
            for (int r = 0; r < size.reps; ++r) {
                for (int side = 0; side < 2; ++side) {
                    const bool fusedNow = (side == 0) == (r % 2 == 1);
                    const auto t0 = Clock::now();
                    (fusedNow ? fus : ref)->step();
                    (fusedNow ? tf : tr).push_back(msSince(t0));
                }
            }
            if (!dynamic_cast<lathe::core::FusedStep&>(*fus).lastStepFused()) {
                std::fprintf(stderr, "bench_optim: the fused %s step fell back to LibTorch's\n",
                             kind.c_str());
                return 1;
            }
            Row row;
            row.size = size.name;
            row.kind = kind;
            for (const auto& p : pa) row.params += p.numel();
            row.torchMs = median(tr);
            row.fusedMs = median(tf);
            row.ratio = row.torchMs / row.fusedMs;
            if (row.size == "100M") {
                const double bytes = static_cast<double>(row.params) * (kind == "sgd" ? 20.0 : 28.0);
                row.bandwidthMultiple = row.fusedMs / (bytes / (gbs * 1e6));
            }
            rows.push_back(row);
            char bw[32] = "";
            if (row.bandwidthMultiple > 0) std::snprintf(bw, sizeof bw, "%.2fx", row.bandwidthMultiple);
            std::printf("%-6s %-6s %12lld %14.4f %12.4f %8.2fx %14s\n", row.size.c_str(), kind.c_str(),
                        static_cast<long long>(row.params), row.torchMs, row.fusedMs, row.ratio, bw);
            std::fflush(stdout);
        }
    }
    std::printf(
        "\nratio = torch::optim time / fused time (higher is better); x bandwidth = fused time / the time "
        "the "
        "step's bytes take at memcpy's bandwidth (1.00x = at memory speed)\n");
    if (!out.empty()) {
        std::ofstream f(out + "/bench_optim.json");
        f << "{\"name\":\"bench_optim\",\"threads\":" << threads
          << ",\"quick\":" << (quick ? "true" : "false") << ",\"copy_gb_s\":" << gbs << ",\"isa\":\""
          << lathe::kernels::cpuIsaName(lathe::kernels::bestCpuIsa()) << "\",\"results\":[";
        for (size_t i = 0; i < rows.size(); ++i) {
            const auto& r = rows[i];
            f << (i ? "," : "") << "{\"size\":\"" << r.size << "\",\"optimizer\":\"" << r.kind
              << "\",\"parameters\":" << r.params << ",\"torch_ms\":" << r.torchMs
              << ",\"fused_ms\":" << r.fusedMs << ",\"ratio\":" << r.ratio;
            if (r.bandwidthMultiple > 0) f << ",\"bandwidth_multiple\":" << r.bandwidthMultiple;
            f << "}";
        }
        f << "]}\n";
        std::printf("results: %s/bench_optim.json\n", out.c_str());
    }
    return 0;
}
