// Quantization of a registered TorchScript model (compress.h): the graph pass that puts
// lathe::linear_int8 in place of aten::linear, and the side-by-side measurement of parent and
// compressed model (evaluate.h) that becomes the version's report.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_pooling.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/fuse_linear.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "compression/evaluate.h"
#include "compression/fake_quant.h"
#include "compression/observers.h"
#include "compression/quantized_ops.h"
#include "compression/retrain.h"
#include "lathe/core/compress.h"
#include "lathe/kernels/qgemm.h"
#include "serving/artifact_io.h"
#include "torch_backend.h"

namespace lathe::core {

namespace {

using torch::jit::Node;
using torch::jit::Value;

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::optional<std::vector<int64_t>> constPair(Value* v) {
    const auto iv = torch::jit::toIValue(v);
    if (!iv || !iv->isIntList()) return std::nullopt;
    auto list = iv->toIntVector();
    if (list.size() == 1) list.push_back(list[0]);
    if (list.size() != 2) return std::nullopt;
    return list;
}

// A layer the pass can replace: aten::linear or aten::conv2d (groups 1, integer padding) whose
// weight and bias are constants of the frozen graph.
struct Target {
    Node* node = nullptr;
    bool conv = false;
    at::Tensor weight;
    c10::optional<at::Tensor> bias;
    std::vector<int64_t> stride, padding, dilation;
    Node* relu = nullptr;  // the only user, fused into the op
};

std::vector<Target> targets(torch::jit::Graph& graph, bool withConv) {
    const auto linear = c10::Symbol::fromQualString("aten::linear");
    const auto conv2d = c10::Symbol::fromQualString("aten::conv2d");
    const auto relu = c10::Symbol::fromQualString("aten::relu");
    const auto relu_ = c10::Symbol::fromQualString("aten::relu_");
    std::vector<Target> out;
    for (Node* n : graph.nodes()) {
        Target t;
        t.node = n;
        t.conv = n->kind() == conv2d;
        if (n->kind() != linear && !(withConv && t.conv)) continue;
        const auto w = torch::jit::toIValue(n->input(1));
        if (!w || !w->isTensor() || !w->toTensor().is_floating_point()) continue;
        t.weight = w->toTensor();
        if (t.weight.dim() != (t.conv ? 4 : 2)) continue;
        const auto b = torch::jit::toIValue(n->input(2));
        if (!b) continue;  // a bias computed at run time: not ours to fold
        if (b->isTensor()) {
            if (b->toTensor().dim() != 1) continue;
            t.bias = b->toTensor().detach().to(torch::kFloat).contiguous();
        } else if (!b->isNone()) {
            continue;
        }
        if (t.conv) {
            const auto stride = constPair(n->input(3)), padding = constPair(n->input(4)),
                       dilation = constPair(n->input(5));
            const auto groups = torch::jit::toIValue(n->input(6));
            if (!stride || !padding || !dilation || !groups || !groups->isInt() || groups->toInt() != 1)
                continue;
            t.stride = *stride;
            t.padding = *padding;
            t.dilation = *dilation;
        }
        if (n->output()->uses().size() == 1) {
            Node* user = n->output()->uses()[0].user;
            if ((user->kind() == relu || user->kind() == relu_) && user->inputs().size() == 1) t.relu = user;
        }
        out.push_back(t);
    }
    return out;
}

// The module's forward as one flat graph with weights as constants.
torch::jit::Module frozenFlat(const torch::jit::Module& module) {
    auto copy = module.clone();
    copy.eval();
    auto graph = copy.get_method("forward").graph();
    torch::jit::Inline(*graph);
    torch::jit::FuseLinear(graph);  // addmm(b, x, W.t()) -> linear(x, W, b)
    // No numerics-changing rewrites (they could turn linear into matmul or fold conv into others).
    return torch::jit::freeze(copy, c10::nullopt, /*optimize_numerics=*/false);
}

// Puts lathe's int8 op in place of each target; inputScales[i] > 0: static, 0: per row.
void rewrite(const std::shared_ptr<torch::jit::Graph>& g, std::vector<Target>& ts,
             const std::vector<float>& inputScales, std::vector<CompressReport::Layer>& layers,
             const std::string& how) {
    using namespace compression;
    auto& graph = *g;
    int linears = 0, convs = 0;
    // Static: a layer whose result goes straight to the next quantized layer (or through a
    // flatten) hands it over as int8 codes of that layer's input scale.
    const auto flatten = c10::Symbol::fromQualString("aten::flatten");
    std::vector<double> outputScales(ts.size(), 0.0);
    for (size_t i = 0; i < ts.size() && !inputScales.empty(); ++i) {
        Value* result = ts[i].relu ? ts[i].relu->output() : ts[i].node->output();
        if (result->uses().size() != 1) continue;
        auto use = result->uses()[0];
        if (use.user->kind() == flatten && use.offset == 0 && use.user->output()->uses().size() == 1)
            use = use.user->output()->uses()[0];
        if (use.offset != 0) continue;  // x is a quantized op's first input
        for (size_t j = i + 1; j < ts.size(); ++j)
            if (ts[j].node == use.user && inputScales[j] > 0) outputScales[i] = inputScales[j];
    }
    for (size_t i = 0; i < ts.size(); ++i) {
        auto& t = ts[i];
        const auto packed = compression::packLinear(t.weight);
        torch::jit::WithInsertPoint guard(t.node);
        Value* biasValue = t.bias ? graph.insertConstant(*t.bias) : graph.insertConstant(c10::IValue());
        const double scale = inputScales.empty() ? 0.0 : inputScales[i];
        std::vector<torch::jit::NamedValue> args{t.node->input(0),
                                                 graph.insertConstant(packed.packed),
                                                 graph.insertConstant(packed.colSums),
                                                 graph.insertConstant(packed.scales),
                                                 biasValue,
                                                 t.weight.size(0)};
        CompressReport::Layer layer;
        layer.outFeatures = layer.parentOutFeatures = t.weight.size(0);
        if (t.conv) {
            args.emplace_back(t.weight.size(1));
            args.emplace_back(std::vector<int64_t>{t.weight.size(2), t.weight.size(3)});
            args.emplace_back(t.stride);
            args.emplace_back(t.padding);
            args.emplace_back(t.dilation);
            layer.name = "conv2d " + std::to_string(convs++);
            layer.kind = "conv2d";
            layer.inFeatures = t.weight.size(1);
        } else {
            args.emplace_back(t.weight.size(1));
            layer.name = "linear " + std::to_string(linears++);
            layer.kind = "linear";
            layer.inFeatures = t.weight.size(1);
        }
        args.emplace_back(t.relu != nullptr);
        args.emplace_back(scale);
        args.emplace_back(outputScales[i]);
        Value* out = graph.insert(c10::Symbol::fromQualString(t.conv ? kConv2dInt8 : kLinearInt8), args);
        char scaleText[64] = "";
        if (scale > 0) std::snprintf(scaleText, sizeof scaleText, " (scale %.4g)", scale);
        layer.change = "int8 weights per channel, " +
                       (scale > 0 ? how + scaleText : std::string("int8 inputs per row")) +
                       (t.relu ? ", fused relu" : "") + (outputScales[i] > 0 ? ", int8 output" : "");
        layers.push_back(layer);
        if (t.relu) {
            t.relu->output()->replaceAllUsesWith(out);
            t.relu->destroy();
        } else {
            t.node->output()->replaceAllUsesWith(out);
        }
        t.node->destroy();
    }
    torch::jit::EliminateDeadCode(g);
    torch::jit::ConstantPooling(g);
}

// Saved and loaded again: what the registry will hold, and a module whose executor has never
// seen the graph before the rewrite.
torch::jit::Module roundTrip(const torch::jit::Module& m) {
    std::stringstream buf;
    m.save(buf);
    return torch::jit::load(buf);
}

}  // namespace

namespace compression {

torch::jit::Module quantizeDynamic(const torch::jit::Module& module,
                                   std::vector<CompressReport::Layer>& layers) {
    ensureQuantizedOpsRegistered();
    auto frozen = frozenFlat(module);
    auto graph = frozen.get_method("forward").graph();
    auto ts = targets(*graph, /*withConv=*/false);
    if (ts.empty()) return frozen;
    rewrite(graph, ts, {}, layers, "");
    return roundTrip(frozen);
}

torch::jit::Module quantizeStatic(const torch::jit::Module& module, const torch::Tensor& calibration,
                                  int64_t batches, int64_t batchSize, const std::string& observer,
                                  double percentile, std::vector<CompressReport::Layer>& layers,
                                  Progress& progress) {
    ensureQuantizedOpsRegistered();
    auto frozen = frozenFlat(module);
    auto graph = frozen.get_method("forward").graph();
    auto ts = targets(*graph, /*withConv=*/true);
    if (ts.empty()) return frozen;
    // Observers on every target's input, fed by the calibration batches.
    const auto kind = Observer::kindFromName(observer);
    std::vector<Observer> observers(ts.size(), Observer(kind, percentile));
    std::vector<Node*> observeNodes;
    for (size_t i = 0; i < ts.size(); ++i) {
        torch::jit::WithInsertPoint guard(ts[i].node);
        Value* seen = graph->insert(c10::Symbol::fromQualString(kObserve),
                                    {ts[i].node->input(0), static_cast<int64_t>(i)});
        observeNodes.push_back(seen->node());
        ts[i].node->replaceInput(0, seen);
    }
    {
        auto instrumented = roundTrip(frozen);
        ObserveScope scope([&](int64_t id, const at::Tensor& x) {
            if (id < 0 || id >= static_cast<int64_t>(observers.size())) return;
            const auto c = x.detach().to(torch::kFloat).contiguous();
            observers[static_cast<size_t>(id)].observe(c.data_ptr<float>(), static_cast<size_t>(c.numel()));
        });
        c10::InferenceMode guard;
        const int64_t n = calibration.size(0);
        for (int64_t b = 0; b < batches; ++b) {
            const int64_t start = (b * batchSize) % n;
            instrumented.forward({calibration.narrow(0, start, std::min(batchSize, n - start))});
            progress.within(static_cast<double>(b + 1) / static_cast<double>(batches));
        }
    }
    for (Node* o : observeNodes) {
        o->output()->replaceAllUsesWith(o->input(0));
        o->destroy();
    }
    std::vector<float> scales;
    for (const auto& o : observers) scales.push_back(o.scale());
    rewrite(graph, ts, scales, layers, "int8 inputs per tensor from " + observer);
    return roundTrip(frozen);
}

torch::jit::Module quantizeWithScales(const torch::jit::Module& module, const std::vector<float>& scales,
                                      std::vector<CompressReport::Layer>& layers, const std::string& how) {
    ensureQuantizedOpsRegistered();
    auto frozen = frozenFlat(module);
    auto graph = frozen.get_method("forward").graph();
    auto ts = targets(*graph, /*withConv=*/true);
    if (ts.size() != scales.size())
        throw Error("the model has " + std::to_string(ts.size()) + " Linear/Conv2d layers and " +
                    std::to_string(scales.size()) + " learned input ranges");
    if (ts.empty()) return frozen;
    rewrite(graph, ts, scales, layers, how);
    return roundTrip(frozen);
}

}  // namespace compression

CompressResult torch_impl::quantizeModel(Registry& registry, Store* store, const ModelRef& ref,
                                         const QuantizeOptions& options, const CompressControl& control) {
    const bool dynamic = options.mode == "dynamic", qat = options.mode == "qat";
    if (!dynamic && !qat && options.mode != "static")
        throw ConfigError("unknown quantization mode '" + options.mode + "' (dynamic, static or qat)");
    if (options.mode == "static") {
        // ConfigError for an unknown observer or a histogram percentile out of range, before any work.
        compression::Observer(compression::Observer::kindFromName(options.observer), options.percentile);
        if (options.calibBatches < 1 || options.calibBatches > 100000)
            throw ConfigError("--calib-batches must be 1..100000 (got " +
                              std::to_string(options.calibBatches) + ")");
    }
    if (qat && !store) throw ConfigError("quantization-aware training records a run: it needs a workspace");
    std::vector<std::pair<std::string, double>> phases{{"loading", 0.1},
                                                       {dynamic ? "quantizing" : "calibrating", 0.2},
                                                       {"measuring", 0.6},
                                                       {"registering", 0.1}};
    if (qat)
        phases = {{"loading", 0.03},
                  {"training", 0.7},
                  {"quantizing", 0.05},
                  {"measuring", 0.17},
                  {"registering", 0.05}};
    compression::Progress progress(control, phases);
    progress.begin("loading");
    const ModelVersion parent = registry.resolve(ref);
    const std::string what = parent.name + ":" + std::to_string(parent.version);
    RunSpec qatSpec;
    if (qat) {
        qatSpec = compression::runSpecOf(*store, parent, "quantization-aware training");
        if (qatSpec.model == "embed")
            throw ConfigError(
                "quantization-aware training quantizes the Linear and Conv2d layers of mlp and cnn "
                "models; " +
                what + " is an embed model (use --mode dynamic)");
        std::map<std::string, std::string> run = options.run;
        char lr[32];
        std::snprintf(lr, sizeof lr, "%g", qatSpec.lr / 10);
        run.emplace("epochs", "3");
        run.emplace("lr", lr);
        if (!options.data.empty()) run.emplace("data", options.data);
        if (options.seed > 0) run.emplace("seed", std::to_string(options.seed));
        qatSpec = compression::fineTuneSpec(qatSpec, run);
        if (qatSpec.minLr > qatSpec.lr) qatSpec.minLr = 0;
        qatSpec.qat = true;
        qatSpec.initFrom = parent.path;
        if (!options.run.count("name")) qatSpec.name = "qat " + what;
        validateOrThrow(qatSpec);
    }
    auto data = compression::evaluationData(registry, store, parent, options.data, options.seed);
    if (options.mode == "static" && data.calibration.size(0) == 0)
        throw ConfigError("the calibration set (the training split of " + data.name +
                          ") is empty: nothing to "
                          "calibrate " +
                          what + " on");
    ArtifactInfo info;
    torch::jit::Module parentModule = loadArtifact(parent.path, torch::kCPU, info);
    parentModule.eval();

    CompressReport report;
    report.method = "quantize";
    report.settings = {{"mode", options.mode}, {"weights", "int8, symmetric, per output channel"}};
    torch::jit::Module quantized;
    if (qat) {
        report.settings["activations"] = "int8, symmetric, per tensor, ranges learned in training";
        report.settings["epochs"] = std::to_string(qatSpec.epochs);
        char lr[32];
        std::snprintf(lr, sizeof lr, "%g", qatSpec.lr);
        report.settings["lr"] = lr;
        progress.begin("training");
        const auto tuned = compression::trainRecorded(*store, qatSpec, control, progress);
        report.runs.push_back(tuned.runId);
        progress.begin("quantizing");
        auto network = compression::trainedNetwork(
            *store, tuned.runId, qatSpec, compression::sampleShapeOf(parent), compression::classesOf(parent));
        const auto scales = compression::qatInputScales(network);
        auto trained = compression::exportedModule(*store, tuned.runId, info);
        info.source = "quantize (qat int8, run " + std::to_string(tuned.runId) + ") of " + what;
        try {
            quantized = compression::quantizeWithScales(trained, scales, report.layers,
                                                        "int8 inputs per tensor from QAT");
        } catch (const c10::Error& ex) {
            throw ConfigError("cannot quantize " + what + ": " + firstLine(ex.what_without_backtrace()));
        }
    } else {
        progress.begin(dynamic ? "quantizing" : "calibrating");
        if (dynamic) {
            report.settings["activations"] = "int8, symmetric, per row at run time";
        } else {
            report.settings["activations"] = "int8, symmetric, per tensor, calibrated";
            report.settings["observer"] = options.observer;
            report.settings["calib_batches"] = std::to_string(options.calibBatches);
            if (options.observer == "histogram") {
                char p[32];
                std::snprintf(p, sizeof p, "%g", options.percentile);
                report.settings["percentile"] = p;
            }
        }
        try {
            quantized = dynamic ? compression::quantizeDynamic(parentModule, report.layers)
                                : compression::quantizeStatic(parentModule, data.calibration,
                                                              options.calibBatches, 32, options.observer,
                                                              options.percentile, report.layers, progress);
        } catch (const c10::Error& ex) {
            throw ConfigError("cannot quantize " + what + ": " + firstLine(ex.what_without_backtrace()));
        }
        info.source = "quantize (" + options.mode + " int8) of " + what;
    }
    if (report.layers.empty())
        throw ConfigError("model " + what + " has no layer with constant weights to quantize (" +
                          (dynamic ? "dynamic quantization replaces Linear layers: aten::linear / addmm"
                                   : "static quantization replaces Linear and Conv2d layers (groups 1)") +
                          ")");
    return compression::measureAndRegister(registry, parent, parent.name, parentModule, quantized, data,
                                           report, info, progress);
}

}  // namespace lathe::core
