// serve --optimize's graph rewrite on its own (LibTorch types, so a translation unit of its own):
// linear layers written as addmm(b, x, W.t()), also inside submodules, leave no addmm behind,
// the answers stay the model's, and the module as loaded is left as it was.
// REQUIRE only: LibTorch's headers bring glog's CHECK, which replaces Catch's.
#include <torch/script.h>
#include <catch2/catch.hpp>

#include "serving/artifact_io.h"

TEST_CASE("optimizedForInference rewrites linear layers, in submodules too, and keeps the answers",
          "[serving]") {
    torch::manual_seed(11);
    torch::jit::Module inner("Inner");
    inner.register_parameter("w", torch::randn({16, 8}), false);
    inner.register_parameter("b", torch::randn({16}), false);
    inner.define("def forward(self, x):\n    return torch.relu(torch.addmm(self.b, x, self.w.t()))\n");
    torch::jit::Module outer("Outer");
    outer.register_module("inner", inner);
    outer.register_parameter("w", torch::randn({4, 16}), false);
    outer.register_parameter("b", torch::randn({4}), false);
    outer.define(
        "def forward(self, x):\n    return torch.addmm(self.b, self.inner.forward(x), self.w.t())\n");
    outer.eval();
    const std::string before = outer.get_method("forward").graph()->toString();

    auto optimized = lathe::core::optimizedForInference(outer);
    const std::string graph = optimized.get_method("forward").graph()->toString();
    INFO(graph);
    // Both layers, the submodule's included, became linear and then (LibTorch 1.13) a matmul on a
    // weight transposed once at load, or (2.x) a oneDNN linear: no addmm and no transpose left.
    REQUIRE(graph.find("aten::addmm") == std::string::npos);
    REQUIRE(graph.find("aten::t(") == std::string::npos);
    REQUIRE(outer.get_method("forward").graph()->toString() == before);  // the loaded module is untouched

    const auto x = torch::randn({5, 8});
    c10::InferenceMode guard;
    const auto want = outer.forward({x}).toTensor();
    const auto got = optimized.forward({x}).toTensor();
    REQUIRE(want.sizes() == got.sizes());
    REQUIRE(torch::allclose(want, got, 1e-5, 1e-5));
}
