// bench_unscale: the loss scaler's fused unscale-and-check (kernels/scale_and_check, one pass
// that scales and flags non-finite values) against what a trainer without a fused kernel really
// does on LibTorch 1.13's CPU ops, side by side on the same gradient buffers:
//
//   mul_                 g.mul_(1/scale); the non-finite check is folded into the gradient norm
//                        the trainer computes anyway (isfinite of one scalar), so the check itself
//                        costs no pass. The baseline.
//   mul_ + sum()         g.mul_(1/scale), then one read-only sum() whose scalar is tested with
//                        isfinite (any inf or NaN makes the sum non-finite): for a trainer that
//                        does not compute the norm.
//   mul_ + isfinite().all()  context only: the naive check, whose bool temporary and reduction
//                        dominate; it flatters the fused kernel.
//   ... + norm           the stage as the trainer runs it: the fused kernel + the gradient norm,
//                        against mul_ + the same norm + isfinite(norm).
//
// Working set and cache state are printed with every row: "warm" times the same buffer again
// and again (after two untimed passes), so buffers that fit in the caches are timed from the
// caches; "cold" cycles over enough copies of the buffer (at least twice the last-level cache
// in all) that each timed pass finds its buffer evicted.
//
//   bench_unscale [--out DIR] [--warm-only]
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "lathe/kernels/info.h"
#include "lathe/kernels/scale_and_check.h"

using Clock = std::chrono::steady_clock;

