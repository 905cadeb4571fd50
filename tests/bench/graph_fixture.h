#pragma once
// The model graph the graph benchmarks lay out and pan over (bench_graph_layout,
// bench_graph_view): a stack of transformer encoder layers as a reader would return it.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/model_graph.h"

namespace lathe::bench {

// A stack of transformer encoder layers as a reader would return it: 19 ops per layer under
// "encoder.layers.i.{self_attn,linear1,…}", residual edges around attention and the MLP.
inline core::ModelGraph encoderStack(int64_t targetNodes) {
    core::ModelGraph g;
    g.source = "synthetic";
    auto add = [&](const std::string& op, const std::string& category, const std::string& scope,
                   std::vector<int64_t> from) {
        core::GraphNode n;
        n.id = static_cast<int64_t>(g.nodes.size());
        n.op = op;
        n.category = category;
        n.scope = scope;
        n.name = scope + "/" + op + "_" + std::to_string(n.id);
        n.outputs.push_back({true, {8, 128, 512}, "float32"});
        for (int64_t f : from) g.edges.push_back({f, n.id, {true, {8, 128, 512}, "float32"}});
        g.nodes.push_back(n);
        return n.id;
    };
    int64_t x = add("input", "input", "", {});
    const int64_t layers = std::max<int64_t>(1, (targetNodes - 2) / 19);
    for (int64_t i = 0; i < layers; ++i) {
        const std::string s = "encoder.layers." + std::to_string(i);
        const std::string a = s + ".self_attn";
        const int64_t q = add("aten::linear", "linear", a + ".q_proj", {x});
        const int64_t k = add("aten::linear", "linear", a + ".k_proj", {x});
        const int64_t v = add("aten::linear", "linear", a + ".v_proj", {x});
        const int64_t qr = add("aten::reshape", "reshape", a, {q});
        const int64_t kr = add("aten::reshape", "reshape", a, {k});
        const int64_t vr = add("aten::reshape", "reshape", a, {v});
        const int64_t kt = add("aten::transpose", "reshape", a, {kr});
        const int64_t sc = add("aten::matmul", "linear", a, {qr, kt});
        const int64_t sm = add("aten::softmax", "activation", a, {sc});
        const int64_t ctx = add("aten::matmul", "linear", a, {sm, vr});
        const int64_t cr = add("aten::reshape", "reshape", a, {ctx});
        const int64_t o = add("aten::linear", "linear", a + ".out_proj", {cr});
        const int64_t r1 = add("aten::add", "elementwise", s, {x, o});
        const int64_t n1 = add("aten::layer_norm", "norm", s + ".norm1", {r1});
        const int64_t l1 = add("aten::linear", "linear", s + ".linear1", {n1});
        const int64_t act = add("aten::gelu", "activation", s + ".activation", {l1});
        const int64_t l2 = add("aten::linear", "linear", s + ".linear2", {act});
        const int64_t r2 = add("aten::add", "elementwise", s, {n1, l2});
        x = add("aten::layer_norm", "norm", s + ".norm2", {r2});
    }
    add("output", "output", "", {x});
    return g;
}

}  // namespace lathe::bench
