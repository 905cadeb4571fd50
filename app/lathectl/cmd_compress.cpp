// lathectl compress: make a smaller, faster version of a registered model and report what it
// cost (core/include/lathe/core/compress.h): quantize (dynamic, static, qat), prune, distill.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include "cli_common.h"
#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/registry.h"

namespace lathe::cli {
namespace {

// Run keys a compression's training runs take from the command line (--lr, --nproc …), with
// the help text of the run form.
struct RunFlags {
    std::map<std::string, std::string> values;
    std::map<std::string, CLI::Option*> options;
    std::map<std::string, std::string> given() const {
        std::map<std::string, std::string> out;
        for (const auto& [k, o] : options)
            if (o->count() > 0) out[k] = values.at(k);
        return out;
    }
};

void addRunFlags(CLI::App* cmd, RunFlags& flags, const std::vector<std::string>& keys) {
    for (const auto& k : core::specKeys()) {
        if (std::find(keys.begin(), keys.end(), k.name) == keys.end()) continue;
        std::string typeName = k.kind == "int" ? "INT" : k.kind == "float" ? "X" : "TEXT";
        if (k.kind == "choice") {
            typeName.clear();
            for (const auto& c : k.choices) typeName += (typeName.empty() ? "" : "|") + c;
        }
        flags.options[k.name] = cmd->add_option(flagName(k.name), flags.values[k.name], "run: " + k.help)
                                    ->type_name(typeName)
                                    ->group("Training runs");
    }
}

const std::vector<std::string> kRunKeys{"lr",       "batch",      "optimizer",       "weight_decay",
                                        "schedule", "nproc",      "precision",       "threads",
                                        "device",   "experiment", "checkpoint_every"};

struct QuantizeState {
    CommonOptions common;
    std::string ref;
    core::QuantizeOptions options;
    RunFlags run;
};

struct PruneState {
    CommonOptions common;
    std::string ref;
    core::PruneOptions options;
    RunFlags run;
};

struct DistillState {
    CommonOptions common;
    std::string teacher;
    core::DistillOptions options;
    RunFlags run;
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
    std::printf("registered %s:%lld from %s:%lld (%s%s)\n", v.name.c_str(), static_cast<long long>(v.version),
                v.parentModel.empty() ? v.name.c_str() : v.parentModel.c_str(),
                static_cast<long long>(v.parentVersion), r.method.c_str(),
                r.settings.count("mode") ? (" " + r.settings.at("mode")).c_str() : "");
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
    if (r.parentParameters > 0)
        std::printf(
            "  %-16s %14lld %14lld %10s\n", "parameters", static_cast<long long>(r.parentParameters),
            static_cast<long long>(r.parameters),
            ratio(static_cast<double>(r.parentParameters), static_cast<double>(r.parameters)).c_str());
    for (const auto& round : r.rounds)
        std::printf("  round %lld (run %lld): kept %.1f%%, accuracy %s, %lld parameters\n",
                    static_cast<long long>(round.round), static_cast<long long>(round.runId),
                    round.kept * 100, pct(round.accuracy).c_str(), static_cast<long long>(round.parameters));
    if (r.rounds.empty() && !r.runs.empty()) {
        std::string runs;
        for (auto id : r.runs) runs += (runs.empty() ? "" : ", ") + std::to_string(id);
        std::printf("  trained in run %s\n", runs.c_str());
    }
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

// Runs one compression with a progress line on a terminal and Ctrl+C as a clean stop.
void runCompression(const CommonOptions& common, int& exitCode,
                    const std::function<core::CompressResult(core::Registry&, core::Store*,
                                                             const core::CompressControl&)>& work) {
    auto registry = std::make_unique<core::Registry>(core::Store::resolvePath(common.db));
    auto store = openStore(common);
    const bool tty = ::isatty(fileno(stderr)) != 0;
    core::CompressControl control;
    control.stop = &installStopHandler();
    control.progress = [tty](const core::CompressProgress& p) {
        if (!tty) return;
        std::fprintf(stderr, "\r\033[K%-14s %3.0f%%", p.phase.c_str(), p.fraction * 100);
        if (p.phase == "done") std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
    };
    try {
        const auto result = work(*registry, store.get(), control);
        if (common.json)
            std::cout << resultJson(result.version, result.report).dump() << std::endl;
        else
            printReport(result.version, result.report);
    } catch (const core::StoppedError& ex) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        std::fprintf(stderr, "%s\n", ex.what());
        exitCode = kInterrupted;
    } catch (...) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        removeStopHandler();
        throw;
    }
    removeStopHandler();
}

core::Store& needStore(core::Store* store) {
    if (!store) throw UsageError("this compression records training runs: it needs a workspace");
    return *store;
}

void runQuantize(QuantizeState st, int& exitCode) {
    st.options.run = st.run.given();
    runCompression(st.common, exitCode,
                   [&](core::Registry& registry, core::Store* store, const auto& control) {
                       return core::quantizeModel(registry, store, resolveRef(st.ref, registry, store),
                                                  st.options, control);
                   });
}

void runPrune(PruneState st, int& exitCode) {
    st.options.run = st.run.given();
    runCompression(st.common, exitCode,
                   [&](core::Registry& registry, core::Store* store, const auto& control) {
                       return core::pruneModel(registry, needStore(store),
                                               resolveRef(st.ref, registry, store), st.options, control);
                   });
}

void runDistill(DistillState st, int& exitCode) {
    st.options.run = st.run.given();
    runCompression(st.common, exitCode,
                   [&](core::Registry& registry, core::Store* store, const auto& control) {
                       st.options.teacher = resolveRef(st.teacher, registry, store);
                       return core::distillModel(registry, needStore(store), st.options, control);
                   });
}

}  // namespace

