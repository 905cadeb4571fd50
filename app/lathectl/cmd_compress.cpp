// lathectl compress: make a smaller, faster version of a registered model and report what it
// cost (core/include/lathe/core/compress.h). `quantize` today; pruning and distillation follow.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/registry.h"

namespace lathe::cli {
namespace {

struct QuantizeState {
    CommonOptions common;
    std::string ref;
    core::QuantizeOptions options;
};

// A positive integer names a run: its model is registered first (as run-N) and compressed.
core::ModelRef resolveRef(const std::string& text, core::Registry& registry, core::Store* store) {
    if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
        const auto runId = std::stoll(text);
        if (!store) throw UsageError("a run id needs the workspace");
        // The run's model registered before (by an earlier compress of the same run) is reused.
        for (const auto& v : registry.versions("run-" + text))
            if (v.runId == runId && v.parentVersion == 0) return {v.name, v.version, {}};
        const auto v = core::registerModel(registry, store, "run-" + text, runId, "", {}, 0);
        std::fprintf(stderr, "registered run %lld's model as %s:%lld\n", static_cast<long long>(runId),
                     v.name.c_str(), static_cast<long long>(v.version));
        return {v.name, v.version, {}};
    }
    return core::parseModelRef(text);
}

std::string pct(double fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f%%", fraction * 100);
    return buf;
}

std::string kib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
    return buf;
}

std::string ratio(double a, double b) {
    if (b <= 0) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2fx", a / b);
    return buf;
}

void printReport(const core::ModelVersion& v, const core::CompressReport& r) {
    std::printf("registered %s:%lld from %s:%lld (%s %s)\n", v.name.c_str(),
                static_cast<long long>(v.version),
                v.parentModel.empty() ? v.name.c_str() : v.parentModel.c_str(),
                static_cast<long long>(v.parentVersion), r.method.c_str(),
                r.settings.count("mode") ? r.settings.at("mode").c_str() : "");
    std::printf("  measured on %s (%lld validation samples), int8 kernel %s\n", r.data.c_str(),
                static_cast<long long>(r.samples), r.kernel.c_str());
    std::printf("  %-16s %14s %14s %10s\n", "", "parent", "compressed", "ratio");
    std::printf("  %-16s %14s %14s %+9.2f pt\n", "accuracy", pct(r.parentAccuracy).c_str(),
                pct(r.accuracy).c_str(), (r.accuracy - r.parentAccuracy) * 100);
    std::printf("  %-16s %14s %14s %10s\n", "size", kib(r.parentSizeBytes).c_str(), kib(r.sizeBytes).c_str(),
                ratio(static_cast<double>(r.parentSizeBytes), static_cast<double>(r.sizeBytes)).c_str());
    std::printf("  %-16s %11.3f ms %11.3f ms %10s\n", "latency batch 1", r.parentLatencyMsB1, r.latencyMsB1,
                ratio(r.parentLatencyMsB1, r.latencyMsB1).c_str());
    std::printf("  %-16s %11.3f ms %11.3f ms %10s\n", "latency batch 32", r.parentLatencyMsB32,
                r.latencyMsB32, ratio(r.parentLatencyMsB32, r.latencyMsB32).c_str());
    for (const auto& l : r.layers)
        std::printf("  %-10s %lld -> %lld: %s\n", l.name.c_str(), static_cast<long long>(l.inFeatures),
                    static_cast<long long>(l.outFeatures), l.change.c_str());
}

nlohmann::json resultJson(const core::ModelVersion& v, const core::CompressReport& r) {
    auto j = nlohmann::json::parse(r.toJson());
    j["model"] = v.name;
    j["version"] = v.version;
    j["parent_model"] = v.parentModel.empty() ? v.name : v.parentModel;
    j["parent_version"] = v.parentVersion;
    j["path"] = v.path;
    j["sha256"] = v.sha256;
    return j;
}

void runQuantize(const QuantizeState& st, int& exitCode) {
    auto registry = std::make_unique<core::Registry>(core::Store::resolvePath(st.common.db));
    auto store = openStore(st.common);
    const auto ref = resolveRef(st.ref, *registry, store.get());
    const bool tty = ::isatty(fileno(stderr)) != 0;
    core::CompressControl control;
    control.stop = &installStopHandler();
    control.progress = [tty](const core::CompressProgress& p) {
        if (!tty) return;
        std::fprintf(stderr, "\r\033[K%-12s %3.0f%%", p.phase.c_str(), p.fraction * 100);
        if (p.phase == "done") std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
    };
    try {
        const auto result = core::quantizeModel(*registry, store.get(), ref, st.options, control);
        if (st.common.json)
            std::cout << resultJson(result.version, result.report).dump() << std::endl;
        else
            printReport(result.version, result.report);
    } catch (const core::StoppedError& ex) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        std::fprintf(stderr, "%s\n", ex.what());
        exitCode = kInterrupted;
    }
    removeStopHandler();
}

}  // namespace

void registerCompress(CLI::App& app, int& exitCode) {
    auto* compress = app.add_subcommand("compress",
                                        "make a smaller, faster version of a registered model: quantize "
                                        "(int8 dynamic or static); registered with "
                                        "its parent and a report");
    compress->require_subcommand(1);

    auto q = std::make_shared<QuantizeState>();
    auto* quantize = compress->add_subcommand(
        "quantize", "int8 quantization: Linear layers run on Lathe's int8 GEMM; measured against the parent");
    quantize
        ->add_option("REF", q->ref, "NAME, NAME:V, NAME@ALIAS, or a run id (its model is registered first)")
        ->required();
    quantize
        ->add_option(
            "--mode", q->options.mode,
            "dynamic: Linear layers, inputs quantized per row at run time; static: Linear and Conv2d, "
            "input scales calibrated on training batches")
        ->check(CLI::IsMember({"dynamic", "static"}))
        ->default_val("dynamic");
    quantize
        ->add_option("--observer", q->options.observer,
                     "static: how a layer's input range is taken: minmax, moving-average, or histogram (the "
                     "--percentile of |x|)")
        ->check(CLI::IsMember({"minmax", "moving-average", "histogram"}))
        ->default_val("histogram");
    quantize
        ->add_option("--calib-batches", q->options.calibBatches,
                     "static: batches of 32 training samples to calibrate on, 1..100000")
        ->default_val(32);
    quantize
        ->add_option("--percentile", q->options.percentile,
                     "static, histogram observer: percentile of |x|, (0, 100]")
        ->default_val(99.99);
    quantize->add_option("--data", q->options.data,
                         "data set to measure accuracy on (default: the one the parent's run trained on)");
    quantize->add_option("--seed", q->options.seed, "split seed (default: the parent run's; 42 with --data)");
    addCommonOptions(quantize, q->common);
    quantize->callback([q, &exitCode] { runQuantize(*q, exitCode); });
}

}  // namespace lathe::cli
