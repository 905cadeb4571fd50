// Side-by-side measurement of parent and compressed models (evaluate.h).
#include "compression/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "data/raw.h"
#include "lathe/core/data_versions.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"

namespace lathe::core::compression {

namespace {

std::string shapeText(const std::vector<int64_t>& s, size_t from = 0) {
    std::string out = "[";
    for (size_t i = from; i < s.size(); ++i) out += (i > from ? "," : "") + std::to_string(s[i]);
    return out + "]";
}

}  // namespace

EvalData evaluationData(const Registry&, const Store* store, const ModelVersion& parent,
                        const std::string& dataOverride, int64_t seed) {
    const std::string what = parent.name + ":" + std::to_string(parent.version);
    RunSpec spec;
    if (!dataOverride.empty()) {
        spec.data = dataOverride;
    } else {
        std::optional<RunRecord> run;
        if (parent.runId > 0 && store) run = store->run(parent.runId);
        if (!run)
            throw ConfigError(
                "model " + what + " has no run in this workspace to take its data from" +
                (parent.data.empty() ? std::string() : " (it was trained on " + parent.data + ")") +
                ": give the data set to measure it on with --data NAME (digits, csv:PATH, idx:DIR, "
                "dataset:NAME[:V])");
        spec = parseRunSpec(run->config, "run " + std::to_string(parent.runId) + " config", false);
    }
    if (seed > 0) spec.seed = seed;
    // A versioned data set (dataset:NAME:V, as runs record it) is read where its files are.
    auto split = data::loadSplit(store ? bindDataSet(spec, store->path()).used : spec);
    auto& val = split.val;
    if (val.size() == 0)
        throw ConfigError("data set " + spec.data + " has an empty validation split: nothing to measure " +
                          what + " on");
    const auto& inputs = parent.signature.inputs;
    std::vector<int64_t> want{-1};
    want.insert(want.end(), val.shape.begin(), val.shape.end());
    if (inputs.empty() || inputs[0].shape != want)
        throw ConfigError("model " + what + " takes input " +
                          (inputs.empty() ? std::string("?") : shapeText(inputs[0].shape, 1)) +
                          " per sample but " + spec.data + " has samples of shape " + shapeText(val.shape));
    const auto& outputs = parent.signature.outputs;
    const auto classes = static_cast<int64_t>(val.classNames.size());
    if (outputs.empty() || outputs[0].shape.size() != 2 || outputs[0].shape[1] != classes)
        throw ConfigError("model " + what + " has " +
                          (outputs.empty() || outputs[0].shape.size() != 2
                               ? std::string("no class")
                               : std::to_string(outputs[0].shape[1])) +
                          " outputs but " + spec.data + " has " + std::to_string(classes) + " classes");
    EvalData d;
    d.name = spec.data;
    std::vector<int64_t> shape{val.size()};
    shape.insert(shape.end(), val.shape.begin(), val.shape.end());
    d.x = torch::from_blob(val.x.data(), shape, torch::kFloat).clone();
    if (!split.mean.empty()) d.x = d.x * torch::tensor(split.stddev) + torch::tensor(split.mean);
    d.y = torch::from_blob(val.y.data(), {val.size()}, torch::kLong).clone();
    d.classNames = val.classNames;
    auto& train = split.train;
    std::vector<int64_t> trainShape{train.size()};
    trainShape.insert(trainShape.end(), train.shape.begin(), train.shape.end());
    d.calibration = torch::from_blob(train.x.data(), trainShape, torch::kFloat).clone();
    if (!split.mean.empty() && train.size() > 0)
        d.calibration = d.calibration * torch::tensor(split.stddev) + torch::tensor(split.mean);
    return d;
}

Progress::Progress(const CompressControl& control, std::vector<std::pair<std::string, double>> phases)
    : m_control(control), m_phases(std::move(phases)) {}

void Progress::begin(const std::string& phase) {
    double start = 0;
    for (const auto& [name, share] : m_phases) {
        if (name == phase) {
            m_phase = phase;
            m_start = start;
            m_share = share;
            break;
        }
        start += share;
    }
    within(0);
}

void Progress::within(double fraction) {
    if (m_control.stop && m_control.stop->load()) throw StoppedError("stopped: nothing was registered");
    report(m_start + m_share * std::clamp(fraction, 0.0, 1.0));
}

void Progress::update(double fraction) { report(m_start + m_share * std::clamp(fraction, 0.0, 1.0)); }

void Progress::done() {
    m_phase = "done";
    report(1.0);
}

void Progress::report(double fraction) {
    if (m_control.progress) m_control.progress({m_phase, fraction});
}

Accuracy accuracyOf(torch::jit::Module& module, const EvalData& data) {
    c10::InferenceMode guard;
    const int64_t n = data.y.size(0), classes = static_cast<int64_t>(data.classNames.size());
    std::vector<int64_t> right(static_cast<size_t>(classes), 0), total(static_cast<size_t>(classes), 0);
    int64_t correct = 0;
    for (int64_t b = 0; b < n; b += 256) {
        const auto len = std::min<int64_t>(256, n - b);
        const auto logits = module.forward({data.x.narrow(0, b, len)}).toTensor();
        const auto pred = logits.argmax(1);
        const auto y = data.y.narrow(0, b, len);
        const auto hit = pred.eq(y);
        correct += hit.sum().item<int64_t>();
        const auto ya = y.accessor<int64_t, 1>();
        const auto ha = hit.accessor<bool, 1>();
        for (int64_t i = 0; i < len; ++i) {
            const auto c = ya[i];
            if (c < 0 || c >= classes) continue;
            ++total[static_cast<size_t>(c)];
            right[static_cast<size_t>(c)] += ha[i] ? 1 : 0;
        }
    }
    Accuracy a;
    a.overall = n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0;
    for (size_t c = 0; c < right.size(); ++c)
        a.perClass.push_back(total[c] ? static_cast<double>(right[c]) / static_cast<double>(total[c]) : 0);
    return a;
}

void measurePair(torch::jit::Module& parent, torch::jit::Module& child, const EvalData& data,
                 CompressReport& report, Progress& progress) {
    const auto pa = accuracyOf(parent, data);
    progress.within(0.2);
    const auto ca = accuracyOf(child, data);
    progress.within(0.4);
    report.data = data.name;
    report.samples = data.y.size(0);
    report.parentAccuracy = pa.overall;
    report.accuracy = ca.overall;
    report.parentPerClassAccuracy = pa.perClass;
    report.perClassAccuracy = ca.perClass;
    report.classNames = data.classNames;

    // Latency: the median of alternated timings of each model on the same rows (repeated when the
    // split has fewer than 32).
    auto rows = [&](int64_t count) {
        const int64_t n = data.x.size(0);
        if (n >= count) return data.x.narrow(0, 0, count).contiguous();
        std::vector<int64_t> reps(static_cast<size_t>(data.x.dim()), 1);
        reps[0] = (count + n - 1) / n;
        return data.x.repeat(reps).narrow(0, 0, count).contiguous();
    };
    c10::InferenceMode guard;
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    int step = 0;
    for (const int64_t batch : {1, 32}) {
        const auto x = rows(batch);
        // Warm-up: first-call allocations, caches, thread wake-up, and TorchScript's profiling
        // executor, which optimizes a graph after its first runs.
        const auto w0 = std::chrono::steady_clock::now();
        for (int w = 0; w < 10; ++w) {
            parent.forward({x});
            child.forward({x});
        }
        // Each timing repeats the call for about 2 ms, so that the clock and a stray interrupt
        // weigh little even for a model that answers in microseconds.
        const double pairMs =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count() / 10;
        const int inner = static_cast<int>(std::clamp(4.0 / std::max(pairMs, 1e-3), 1.0, 200.0));
        std::vector<double> tp, tc;
        for (int r = 0; r < 21; ++r) {
            for (auto* which : {&parent, &child}) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < inner; ++i) which->forward({x});
                const double ms =
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                    inner;
                (which == &parent ? tp : tc).push_back(ms);
            }
        }
        (batch == 1 ? report.parentLatencyMsB1 : report.parentLatencyMsB32) = median(tp);
        (batch == 1 ? report.latencyMsB1 : report.latencyMsB32) = median(tc);
        progress.within(0.4 + 0.3 * ++step);
    }
}

}  // namespace lathe::core::compression
