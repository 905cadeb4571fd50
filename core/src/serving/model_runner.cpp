#include "model_runner.h"

#include <torch/csrc/jit/passes/fuse_linear.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "artifact_io.h"
#include "lathe/core/error.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/sha256.h"
#include "torch_backend.h"

namespace lathe::core {

torch::jit::Module optimizedForInference(const torch::jit::Module& module) {
    // On a deep copy, so the module as loaded stays exactly as it was. Submodules' methods are
    // inlined first, so that addmm(b, x, W.t()) anywhere (Lathe's exports, nn.Linear written by
    // hand) becomes aten::linear, the form the inference rewrites recognise, before freezing folds
    // W.t() into a constant the pattern would no longer match.
    auto copy = module.clone();
    auto graph = copy.get_method("forward").graph();
    torch::jit::Inline(*graph);
    torch::jit::FuseLinear(graph);
    auto frozen = torch::jit::freeze(copy);
    return torch::jit::optimize_for_inference(frozen);
}

}  // namespace lathe::core

namespace lathe::core::serving {

std::shared_ptr<LoadedModel> loadTorchModel(const ServedModel& model, int64_t maxBatch,
                                            const std::string& device, const std::string& expectedSha256,
                                            int instances, const std::string& optimize);

// The TorchScript side of a LoadedModel: the module and its per-instance batch buffers.
class TorchModel final : public LoadedModel {
public:
    torch::jit::Module module;
    torch::Device device = torch::kCPU;
    std::vector<torch::Tensor> inputs;  // per instance: [maxBatch, sample...], allocated once
    // runRows[b]: the rows a batch of b rows is computed as (>= b; zero rows fill the rest), where
    // the forward is measurably faster at that size (empty: every batch at its own size).
    std::vector<int64_t> runRows;

    float* inputBuffer(int instance) override {
        return inputs.at(static_cast<size_t>(instance)).data_ptr<float>();
    }
    void run(int instance, int64_t rows, float* out) override;

