#pragma once
// Model graphs (core/src/graph/README.md): a model's ops as a neutral graph — op kind, printable
// attributes, input and output shapes, the parameters each op reads, estimated FLOPs, the module
// scope it came from — read from a TorchScript file (registered artifacts and run exports
// included) or an ONNX file. The graph is plain data: the CLI prints it as a summary, JSON or Graphviz DOT,
// and the workbench lays it out and draws it.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lathe::core {

struct GraphTensor {
    bool known = false;          // whether shape and dtype were found (from a run on an example input)
    std::vector<int64_t> shape;  // with the batch dimension
    std::string dtype;           // "float32", "int8", "int64", …
};

struct GraphNode {
    int64_t id = 0;        // its index in ModelGraph::nodes
    std::string name;      // unique: the module path when the module has one op, else path/op_k
    std::string op;        // as the source names it: "aten::conv2d", "lathe::linear_int8", "input"
    std::string category;  // conv, linear, norm, activation, pool, elementwise, reshape, attention,
                           // embedding, dropout, quantized, control, input, output, other
    std::string scope;     // module path, "layer1.0.conv1"; "" at the top level
    std::vector<std::pair<std::string, std::string>> attributes;  // constant arguments, printable
    std::vector<GraphTensor> inputs, outputs;                     // tensor arguments and results
    int64_t parameters = 0;      // elements of the parameters it reads (as PyTorch counts them: not
                                 // buffers such as batch norm's running statistics)
    int64_t parameterBytes = 0;  // bytes of the parameters and buffers it reads, as stored
    double flops = 0;            // estimated floating-point (or integer) operations, a multiply-add = 2
};

struct GraphEdge {
    int64_t from = 0, to = 0;  // node ids
    GraphTensor tensor;        // what flows along it
};

struct ModelGraph {
    std::string source;            // "torchscript" or "onnx"
    std::string name;              // the file, model version or run it was read from
    std::vector<GraphNode> nodes;  // in execution order: the input first, the output last
    std::vector<GraphEdge> edges;
    int64_t parameters = 0;             // the model's, each tensor counted once however many ops read it
    int64_t parameterBytes = 0;         // parameters and buffers
    double flops = 0;                   // sum over nodes, for one run on the example input
    std::vector<int64_t> exampleInput;  // the input shape shapes and FLOPs are for; {} when none ran
    std::vector<std::string> notes;     // what could not be determined, and why
};

struct GraphOptions {
    // The example input (batch included) run to find shapes. Empty: the artifact's declared input
    // with batch 1 when the file is a Lathe artifact; else the graph has no shapes or FLOPs.
    std::vector<int64_t> inputShape;
    // TorchScript through readModelGraph: LibTorch's own loader crashes (SIGSEGV) on some damaged
    // archives, so by default the file is read by a child process (`lathectl graph FILE --format
    // json`), which a crash ends instead of this program. True reads it here (what that child does).
    bool inProcess = false;
    std::string readerProgram;    // the child's program; "" = lathectl beside this program
    double readerTimeoutS = 300;  // the child is killed after this long (a file that never loads)
};

/// Reads a TorchScript file (loads LibTorch). Throws ConfigError, naming the file, for a missing
/// or unreadable file, one that is not TorchScript (truncated, another format), one that needs an
/// operator this process lacks, or an explicit input shape the model cannot run.
ModelGraph readTorchScriptGraph(const std::string& path, const GraphOptions& options = {});

/// Reads an ONNX file with libonnx's protobuf definitions and shape inference (no runtime; in
/// liblathe_graph). Symbolic dimensions (a dynamic batch) are taken as 1 unless
/// `options.inputShape` gives the first input's shape. Throws ConfigError, naming the file, for a
/// missing, empty, truncated or foreign file, or an opset newer than the reader knows.
ModelGraph readOnnxGraph(const std::string& path, const GraphOptions& options = {});

/// Either, by content: a zip archive is TorchScript, anything else is read as ONNX (in
/// liblathe_graph). TorchScript is read in a child process unless `options.inProcess` (see
/// GraphOptions): a file that crashes LibTorch's loader is a ConfigError naming the file and the
/// signal, one that never loads is stopped after `readerTimeoutS`.
ModelGraph readModelGraph(const std::string& path, const GraphOptions& options = {});

/// One object: source, name, parameters, parameter_bytes, flops, example_input, notes, nodes
/// (id, name, op, category, scope, attributes, inputs, outputs, parameters, parameter_bytes,
/// flops) and edges (from, to, shape, dtype). Shapes not known are null.
std::string graphJson(const ModelGraph& graph, int indent = -1);

/// graphJson's inverse. Throws ConfigError for text that is not such an object (a missing or
/// mistyped field, an edge to a node that is not there).
ModelGraph graphFromJson(const std::string& text);

/// Graphviz DOT: a cluster per module scope, nodes labelled with op and output shape, coloured by
/// category; rankdir TB, or LR when `horizontal`.
std::string graphDot(const ModelGraph& graph, bool horizontal = false);

/// A model summary's rows: every node that reads parameters or does arithmetic (not reshapes,
/// the input or the output), in execution order.
struct GraphLayer {
    std::string name, op, category;
    std::string outputShape;  // "[1, 16, 8, 8]", "?" when not known
    int64_t parameters = 0;
    double flops = 0;
};
std::vector<GraphLayer> graphLayers(const ModelGraph& graph);

/// Display colour (#rrggbb) of a node category, shared by the DOT output and the workbench.
const char* graphCategoryColor(const std::string& category);

/// "[1, 16, 8, 8]"; "?" when not known.
std::string graphShapeText(const GraphTensor& t);

}  // namespace lathe::core
