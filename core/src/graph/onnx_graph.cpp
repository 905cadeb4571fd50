// ONNX files as model graphs (model_graph.h), parsed with the protobuf definitions and the shape
// inference of Debian's libonnx (no runtime): initializers become parameters, Constant nodes and
// aliases of initializers fold into their consumers, scopes come from the exporter's node names
// ("/layer1/layer1.0/conv1/Conv"), shapes from value_info and ONNX's shape inference.
#include <onnx/common/version.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "graph_names.h"
#include "lathe/core/error.h"
#include "lathe/core/model_graph.h"
#include "onnx_reader.h"

namespace lathe::core {

namespace {

std::string dtypeName(int t) {
    switch (t) {
        case onnx::TensorProto_DataType_FLOAT:
            return "float32";
        case onnx::TensorProto_DataType_UINT8:
            return "uint8";
        case onnx::TensorProto_DataType_INT8:
            return "int8";
        case onnx::TensorProto_DataType_UINT16:
            return "uint16";
        case onnx::TensorProto_DataType_INT16:
            return "int16";
        case onnx::TensorProto_DataType_INT32:
            return "int32";
        case onnx::TensorProto_DataType_INT64:
            return "int64";
        case onnx::TensorProto_DataType_STRING:
            return "string";
        case onnx::TensorProto_DataType_BOOL:
            return "bool";
        case onnx::TensorProto_DataType_FLOAT16:
            return "float16";
        case onnx::TensorProto_DataType_DOUBLE:
            return "float64";
        case onnx::TensorProto_DataType_UINT32:
            return "uint32";
        case onnx::TensorProto_DataType_UINT64:
            return "uint64";
        case onnx::TensorProto_DataType_BFLOAT16:
            return "bfloat16";
        default:
            return "?";
    }
}

int64_t dtypeBytes(int t) {
    switch (t) {
        case onnx::TensorProto_DataType_DOUBLE:
        case onnx::TensorProto_DataType_INT64:
        case onnx::TensorProto_DataType_UINT64:
            return 8;
        case onnx::TensorProto_DataType_FLOAT:
        case onnx::TensorProto_DataType_INT32:
        case onnx::TensorProto_DataType_UINT32:
            return 4;
        case onnx::TensorProto_DataType_FLOAT16:
        case onnx::TensorProto_DataType_BFLOAT16:
        case onnx::TensorProto_DataType_INT16:
        case onnx::TensorProto_DataType_UINT16:
            return 2;
        default:
            return 1;
    }
}

// Elements of a shape, saturating at 2^53: a file may declare any dimensions.
constexpr int64_t kMaxElements = int64_t{1} << 53;
int64_t elements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
        d = std::max<int64_t>(d, 0);
        if (d != 0 && n > kMaxElements / d) return kMaxElements;
        n *= d;
    }
    return n;
}

