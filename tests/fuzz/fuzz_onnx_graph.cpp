// libFuzzer target: the ONNX model-graph reader (core/src/graph/onnx_graph.cpp, with libonnx's
// protobuf parser and shape inference) on arbitrary bytes. Besides crashes and sanitizer reports
// it checks the reader's promises: it returns a well-formed graph (ids are indices, edges join
// existing nodes, an output node last, totals that add up) or throws ConfigError; nothing else.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "graph/onnx_reader.h"
#include "lathe/core/error.h"

using namespace lathe::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    ModelGraph g;
    try {
        g = readOnnxGraphBytes(bytes, "fuzz.onnx");
    } catch (const ConfigError&) {
        return 0;
    }
    if (g.nodes.empty() || g.nodes.back().category != "output") std::abort();
    int64_t params = 0;
    double flops = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const auto& n = g.nodes[i];
        if (n.id != static_cast<int64_t>(i) || n.parameters < 0 || n.flops < 0) std::abort();
        if (__builtin_add_overflow(params, n.parameters, &params)) params = INT64_MAX;
        flops += n.flops;
    }
    for (const auto& e : g.edges)
        if (e.from < 0 || e.to < 0 || static_cast<size_t>(e.from) >= g.nodes.size() ||
            static_cast<size_t>(e.to) >= g.nodes.size())
            std::abort();
    // Each tensor counted once in the total; ops reading a shared one each count it.
    if (g.parameters < 0 || g.parameters > params) std::abort();
    if (!(g.flops == flops)) std::abort();
    (void)graphJson(g);
    return 0;
}
