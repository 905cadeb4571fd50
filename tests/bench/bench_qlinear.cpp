// bench_qlinear: Lathe's int8 Linear layer (quantize each row + int8 GEMM + dequantize, one
// kernels::qlinear call) against LibTorch's fp32 linear (OpenBLAS) and LibTorch's own dynamically
// quantized linear (quantized::linear_dynamic on every engine this build has: fbgemm, onednn,
// qnnpack), side by side, alternating, on the same input, at batch 1, 32 and 128 of a
// 1024 x 1024 layer (--n/--k change it). Every implementation gets the same number of threads.
// Prints a table with the ratios and writes bench_qlinear.json to --out. It fails only when
// something is broken (our output drifting from fp32 by more than the int8 error), never
// because a ratio is low.
//
//   bench_qlinear [--out DIR] [--reps N] [--n N] [--k K] [--threads T]

#include <torch/torch.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "lathe/kernels/qgemm.h"

using namespace lathe;

namespace {

double medianMs(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double timeMs(const std::function<void()>& f, int inner) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / inner;
}

c10::IValue callOp(const char* name, std::vector<c10::IValue> stack) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    op.callBoxed(&stack);
    return stack.at(0);
}

std::string engineName(at::QEngine e) {
    switch (e) {
        case at::QEngine::FBGEMM:
            return "fbgemm";
        case at::QEngine::QNNPACK:
            return "qnnpack";
#if TORCH_VERSION_MAJOR > 1 || TORCH_VERSION_MINOR >= 12
        case at::QEngine::ONEDNN:
            return "onednn";
#endif
        default:
            return "other";
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    int reps = 15;
    int64_t n = 1024, k = 1024;
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--out")
            out = next();
        else if (a == "--reps")
            reps = std::max(3, std::atoi(next().c_str()));
        else if (a == "--n")
            n = std::atoll(next().c_str());
        else if (a == "--k")
            k = std::atoll(next().c_str());
        else if (a == "--threads")
            threads = std::max(1, std::atoi(next().c_str()));
        else {
            std::fprintf(stderr,
                         "usage: bench_qlinear [--out DIR] [--reps N] [--n N] [--k K] [--threads T]\n");
            return 2;
        }
    }
    torch::manual_seed(0);
    torch::set_num_threads(threads);
    kernels::setThreads(threads);
    torch::NoGradGuard noGrad;
    const auto w = torch::randn({n, k}) * 0.03;
    const auto b = torch::randn({n}) * 0.1;

    // Ours: per-channel int8 weights, packed once.
    std::vector<std::int8_t> q(static_cast<size_t>(n * k)), packed(kernels::packedWeightBytes(n, k));
    std::vector<std::int32_t> colSums(kernels::qPaddedN(n));
    std::vector<float> scales(static_cast<size_t>(n));
    kernels::quantizeWeights(w.data_ptr<float>(), n, k, k, q.data(), scales.data());
    kernels::packWeights(q.data(), n, k, k, packed.data(), colSums.data());
    const kernels::QLinear layer{packed.data(),       colSums.data(),         scales.data(),
                                 b.data_ptr<float>(), static_cast<size_t>(n), static_cast<size_t>(k)};

    // LibTorch's engines: prepacked per-channel qint8 weights (per-tensor where an engine lacks it).
    struct Engine {
        std::string name;
        at::QEngine engine;
        c10::IValue packed;
    };
    std::vector<Engine> engines;
    for (const auto e : at::globalContext().supportedQEngines()) {
        if (e == at::QEngine::NoQEngine) continue;
        at::globalContext().setQEngine(e);
        try {
            const auto amax = std::get<0>(w.abs().max(1));
            const auto wscales = (amax / 127).to(torch::kDouble);
            at::Tensor wq =
                e == at::QEngine::QNNPACK
                    ? at::quantize_per_tensor(w, w.abs().max().item<double>() / 127, 0, torch::kQInt8)
                    : at::quantize_per_channel(w, wscales, torch::zeros({n}, torch::kLong), 0, torch::kQInt8);
            engines.push_back(
                {engineName(e), e, callOp("quantized::linear_prepack", {wq, c10::optional<at::Tensor>(b)})});
        } catch (const std::exception& ex) {
            std::printf("LibTorch engine %s unusable here: %.120s\n", engineName(e).c_str(), ex.what());
        }
    }

    std::printf("Linear %lld x %lld, %d threads each; ours: %s; reps %d (median)\n", (long long)n,
                (long long)k, threads, kernels::gemmIsaName(kernels::bestGemmIsa()), reps);
    std::printf("%6s %12s %12s", "batch", "fp32 ms", "ours ms");
    for (const auto& e : engines) std::printf(" %12s", (e.name + " ms").c_str());
    std::printf(" %10s %14s %9s\n", "fp32/ours", "best int8/ours", "max err");
    std::string json = "{\"bench\":\"qlinear\",\"n\":" + std::to_string(n) + ",\"k\":" + std::to_string(k) +
                       ",\"threads\":" + std::to_string(threads) + ",\"isa\":\"" +
                       kernels::gemmIsaName(kernels::bestGemmIsa()) + "\",\"rows\":[";
    bool ok = true;
    for (const int64_t batch : {1, 32, 128}) {
        const auto x = torch::randn({batch, k});
        auto y = torch::empty({batch, n});
        const int inner = batch == 1 ? 200 : batch == 32 ? 20 : 5;
        std::vector<double> fp32, ours;
        std::vector<std::vector<double>> theirs(engines.size());
        for (int r = 0; r < reps; ++r) {
            fp32.push_back(timeMs([&] { torch::linear(x, w, b); }, inner));
            ours.push_back(timeMs(
                [&] { kernels::qlinear(x.data_ptr<float>(), batch, k, layer, y.data_ptr<float>(), n); },
                inner));
            for (size_t e = 0; e < engines.size(); ++e) {
                at::globalContext().setQEngine(engines[e].engine);
                theirs[e].push_back(timeMs(
                    [&] {
                        callOp("quantized::linear_dynamic", {x, engines[e].packed, false});
                    },
                    inner));
            }
        }
        // Correctness: int8 error against fp32, relative to the output's scale.
        const auto ref = torch::linear(x, w, b);
        const double err = ((y - ref).abs().max() / ref.abs().max()).item<double>();
        if (!(err < 0.05)) ok = false;
        const double f = medianMs(fp32), o = medianMs(ours);
        double best = 0;
        std::string bestName;
        std::printf("%6lld %12.4f %12.4f", (long long)batch, f, o);
        std::string engJson;
        for (size_t e = 0; e < engines.size(); ++e) {
            const double t = medianMs(theirs[e]);
            std::printf(" %12.4f", t);
            if (best == 0 || t < best) best = t, bestName = engines[e].name;
            engJson += std::string(e ? "," : "") + "\"" + engines[e].name + "\":" + std::to_string(t);
        }
        std::printf(" %9.2fx %13.2fx %9.4f\n", f / o, best > 0 ? best / o : 0.0, err);
        json += std::string(batch == 1 ? "" : ",") + "{\"batch\":" + std::to_string(batch) +
                ",\"fp32_ms\":" + std::to_string(f) + ",\"ours_ms\":" + std::to_string(o) +
                ",\"libtorch_int8_ms\":{" + engJson + "},\"fp32_over_ours\":" + std::to_string(f / o) +
                ",\"best_int8_engine\":\"" + bestName +
                "\",\"best_int8_over_ours\":" + std::to_string(best > 0 ? best / o : 0.0) +
                ",\"max_rel_error\":" + std::to_string(err) + "}";
    }
    json += "]}";
    std::printf("ratios above 1 mean ours is faster\n");
    if (!out.empty()) std::ofstream(out + "/bench_qlinear.json") << json << "\n";
    if (!ok) {
        std::fprintf(stderr, "int8 output drifted from fp32 by more than 5%% of its range: broken\n");
        return 1;
    }
    return 0;
}
