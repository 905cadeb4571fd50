// Model artifacts from files nobody vouches for: a TorchScript file's Lathe metadata is read
// defensively, at registration and again whenever a server loads it.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include <torch/script.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "data/raw.h"
#include "lathe/core/error.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/server.h"
#include "lathe/core/store.h"
#include "serving_fixture.h"
#include "temp_dir.h"
#include "training/checkpoint_io.h"
#include "training/zoo.h"

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

TEST_CASE("a model trained on CSV, served, answers raw rows as the trained model answers them standardised",
          "[serving][artifacts]") {
    // Three features on scales far apart (so that standardising matters), the label column among
    // them, text labels. `size` is unique per row by construction: see the mapping below.
    TempDir dir;
    constexpr int kRows = 120;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<int> order(kRows);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::array<float, 3>> raw(kRows);  // size, ratio, offset: the features, in file order
    std::vector<std::string> label(kRows);
    std::string csv = "size,kind,ratio,offset\n";
    auto text = [](float v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));  // round-trips a float exactly
        return std::string(buf);
    };
    for (int i = 0; i < kRows; ++i) {
        raw[i] = {1000.f + 5.f * static_cast<float>(order[i]) + 0.25f * unit(rng), 0.001f * normal(rng),
                  -50.f + 10.f * normal(rng)};
        label[i] = order[i] < 40 ? "lo" : order[i] < 80 ? (raw[i][1] > 0 ? "mid" : "lo") : "hi";
        csv += text(raw[i][0]) + "," + label[i] + "," + text(raw[i][1]) + "," + text(raw[i][2]) + "\n";
    }
    const auto csvPath = dir.file("table.csv");
    test::writeFile(csvPath, csv);

    // Trained and registered as any run is.
    const auto db = dir.file("ws/lathe.db");
    core::RunSpec spec;
    spec.data = "csv:" + csvPath;
    spec.labelColumn = "kind";
    spec.hidden = {16};
    spec.epochs = 3;
    spec.batch = 16;
    spec.lr = 1e-2;
    core::Store store(db);
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == core::RunStatus::Completed);
    store.flush();
    core::Registry registry(db);
    const auto v = core::registerModel(registry, &store, "table", rec.runId, "", {});

    // Which file row each loaded sample is, without the loader's statistics: standardising is
    // increasing in each column, so a sample's rank by its first feature among all samples is
    // its row's rank by `size`.
    const auto split = core::data::loadSplit(spec);
    REQUIRE(split.train.shape == std::vector<int64_t>{3});
    REQUIRE(split.train.classNames == std::vector<std::string>{"hi", "lo", "mid"});
    const auto nTrain = static_cast<size_t>(split.train.size());
    const auto nVal = static_cast<size_t>(split.val.size());
    REQUIRE(nTrain + nVal == kRows);
    struct Sample {
        float first;
        const core::data::RawSet* set;
        size_t index;
    };
    std::vector<Sample> samples;
    for (const auto* set : {&split.train, &split.val})
        for (size_t k = 0; k < static_cast<size_t>(set->size()); ++k)
            samples.push_back({set->x[k * 3], set, k});
    std::sort(samples.begin(), samples.end(),
              [](const Sample& a, const Sample& b) { return a.first < b.first; });
    std::vector<int> bySize(kRows);
    std::iota(bySize.begin(), bySize.end(), 0);
    std::sort(bySize.begin(), bySize.end(), [&](int a, int b) { return raw[a][0] < raw[b][0]; });
    std::vector<int> trainRow(nTrain), valRow(nVal);
    for (size_t j = 0; j < samples.size(); ++j)
        (samples[j].set == &split.train ? trainRow : valRow)[samples[j].index] = bySize[j];
    auto classOf = [&](int row) {
        const auto& names = split.train.classNames;
        return static_cast<int64_t>(std::find(names.begin(), names.end(), label[row]) - names.begin());
    };
    for (size_t k = 0; k < nTrain; ++k) REQUIRE(split.train.y[k] == classOf(trainRow[k]));
    for (size_t k = 0; k < nVal; ++k) REQUIRE(split.val.y[k] == classOf(valRow[k]));

    // The training split's statistics, computed here from the file's rows (population std).
    std::array<double, 3> mean{}, sd{};
    for (int r : trainRow)
        for (int f = 0; f < 3; ++f) mean[f] += raw[r][f];
    for (auto& m : mean) m /= static_cast<double>(nTrain);
    for (int r : trainRow)
        for (int f = 0; f < 3; ++f) sd[f] += (raw[r][f] - mean[f]) * (raw[r][f] - mean[f]);
    for (auto& s : sd) s = std::sqrt(s / static_cast<double>(nTrain));
    auto standardised = [&](int row, int f) { return static_cast<float>((raw[row][f] - mean[f]) / sd[f]); };
    // What the trainer saw is exactly that.
    double loaderError = 0;
    for (const auto& [set, rows] : {std::pair{&split.train, &trainRow}, std::pair{&split.val, &valRow}})
        for (size_t k = 0; k < rows->size(); ++k)
            for (int f = 0; f < 3; ++f)
                loaderError =
                    std::max(loaderError,
                             std::fabs(static_cast<double>(set->x[k * 3 + f] - standardised((*rows)[k], f))));
    CHECK(loaderError < 1e-5);

    // The trained model (the run's checkpoint in the zoo's own module) on those standardised rows.
    std::string checkpoint;
    for (const auto& a : store.artifacts(rec.runId))
        if (a.kind == "checkpoint") checkpoint = a.path;
    REQUIRE(!checkpoint.empty());
    auto model = core::makeModel(spec, {3}, 3);
    core::loadModelWeights(checkpoint, *model);
    model->eval();
    torch::NoGradGuard noGrad;
    std::vector<float> zRows, rawRows;
    for (int r = 0; r < kRows; ++r)
        for (int f = 0; f < 3; ++f) {
            zRows.push_back(standardised(r, f));
            rawRows.push_back(raw[r][f]);
        }
    const auto expected = model->forward(torch::from_blob(zRows.data(), {kRows, 3}).clone()).contiguous();
    REQUIRE(expected.sizes() == torch::IntArrayRef{kRows, 3});
    // Unstandardised, the same weights answer very differently: the comparison below can tell.
    const auto unstandardised = model->forward(torch::from_blob(rawRows.data(), {kRows, 3}).clone());
    CHECK((unstandardised - expected).abs().max().item<double>() > 0.1);

    // The served artifact, given the file's raw rows, a few per request.
    core::ServeOptions so;
    so.port = 0;
    core::InferenceServer server(so);
    server.load({"table", v.version, v.path});
    const auto port = server.start();
    std::vector<double> served;
    for (int from = 0; from < kRows; from += 8) {
        const int n = std::min(8, kRows - from);
        nlohmann::json data = nlohmann::json::array();
        for (int r = from; r < from + n; ++r)
            for (int f = 0; f < 3; ++f) data.push_back(raw[r][f]);
        const nlohmann::json body{
            {"inputs", {{{"name", "input"}, {"shape", {n, 3}}, {"datatype", "FP32"}, {"data", data}}}}};
        const auto a = test::httpRequest(port, "POST", "/v2/models/table/infer", body.dump());
        REQUIRE(a.status == 200);
        const auto out = nlohmann::json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>();
        REQUIRE(out.size() == static_cast<size_t>(n) * 3);
        served.insert(served.end(), out.begin(), out.end());
    }
    const auto* want = expected.data_ptr<float>();
    double worst = 0;
    for (size_t i = 0; i < served.size(); ++i)
        worst =
            std::max(worst, std::fabs(served[i] - want[i]) / (1.0 + std::fabs(static_cast<double>(want[i]))));
    CHECK(worst < 1e-4);

    // And the trainer's own evaluation: the served answers' accuracy on the validation rows is the
    // val/accuracy the run recorded with these weights.
    int correct = 0;
    for (size_t k = 0; k < nVal; ++k) {
        const auto* row = &served[static_cast<size_t>(valRow[k]) * 3];
        const auto predicted = std::max_element(row, row + 3) - row;
        if (predicted == split.val.y[k]) ++correct;
    }
    const auto metrics = store.lastMetrics(rec.runId);
    REQUIRE(metrics.count("val/accuracy") == 1);
    CHECK(static_cast<double>(correct) / static_cast<double>(nVal) ==
          Approx(metrics.at("val/accuracy")).margin(1e-9));
}