void registerCompress(CLI::App& app, int& exitCode) {
    auto* compress = app.add_subcommand("compress",
                                        "make a smaller, faster version of a registered model: quantize "
                                        "(int8 dynamic, static or quantization-aware), prune, distill; "
                                        "registered with its parent and a report");
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
            "input scales calibrated on training batches; qat: fine-tune with fake int8 (a recorded run), "
            "then static int8 with the learned input ranges")
        ->check(CLI::IsMember({"dynamic", "static", "qat"}))
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
    q->run.options["epochs"] =
        quantize->add_option("--epochs", q->run.values["epochs"], "qat: fine-tuning epochs (default 3)");
    addRunFlags(quantize, q->run, kRunKeys);
    addCommonOptions(quantize, q->common);
    quantize->callback([q, &exitCode] { runQuantize(*q, exitCode); });

    auto p = std::make_shared<PruneState>();
    auto* prune = compress->add_subcommand(
        "prune",
        "structured pruning: the least important mlp neurons / cnn channels (and what reads them) removed in "
        "rounds, each fine-tuned in a recorded run");
    prune->add_option("REF", p->ref, "NAME, NAME:V, NAME@ALIAS, or a run id")->required();
    prune
        ->add_option("--target-sparsity", p->options.targetSparsity,
                     "share of each hidden layer's neurons / channels to remove, in (0, 1)")
        ->default_val(0.5);
    prune->add_option("--rounds", p->options.rounds, "prune-and-fine-tune rounds (0: as --per-round needs)")
        ->default_val(0);
    prune
        ->add_option("--per-round", p->options.perRound,
                     "share of the remaining ones removed per round, in (0, 1)")
        ->default_val(0.25);
    prune
        ->add_option(
            "--importance", p->options.importance,
            "l1: weight magnitude; taylor: first-order estimate of the loss change, on training batches")
        ->check(CLI::IsMember({"l1", "taylor"}))
        ->default_val("l1");
    prune
        ->add_option("--finetune-epochs", p->options.finetuneEpochs,
                     "epochs of fine-tuning per round, 1..100000")
        ->default_val(3);
    prune->add_option("--data", p->options.data, "data set (default: the parent run's)");
    prune->add_option("--seed", p->options.seed, "split and training seed (default: the parent run's)");
    addRunFlags(prune, p->run, kRunKeys);
    addCommonOptions(prune, p->common);
    prune->callback([p, &exitCode] { runPrune(*p, exitCode); });

    auto d = std::make_shared<DistillState>();
    auto* distill = compress->add_subcommand(
        "distill",
        "knowledge distillation: train a smaller zoo network (a recorded run) on the teacher's soft targets");
    distill
        ->add_option("--teacher", d->teacher,
                     "NAME, NAME:V, NAME@ALIAS, or a run id (any TorchScript classifier)")
        ->required();
    distill
        ->add_option(
            "--student", d->options.student,
            "the student: mlp:64,64 (hidden widths), cnn:8,16 or cnn:8,16:32 (channels, head widths), or "
            "a run config file")
        ->required();
    distill->add_option("--name", d->options.name,
                        "register the student under this name (default: the teacher's)");
    distill->add_option("--temperature", d->options.temperature, "softmax temperature of the soft targets")
        ->default_val(4.0);
    distill
        ->add_option("--alpha", d->options.alpha, "weight of the soft-target loss, 0..1 (the rest: labels)")
        ->default_val(0.7);
    distill
        ->add_option("--hints", d->options.hints,
                     "FitNets hints through a learned regressor: none, last (last hidden block) or all")
        ->check(CLI::IsMember({"none", "last", "all"}))
        ->default_val("none");
    distill->add_option("--hint-weight", d->options.hintWeight, "weight of the hint loss")->default_val(1.0);
    distill
        ->add_option("--attention-transfer", d->options.attentionTransfer,
                     "cnn: attention transfer on conv blocks with this beta (flag alone: 1)")
        ->expected(0, 1)
        ->default_str("0");
    distill->add_option("--data", d->options.data, "data set (default: the teacher run's)");
    addRunFlags(distill, d->run, [] {
        auto keys = kRunKeys;
        keys.insert(keys.end(), {"epochs", "seed"});
        return keys;
    }());
    addCommonOptions(distill, d->common);
    distill->callback([d, distill, &exitCode] {
        if (distill->get_option("--attention-transfer")->count() > 0 && d->options.attentionTransfer == 0 &&
            distill->get_option("--attention-transfer")->results().empty())
            d->options.attentionTransfer = 1;
        runDistill(*d, exitCode);
    });
}

}  // namespace lathe::cli
