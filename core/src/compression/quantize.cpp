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

#include "compression/evaluate.h"
#include "compression/quantized_ops.h"
#include "lathe/core/compress.h"
#include "lathe/kernels/qgemm.h"
#include "serving/artifact_io.h"
#include "torch_backend.h"

namespace lathe::core {

namespace {

using torch::jit::Node;
using torch::jit::Value;

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// The linear layers of the frozen graph that have constant weights, in graph order.
std::vector<Node*> constantLinears(torch::jit::Graph& graph) {
    std::vector<Node*> out;
    for (Node* n : graph.nodes()) {
        if (n->kind() != c10::Symbol::fromQualString("aten::linear")) continue;
        const auto w = torch::jit::toIValue(n->input(1));
        if (!w || !w->isTensor() || w->toTensor().dim() != 2 || !w->toTensor().is_floating_point()) continue;
        const auto b = torch::jit::toIValue(n->input(2));
        if (!b) continue;  // a bias computed at run time: not ours to fold
        if (!b->isNone() && !(b->isTensor() && b->toTensor().dim() == 1)) continue;
        out.push_back(n);
    }
    return out;
}

}  // namespace

namespace compression {

torch::jit::Module quantizeDynamic(const torch::jit::Module& module,
                                   std::vector<CompressReport::Layer>& layers) {
    ensureQuantizedOpsRegistered();
    auto copy = module.clone();
    copy.eval();
    {
        auto graph = copy.get_method("forward").graph();
        torch::jit::Inline(*graph);
        torch::jit::FuseLinear(graph);  // addmm(b, x, W.t()) -> linear(x, W, b)
    }
    // Weights become constants; no numerics-changing rewrites (they could turn linear into matmul).
    auto frozen = torch::jit::freeze(copy, c10::nullopt, /*optimize_numerics=*/false);
    auto graph = frozen.get_method("forward").graph();
    const auto relu = c10::Symbol::fromQualString("aten::relu");
    const auto relu_ = c10::Symbol::fromQualString("aten::relu_");
    int index = 0;
    for (Node* n : constantLinears(*graph)) {
        const auto w = torch::jit::toIValue(n->input(1))->toTensor();
        const auto b = torch::jit::toIValue(n->input(2));
        const auto packed = compression::packLinear(w);
        Node* reluNode = nullptr;
        if (n->output()->uses().size() == 1) {
            Node* user = n->output()->uses()[0].user;
            if ((user->kind() == relu || user->kind() == relu_) && user->inputs().size() == 1)
                reluNode = user;
        }
        torch::jit::WithInsertPoint guard(n);
        Value* biasValue = n->input(2);
        if (b && b->isTensor())
            biasValue = graph->insertConstant(b->toTensor().detach().to(torch::kFloat).contiguous());
        Value* out = graph->insert(
            c10::Symbol::fromQualString(kLinearInt8),
            {n->input(0), graph->insertConstant(packed.packed), graph->insertConstant(packed.colSums),
             graph->insertConstant(packed.scales), biasValue, w.size(0), w.size(1), reluNode != nullptr});
        CompressReport::Layer layer;
        layer.name = "linear " + std::to_string(index++);
        layer.kind = "linear";
        layer.inFeatures = w.size(1);
        layer.outFeatures = layer.parentOutFeatures = w.size(0);
        layer.change =
            std::string("int8 weights per channel, int8 inputs per row") + (reluNode ? ", fused relu" : "");
        layers.push_back(layer);
        if (reluNode) {
            reluNode->output()->replaceAllUsesWith(out);
            reluNode->destroy();
        } else {
            n->output()->replaceAllUsesWith(out);
        }
        n->destroy();
    }
    torch::jit::EliminateDeadCode(graph);
    torch::jit::ConstantPooling(graph);
    return frozen;
}

}  // namespace compression

CompressResult torch_impl::quantizeModel(Registry& registry, const Store* store, const ModelRef& ref,
                                         const QuantizeOptions& options, const CompressControl& control) {
    if (options.mode != "dynamic")
        throw ConfigError("unknown quantization mode '" + options.mode + "' (this Lathe has: dynamic)");
    compression::Progress progress(
        control, {{"loading", 0.1}, {"quantizing", 0.1}, {"measuring", 0.7}, {"registering", 0.1}});
    progress.begin("loading");
    const ModelVersion parent = registry.resolve(ref);
    auto data = compression::evaluationData(registry, store, parent, options.data, options.seed);
    ArtifactInfo info;
    torch::jit::Module parentModule;
    parentModule = loadArtifact(parent.path, torch::kCPU, info);
    parentModule.eval();

    progress.begin("quantizing");
    CompressReport report;
    report.method = "quantize";
    report.settings = {{"mode", "dynamic"},
                       {"weights", "int8, symmetric, per output channel"},
                       {"activations", "int8, symmetric, per row at run time"}};
    torch::jit::Module quantized;
    try {
        quantized = compression::quantizeDynamic(parentModule, report.layers);
    } catch (const c10::Error& ex) {
        throw ConfigError("cannot quantize " + parent.name + ":" + std::to_string(parent.version) + ": " +
                          firstLine(ex.what_without_backtrace()));
    }
    if (report.layers.empty())
        throw ConfigError("model " + parent.name + ":" + std::to_string(parent.version) +
                          " has no Linear layer with constant weights to quantize (dynamic quantization "
                          "replaces aten::linear / addmm layers)");

    progress.begin("measuring");
    compression::measurePair(parentModule, quantized, data, report, progress);
    report.parentSizeBytes = parent.sizeBytes;
    report.kernel = kernels::gemmIsaName(kernels::bestGemmIsa());

    progress.begin("registering");
    ArtifactInfo out = info;
    out.metrics = {{"val/accuracy", report.accuracy}};
    out.source = "quantize (dynamic int8) of " + parent.name + ":" + std::to_string(parent.version);
    ModelVersion lineage;
    lineage.parentVersion = parent.version;
    nlohmann::json derivation{{"method", report.method},
                              {"parent", parent.name + ":" + std::to_string(parent.version)}};
    for (const auto& [k, v] : report.settings) derivation[k] = v;
    lineage.derivation = derivation.dump();
    // The size is the file's: known only once written, so the report is completed after.
    CompressResult result;
    lineage.report = report.toJson();
    result.version = registerModule(registry, parent.name, quantized, out, lineage);
    report.sizeBytes = result.version.sizeBytes;
    result.report = report;
    registry.setReport(parent.name, result.version.version, report.toJson());
    result.version.report = report.toJson();
    progress.done();
    return result;
}

}  // namespace lathe::core