int64_t addSaturated(int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

// A value's type as a GraphTensor: known when it is a tensor whose every dimension is a number.
GraphTensor tensorOf(const onnx::TypeProto& type) {
    GraphTensor t;
    if (!type.has_tensor_type()) return t;
    const auto& tt = type.tensor_type();
    if (!tt.has_shape()) return t;
    for (const auto& d : tt.shape().dim()) {
        // A negative size (a damaged file; fuzz.onnx_graph found one) is no shape either.
        if (!d.has_dim_value() || d.dim_value() < 0) return GraphTensor{};
        t.shape.push_back(d.dim_value());
    }
    t.known = true;
    t.dtype = dtypeName(tt.elem_type());
    return t;
}

std::string attributeText(const onnx::AttributeProto& a) {
    auto list = [](const auto& values) {
        std::ostringstream s;
        s << "[";
        int i = 0;
        for (const auto& v : values) {
            if (i++) s << ", ";
            if (i > 16) {
                s << "…";
                break;
            }
            s << v;
        }
        s << "]";
        return s.str();
    };
    switch (a.type()) {
        case onnx::AttributeProto_AttributeType_FLOAT: {
            std::ostringstream s;
            s << a.f();
            return s.str();
        }
        case onnx::AttributeProto_AttributeType_INT:
            return std::to_string(a.i());
        case onnx::AttributeProto_AttributeType_STRING:
            return a.s().substr(0, 200);
        case onnx::AttributeProto_AttributeType_FLOATS:
            return list(a.floats());
        case onnx::AttributeProto_AttributeType_INTS:
            return list(a.ints());
        case onnx::AttributeProto_AttributeType_STRINGS:
            return list(a.strings());
        case onnx::AttributeProto_AttributeType_TENSOR: {
            std::vector<int64_t> dims(a.t().dims().begin(), a.t().dims().end());
            GraphTensor t{true, dims, dtypeName(a.t().data_type())};
            return "tensor " + graphShapeText(t);
        }
        case onnx::AttributeProto_AttributeType_GRAPH:
            return "graph (" + std::to_string(a.g().node_size()) + " nodes)";
        default:
            return "…";
    }
}

std::string categoryOf(const std::string& domain, const std::string& op) {
    if (!domain.empty() && domain != "ai.onnx") return "other";
    static const std::map<std::string, const char*> m{
        {"Conv", "conv"},
        {"ConvTranspose", "conv"},
        {"ConvInteger", "quantized"},
        {"QLinearConv", "quantized"},
        {"QLinearMatMul", "quantized"},
        {"MatMulInteger", "quantized"},
        {"QuantizeLinear", "quantized"},
        {"DequantizeLinear", "quantized"},
        {"DynamicQuantizeLinear", "quantized"},
        {"Gemm", "linear"},
        {"MatMul", "linear"},
        {"Einsum", "linear"},
        {"BatchNormalization", "norm"},
        {"InstanceNormalization", "norm"},
        {"LayerNormalization", "norm"},
        {"GroupNormalization", "norm"},
        {"LpNormalization", "norm"},
        {"MeanVarianceNormalization", "norm"},
        {"LRN", "norm"},
        {"Relu", "activation"},
        {"LeakyRelu", "activation"},
        {"PRelu", "activation"},
        {"Sigmoid", "activation"},
        {"HardSigmoid", "activation"},
        {"HardSwish", "activation"},
        {"Tanh", "activation"},
        {"Elu", "activation"},
        {"Selu", "activation"},
        {"Celu", "activation"},
        {"Softplus", "activation"},
        {"Softsign", "activation"},
        {"Softmax", "activation"},
        {"LogSoftmax", "activation"},
        {"Clip", "activation"},
        {"Gelu", "activation"},
        {"Mish", "activation"},
        {"ThresholdedRelu", "activation"},
        {"MaxPool", "pool"},
        {"AveragePool", "pool"},
        {"GlobalAveragePool", "pool"},
        {"GlobalMaxPool", "pool"},
        {"LpPool", "pool"},
        {"GlobalLpPool", "pool"},
        {"MaxRoiPool", "pool"},
        {"Dropout", "dropout"},
        {"Gather", "embedding"},
        {"If", "control"},
        {"Loop", "control"},
        {"Scan", "control"},
        {"Reshape", "reshape"},
        {"Flatten", "reshape"},
        {"Transpose", "reshape"},
        {"Squeeze", "reshape"},
        {"Unsqueeze", "reshape"},
        {"Concat", "reshape"},
        {"Split", "reshape"},
        {"Slice", "reshape"},
        {"Expand", "reshape"},
        {"Tile", "reshape"},
        {"Shape", "reshape"},
        {"Size", "reshape"},
        {"Cast", "reshape"},
        {"CastLike", "reshape"},
        {"Identity", "reshape"},
        {"Pad", "reshape"},
        {"GatherElements", "reshape"},
        {"GatherND", "reshape"},
        {"ScatterND", "reshape"},
        {"ScatterElements", "reshape"},
        {"ConstantOfShape", "reshape"},
        {"Range", "reshape"},
        {"DepthToSpace", "reshape"},
        {"SpaceToDepth", "reshape"},
        {"Resize", "reshape"},
        {"Upsample", "reshape"},
    };
    const auto it = m.find(op);
    if (it != m.end()) return it->second;
    static const std::set<std::string> elementwise{"Add",
                                                   "Sub",
                                                   "Mul",
                                                   "Div",
                                                   "Pow",
                                                   "Sqrt",
                                                   "Exp",
                                                   "Log",
                                                   "Abs",
                                                   "Neg",
                                                   "Reciprocal",
                                                   "Floor",
                                                   "Ceil",
                                                   "Round",
                                                   "Sign",
                                                   "Erf",
                                                   "Min",
                                                   "Max",
                                                   "Mean",
                                                   "Sum",
                                                   "Where",
                                                   "Equal",
                                                   "Less",
                                                   "Greater",
                                                   "LessOrEqual",
                                                   "GreaterOrEqual",
                                                   "Not",
                                                   "And",
                                                   "Or",
                                                   "Xor",
                                                   "Mod",
                                                   "ReduceMean",
                                                   "ReduceSum",
                                                   "ReduceMax",
                                                   "ReduceMin",
                                                   "ReduceProd",
                                                   "ReduceL1",
                                                   "ReduceL2",
                                                   "ReduceSumSquare",
                                                   "ReduceLogSum",
                                                   "ReduceLogSumExp",
                                                   "ArgMax",
                                                   "ArgMin",
                                                   "CumSum",
                                                   "Sin",
                                                   "Cos",
                                                   "Tan",
                                                   "IsNaN",
                                                   "IsInf",
                                                   "BitShift",
                                                   "Trilu",
                                                   "TopK",
                                                   "NonZero"};
    return elementwise.count(op) ? "elementwise" : "other";
}

// "/layer1/layer1.0/conv1/Conv" -> "layer1.0.conv1": PyTorch's exporter names a node by the
// module calls it ran in; nodes named otherwise ("Conv_12", "node7") have no scope.
std::string scopeOf(const std::string& name) {
    if (name.size() < 2 || name[0] != '/') return "";
    std::vector<std::string> parts;
    std::stringstream s(name.substr(1));
    std::string part;
    while (std::getline(s, part, '/'))
        if (!part.empty()) parts.push_back(part);
    // Real exporters nest a few dozen modules at most; a file may name a node with thousands of
    // parts (merging below is quadratic in them, clusters nest as deep): no scope then.
    if (parts.size() < 2 || parts.size() > 64) return "";
    parts.pop_back();  // the op ("Conv", "Add_1")
    // Each part repeats the tail of the path so far ("layer2", "layer2.0", "downsample",
    // "downsample.0"): merge on the longest overlap at a dot.
    std::string scope;
    for (const auto& p : parts) {
        size_t keep = scope.size();  // how much of `scope` precedes p
        for (size_t start = 0; start < scope.size(); start = scope.find('.', start) + 1) {
            const std::string_view tail = std::string_view(scope).substr(start);
            if (p.size() > tail.size() && p.compare(0, tail.size(), tail) == 0 && p[tail.size()] == '.') {
                keep = start;
                break;
            }
            if (scope.find('.', start) == std::string::npos) break;
        }
        if (keep == scope.size())
            scope += (scope.empty() ? "" : ".") + p;
        else
            scope = scope.substr(0, keep) + p;
    }
    return scope;
}

std::string readAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(path + ": no such file or not readable");
    std::ostringstream s;
    s << in.rdbuf();
    if (!in.good() && !in.eof()) throw ConfigError(path + ": read failed");
    return s.str();
}

