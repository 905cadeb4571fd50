// TorchScript file -> ModelGraph (model_graph.h). The forward method is inlined (one flat op graph,
// each node keeping the chain of module calls it came from: its scope); structural nodes
// (constants, attribute reads, list and tuple plumbing, scalar arithmetic on sizes) are folded
// into the ops that use them: constants become attributes, attribute reads of tensors become the
// op's parameters, lists and tuples pass their producers' edges through. Shapes come from one run
// of a copy of the graph on an example input, with every op's tensor results added to its outputs.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph_names.h"
#include "lathe/core/error.h"
#include "lathe/core/model_graph.h"
#include "serving/artifact_io.h"
#include "torch_backend.h"

namespace lathe::core {

namespace {

using torch::jit::Node;
using torch::jit::Value;

std::string dtypeName(c10::ScalarType t) {
    switch (t) {
        case c10::ScalarType::Float:
            return "float32";
        case c10::ScalarType::Double:
            return "float64";
        case c10::ScalarType::Half:
            return "float16";
        case c10::ScalarType::BFloat16:
            return "bfloat16";
        case c10::ScalarType::Char:
            return "int8";
        case c10::ScalarType::Byte:
            return "uint8";
        case c10::ScalarType::Short:
            return "int16";
        case c10::ScalarType::Int:
            return "int32";
        case c10::ScalarType::Long:
            return "int64";
        case c10::ScalarType::Bool:
            return "bool";
        default:
            return c10::toString(t);
    }
}

bool isTensorType(const c10::TypePtr& t) { return t->isSubtypeOf(*c10::TensorType::get()); }

// The op's short name ("conv2d" of "aten::conv2d"), without a trailing in-place underscore.
std::string baseName(const std::string& op) {
    auto p = op.rfind("::");
    std::string s = p == std::string::npos ? op : op.substr(p + 2);
    if (s.size() > 1 && s.back() == '_' && s[s.size() - 2] != '_') s.pop_back();
    return s;
}

std::string categoryOf(const std::string& op) {
    const std::string b = baseName(op);
    auto any = [&](std::initializer_list<const char*> names) {
        return std::any_of(names.begin(), names.end(), [&](const char* n) { return b == n; });
    };
    auto contains = [&](const char* part) { return b.find(part) != std::string::npos; };
    if (op.rfind("lathe::", 0) == 0) return b.find("conv") != std::string::npos ? "conv" : "quantized";
    if (op.rfind("quantized::", 0) == 0) return "quantized";
    if (op == "prim::If" || op == "prim::Loop") return "control";
    if (contains("conv")) return "conv";
    if (contains("attention") || contains("transformer") || b == "scaled_dot_product_attention")
        return "attention";
    if (any({"linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "einsum", "addmv", "mv", "bilinear"}))
        return "linear";
    if (contains("norm")) return "norm";
    if (contains("pool")) return "pool";
    if (contains("dropout")) return "dropout";
    if (contains("embedding")) return "embedding";
    if (any({"relu",      "relu6",      "gelu",      "sigmoid",     "tanh",      "silu",
             "hardtanh",  "leaky_relu", "softmax",   "log_softmax", "hardswish", "hardsigmoid",
             "elu",       "selu",       "mish",      "softplus",    "prelu",     "glu",
             "threshold", "clamp",      "clamp_min", "clamp_max"}))
        return "activation";
    if (any({"view",       "reshape",      "flatten",   "permute", "transpose", "t",
             "contiguous", "squeeze",      "unsqueeze", "cat",     "concat",    "stack",
             "select",     "slice",        "chunk",     "split",   "expand",    "expand_as",
             "narrow",     "index_select", "unflatten", "repeat",  "to",        "type_as",
             "detach",     "clone",        "unbind",    "movedim", "zeros",     "ones",
             "zeros_like", "ones_like",    "empty",     "arange",  "full",      "tensor",
             "copy"}))
        return "reshape";
    if (any({"add",   "sub",         "mul",    "div",  "rsub",        "neg",         "pow",     "sqrt",
             "rsqrt", "exp",         "log",    "abs",  "mean",        "sum",         "max",     "min",
             "where", "masked_fill", "eq",     "ne",   "lt",          "gt",          "le",      "ge",
             "erf",   "reciprocal",  "square", "norm", "cumsum",      "argmax",      "sign",    "floor",
             "ceil",  "round",       "var",    "std",  "logical_not", "bitwise_not", "baddbmm_"}))
        return "elementwise";
    return "other";
}

// Nodes shown: ops with a tensor among their results, and control flow. Everything in prim::
// but If/Loop is plumbing; so are ops that only compute Python values (sizes, flags).
bool shown(const Node* n) {
    const auto kind = n->kind();
    if (kind == c10::prim::If || kind == c10::prim::Loop) return true;
    if (kind.is_prim()) return false;
    for (const Value* o : n->outputs())
        if (isTensorType(o->type()))
            return true;
        else if (auto tt = o->type()->cast<c10::TupleType>())
            for (const auto& e : tt->elements())
                if (isTensorType(e)) return true;
    return false;
}

std::string ivalueText(const c10::IValue& v) {
    if (v.isInt()) return std::to_string(v.toInt());
    if (v.isDouble()) {
        std::ostringstream s;
        s << v.toDouble();
        return s.str();
    }
    if (v.isBool()) return v.toBool() ? "true" : "false";
    if (v.isString()) return v.toStringRef();
    if (v.isIntList()) {
        std::string s = "[";
        const auto l = v.toIntVector();
        for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + std::to_string(l[i]);
        return s + "]";
    }
    if (v.isDevice()) return v.toDevice().str();
    if (v.isTensor() && v.toTensor().numel() == 1) {
        std::ostringstream s;
        s << v.toTensor().item().toDouble();
        return s.str();
    }
    std::ostringstream s;
    s << v;
    return s.str();
}

// A parameter as an attribute: "[16, 1, 3, 3] float32".
std::string tensorText(const at::Tensor& t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "] " + dtypeName(t.scalar_type());
}

struct Reader {
    torch::jit::Module module;
    std::shared_ptr<torch::jit::Graph> graph;
    ModelGraph out;
    std::unordered_map<const Node*, int64_t> nodeId;           // shown node -> id
    std::unordered_map<const Value*, int64_t> producer;        // tensor value -> shown node id
    std::unordered_map<const Value*, GraphTensor> shapes;      // after the run
    std::unordered_set<const c10::TensorImpl*> countedParams;  // for the model's total

    // The tensor an attribute-read chain from `self` reaches, or undefined; `buffer` says whether
    // it is a registered buffer (batch norm's running statistics) rather than a parameter.
    at::Tensor attributeTensor(const Value* v, bool& buffer) {
        buffer = false;
        std::vector<std::string> names;
        const Value* cur = v;
        while (cur->node()->kind() == c10::prim::GetAttr) {
            names.push_back(cur->node()->s(c10::attr::name));
            cur = cur->node()->input();
        }
        if (cur != graph->inputs()[0] || names.empty()) return {};
        c10::IValue iv = module._ivalue();
        for (auto it = names.rbegin(); it != names.rend(); ++it) {
            if (!iv.isObject()) return {};
            const auto obj = iv.toObject();
            const auto slot = obj->type()->findAttributeSlot(*it);
            if (!slot) return {};
            buffer = obj->type()->is_buffer(*slot);
            iv = obj->getSlot(*slot);
        }
        return iv.isTensor() ? iv.toTensor() : at::Tensor();
    }

    // A tensor the op reads from the model: a parameter (or a frozen model's constant, or a plain
    // tensor attribute), counted in parameters; a buffer only in the bytes.
    void addParam(GraphNode& node, const at::Tensor& t, bool buffer) {
        if (!t.defined()) return;
        const auto bytes = static_cast<int64_t>(t.numel() * t.element_size());
        if (!buffer) node.parameters += t.numel();
        node.parameterBytes += bytes;
        if (countedParams.insert(t.unsafeGetTensorImpl()).second) {
            if (!buffer) out.parameters += t.numel();
            out.parameterBytes += bytes;
        }
    }

    // Walks an input back through plumbing to the shown nodes (or the graph input) it comes from,
    // collecting edges, parameters and constants.
    void trace(const Value* v, GraphNode& node, const std::string& argName, std::set<int64_t>& from,
               int depth = 0) {
        if (depth > 64) return;
        if (auto it = producer.find(v); it != producer.end()) {
            from.insert(it->second);
            return;
        }
        const Node* p = v->node();
        if (p->kind() == c10::prim::GetAttr) {
            bool buffer = false;
            const auto t = attributeTensor(v, buffer);
            addParam(node, t, buffer);
            if (t.defined() && !argName.empty()) node.attributes.emplace_back(argName, tensorText(t));
            return;
        }
        if (p->kind() == c10::prim::Constant) {
            const auto iv = torch::jit::toIValue(v);
            if (!iv) return;
            if (iv->isTensor() && iv->toTensor().dim() > 0) {
                // A frozen model's weights. (0-d constants are scalars a trace recorded.)
                addParam(node, iv->toTensor(), false);
                if (!argName.empty()) node.attributes.emplace_back(argName, tensorText(iv->toTensor()));
            } else if (!iv->isNone() && !argName.empty()) {
                node.attributes.emplace_back(argName, ivalueText(*iv));
            }
            return;
        }
        if (p->kind() == c10::prim::ListConstruct || p->kind() == c10::prim::TupleConstruct) {
            // A list of constants is one attribute; a list of tensors passes its producers through.
            bool allConstant = !p->inputs().empty();
            for (const Value* i : p->inputs())
                allConstant = allConstant && i->node()->kind() == c10::prim::Constant;
            if (allConstant && !argName.empty()) {
                std::string s = "[";
                for (size_t i = 0; i < p->inputs().size(); ++i) {
                    const auto iv = torch::jit::toIValue(p->inputs()[i]);
                    s += (i ? ", " : "") + (iv ? ivalueText(*iv) : std::string("?"));
                }
                node.attributes.emplace_back(argName, s + "]");
                return;
            }
            for (const Value* i : p->inputs()) trace(i, node, "", from, depth + 1);
            return;
        }
        if (!shown(p) && p->kind() != c10::prim::Param)
            for (const Value* i : p->inputs()) trace(i, node, "", from, depth + 1);
    }

    std::string scopeOf(const Node* n) {
        std::string scope;
        auto cs = n->callstack();
        if (!cs) return scope;
        c10::optional<torch::jit::InlinedCallStackPtr> frame = *cs;
        while (frame) {
            if (auto mi = (*frame)->module_instance()) {
                const auto name = mi->instance_name();
                if (!name.empty()) scope += (scope.empty() ? "" : ".") + name;
            }
            frame = (*frame)->callee();
        }
        return scope;
    }

    void build() {
        // The data input.
        GraphNode input;
        input.id = 0;
        input.name = "input";
        input.op = "input";
        input.category = "input";
        out.nodes.push_back(input);
        for (size_t i = 1; i < graph->inputs().size(); ++i) producer[graph->inputs()[i]] = 0;

        for (Node* n : graph->nodes()) {
            if (!shown(n)) continue;
            GraphNode node;
            node.id = static_cast<int64_t>(out.nodes.size());
            node.op = n->kind().toQualString();
            node.category = categoryOf(node.op);
            node.scope = scopeOf(n);
            const auto* schema = n->maybeSchema();
            std::set<int64_t> from;
            for (size_t i = 0; i < n->inputs().size(); ++i) {
                std::string arg = schema && i < schema->arguments().size() ? schema->arguments()[i].name()
                                                                           : "arg" + std::to_string(i);
                trace(n->inputs()[i], node, arg, from);
            }
            for (int64_t f : from) out.edges.push_back({f, node.id, {}});
            nodeId[n] = node.id;
            for (const Value* o : n->outputs()) producer[o] = node.id;
            out.nodes.push_back(std::move(node));
        }
        GraphNode output;
        output.id = static_cast<int64_t>(out.nodes.size());
        output.name = "output";
        output.op = "output";
        output.category = "output";
        std::set<int64_t> from;
        for (const Value* o : graph->outputs()) trace(o, output, "", from);
        for (int64_t f : from) out.edges.push_back({f, output.id, {}});
        out.nodes.push_back(output);
        nameGraphNodes(out);
    }

    // Runs a copy of forward returning every shown op's tensor results; fills the shapes.
    void runShapes(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
        std::vector<Value*> probes;
        for (Node* n : graph->nodes())
            if (nodeId.count(n))
                for (Value* o : n->outputs())
                    if (isTensorType(o->type())) probes.push_back(o);
        std::vector<Value*> all(graph->outputs().begin(), graph->outputs().end());
        const size_t originals = all.size();
        all.insert(all.end(), probes.begin(), probes.end());
        auto* tuple = graph->appendNode(graph->createTuple(all));
        while (!graph->outputs().empty()) graph->eraseOutput(0);
        graph->registerOutput(tuple->output());
        torch::jit::GraphFunction fn("lathe_graph_shapes", graph, nullptr);
        torch::NoGradGuard noGrad;
        at::Tensor x = dtype == at::kLong ? torch::zeros(shape, torch::kLong) : torch::rand(shape);
        const auto result = fn({module._ivalue(), x}).toTupleRef().elements();
        for (size_t i = 0; i < probes.size(); ++i) {
            const auto& r = result[originals + i];
            if (!r.isTensor()) continue;
            const auto& t = r.toTensor();
            GraphTensor g;
            g.known = true;
            g.shape = t.sizes().vec();
            g.dtype = dtypeName(t.scalar_type());
            shapes[probes[i]] = g;
        }
        GraphTensor in;
        in.known = true;
        in.shape = shape;
        in.dtype = dtypeName(x.scalar_type());
        for (size_t i = 1; i < graph->inputs().size(); ++i) shapes[graph->inputs()[i]] = in;
    }

    void attachShapes() {
        // Outputs of each node, inputs from its edges' tensors, the edges themselves.
        std::unordered_map<int64_t, GraphTensor> firstOut;
        for (const auto& [v, t] : shapes) {
            const auto it = producer.find(v);
            if (it == producer.end()) continue;
            if (!firstOut.count(it->second)) firstOut[it->second] = t;
        }
        for (Node* n : graph->nodes()) {
            const auto it = nodeId.find(n);
            if (it == nodeId.end()) continue;
            auto& node = out.nodes[static_cast<size_t>(it->second)];
            for (const Value* o : n->outputs())
                if (auto s = shapes.find(o); s != shapes.end()) node.outputs.push_back(s->second);
            for (const Value* i : n->inputs())
                if (auto s = shapes.find(i); s != shapes.end()) node.inputs.push_back(s->second);
            if (!node.outputs.empty()) firstOut[node.id] = node.outputs[0];
        }
        if (auto s = shapes.find(graph->inputs().size() > 1 ? graph->inputs()[1] : nullptr);
            s != shapes.end())
            out.nodes[0].outputs.push_back(s->second), firstOut[0] = s->second;
        for (auto& e : out.edges)
            if (auto f = firstOut.find(e.from); f != firstOut.end()) e.tensor = f->second;
        auto& output = out.nodes.back();
        for (const auto& e : out.edges)
            if (e.to == output.id) output.inputs.push_back(e.tensor);
    }
};

int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
}

// The dimensions at the start of "[16, 1, 3, 3] float32" (or "[3, 3]"); {} when there are none.
std::vector<int64_t> dims(const std::string& text) {
    std::vector<int64_t> d;
    if (text.empty() || text[0] != '[') return d;
    std::stringstream in(text.substr(1, text.find(']') - 1));
    std::string part;
    while (std::getline(in, part, ',')) try {
            d.push_back(std::stoll(part));
        } catch (...) {
            return {};
        }
    return d;
}

std::string attribute(const GraphNode& n, const std::string& key) {
    for (const auto& [k, v] : n.attributes)
        if (k == key) return v;
    return "";
}

// Estimated FLOPs of one node from its shapes (a multiply-add = 2). Unknown ops: 0.
double flopsOf(const GraphNode& n) {
    if (n.outputs.empty() || !n.outputs[0].known) return 0;
    const double out = static_cast<double>(numel(n.outputs[0].shape));
    const std::string b = baseName(n.op);
    auto inShape = [&](size_t i) -> const std::vector<int64_t>* {
        return i < n.inputs.size() && n.inputs[i].known ? &n.inputs[i].shape : nullptr;
    };
    if (n.category == "conv" && n.op.rfind("lathe::", 0) != 0) {
        // Per output element: one multiply-add per weight of its output channel, plus the bias.
        const auto w = dims(attribute(n, "weight"));
        if (w.size() < 2 || w[0] == 0) return 0;
        const double perOut = static_cast<double>(numel(w) / w[0]);
        return 2 * out * perOut + (attribute(n, "bias").empty() ? 0 : out);
    }
    if (n.op == "lathe::conv2d_int8") {
        const auto in = attribute(n, "in_channels");
        const auto kernel = dims(attribute(n, "kernel"));
        if (in.empty() || kernel.size() != 2) return 0;
        return 2 * out * static_cast<double>(std::stoll(in) * kernel[0] * kernel[1]);
    }
    if (n.op == "lathe::linear_int8") {
        const auto in = attribute(n, "in_features");
        return in.empty() ? 0 : 2 * out * static_cast<double>(std::stoll(in));
    }
    if (n.category == "linear") {
        // y = x W^T (+ b): the contracted dimension is x's last.
        const auto* x = inShape(b == "addmm" || b == "baddbmm" ? 1 : 0);
        if (!x || x->empty()) return 0;
        return 2 * out * static_cast<double>(x->back());
    }
    if (n.category == "norm") return 4 * out;
    if (n.category == "activation" || n.category == "elementwise") {
        double in = 0;
        for (const auto& t : n.inputs)
            if (t.known) in = std::max(in, static_cast<double>(numel(t.shape)));
        return (b == "softmax" || b == "log_softmax" ? 4 : 1) * std::max(in, out);
    }
    if (n.category == "pool") {
        const auto* x = inShape(0);
        return x ? static_cast<double>(numel(*x)) : out;  // every input element compared or added once
    }
    return 0;
}

// One line of why a run failed: the interpreter wraps the op's error in a TorchScript traceback
// ("... RuntimeError: Given groups=1, weight of size ..."); c10::Error has it on its first line.
std::string reasonOf(const std::exception& ex) {
    const auto* c10 = dynamic_cast<const c10::Error*>(&ex);
    const std::string what = c10 ? c10->what_without_backtrace() : ex.what();
    const auto at = what.rfind("Error: ");
    std::string line = at == std::string::npos ? what : what.substr(at + 7);
    line = line.substr(0, line.find('\n'));
    return line.empty() ? what.substr(0, what.find('\n')) : line;
}

}  // namespace

ModelGraph torch_impl::readTorchScriptGraph(const std::string& path, const GraphOptions& options) {
    Reader r;
    ArtifactInfo info;
    bool lathe = false;
    r.module = loadAnyScript(path, torch::kCPU, info, lathe);  // ConfigError for a bad file
    r.module.eval();
    if (!r.module.find_method("forward"))
        throw ConfigError(path + " is TorchScript without a forward method: nothing to draw");
    r.out.source = "torchscript";
    r.out.name = path;
    r.graph = r.module.get_method("forward").graph()->copy();
    torch::jit::Inline(*r.graph);
    r.build();

    std::vector<int64_t> shape = options.inputShape;
    c10::ScalarType dtype = at::kFloat;
    const bool given = !shape.empty();
    if (lathe && !info.signature.inputs.empty()) {
        const auto& in = info.signature.inputs[0];
        if (in.datatype == "INT64") dtype = at::kLong;
        if (!given) {
            shape = in.shape;
            for (auto& d : shape) d = d < 0 ? 1 : d;
        }
    }
    if (shape.empty()) {
        r.out.notes.push_back(
            "no shapes or FLOPs: the file declares no input; give an example input shape "
            "(--input-shape 1,3,224,224)");
    } else if (r.graph->inputs().size() != 2) {
        r.out.notes.push_back("no shapes or FLOPs: forward takes " +
                              std::to_string(r.graph->inputs().size() - 1) +
                              " inputs, the example run feeds one");
    } else {
        try {
            r.runShapes(shape, dtype);
            r.attachShapes();
            r.out.exampleInput = shape;
        } catch (const std::exception& ex) {  // c10::Error, or the interpreter's JITException
            const std::string msg = reasonOf(ex);
            std::string s = "[";
            for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
            s += "]";
            if (given) throw ConfigError(path + " cannot run on an input of shape " + s + ": " + msg);
            r.out.notes.push_back("no shapes or FLOPs: the example input " + s + " did not run: " + msg);
        }
    }
    for (auto& n : r.out.nodes) {
        n.flops = flopsOf(n);
        r.out.flops += n.flops;
    }
    return r.out;
}

}  // namespace lathe::core