    friend std::shared_ptr<LoadedModel> loadTorchModel(const ServedModel&, int64_t, const std::string&,
                                                       const std::string&, int, const std::string&);
};

namespace {

// Median wall time of `runs` forwards of `x` after two warm-ups, in milliseconds.
double forwardMs(torch::jit::Module& module, const torch::Tensor& x, int runs) {
    c10::InferenceMode guard;
    for (int i = 0; i < 2; ++i) module.forward({x});
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        module.forward({x});
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

std::string fmtMs(double ms) {
    char buf[32];
    if (ms < 0.1)
        std::snprintf(buf, sizeof buf, "%.1f us", ms * 1000);
    else
        std::snprintf(buf, sizeof buf, "%.2f ms", ms);
    return buf;
}

// Whether two outputs agree: the same shape, non-finite values in the same places, and the
// finite ones within 1e-4 (1 + max |want|). Otherwise `why` says how they differ.
bool agree(const torch::Tensor& want, const torch::Tensor& got, std::string& why) {
    if (want.sizes() != got.sizes()) {
        why = "the optimized graph's output has another shape";
        return false;
    }
    const auto finite = torch::isfinite(want);
    if (!torch::equal(finite, torch::isfinite(got)) || !torch::equal(torch::isnan(want), torch::isnan(got)) ||
        !torch::equal(want.masked_select(torch::isinf(want)), got.masked_select(torch::isinf(got)))) {
        why = "the optimized graph's output has non-finite values where the model's has none, or the reverse";
        return false;
    }
    if (finite.sum().item<int64_t>() == 0) return true;
    const auto w = want.masked_select(finite), g = got.masked_select(finite);
    const double diff = (w - g).abs().max().item<double>();
    if (diff <= 1e-4 * (1.0 + w.abs().max().item<double>())) return true;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", diff);
    why = "the optimized graph's outputs differ from the model's by " + std::string(buf);
    return false;
}

// Builds the optimized copy of `module`, checks it on `x` (max-batch rows), times both at
// max-batch and at one row, then decides (see LoadedModel::load). Returns the module to serve
// and says why in `note`. Under "auto" nothing the copy does can fail the load.
torch::jit::Module maybeOptimize(torch::jit::Module module, const std::string& mode, const torch::Tensor& x,
                                 const std::string& name, std::string& note) {
    const auto fail = [&](const std::string& why) {
        if (mode == "on") throw Error("model " + name + ": --optimize on, but " + why);
        note = "kept as loaded: " + why;
        return module;
    };
    const auto firstLine = [](const std::exception& ex) {
        std::string msg = ex.what();
        return msg.substr(0, msg.find('\n'));
    };
    torch::jit::Module optimized;
    try {
        optimized = optimizedForInference(module);
    } catch (const std::exception& ex) {
        return fail("TorchScript could not optimize it (" + firstLine(ex) + ")");
    }
    torch::Tensor want;
    {
        c10::InferenceMode guard;
        want =
            module.forward({x}).toTensor().to(torch::kFloat);  // the model itself: its errors are the load's
    }
    const auto one = x.narrow(0, 0, 1);
    torch::Tensor got;
    try {
        c10::InferenceMode guard;
        got = optimized.forward({x}).toTensor().to(torch::kFloat);
    } catch (const std::exception& ex) {
        return fail("the optimized graph failed to run (" + firstLine(ex) + ")");
    }
    if (std::string why; !agree(want, got, why)) return fail(why);
    double plain = 1e30, fast = 1e30, plain1 = 1e30, fast1 = 1e30;
    try {
        // Alternated in short rounds and the best of each side kept, so a noisy moment on a shared
        // machine does not decide for one side (two rounds of five were seen to pick the slower
        // graph: 4.89 vs 3.38 ms, where a quiet run measures 2.0 vs 2.7 ms); at max-batch, where a
        // loaded server spends its time, and at one row, where a quiet one does.
        for (int round = 0; round < 6; ++round) {
            plain = std::min(plain, forwardMs(module, x, 3));
            fast = std::min(fast, forwardMs(optimized, x, 3));
            plain1 = std::min(plain1, forwardMs(module, one, 3));
            fast1 = std::min(fast1, forwardMs(optimized, one, 3));
        }
    } catch (const std::exception& ex) {
        return fail("the optimized graph failed to run (" + firstLine(ex) + ")");
    }
    const std::string timing = fmtMs(fast) + " vs " + fmtMs(plain) + " per " + std::to_string(x.size(0)) +
                               "-row batch, " + fmtMs(fast1) + " vs " + fmtMs(plain1) + " per row";
    // auto: >= 5% faster at max-batch and no more than 5% slower on one row.
    if (mode == "on" || (fast < 0.95 * plain && fast1 < 1.05 * plain1)) {
        note = "optimized for inference: " + timing;
        return optimized;
    }
    note = "kept as loaded: the optimized graph is not faster (" + timing + ")";
    return module;
}

// Batch sizes the forward runs faster at than smaller ones: OpenBLAS's SGEMM is far from linear
// in the row count (the 1024-wide MLP's optimised graph on one core of the development machine:
// 28 rows 2.37 ms, 32 rows 1.24 ms; 12 rows 1.85 ms, 16 rows 0.76 ms). Times every batch size
// from 1 to max-batch (best of two rounds of three) and pads a batch of b rows to the size
// p >= b with the least time when that is at least 15% less than b's own; rows are independent
// in any model that can be batched at all, so the padded rows change nothing but the time.
// Skipped when max-batch is above 64 or the timing would take more than ~2 s. Returns
// runRows (empty: no padding) and says what it chose in `note`.
std::vector<int64_t> planPadding(torch::jit::Module& module, const torch::Tensor& probe, std::string& note) {
    const int64_t maxBatch = probe.size(0);
    if (maxBatch < 2 || maxBatch > 64) return {};
    const double full = forwardMs(module, probe, 3);
    if (full * static_cast<double>(maxBatch) * 5 > 2000) return {};  // ~10 forwards of every size
    std::vector<double> ms(static_cast<size_t>(maxBatch + 1), 1e30);
    for (int round = 0; round < 2; ++round)
        for (int64_t b = 1; b <= maxBatch; ++b)
            ms[static_cast<size_t>(b)] =
                std::min(ms[static_cast<size_t>(b)], forwardMs(module, probe.narrow(0, 0, b), 3));
    return choosePadding(ms, note);
}

}  // namespace

std::vector<int64_t> choosePadding(const std::vector<double>& ms, std::string& note) {
    const auto maxBatch = static_cast<int64_t>(ms.size()) - 1;
    if (maxBatch < 2) return {};
    auto t = [&](int64_t b) { return ms[static_cast<size_t>(b)]; };
    std::vector<int64_t> runRows(static_cast<size_t>(maxBatch + 1));
    int64_t best = maxBatch;  // the fastest size >= b, from the top down
    bool any = false;
    for (int64_t b = maxBatch; b >= 1; --b) {
        if (t(b) <= t(best)) best = b;
        const bool pad = best != b && t(best) < 0.85 * t(b);
        runRows[static_cast<size_t>(b)] = pad ? best : b;
        any |= pad;
    }
    if (!any) return {};
    // "9-11 rows -> 12, 15 -> 16 (11 rows: 1.52 ms, 12: 0.85 ms)": ranges of sizes padded to one,
    // and the size that gains most.
    std::string ranges;
    int64_t example = 0;
    auto gain = [&](int64_t b) { return t(b) / t(runRows[static_cast<size_t>(b)]); };
    for (int64_t b = 1; b <= maxBatch;) {
        const int64_t to = runRows[static_cast<size_t>(b)];
        int64_t e = b;
        while (e + 1 <= maxBatch && runRows[static_cast<size_t>(e + 1)] == to && to != e + 1) ++e;
        if (to != b) {
            ranges += (ranges.empty() ? "" : ", ") + std::to_string(b) +
                      (e > b ? "-" + std::to_string(e) : "") + (ranges.empty() ? " rows -> " : " -> ") +
                      std::to_string(to);
            for (int64_t i = b; i <= e; ++i)
                if (example == 0 || gain(i) > gain(example)) example = i;
        }
        b = e + 1;
    }
    const int64_t to = runRows[static_cast<size_t>(example)];
    note = "pads batches to sizes that run faster: " + ranges + " (" + std::to_string(example) +
           " rows: " + fmtMs(t(example)) + ", " + std::to_string(to) + ": " + fmtMs(t(to)) + ")";
    return runRows;
}

std::shared_ptr<LoadedModel> loadTorchModel(const ServedModel& model, int64_t maxBatch,
                                            const std::string& device, const std::string& expectedSha256,
                                            int instances, const std::string& optimize) {
    if (instances < 1) throw ConfigError("--instances must be at least 1");
    if (!expectedSha256.empty()) {
        const auto sha = sha256File(model.path);
        if (sha != expectedSha256)
            throw Error("model artifact " + model.path + " fails its SHA-256 check (registered " +
                        expectedSha256.substr(0, 12) + "…, file " + sha.substr(0, 12) +
                        "…): it was changed or damaged");
    }
    // One deserialisation gives both the module and its metadata; the device is chosen first.
    torch::Device dev = torch::kCPU;
    if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) {
        if (!torch::cuda::is_available()) throw ConfigError("--device cuda: no CUDA device is available");
        dev = torch::Device(torch::kCUDA, 0);
    }
    ArtifactInfo info;
    torch::jit::Module module;
    try {
        module = loadArtifact(model.path, dev, info);
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw Error("model " + model.name + " failed to load: " + msg.substr(0, msg.find('\n')));
    }
    const auto& sig = info.signature;
    if (sig.inputs.size() != 1 || sig.inputs[0].datatype != "FP32")
        throw ConfigError("model " + model.name + ": only models with one FP32 input can be served");
    if (sig.outputs.size() != 1 || sig.outputs[0].datatype != "FP32")
        throw ConfigError("model " + model.name + ": only models with one FP32 output can be served");
    auto m = std::make_shared<TorchModel>();
    auto& d = *m;
    d.m_model = model;
    d.m_signature = sig;
    d.m_maxBatch = maxBatch;
    d.device = dev;
    d.module = std::move(module);
    std::vector<int64_t> shape{maxBatch};
    for (size_t i = 1; i < sig.inputs[0].shape.size(); ++i) {
        const auto s = sig.inputs[0].shape[i];
        if (s <= 0)
            throw ConfigError("model " + model.name +
                              ": input dimensions after the batch must be fixed to serve");
        shape.push_back(s);
        d.m_inElems *= s;
    }
    for (size_t i = 1; i < sig.outputs[0].shape.size(); ++i)
        d.m_outElems *= std::max<int64_t>(1, sig.outputs[0].shape[i]);
    // Buffers are allocated per instance before the first request: bounded, with a reason.
    constexpr int64_t kMaxBatchValues = int64_t{1} << 30;
    for (const auto elems : {d.m_inElems, d.m_outElems})
        if (elems > kMaxBatchValues / std::max<int64_t>(1, maxBatch))
            throw ConfigError("model " + model.name + ": --max-batch " + std::to_string(maxBatch) +
                              " rows of " + std::to_string(elems) +
                              " values exceed 2^30 values per batch buffer; lower --max-batch");
    try {
        d.module.eval();
        // On a GPU nothing of this has been measured: the module runs as loaded.
        if (optimize != "off" && !d.device.is_cuda()) {
            // A fixed, varied input (no RNG: the process's generator is not ours to move).
            int64_t numel = 1;
            for (auto s : shape) numel *= s;
            const auto probe = torch::arange(numel, torch::kFloat).mul_(0.37).sin_().reshape(shape);
            d.module = maybeOptimize(d.module, optimize, probe, model.name, d.m_optimization);
            std::string padding;
            d.runRows = planPadding(d.module, probe, padding);
            if (!padding.empty()) d.m_optimization += (d.m_optimization.empty() ? "" : "; ") + padding;
        }
        // Pinned host memory lets the copy to the GPU run asynchronously.
        for (int i = 0; i < instances; ++i)
            d.inputs.push_back(torch::zeros(
                shape, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(d.device.is_cuda())));
        // Warm-up: the first forward pays for lazy initialisation (and the JIT's profiling runs);
        // a model is only switched in once that has happened.
        std::vector<float> out(static_cast<size_t>(maxBatch * d.m_outElems));
        for (int i = 0; i < 3; ++i) m->run(0, maxBatch, out.data());
        m->run(0, 1, out.data());
        d.m_instances = instances;
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw Error("model " + model.name + " failed to load or run: " + msg.substr(0, msg.find('\n')));
    }
    return m;
}

void TorchModel::run(int instance, int64_t rows, float* out) {
    c10::InferenceMode guard;
    auto& buffer = inputs.at(static_cast<size_t>(instance));
    const int64_t n = runRows.empty() ? rows : runRows.at(static_cast<size_t>(rows));
    if (n > rows)  // zero rows to a faster size (planPadding); their outputs are dropped
        std::memset(buffer.data_ptr<float>() + rows * m_inElems, 0,
                    static_cast<size_t>((n - rows) * m_inElems) * sizeof(float));
    auto x = buffer.narrow(0, 0, n);
    if (device.is_cuda()) x = x.to(device, /*non_blocking=*/true);
    auto y = module.forward({x}).toTensor();
    y = y.to(torch::kCPU, torch::kFloat).contiguous();
    if (y.numel() != n * m_outElems)
        throw Error("model " + m_model.name + " returned " + std::to_string(y.numel()) + " values for " +
                    std::to_string(n) + " rows; its signature promises " + std::to_string(m_outElems) +
                    " per row");
    std::memcpy(out, y.data_ptr<float>(), static_cast<size_t>(rows * m_outElems) * sizeof(float));
}

}  // namespace lathe::core::serving

namespace lathe::core {

std::shared_ptr<serving::LoadedModel> torch_impl::loadModel(const ServedModel& model, int64_t maxBatch,
                                                            const std::string& device,
                                                            const std::string& expectedSha256, int instances,
                                                            const std::string& optimize) {
    return serving::loadTorchModel(model, maxBatch, device, expectedSha256, instances, optimize);
}

}  // namespace lathe::core