struct OnnxReader {
    const std::string& path;
    const std::string* bytes = nullptr;  // the file's content when given, else read from path
    onnx::ModelProto model;
    ModelGraph out;
    std::unordered_map<std::string, GraphTensor> types;  // value name -> tensor type
    struct Param {
        std::vector<int64_t> dims;
        int type = 0;
    };
    std::unordered_map<std::string, Param> params;                      // initializers and aliases
    std::unordered_map<std::string, const onnx::NodeProto*> constants;  // Constant nodes' outputs
    std::unordered_map<std::string, int64_t> producer;                  // value -> shown node id
    std::map<std::string, int> opsets;

    explicit OnnxReader(const std::string& p) : path(p) {}

    void parse() {
        const std::string owned = this->bytes ? std::string() : readAll(path);
        const std::string& bytes = this->bytes ? *this->bytes : owned;
        if (bytes.empty()) throw ConfigError(path + " is empty, not an ONNX model");
        if (bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0)
            throw ConfigError(path + " is a zip archive (TorchScript?), not an ONNX model");
        if (bytes.size() > (size_t{2} << 30) - 1)
            throw ConfigError(path + " is over 2 GiB, more than protobuf parses; save it with external data");
        if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) || !model.has_graph() ||
            model.ir_version() <= 0)
            throw ConfigError(path +
                              " is not an ONNX model (not a ModelProto with a graph: truncated, or "
                              "another format)");
        const auto& range = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
        for (const auto& o : model.opset_import()) {
            const std::string domain = o.domain() == "ai.onnx" ? "" : o.domain();
            opsets[domain] = static_cast<int>(o.version());
            const auto known = range.find(domain);
            if (domain.empty() && known != range.end() && o.version() > known->second.second)
                throw ConfigError(path + " uses ONNX opset " + std::to_string(o.version()) +
                                  "; this reader (onnx " + std::string(onnx::LAST_RELEASE_VERSION) +
                                  ") knows opsets up to " + std::to_string(known->second.second) +
                                  ": export with opset_version=" + std::to_string(known->second.second) +
                                  " or lower");
            if (domain.empty() && o.version() < 1)
                throw ConfigError(path + " declares ONNX opset " + std::to_string(o.version()));
        }
        if (!opsets.count("")) {
            if (model.opset_import_size() == 0)
                throw ConfigError(path +
                                  " declares no opset (opset_import is empty): not a valid ONNX model");
        }
    }

    // Fixes the graph inputs' shapes (the example input, or 1 for each symbolic dimension), then
    // runs ONNX's shape inference; collects every value's type.
    void inferShapes(const GraphOptions& options) {
        auto* g = model.mutable_graph();
        std::set<std::string> inits;
        for (const auto& t : g->initializer()) inits.insert(t.name());
        std::vector<std::string> symbolic;
        bool first = true;
        for (auto& in : *g->mutable_input()) {
            if (inits.count(in.name()) || !in.type().has_tensor_type()) continue;
            auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
            if (first && !options.inputShape.empty()) {
                shape->clear_dim();
                for (int64_t d : options.inputShape) shape->add_dim()->set_dim_value(d);
                out.exampleInput = options.inputShape;
            } else {
                for (auto& d : *shape->mutable_dim())
                    if (!d.has_dim_value() || d.dim_value() < 0) {
                        symbolic.push_back(
                            in.name() + "[" +
                            (d.has_dim_value() ? std::to_string(d.dim_value()) : d.dim_param()) + "]");
                        d.set_dim_value(1);
                    }
                if (first) {
                    std::vector<int64_t> dims;
                    for (const auto& d : shape->dim()) dims.push_back(d.dim_value());
                    out.exampleInput = dims;
                }
            }
            first = false;
        }
        if (!symbolic.empty()) {
            std::string list;
            for (const auto& s : symbolic) list += (list.empty() ? "" : ", ") + s;
            out.notes.push_back("symbolic dimensions taken as 1: " + list +
                                " (give --input-shape to choose)");
        }
        onnx::ShapeInferenceOptions opts;
        opts.check_type = false;
        opts.error_mode = 0;  // an op it cannot infer leaves its outputs unknown
        opts.enable_data_propagation = true;
        try {
            onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), opts);
        } catch (const std::exception& ex) {
            std::string why = ex.what();
            why = why.substr(0, why.find('\n'));
            if (!options.inputShape.empty())
                throw ConfigError(path + ": shape inference failed for input shape " +
                                  graphShapeText(GraphTensor{true, options.inputShape, ""}) + ": " + why);
            out.notes.push_back("shape inference stopped: " + why);
        }
        auto collect = [&](const auto& values) {
            for (const auto& v : values) types[v.name()] = tensorOf(v.type());
        };
        collect(g->input());
        collect(g->value_info());
        collect(g->output());
        if (!options.inputShape.empty()) {
            // An explicit input shape the model cannot take: inference leaves the output unknown or
            // reports nothing; find a node whose declared rank it violates (Conv on a 2-d input).
            for (const auto& o : g->output())
                if (!types[o.name()].known)
                    out.notes.push_back("the output " + o.name() +
                                        "'s shape is unknown for this input shape");
        }
    }

    void collectParameters() {
        for (const auto& t : model.graph().initializer()) {
            Param p;
            p.dims.assign(t.dims().begin(), t.dims().end());
            p.type = t.data_type();
            params[t.name()] = p;
        }
        for (const auto& n : model.graph().node()) {
            if (n.op_type() == "Constant" && n.domain().empty() && n.output_size() == 1)
                constants[n.output(0)] = &n;
            // The exporter shares an initializer between layers through Identity nodes.
            if (n.op_type() == "Identity" && n.input_size() == 1 && n.output_size() == 1 &&
                params.count(n.input(0))) {
                Param p = params[n.input(0)];
                params[n.output(0)] = p;
            }
        }
    }

    bool folded(const onnx::NodeProto& n) const {
        if (n.op_type() == "Constant" && n.domain().empty()) return true;
        return n.op_type() == "Identity" && n.input_size() == 1 && params.count(n.input(0));
    }

    // Which inputs of an op are parameters in PyTorch's sense (trained); the rest of the
    // initializers it reads (batch norm's running statistics) are buffers, counted in bytes only.
    static bool isBuffer(const onnx::NodeProto& n, int input) {
        return n.op_type() == "BatchNormalization" && input >= 3;
    }

    ModelGraph read(const GraphOptions& options) {
        parse();
        out.source = "onnx";
        out.name = path;
        inferShapes(options);
        collectParameters();
        const auto& g = model.graph();
        std::set<std::string> initNames;
        for (const auto& t : g.initializer()) initNames.insert(t.name());

        for (const auto& in : g.input()) {
            if (initNames.count(in.name())) continue;
            GraphNode node;
            node.id = static_cast<int64_t>(out.nodes.size());
            node.name = out.nodes.empty() ? "input" : in.name();
            node.op = "input";
            node.category = "input";
            node.outputs.push_back(types[in.name()]);
            node.attributes.push_back({"name", in.name()});
            producer[in.name()] = node.id;
            out.nodes.push_back(std::move(node));
        }
        if (out.nodes.empty()) {
            GraphNode node;
            node.name = "input";
            node.op = node.category = "input";
            out.nodes.push_back(std::move(node));
            out.notes.push_back("the graph declares no input");
        }
        std::set<std::string> counted;  // parameters already in the model's totals
        std::set<std::string> unknownOps;
        int subgraphs = 0;
        for (const auto& n : g.node()) {
            if (folded(n)) continue;
            GraphNode node;
            node.id = static_cast<int64_t>(out.nodes.size());
            node.op =
                n.domain().empty() || n.domain() == "ai.onnx" ? n.op_type() : n.domain() + "::" + n.op_type();
            node.category = categoryOf(n.domain(), n.op_type());
            node.scope = scopeOf(n.name());
            if (!n.name().empty()) node.attributes.push_back({"onnx_name", n.name()});
            for (const auto& a : n.attribute()) {
                node.attributes.push_back({a.name(), attributeText(a)});
                if (a.type() == onnx::AttributeProto_AttributeType_GRAPH ||
                    a.type() == onnx::AttributeProto_AttributeType_GRAPHS)
                    ++subgraphs;
            }
            if ((n.domain().empty() || n.domain() == "ai.onnx") && opsets.count("") &&
                !onnx::OpSchemaRegistry::Schema(n.op_type(), opsets[""], ""))
                unknownOps.insert(n.op_type());
            std::set<int64_t> from;
            for (int i = 0; i < n.input_size(); ++i) {
                const std::string& v = n.input(i);
                if (v.empty()) continue;  // an omitted optional input
                if (const auto p = params.find(v); p != params.end()) {
                    const auto& prm = p->second;
                    const int64_t count = elements(prm.dims);
                    const int64_t bytes = count * dtypeBytes(prm.type);  // <= 2^56: no overflow
                    GraphTensor t{true, prm.dims, dtypeName(prm.type)};
                    node.attributes.push_back(
                        {"input " + std::to_string(i) + " (" + v + ")", graphShapeText(t) + " " + t.dtype});
                    node.inputs.push_back(t);
                    node.parameterBytes = addSaturated(node.parameterBytes, bytes);
                    const bool buffer = isBuffer(n, i);
                    if (!buffer) node.parameters = addSaturated(node.parameters, count);
                    // Each named tensor once. An Identity alias counts as its own: PyTorch's exporter
                    // folds equal-valued initializers (two zero biases) into one plus Identity nodes,
                    // where the model has two parameters.
                    if (counted.insert(v).second) {
                        if (!buffer) out.parameters = addSaturated(out.parameters, count);
                        out.parameterBytes = addSaturated(out.parameterBytes, bytes);
                    }
                    continue;
                }
                if (const auto c = constants.find(v); c != constants.end()) {
                    std::string text = "?";
                    for (const auto& a : c->second->attribute()) text = attributeText(a);
                    node.attributes.push_back({"input " + std::to_string(i), text});
                    continue;
                }
                node.inputs.push_back(types.count(v) ? types[v] : GraphTensor{});
                if (const auto pr = producer.find(v); pr != producer.end()) from.insert(pr->second);
            }
            // Gather is an embedding lookup when it reads a table of parameters, else indexing.
            if (n.op_type() == "Gather" && node.parameters == 0) node.category = "reshape";
            for (const auto& o : n.output()) {
                if (o.empty()) continue;
                node.outputs.push_back(types.count(o) ? types[o] : GraphTensor{});
                producer[o] = node.id;
            }
            for (int64_t f : from) {
                GraphEdge e{f, node.id, {}};
                // The tensor along the edge: the first input that the producer made.
                for (const auto& v : n.input())
                    if (producer.count(v) && producer[v] == f && types.count(v)) {
                        e.tensor = types[v];
                        break;
                    }
                out.edges.push_back(e);
            }
            out.nodes.push_back(std::move(node));
        }
        GraphNode output;
        output.id = static_cast<int64_t>(out.nodes.size());
        output.name = output.op = output.category = "output";
        std::set<int64_t> from;
        for (const auto& o : g.output()) {
            output.inputs.push_back(types.count(o.name()) ? types[o.name()] : GraphTensor{});
            if (const auto pr = producer.find(o.name()); pr != producer.end())
                if (from.insert(pr->second).second)
                    out.edges.push_back(
                        {pr->second, output.id, types.count(o.name()) ? types[o.name()] : GraphTensor{}});
        }
        out.nodes.push_back(output);
        nameGraphNodes(out);
        for (auto& n : out.nodes) {
            n.flops = onnxFlops(n);
            if (!(n.flops >= 0) || !std::isfinite(n.flops)) n.flops = 0;  // shapes a damaged file got wrong
            out.flops += n.flops;
        }
        if (!unknownOps.empty()) {
            std::string list;
            for (const auto& o : unknownOps) list += (list.empty() ? "" : ", ") + o;
            out.notes.push_back("ops not in ONNX opset " + std::to_string(opsets[""]) + ": " + list +
                                " (no shapes or FLOPs for them)");
        }
        if (subgraphs)
            out.notes.push_back(std::to_string(subgraphs) + " control-flow subgraphs shown as one node each");
        for (const auto& [domain, version] : opsets)
            if (!domain.empty())
                out.notes.push_back("custom op domain " + domain + " (version " + std::to_string(version) +
                                    "): its ops have no shapes or FLOPs");
        bool anyKnown = false;
        for (const auto& n : out.nodes)
            for (const auto& t : n.outputs) anyKnown |= t.known;
        if (!anyKnown) out.exampleInput.clear();
        return std::move(out);
    }

    std::string attribute(const GraphNode& n, const std::string& key) const {
        for (const auto& [k, v] : n.attributes)
            if (k == key) return v;
        return "";
    }

    double onnxFlops(const GraphNode& n) const {
        if (n.outputs.empty() || !n.outputs[0].known) return 0;
        const double outN = static_cast<double>(elements(n.outputs[0].shape));
        auto in = [&](size_t i) -> const GraphTensor* {
            return i < n.inputs.size() && n.inputs[i].known ? &n.inputs[i] : nullptr;
        };
        const std::string& op = n.op;
        if (op == "Conv" || op == "ConvTranspose") {
            const auto* w = in(1);
            if (!w || w->shape.size() < 2 || w->shape[0] == 0) return 0;
            if (op == "ConvTranspose") {
                const auto* x = in(0);
                // Every input element meets every weight of its group's output channels.
                return x ? 2 * static_cast<double>(elements(x->shape)) *
                               static_cast<double>(elements(w->shape) / w->shape[0])
                         : 0;
            }
            const double perOut = static_cast<double>(elements(w->shape) / w->shape[0]);
            return 2 * outN * perOut + (n.inputs.size() > 2 ? outN : 0);
        }
        if (op == "Gemm") {
            const auto* a = in(0);
            if (!a || a->shape.size() != 2) return 0;
            const bool transA = attribute(n, "transA") == "1";
            const double k = static_cast<double>(transA ? a->shape[0] : a->shape[1]);
            return 2 * outN * k + (n.inputs.size() > 2 ? outN : 0);
        }
        if (op == "MatMul") {
            const auto* a = in(0);
            if (!a || a->shape.empty()) return 0;
            return 2 * outN * static_cast<double>(a->shape.back());
        }
        if (n.category == "norm") return 4 * outN;
        if (n.category == "activation" || n.category == "elementwise") {
            double biggest = outN;
            for (const auto& t : n.inputs)
                if (t.known) biggest = std::max(biggest, static_cast<double>(elements(t.shape)));
            return (op == "Softmax" || op == "LogSoftmax" ? 4 : 1) * biggest;
        }
        if (n.category == "pool") {
            const auto* x = in(0);
            return x ? static_cast<double>(elements(x->shape)) : outN;
        }
        return 0;
    }
};

}  // namespace

namespace {

ModelGraph readOnnx(const std::string& path, const std::string* bytes, const GraphOptions& options) {
    for (int64_t d : options.inputShape)
        if (d <= 0) throw ConfigError("--input-shape: every dimension must be positive");
    try {
        OnnxReader reader(path);
        reader.bytes = bytes;
        return reader.read(options);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& ex) {
        // Protobuf and ONNX report with exceptions of their own (bad_alloc on absurd sizes included).
        throw ConfigError(path + ": not a readable ONNX model: " + std::string(ex.what()).substr(0, 300));
    }
}

}  // namespace

ModelGraph readOnnxGraph(const std::string& path, const GraphOptions& options) {
    return readOnnx(path, nullptr, options);
}

ModelGraph readOnnxGraphBytes(const std::string& bytes, const std::string& name,
                              const GraphOptions& options) {
    return readOnnx(name, &bytes, options);
}

}  // namespace lathe::core
