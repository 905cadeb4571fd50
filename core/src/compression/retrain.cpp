// Compression methods that train (compress.h): the shared fine-tuning helpers (retrain.h),
// structured pruning and knowledge distillation. Quantization-aware training is a mode of
// quantizeModel (quantize.cpp) and uses the same helpers.
#include "compression/retrain.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "data/raw.h"
#include "lathe/core/data_versions.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/kernels/qgemm.h"
#include "serving/artifact_io.h"
#include "torch_backend.h"
#include "training/checkpoint_io.h"
#include "training/zoo.h"

namespace lathe::core {

namespace fs = std::filesystem;

namespace compression {

RunSpec runSpecOf(const Store& store, const ModelVersion& version, const std::string& method) {
    const std::string what = version.name + ":" + std::to_string(version.version);
    std::optional<RunRecord> run;
    if (version.runId > 0) run = store.run(version.runId);
    if (!run)
        throw ConfigError(method + " trains the model's network further, and " + what +
                          " was not trained in this workspace (" +
                          (version.source.empty() ? std::string("imported from a file") : version.source) +
                          "): it needs a version registered from a run here");
    return parseRunSpec(run->config, "run " + std::to_string(version.runId) + " config", false);
}

RunSpec fineTuneSpec(RunSpec spec, const std::map<std::string, std::string>& overrides) {
    spec.initFrom.clear();
    spec.qat = false;
    spec.teacher.clear();
    spec.distillHints = "none";
    spec.attentionTransfer = 0;
    spec.nproc = 1;
    spec.injectNonfinite.clear();
    spec.profile = false;
    for (const auto& [key, value] : overrides) setSpecValue(spec, key, value);
    return spec;
}

FineTuned trainRecorded(Store& store, const RunSpec& spec, const CompressControl& control,
                        Progress& progress) {
    validateOrThrow(spec);
    torch_impl::checkRunnable(spec);
    RecordOptions options;
    options.stop = control.stop;
    double total = 0;
    const EventSink observer = [&](const Event& e) {
        if (e.type == Event::Type::Status && e.text == toString(RunStatus::Running) && e.value > 0)
            total = e.value;
        else if (e.type == Event::Type::Metric && total > 0 && e.key == "train/grad_norm")
            progress.update(static_cast<double>(e.step) / total);
    };
    // A run's `threads` sets the process's compute threads; the measurement after it runs with
    // what the process had before, like the methods that do not train.
    const int torchThreads = at::get_num_threads(), kernelThreads = kernels::threads();
    const auto rec = trainAndRecord(store, spec, options, observer);
    torch_impl::setComputeThreads(torchThreads);  // LibTorch's and OpenBLAS's
    kernels::setThreads(kernelThreads);
    const std::string run = "run " + std::to_string(rec.runId);
    if (rec.result.status == RunStatus::Stopped)
        throw StoppedError("stopped: nothing was registered (" + run + " is recorded as stopped)");
    if (rec.result.status != RunStatus::Completed)
        throw Error("the fine-tuning " + run + " failed: " + rec.result.error);
    FineTuned out;
    out.runId = rec.runId;
    const auto it = rec.result.finalMetrics.find("val/accuracy");
    out.accuracy = it == rec.result.finalMetrics.end() ? 0.0 : it->second;
    progress.update(1.0);
    return out;
}

torch::nn::Sequential trainedNetwork(const Store& store, int64_t runId, const RunSpec& spec,
                                     const std::vector<int64_t>& sampleShape, int64_t classes) {
    std::string checkpoint;
    for (const auto& a : store.artifacts(runId))
        if (a.kind == "checkpoint") checkpoint = a.path;  // the newest
    if (checkpoint.empty()) throw Error("run " + std::to_string(runId) + " left no checkpoint");
    auto model = makeModel(spec, sampleShape, classes);
    loadModelWeights(checkpoint, *model);
    model->eval();
    return model;
}

torch::jit::Module exportedModule(const Store& store, int64_t runId, ArtifactInfo& info) {
    const auto tmp = (fs::temp_directory_path() /
                      ("lathe-export-" + std::to_string(::getpid()) + "-" + std::to_string(runId) + ".pt"))
                         .string();
    torch_impl::exportRunModel(store, runId, tmp);
    torch::jit::Module m;
    try {
        m = loadArtifact(tmp, torch::kCPU, info);
    } catch (...) {
        std::error_code ec;
        fs::remove(tmp, ec);
        throw;
    }
    std::error_code ec;
    fs::remove(tmp, ec);
    m.eval();
    return m;
}

namespace {
int64_t parameterCountOf(const torch::jit::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
}
}  // namespace

CompressResult measureAndRegister(Registry& registry, const ModelVersion& parent, const std::string& name,
                                  torch::jit::Module& parentModule, torch::jit::Module& child,
                                  const EvalData& data, CompressReport& report, ArtifactInfo info,
                                  Progress& progress) {
    const std::string what = parent.name + ":" + std::to_string(parent.version);
    progress.begin("measuring");
    measurePair(parentModule, child, data, report, progress);
    report.parentSizeBytes = parent.sizeBytes;
    report.kernel = kernels::gemmIsaName(kernels::bestGemmIsa());
    report.parentParameters = parameterCountOf(parentModule);
    const int64_t own = parameterCountOf(child);
    report.parameters = own > 0 ? own : report.parentParameters;  // a quantized graph holds constants

    progress.begin("registering");
    info.metrics = {{"val/accuracy", report.accuracy}};
    ModelVersion lineage;
    lineage.parentVersion = parent.version;
    if (name != parent.name) lineage.parentModel = parent.name;
    nlohmann::json derivation{{"method", report.method}, {"parent", what}};
    for (const auto& [k, v] : report.settings) derivation[k] = v;
    if (!report.runs.empty()) derivation["runs"] = report.runs;
    lineage.derivation = derivation.dump();
    lineage.report = report.toJson();
    CompressResult result;
    result.version = registerModule(registry, name, child, info, lineage);
    report.sizeBytes = result.version.sizeBytes;  // the file's, known once written
    registry.setReport(name, result.version.version, report.toJson());
    result.version.report = report.toJson();
    result.report = report;
    progress.done();
    return result;
}

std::vector<int64_t> sampleShapeOf(const ModelVersion& v) {
    if (v.signature.inputs.empty() || v.signature.inputs[0].shape.empty())
        throw ConfigError("model " + v.name + ":" + std::to_string(v.version) + " has no input signature");
    const auto& s = v.signature.inputs[0].shape;
    return {s.begin() + 1, s.end()};
}

int64_t classesOf(const ModelVersion& v) {
    if (v.signature.outputs.empty() || v.signature.outputs[0].shape.size() != 2)
        throw ConfigError("model " + v.name + ":" + std::to_string(v.version) + " has no class output");
    return v.signature.outputs[0].shape[1];
}

// ---- pruning -----------------------------------------------------------------------------

namespace {

std::string fmt(double v, int prec = 3) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    return buf;
}

bool isLinear(const torch::nn::Module* m) { return dynamic_cast<const torch::nn::LinearImpl*>(m) != nullptr; }
bool isConv(const torch::nn::Module* m) { return dynamic_cast<const torch::nn::Conv2dImpl*>(m) != nullptr; }

// The layers with weights, in order; all but the last (the classifier) are prunable: their output
// neurons/channels can go, with the matching inputs of the next weighted layer.
std::vector<size_t> weightedLayers(torch::nn::Sequential& model) {
    std::vector<size_t> out;
    for (size_t i = 0; i < model->size(); ++i)
        if (isLinear(model->ptr(i).get()) || isConv(model->ptr(i).get())) out.push_back(i);
    return out;
}

torch::Tensor weightOf(torch::nn::Sequential& model, size_t i) {
    const auto* m = model->ptr(i).get();
    if (const auto* l = dynamic_cast<const torch::nn::LinearImpl*>(m)) return l->weight;
    return dynamic_cast<const torch::nn::Conv2dImpl*>(m)->weight;
}

torch::Tensor biasOf(torch::nn::Sequential& model, size_t i) {
    const auto* m = model->ptr(i).get();
    if (const auto* l = dynamic_cast<const torch::nn::LinearImpl*>(m)) return l->bias;
    return dynamic_cast<const torch::nn::Conv2dImpl*>(m)->bias;
}

// Importance of each output channel of every prunable layer. l1: the L1 norm of its weights.
// taylor: Molchanov et al.'s first-order estimate of the loss change when the channel goes,
// (sum over its weights and bias of w * dL/dw)^2, summed over training batches.
std::vector<torch::Tensor> importance(torch::nn::Sequential& model, const std::vector<size_t>& prunable,
                                      const std::string& kind, const torch::Tensor& x,
                                      const torch::Tensor& y) {
    std::vector<torch::Tensor> scores;
    if (kind == "l1") {
        torch::NoGradGuard noGrad;
        for (size_t i : prunable) scores.push_back(weightOf(model, i).abs().flatten(1).sum(1));
        return scores;
    }
    for (size_t i : prunable) scores.push_back(torch::zeros({weightOf(model, i).size(0)}));
    model->train();
    const int64_t n = x.size(0), batch = 64, batches = std::min<int64_t>(16, (n + batch - 1) / batch);
    for (int64_t b = 0; b < batches; ++b) {
        const auto start = b * batch, len = std::min(batch, n - start);
        model->zero_grad();
        const auto out = model->forward(x.narrow(0, start, len));
        torch::nn::functional::cross_entropy(out, y.narrow(0, start, len)).backward();
        torch::NoGradGuard noGrad;
        for (size_t k = 0; k < prunable.size(); ++k) {
            const auto w = weightOf(model, prunable[k]), bias = biasOf(model, prunable[k]);
            auto g = (w * w.grad()).flatten(1).sum(1);
            if (bias.defined() && bias.grad().defined()) g = g + bias * bias.grad();
            scores[k] += g.pow(2);
        }
    }
    model->zero_grad();
    model->eval();
    return scores;
}

// The spec of the network with `widths` outputs at its prunable layers.
RunSpec shrunkSpec(RunSpec spec, const std::vector<int64_t>& widths) {
    if (spec.model == "mlp") {
        spec.hidden = widths;
    } else {
        const size_t convs = spec.channels.size();
        spec.channels.assign(widths.begin(), widths.begin() + static_cast<std::ptrdiff_t>(convs));
        spec.head.assign(widths.begin() + static_cast<std::ptrdiff_t>(convs), widths.end());
    }
    return spec;
}

// Copies the kept rows/channels of `from` into `to` (the same network with fewer of them): each
// weighted layer keeps its outputs' `keep` and the inputs its predecessor kept (a linear layer
// after the flatten of a conv keeps each kept channel's block of H*W columns).
void copyKept(torch::nn::Sequential& from, torch::nn::Sequential& to, const std::vector<size_t>& weighted,
              const std::vector<torch::Tensor>& keep) {
    torch::NoGradGuard noGrad;
    torch::Tensor inKeep;  // the predecessor's kept outputs (undefined: all)
    int64_t inChannels = 0;
    for (size_t k = 0; k < weighted.size(); ++k) {
        const size_t i = weighted[k];
        auto w = weightOf(from, i), b = biasOf(from, i);
        if (inKeep.defined()) {
            torch::Tensor cols = inKeep;
            if (w.dim() == 2 && w.size(1) != inChannels) {  // flattened conv maps
                const int64_t spatial = w.size(1) / inChannels;
                cols = (inKeep.unsqueeze(1) * spatial + torch::arange(spatial).unsqueeze(0)).flatten();
            }
            w = w.index_select(1, cols);
        }
        if (k < keep.size()) {
            w = w.index_select(0, keep[k]);
            b = b.index_select(0, keep[k]);
            inKeep = keep[k];
        } else {
            inKeep = torch::Tensor();
        }
        inChannels = weightOf(from, i).size(0);
        auto tw = weightOf(to, i), tb = biasOf(to, i);
        if (tw.sizes() != w.sizes()) throw Error("pruning: layer " + std::to_string(i) + " shapes disagree");
        tw.copy_(w);
        tb.copy_(b);
    }
}

// The pruned network's weights as a file init_from reads (parameters l<i>_weight, l<i>_bias).
void saveWeights(torch::nn::Sequential& model, const std::string& path) {
    torch::jit::Module m("LathePrunedWeights");
    for (size_t i = 0; i < model->size(); ++i)
        for (const auto& p : model->ptr(i)->named_parameters(false))
            m.register_parameter("l" + std::to_string(i) + "_" + p.key(), p.value().detach().clone(), false);
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    m.save(path);
}

std::string stamp() {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

}  // namespace
}  // namespace compression

CompressResult torch_impl::pruneModel(Registry& registry, Store& store, const ModelRef& ref,
                                      const PruneOptions& options, const CompressControl& control) {
    using namespace compression;
    if (!(options.targetSparsity > 0 && options.targetSparsity < 1))
        throw ConfigError(
            "--target-sparsity must be above 0 and below 1 (the share of neurons/channels removed; got " +
            fmt(options.targetSparsity) + ")");
    if (options.rounds < 0 || options.rounds > 100)
        throw ConfigError("--rounds must be 0..100 (0 = from --per-round)");
    if (options.rounds == 0 && !(options.perRound > 0 && options.perRound < 1))
        throw ConfigError("--per-round must be above 0 and below 1 (got " + fmt(options.perRound) + ")");
    if (options.importance != "l1" && options.importance != "taylor")
        throw ConfigError("--importance must be l1 or taylor (got '" + options.importance + "')");
    if (options.finetuneEpochs < 1 || options.finetuneEpochs > 100000)
        throw ConfigError("--finetune-epochs must be 1..100000 (each round fine-tunes the pruned network)");
    const ModelVersion parent = registry.resolve(ref);
    const std::string what = parent.name + ":" + std::to_string(parent.version);
    RunSpec base = runSpecOf(store, parent, "pruning");
    if (base.model != "mlp" && base.model != "cnn")
        throw ConfigError("pruning removes mlp neurons and cnn channels; " + what + " is a " + base.model +
                          " model");
    std::map<std::string, std::string> run = options.run;
    run.emplace("epochs", std::to_string(options.finetuneEpochs));
    base = fineTuneSpec(base, run);
    if (!options.data.empty()) base.data = options.data;
    if (options.seed > 0) base.seed = options.seed;

    // Rounds: the kept share falls to (1 - target) geometrically.
    const double finalKeep = 1.0 - options.targetSparsity;
    int64_t rounds = options.rounds;
    if (rounds == 0)
        rounds = std::max<int64_t>(
            1,
            static_cast<int64_t>(std::ceil(std::log(finalKeep) / std::log(1.0 - options.perRound) - 1e-9)));
    std::vector<std::pair<std::string, double>> phases{{"loading", 0.03}};
    const double roundShare = 0.8 / static_cast<double>(rounds);
    for (int64_t r = 1; r <= rounds; ++r)
        phases.emplace_back("round " + std::to_string(r) + " of " + std::to_string(rounds), roundShare);
    phases.emplace_back("measuring", 0.12);
    phases.emplace_back("registering", 0.05);
    Progress progress(control, phases);
    progress.begin("loading");
    auto data = evaluationData(registry, &store, parent, options.data, options.seed);
    ArtifactInfo parentInfo;
    auto parentModule = loadArtifact(parent.path, torch::kCPU, parentInfo);
    parentModule.eval();
    const auto shape = sampleShapeOf(parent);
    const auto classes = classesOf(parent);

    RunSpec spec = base;
    auto model = makeModel(spec, shape, classes);
    loadInitialWeights(model, parent.path);
    model->eval();
    const auto weighted = weightedLayers(model);
    const std::vector<size_t> prunable(weighted.begin(), weighted.end() - 1);
    if (prunable.empty()) throw ConfigError(what + " has no hidden layer to prune");
    std::vector<int64_t> original;
    for (size_t i : prunable) original.push_back(weightOf(model, i).size(0));

    // Training samples for the taylor scores, as the network takes them.
    torch::Tensor tx, ty;
    if (options.importance == "taylor") {
        auto split = data::loadSplit(bindDataSet(spec, store.path()).used);
        std::vector<int64_t> s{split.train.size()};
        s.insert(s.end(), split.train.shape.begin(), split.train.shape.end());
        tx = torch::from_blob(split.train.x.data(), s, torch::kFloat).clone();
        ty = torch::from_blob(split.train.y.data(), {split.train.size()}, torch::kLong).clone();
        if (tx.size(0) == 0)
            throw ConfigError("the training split of " + spec.data + " is empty: no taylor scores");
    }

    CompressReport report;
    report.method = "prune";
    report.settings = {
        {"target_sparsity", fmt(options.targetSparsity)},
        {"rounds", std::to_string(rounds)},
        {"importance", options.importance},
        {"finetune_epochs", std::to_string(options.finetuneEpochs)},
        {"structure", base.model == "mlp" ? "neurons of hidden Linear layers"
                                          : "channels of Conv2d layers and neurons of the head"}};
    const std::string workDir = (fs::path(store.filesDir()) / "compress" /
                                 (parent.name + "-v" + std::to_string(parent.version) + "-prune-" + stamp()))
                                    .string();
    std::vector<int64_t> widths = original;
    for (int64_t r = 1; r <= rounds; ++r) {
        progress.begin("round " + std::to_string(r) + " of " + std::to_string(rounds));
        const double keepShare =
            r == rounds
                ? finalKeep
                : std::max(finalKeep, options.rounds > 0 ? std::pow(finalKeep, double(r) / double(rounds))
                                                         : std::pow(1.0 - options.perRound, double(r)));
        const auto scores = importance(model, prunable, options.importance, tx, ty);
        std::vector<torch::Tensor> keep;
        std::vector<int64_t> next;
        for (size_t k = 0; k < prunable.size(); ++k) {
            const int64_t n = std::max<int64_t>(
                1, std::min(widths[k], static_cast<int64_t>(
                                           std::llround(static_cast<double>(original[k]) * keepShare))));
            const auto top = std::get<1>(scores[k].topk(n));
            keep.push_back(std::get<0>(top.sort()).to(torch::kLong));  // kept, in their order
            next.push_back(n);
        }
        RunSpec pruned = shrunkSpec(spec, next);
        auto small = makeModel(pruned, shape, classes);
        copyKept(model, small, weighted, keep);
        const std::string init = workDir + "/round-" + std::to_string(r) + ".pt";
        saveWeights(small, init);
        pruned.initFrom = init;
        pruned.name = "prune " + what + " round " + std::to_string(r) + "/" + std::to_string(rounds);
        const auto tuned = trainRecorded(store, pruned, control, progress);
        model = trainedNetwork(store, tuned.runId, pruned, shape, classes);
        spec = pruned;
        widths = next;
        CompressReport::Round round;
        round.round = r;
        round.runId = tuned.runId;
        round.kept = static_cast<double>(std::accumulate(next.begin(), next.end(), int64_t{0})) /
                     static_cast<double>(std::accumulate(original.begin(), original.end(), int64_t{0}));
        round.accuracy = tuned.accuracy;
        round.parameters = parameterCount(*model);
        report.rounds.push_back(round);
        report.runs.push_back(tuned.runId);
    }
    for (size_t k = 0; k < prunable.size(); ++k) {
        CompressReport::Layer layer;
        const bool conv = isConv(model->ptr(prunable[k]).get());
        int index = 0;
        for (size_t j = 0; j < k; ++j) index += isConv(model->ptr(prunable[j]).get()) == conv ? 1 : 0;
        layer.name = std::string(conv ? "conv2d " : "linear ") + std::to_string(index);
        layer.kind = conv ? "conv2d" : "linear";
        const auto w = weightOf(model, prunable[k]);
        layer.inFeatures = w.size(1);
        layer.outFeatures = w.size(0);
        layer.parentOutFeatures = original[k];
        layer.change = "kept " + std::to_string(widths[k]) + " of " + std::to_string(original[k]) +
                       (conv ? " channels" : " neurons") + " (" + options.importance + ")";
        report.layers.push_back(layer);
    }
    ArtifactInfo info;
    auto child = exportedModule(store, report.runs.back(), info);
    info.source = "prune (" + fmt(options.targetSparsity) + " of the " +
                  (base.model == "mlp" ? "neurons" : "channels") + ", " + std::to_string(rounds) +
                  " rounds) of " + what;
    return measureAndRegister(registry, parent, parent.name, parentModule, child, data, report, info,
                              progress);
}

// ---- distillation -------------------------------------------------------------------------

namespace {

// "mlp:64,64", "cnn:8,16" or "cnn:8,16:32" over `spec`; or a run config file.
RunSpec studentSpec(const RunSpec& base, const std::string& text) {
    if (text.empty())
        throw ConfigError(
            "--student is required: a zoo spec (mlp:64,64, cnn:8,16 or cnn:8,16:32) or a run config file");
    if (fs::is_regular_file(text)) return loadRunSpec(text);
    RunSpec spec = base;
    std::vector<std::string> parts;
    std::stringstream ss(text);
    for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
    if (parts.size() >= 2 && parts[0] == "mlp" && parts.size() == 2) {
        spec.model = "mlp";
        setSpecValue(spec, "hidden", parts[1]);
        return spec;
    }
    if (parts.size() >= 2 && parts[0] == "cnn" && parts.size() <= 3) {
        spec.model = "cnn";
        setSpecValue(spec, "channels", parts[1]);
        if (parts.size() == 3) setSpecValue(spec, "head", parts[2]);
        return spec;
    }
    throw ConfigError("--student '" + text +
                      "' is neither a run config file nor a zoo spec: mlp:H1,H2… (hidden widths), cnn:C1,C2… "
                      "(channels) or cnn:C1,C2:H1 (channels, head widths)");
}

}  // namespace

CompressResult torch_impl::distillModel(Registry& registry, Store& store, const DistillOptions& options,
                                        const CompressControl& control) {
    using namespace compression;
    if (!(options.temperature > 0 && options.temperature <= 100))
        throw ConfigError("--temperature must be above 0 and at most 100");
    if (!(options.alpha >= 0 && options.alpha <= 1)) throw ConfigError("--alpha must be 0..1");
    const ModelVersion teacher = registry.resolve(options.teacher);
    const std::string what = teacher.name + ":" + std::to_string(teacher.version);
    const std::string name = options.name.empty() ? teacher.name : options.name;
    checkModelName(name);
    Progress progress(control,
                      {{"loading", 0.03}, {"training", 0.8}, {"measuring", 0.12}, {"registering", 0.05}});
    progress.begin("loading");
    // The teacher's data (its run's spec) unless --data names another; the student trains on it.
    RunSpec base;
    if (teacher.runId > 0 && store.run(teacher.runId))
        base = runSpecOf(store, teacher, "distillation");
    else if (options.data.empty())
        throw ConfigError("teacher " + what +
                          " was not trained in this workspace: give the data set to distil on with --data");
    base = studentSpec(base, options.student);
    if (!options.data.empty()) base.data = options.data;
    // ConfigError when the teacher's outputs do not match the data's classes (nothing recorded).
    auto data = evaluationData(registry, &store, teacher, base.data, base.seed);
    RunSpec spec = fineTuneSpec(base, options.run);
    spec.teacher = teacher.path;
    spec.distillTemperature = options.temperature;
    spec.distillAlpha = options.alpha;
    spec.distillHints = options.hints;
    spec.hintWeight = options.hintWeight;
    spec.attentionTransfer = options.attentionTransfer;
    if (spec.name.empty() || spec.name == base.name)
        spec.name = "distill " + what + " into " + options.student;
    validateOrThrow(spec);
    ArtifactInfo teacherInfo;
    auto teacherModule = loadArtifact(teacher.path, torch::kCPU, teacherInfo);
    teacherModule.eval();

    progress.begin("training");
    const auto tuned = trainRecorded(store, spec, control, progress);
    CompressReport report;
    report.method = "distill";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", options.temperature);
    report.settings = {{"student", options.student}, {"temperature", buf}, {"hints", options.hints}};
    std::snprintf(buf, sizeof buf, "%g", options.alpha);
    report.settings["alpha"] = buf;
    if (options.attentionTransfer > 0) {
        std::snprintf(buf, sizeof buf, "%g", options.attentionTransfer);
        report.settings["attention_transfer"] = buf;
    }
    if (options.hints != "none") {
        std::snprintf(buf, sizeof buf, "%g", options.hintWeight);
        report.settings["hint_weight"] = buf;
    }
    report.settings["epochs"] = std::to_string(spec.epochs);
    report.runs.push_back(tuned.runId);
    auto network = trainedNetwork(store, tuned.runId, spec, sampleShapeOf(teacher), classesOf(teacher));
    const auto weighted = weightedLayers(network);
    int linears = 0, convs = 0;
    for (size_t i : weighted) {
        const auto w = weightOf(network, i);
        CompressReport::Layer layer;
        const bool conv = w.dim() == 4;
        layer.kind = conv ? "conv2d" : "linear";
        layer.name = layer.kind + " " + std::to_string(conv ? convs++ : linears++);
        layer.inFeatures = w.size(1);
        layer.outFeatures = w.size(0);
        layer.change = "student layer";
        report.layers.push_back(layer);
    }
    ArtifactInfo info;
    auto child = exportedModule(store, tuned.runId, info);
    info.source = "distilled from " + what + " (" + options.student + ")";
    return measureAndRegister(registry, teacher, name, teacherModule, child, data, report, info, progress);
}

}  // namespace lathe::core
