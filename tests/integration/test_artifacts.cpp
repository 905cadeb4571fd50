// Model artifacts from files nobody vouches for: a TorchScript file's Lathe metadata is read
// defensively, at registration and again whenever a server loads it.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include <torch/script.h>

#include <catch2/catch.hpp>

#include <filesystem>

#include "lathe/core/error.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/registry.h"
#include "lathe/core/server.h"
#include "temp_dir.h"

using namespace lathe;
using lathe::test::TempDir;

namespace {

// A 4 -> 2 linear model saved with `meta` as its Lathe metadata (empty: none).
std::string modelWithMeta(const TempDir& dir, const std::string& fileName, const std::string& meta) {
    torch::jit::Module m("Tiny");
    m.register_parameter("w", torch::ones({4, 2}), false);
    m.define("def forward(self, x):\n    return torch.mm(x, self.w)\n");
    const auto path = dir.file(fileName);
    torch::jit::ExtraFilesMap extra;
    if (!meta.empty()) extra["lathe_meta.json"] = meta;
    m.save(path, extra);
    return path;
}

std::string meta(const std::string& inputShape, const std::string& outputShape,
                 const std::string& more = "") {
    return R"({"format":1,"signature":{"inputs":[{"name":"x","datatype":"FP32","shape":)" + inputShape +
           R"(}],"outputs":[{"name":"y","datatype":"FP32","shape":)" + outputShape + "}]}" + more + "}";
}

}  // namespace

TEST_CASE("hostile or damaged artifact metadata is refused with a reason, never a crash or a huge buffer",
          "[serving][artifacts]") {
    TempDir dir;
    auto refused = [&](const std::string& metaText, const std::string& fragment) {
        const auto file = modelWithMeta(dir, "m.pt", metaText);
        CHECK_THROWS_WITH(core::importTorchScript(file, {}, dir.file("out.pt")), Catch::Contains(fragment));
    };
    // Nested a million deep: nlohmann's dump would recurse until the stack ran out.
    refused(R"({"format":1,"signature":)" + std::string(1000000, '[') + std::string(1000000, ']') + "}",
            "at most 1 MiB");
    refused(R"({"format":1,"signature":)" + std::string(100, '[') + std::string(100, ']') + "}",
            "nested too deeply");
    // Buffers a server would size from the signature.
    refused(meta("[-1,268435456]", "[-1,2]"), "has dimension 268435456");
    refused(meta("[-1,65536,65536]", "[-1,2]"), "more than 16777216 values per row");
    refused(meta("[-1,0]", "[-1,2]"), "has dimension 0");
    refused(meta("[4]", "[-1,2]"), "the batch (-1) first");
    refused(
        R"({"format":1,"signature":{"inputs":[],"outputs":[{"name":"y","datatype":"FP32","shape":[-1,2]}]}})",
        "lists no input");
    refused("[1,2,3]", "not an object");

    // A sound file is accepted; the run it names belongs to another workspace and is not kept.
    const auto good = modelWithMeta(dir, "good.pt", meta("[-1,4]", "[-1,2]", R"(,"run_id":7)"));
    const auto info = core::importTorchScript(good, {}, dir.file("good-out.pt"));
    CHECK(info.runId == 0);
    CHECK_THAT(info.source, Catch::Contains("exported from run 7 of another workspace"));

    // --input-shape for a plain file is bounded the same way.
    const auto plain = modelWithMeta(dir, "plain.pt", "");
    CHECK_THROWS_WITH(core::importTorchScript(plain, {65536, 65536}, dir.file("p.pt")),
                      Catch::Contains("more than 2^24 values per sample"));
}

TEST_CASE("a failed registration leaves no artifact behind", "[serving][artifacts]") {
    TempDir dir;
    core::Registry registry(dir.file("ws.db"));
    const auto file = modelWithMeta(dir, "m.pt", meta("[-1,4]", "[-1,2]"));
    CHECK_THROWS_AS(core::registerModel(registry, nullptr, "tiny", 0, file, {}, 9), core::NotFoundError);
    const auto modelDir = registry.modelDir("tiny");
    CHECK((!std::filesystem::exists(modelDir) || std::filesystem::is_empty(modelDir)));
    const auto v = core::registerModel(registry, nullptr, "tiny", 0, file, {});
    CHECK(v.version == 1);
    CHECK(std::filesystem::exists(v.path));
}

TEST_CASE("a server refuses batch buffers beyond 2^30 values before allocating them",
          "[serving][artifacts]") {
    TempDir dir;
    core::Registry registry(dir.file("ws.db"));
    const auto file = modelWithMeta(dir, "m.pt", meta("[-1,4]", "[-1,2]"));
    const auto v = core::registerModel(registry, nullptr, "tiny", 0, file, {});
    // 4 values a row is nothing; a row of 2^24 at --max-batch 4096 would be 256 GiB.
    const auto wide = modelWithMeta(dir, "wide.pt", meta("[-1,4096,4096]", "[-1,2]"));
    const auto w = core::registerModel(registry, nullptr, "wide", 0, wide, {});
    core::ServeOptions so;
    so.maxBatch = 4096;
    so.maxQueue = 4096;
    core::InferenceServer server(so);
    CHECK_THROWS_WITH(server.load({"wide", 0, w.path}),
                      Catch::Contains("exceed 2^30 values per batch buffer"));
    server.load({"tiny", 0, v.path});
    CHECK(server.servedVersion("tiny") == 0);
}
