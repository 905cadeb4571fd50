#pragma once
// A recorded mixed-precision, profiled run written straight through the Store API: dynamic
// loss scale with a few skipped steps, gradient norms (NaN on skipped steps), and nested op
// spans inside step phases on two threads. Shared by the widget tests.
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/store.h"

namespace lathe::test {

struct RecordedAmpRun {
    int64_t runId = 0;
    int64_t steps = 0;
    std::set<int64_t> skipped;
    size_t spanCount = 0;
    int64_t profiledSteps = 0;
};

inline double gradNormAt(int64_t step) {
    return 0.35 + 2.2 * std::exp(-double(step) / 70.0) + 0.12 * std::sin(double(step) * 0.37);
}

/// Synthetic spans of `steps` profiled steps: on thread 0 the phases data → forward → backward
/// → optimizer, with nested ops inside forward/backward/optimizer; on thread 1 a loader thread
/// with a "data" phase and its own ops. Times in ns from 0.
inline std::vector<core::ProfileSpan> syntheticSpans(int64_t firstStep, int64_t steps, int layers) {
    using core::ProfileSpan;
    std::vector<ProfileSpan> out;
    auto add = [&](ProfileSpan::Kind kind, const std::string& name, int64_t step, int64_t thread,
                   int64_t start, int64_t dur, const std::string& shapes = {}) {
        ProfileSpan s;
        s.kind = kind;
        s.name = name;
        s.step = step;
        s.thread = thread;
        s.startNs = start;
        s.durationNs = dur;
        s.shapes = shapes;
        out.push_back(s);
    };
    const auto Op = ProfileSpan::Kind::Op;
    const auto Phase = ProfileSpan::Kind::Phase;
    int64_t t = 0;
    for (int64_t step = firstStep; step < firstStep + steps; ++step) {
        const int64_t stepStart = t;
        // Loader thread: prefetches the next batch while the step runs.
        {
            int64_t lt = stepStart + 2000;
            const int64_t phaseStart = lt;
            for (int b = 0; b < 4; ++b) {
                add(Op, "aten::stack", step, 1, lt, 9000, "[64, 64]");
                add(Op, "aten::to", step, 1, lt + 10000, 6000, "[64, 64]");
                add(Op, "aten::copy_", step, 1, lt + 11000, 4000, "[64, 64], [64, 64]");
                lt += 18000;
            }
            add(Phase, "data", step, 1, phaseStart, lt - phaseStart);
        }
        // data
        add(Phase, "data", step, 0, t, 30000);
        add(Op, "aten::index_select", step, 0, t + 2000, 20000, "[1797, 64], [64]");
        t += 30000;
        // forward: per layer linear(addmm(t)) + relu
        const int64_t fwdStart = t;
        t += 1000;
        for (int l = 0; l < layers; ++l) {
            add(Op, "aten::linear", step, 0, t, 26000, "[64, 128], [128, 128], [128]");
            add(Op, "aten::t", step, 0, t + 500, 2000, "[128, 128]");
            add(Op, "aten::addmm", step, 0, t + 3000, 21000, "[128], [64, 128], [128, 128]");
            t += 27000;
            add(Op, "aten::relu", step, 0, t, 5000, "[64, 128]");
            t += 6000;
        }
        add(Op, "aten::cross_entropy_loss", step, 0, t, 14000, "[64, 10], [64]");
        add(Op, "aten::log_softmax", step, 0, t + 1000, 8000, "[64, 10]");
        t += 15000;
        add(Phase, "forward", step, 0, fwdStart, t - fwdStart);
        // backward: grads of each layer, deepest first
        const int64_t bwdStart = t;
        t += 1000;
        for (int l = 0; l < layers; ++l) {
            add(Op, "AddmmBackward0", step, 0, t, 52000);
            add(Op, "aten::mm", step, 0, t + 1000, 24000, "[64, 128], [128, 128]");
            add(Op, "aten::mm", step, 0, t + 26000, 22000, "[128, 64], [64, 128]");
            t += 53000;
            add(Op, "ReluBackward0", step, 0, t, 7000);
            add(Op, "aten::threshold_backward", step, 0, t + 500, 6000, "[64, 128], [64, 128]");
            t += 8000;
        }
        add(Phase, "backward", step, 0, bwdStart, t - bwdStart);
        // optimizer
        const int64_t optStart = t;
        for (int l = 0; l < layers * 2; ++l) {
            add(Op, "aten::mul_", step, 0, t, 3000, "[128, 128]");
            add(Op, "aten::addcmul_", step, 0, t + 3500, 4000, "[128, 128], [128, 128], [128, 128]");
            add(Op, "aten::add_", step, 0, t + 8000, 2500, "[128, 128], [128, 128]");
            t += 11000;
        }
        add(Phase, "optimizer", step, 0, optStart, t - optStart);
        t += 4000;  // gap between steps
    }
    return out;
}

inline RecordedAmpRun recordAmpRun(core::Store& store, int64_t steps = 200, int64_t profiledSteps = 30) {
    RecordedAmpRun run;
    run.steps = steps;
    for (int64_t s : {5, 9, 60, 61, 150})
        if (s <= steps) run.skipped.insert(s);
    run.runId =
        store.createRun("default", "amp-fixture", "mlp", "digits", "", {{"precision", "fp16"}}, "localhost");
    // A dynamic scaler: halve after an overflow, double after 40 clean steps.
    double scale = 65536.0;
    int64_t clean = 0;
    for (int64_t step = 1; step <= steps; ++step) {
        const bool skip = run.skipped.count(step) != 0;
        store.appendMetric(run.runId, "amp/loss_scale", step, 0, scale);
        store.appendMetric(run.runId, "amp/skipped", step, 0, skip ? 1.0 : 0.0);
        store.appendMetric(run.runId, "train/grad_norm", step, 0,
                           skip ? std::numeric_limits<double>::infinity() : gradNormAt(step));
        store.appendMetric(run.runId, "train/loss", step, 0, 2.3 * std::exp(-double(step) / 90.0) + 0.1);
        if (skip) {
            scale *= 0.5;
            clean = 0;
        } else if (++clean == 40) {
            scale *= 2.0;
            clean = 0;
        }
    }
    run.profiledSteps = profiledSteps;
    const auto spans = syntheticSpans(6, profiledSteps, 6);
    for (const auto& s : spans) store.appendSpan(run.runId, s);
    run.spanCount = spans.size();
    store.flush();
    return run;
}

}  // namespace lathe::test