namespace {

// Median of `reps` timed calls of f(buffer), where call i gets buffer i % count.
template <typename F>
double medianMs(std::vector<torch::Tensor>& bufs, int reps, F&& f) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        auto& g = bufs[static_cast<size_t>(i) % bufs.size()];
        const auto t0 = Clock::now();
        f(g);
        t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// The last-level cache in bytes: glibc's sysconf, else the largest cache sysfs lists for CPU 0;
// 0 when neither says.
long long lastLevelCacheBytes() {
    if (const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) return l3;
    long long best = 0;
    for (int index = 0; index < 8; ++index) {
        std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
        std::string s;
        if (!(f >> s) || s.empty()) continue;
        long long v = std::atoll(s.c_str());
        if (s.back() == 'K') v *= 1024;
        if (s.back() == 'M') v *= 1024 * 1024;
        best = std::max(best, v);
    }
    return best;
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    bool warmOnly = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out = argv[++i];
        else if (a == "--warm-only")
            warmOnly = true;
    }
    torch::set_num_threads(1);
    const long long llcKnown = lastLevelCacheBytes();
    const long long llc = llcKnown > 0 ? llcKnown : 64LL << 20;
    const char* isa = lathe::kernels::cpuIsaName(lathe::kernels::bestCpuIsa());
    std::printf("bench_unscale: CPU paths %s (best: %s), 1 thread; last-level cache %s%s\n",
                lathe::kernels::cpuFeatures().c_str(), isa, mib(static_cast<double>(llc)).c_str(),
                llcKnown > 0 ? "" : " (unknown: assumed)");
    std::printf(
        "  warm: the same buffer timed repeatedly; cold: cycling over copies totalling >= 2x the last-level "
        "cache\n");
    std::printf("  scale 1.0: values stay the same across repetitions; the work is that of any scale\n");
    std::printf("%-9s %11s %5s %4s %9s %9s %9s %9s %9s %9s %9s %8s %8s %8s\n", "floats", "working set",
                "cache", "bufs", "fused ms", "scalar", "mul_", "mul+sum", "naive", "fus+norm", "mul+norm",
                "mul_/fus", "+sum/fus", "stage");
    std::string json = "[";
    bool sink = false;
    double sinkNorm = 0;
    for (int64_t n : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
        const double bytes = 4.0 * static_cast<double>(n);
        for (const bool cold : {false, true}) {
            if (cold && warmOnly) continue;
            const size_t count =
                cold ? std::max<size_t>(
                           2, static_cast<size_t>(std::ceil(2.0 * static_cast<double>(llc) / bytes)))
                     : 1;
            std::vector<torch::Tensor> bufs;
            for (size_t i = 0; i < count; ++i) bufs.push_back(torch::randn({n}));
            // Cold runs visit every buffer the same number of times; at least 15 (101 for small
            // buffers) timed calls.
            const int base = n >= (1 << 24) ? 15 : 101;
            const int reps = static_cast<int>(((std::max<size_t>(base, count) + count - 1) / count) * count);
            // Two untimed passes over every buffer: page faults and first-touch are not timed.
            for (int pass = 0; pass < 2; ++pass)
                for (auto& g : bufs) sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, 1.0f);

            const float inv = 1.0f;
            const double fused = medianMs(bufs, reps, [&](torch::Tensor& g) {
                sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, inv);
            });
            const double scalar = medianMs(bufs, reps, [&](torch::Tensor& g) {
                sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, inv,
                                                      lathe::kernels::CpuIsa::Scalar);
            });
            // The check is the isfinite of the norm the trainer computes next: no pass of its own.
            const double mul = medianMs(bufs, reps, [&](torch::Tensor& g) { g.mul_(inv); });
            const double mulSum = medianMs(bufs, reps, [&](torch::Tensor& g) {
                g.mul_(inv);
                sink ^= !std::isfinite(g.sum().item<float>());
            });
            const double naive = medianMs(bufs, reps, [&](torch::Tensor& g) {
                g.mul_(inv);
                sink ^= !torch::isfinite(g).all().item<bool>();
            });
            const double fusedNorm = medianMs(bufs, reps, [&](torch::Tensor& g) {
                sink ^= lathe::kernels::scaleAndCheck(g.data_ptr<float>(), n, inv);
                sinkNorm += g.norm(2).item<double>();
            });
            const double mulNorm = medianMs(bufs, reps, [&](torch::Tensor& g) {
                g.mul_(inv);
                const double norm = g.norm(2).item<double>();
                sink ^= !std::isfinite(norm);
                sinkNorm += norm;
            });
            std::printf(
                "%-9lld %11s %5s %4zu %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %7.2fx %7.2fx %7.2fx\n",
                static_cast<long long>(n), mib(bytes).c_str(), cold ? "cold" : "warm", count, fused, scalar,
                mul, mulSum, naive, fusedNorm, mulNorm, mul / fused, mulSum / fused, mulNorm / fusedNorm);
            std::fflush(stdout);
            char buf[512];
            std::snprintf(
                buf, sizeof buf,
                "%s{\"floats\":%lld,\"working_set_bytes\":%.0f,\"cache\":\"%s\",\"buffers\":%zu,"
                "\"reps\":%d,\"fused_ms\":%.6f,\"scalar_ms\":%.6f,\"mul_ms\":%.6f,\"mul_sum_ms\":%.6f,"
                "\"naive_isfinite_all_ms\":%.6f,\"fused_norm_ms\":%.6f,\"mul_norm_ms\":%.6f}",
                json.size() > 1 ? "," : "", static_cast<long long>(n), bytes, cold ? "cold" : "warm", count,
                reps, fused, scalar, mul, mulSum, naive, fusedNorm, mulNorm);
            json += buf;
        }
    }
    std::printf(
        "(ms: medians. mul_: g.mul_(1/scale), its check folded into the gradient norm; mul+sum: mul_ then "
        "isfinite(g.sum()); naive: mul_ then isfinite(g).all(), context only; fus+norm / mul+norm: the "
        "stage with the gradient norm the trainer computes either way; stage = mul+norm / fus+norm)\n");
    json += "]";
    if (!std::isfinite(sinkNorm) || sink) std::printf("(non-finite found)\n");
    if (!out.empty()) std::ofstream(out + "/bench_unscale.json") << json << "\n";
    return 0;
}
