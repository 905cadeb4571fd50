// Compression of registered models (compress.h): dynamic int8 quantization of the digits MLP
// against its fp32 parent, the lineage and report the registry keeps, the served artifact, and
// every bad input refused with a clear error and nothing registered. Plus the CLI.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include <torch/script.h>
#include <torch/torch.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <nlohmann/json.hpp>

#include "compression/quantized_ops.h"
#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "lathe/core/torch_runtime.h"
#include "run_process.h"
#include "serving/model_runner.h"
#include "temp_dir.h"

using namespace lathe;
using lathe::test::TempDir;

namespace {

// A workspace with the digits MLP trained (10 epochs) and registered as digits:1.
struct Trained {
    TempDir dir;
    std::string db = dir.file("ws.db");
    Trained() {
        core::Store store(db);
        core::RunSpec spec;
        spec.epochs = 10;
        spec.seed = 5;
        const auto rec = core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == core::RunStatus::Completed);
        store.flush();
        core::Registry registry(db);
        REQUIRE(core::registerModel(registry, &store, "digits", rec.runId, "", {}).version == 1);
    }
};

int64_t versionCount(const std::string& db, const std::string& name) {
    core::Registry registry(db);
    return static_cast<int64_t>(registry.versions(name).size());
}

}  // namespace

TEST_CASE(
    "dynamic int8 quantization keeps the digits MLP within 1 point, records lineage and report, and serves",
    "[compress][quantize]") {
    Trained t;
    core::Store store(t.db);
    core::Registry registry(t.db);
    std::vector<std::string> phases;
    core::CompressControl control;
    control.progress = [&](const core::CompressProgress& p) {
        if (phases.empty() || phases.back() != p.phase) phases.push_back(p.phase);
    };
    const auto result = core::quantizeModel(registry, &store, core::parseModelRef("digits:1"), {}, control);
    const auto& r = result.report;
    INFO("parent " << r.parentAccuracy << " int8 " << r.accuracy);
    CHECK(r.parentAccuracy > 0.9);
    CHECK(r.accuracy >= r.parentAccuracy - 0.01);
    CHECK(r.samples > 300);
    CHECK(r.sizeBytes > 0);
    CHECK(r.sizeBytes < r.parentSizeBytes);
    CHECK(r.latencyMsB1 > 0);
    CHECK(r.latencyMsB32 > 0);
    CHECK(r.parentLatencyMsB1 > 0);
    REQUIRE(r.layers.size() >= 2);  // the hidden layers (relu fused) and the output layer
    CHECK(r.layers.front().change.find("fused relu") != std::string::npos);
    CHECK(r.layers.back().change.find("fused relu") == std::string::npos);
    CHECK(r.perClassAccuracy.size() == 10);
    CHECK(phases.front() == "loading");
    CHECK(phases.back() == "done");

    // The registry keeps where it came from, how, and the report (sizes included).
    const auto v = registry.resolve(core::parseModelRef("digits:2"));
    CHECK(v.parentVersion == 1);
    CHECK(v.parentModel.empty());
    const auto derivation = nlohmann::json::parse(v.derivation);
    CHECK(derivation["method"] == "quantize");
    CHECK(derivation["mode"] == "dynamic");
    const auto stored = core::CompressReport::fromJson(v.report);
    CHECK(stored.sizeBytes == v.sizeBytes);
    CHECK(stored.accuracy == Approx(r.accuracy));
    CHECK(v.metrics.at("val/accuracy") == Approx(r.accuracy));

    // The file is one TorchScript artifact calling lathe::linear_int8; the server's loader runs it
    // and agrees with the parent to int8 precision.
    const auto served = core::serving::LoadedModel::load({"digits", 2, v.path}, 8, "cpu", v.sha256);
    const auto parent =
        core::serving::LoadedModel::load({"digits", 1, registry.resolve({"digits", 1, {}}).path}, 8, "cpu");
    for (auto* m : {served.get(), parent.get()})
        for (int64_t i = 0; i < 8 * 64; ++i) m->inputBuffer()[i] = static_cast<float>((i * 37) % 17) / 16.f;
    std::vector<float> a(80), b(80);
    served->run(0, 8, a.data());
    parent->run(0, 8, b.data());
    double maxDiff = 0, maxAbs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        maxDiff = std::max(maxDiff, static_cast<double>(std::fabs(a[i] - b[i])));
        maxAbs = std::max(maxAbs, static_cast<double>(std::fabs(b[i])));
    }
    CHECK(maxDiff < 0.05 * maxAbs);
    CHECK(maxDiff > 0);  // it really is another computation
}

TEST_CASE(
    "static int8 quantization with each observer keeps the MLP within 1.5 points, and the CNN's convolutions",
    "[compress][quantize][static]") {
    Trained t;
    core::Store store(t.db);
    core::Registry registry(t.db);
    for (const char* observer : {"minmax", "moving-average", "histogram"}) {
        core::QuantizeOptions o;
        o.mode = "static";
        o.observer = observer;
        o.calibBatches = 8;
        const auto r = core::quantizeModel(registry, &store, core::parseModelRef("digits:1"), o).report;
        INFO(observer << ": parent " << r.parentAccuracy << " int8 " << r.accuracy);
        CHECK(r.accuracy >= r.parentAccuracy - 0.015);
        CHECK(r.settings.at("observer") == observer);
        REQUIRE(!r.layers.empty());
        CHECK(r.layers[0].change.find("per tensor from") != std::string::npos);
    }

    // The CNN: its convolutions become lathe::conv2d_int8 with fused ReLU.
    core::RunSpec spec;
    spec.model = "cnn";
    spec.epochs = 8;
    spec.seed = 3;
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == core::RunStatus::Completed);
    store.flush();
    core::registerModel(registry, &store, "cnn", rec.runId, "", {});
    core::QuantizeOptions o;
    o.mode = "static";
    const auto r = core::quantizeModel(registry, &store, core::parseModelRef("cnn:1"), o).report;
    INFO("cnn parent " << r.parentAccuracy << " int8 " << r.accuracy);
    CHECK(r.parentAccuracy > 0.8);
    CHECK(r.accuracy >= r.parentAccuracy - 0.015);
    int convs = 0;
    for (const auto& l : r.layers)
        if (l.kind == "conv2d") {
            ++convs;
            CHECK(l.change.find("fused relu") != std::string::npos);
        }
    CHECK(convs == 2);
    // Dynamic mode leaves convolutions in fp32.
    const auto d = core::quantizeModel(registry, &store, core::parseModelRef("cnn:1"), {}).report;
    for (const auto& l : d.layers) CHECK(l.kind == "linear");
}

TEST_CASE("bad compression input gets a clear error and registers nothing", "[compress][quantize]") {
    Trained t;
    core::Store store(t.db);
    core::Registry registry(t.db);
    const auto ref = core::parseModelRef("digits:1");
    auto refused = [&](const core::QuantizeOptions& o, const std::string& fragment) {
        CHECK_THROWS_AS(core::quantizeModel(registry, &store, ref, o), core::ConfigError);
        CHECK_THROWS_WITH(core::quantizeModel(registry, &store, ref, o), Catch::Contains(fragment));
        CHECK(versionCount(t.db, "digits") == 1);
    };
    core::QuantizeOptions o;
    o.mode = "fancy";
    refused(o, "unknown quantization mode 'fancy'");
    o = {};
    o.mode = "static";
    o.calibBatches = 0;
    refused(o, "--calib-batches must be 1..100000");
    o.calibBatches = 4;
    o.observer = "magic";
    refused(o, "unknown observer 'magic'");
    o = {};
    o.data = "synthetic:spirals";
    refused(o, "takes input [1,8,8] per sample but synthetic:spirals has samples of shape [2]");
    CHECK_THROWS_AS(core::quantizeModel(registry, &store, core::parseModelRef("digits:7"), {}),
                    core::NotFoundError);

    // A model with no Linear layer: nothing to quantize.
    TempDir dir;
    torch::jit::Module m("NoLinear");
    m.define("def forward(self, x):\n    return torch.relu(torch.flatten(x, 1))[:, :10]\n");
    m.save(dir.file("nolinear.pt"));
    core::registerModel(registry, nullptr, "plain", 0, dir.file("nolinear.pt"), {1, 8, 8});
    o = {};
    CHECK_THROWS_WITH(core::quantizeModel(registry, &store, core::parseModelRef("plain"), o),
                      Catch::Contains("has no run in this workspace") && Catch::Contains("--data"));
    o.data = "digits";
    CHECK_THROWS_WITH(core::quantizeModel(registry, &store, core::parseModelRef("plain"), o),
                      Catch::Contains("has no layer with constant weights to quantize"));
    CHECK(versionCount(t.db, "plain") == 1);

    // Stopped: nothing registered.
    std::atomic<bool> stop{true};
    core::CompressControl control;
    control.stop = &stop;
    CHECK_THROWS_AS(core::quantizeModel(registry, &store, ref, {}, control), core::StoppedError);
    CHECK(versionCount(t.db, "digits") == 1);
}

TEST_CASE("lathe::linear_int8 refuses operands of the wrong size instead of reading past them",
          "[compress][quantize]") {
    core::loadTorchRuntime();  // the op is registered when liblathe_torch loads
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("lathe::linear_int8", "");
    auto call = [&](const torch::Tensor& packed, const torch::Tensor& x) {
        std::vector<c10::IValue> stack{x,
                                       packed,
                                       torch::zeros({16}, torch::kInt),
                                       torch::ones({16}),
                                       c10::IValue(),
                                       int64_t{16},
                                       int64_t{64},
                                       false,
                                       0.0,
                                       0.0};
        op.callBoxed(&stack);
        return stack.at(0).toTensor();
    };
    CHECK_THROWS_WITH(call(torch::zeros({100}, torch::kChar), torch::ones({2, 64})),
                      Catch::Contains("packed weights must be"));
    CHECK_THROWS_WITH(call(torch::zeros({16 * 64}, torch::kChar), torch::ones({2, 63})),
                      Catch::Contains("input has 63 features, the layer takes 64"));
    CHECK(call(torch::zeros({16 * 64}, torch::kChar), torch::ones({2, 64})).sizes() ==
          torch::IntArrayRef{2, 16});
}

TEST_CASE("static int8 layers hand int8 codes to the next layer, computing exactly what fp32 hand-over does",
          "[compress][quantize][static]") {
    namespace c = core::compression;
    torch::manual_seed(3);
    for (int64_t hidden : {64, 100}) {  // a multiple of the GEMM's K block, and one that is padded
        INFO("hidden " << hidden);
        const auto w1 = torch::randn({hidden, 40}), w2 = torch::randn({10, hidden});
        const auto b1 = torch::randn({hidden}), b2 = torch::randn({10});
        const auto p1 = c::packLinear(w1), p2 = c::packLinear(w2);
        const auto x = torch::randn({7, 40});
        const double s1 = 0.02, s2 = 0.5;
        const auto viaFloat =
            c::linearInt8(x, p1.packed, p1.colSums, p1.scales, b1, hidden, 40, true, s1, 0.0);
        const auto viaCodes =
            c::linearInt8(x, p1.packed, p1.colSums, p1.scales, b1, hidden, 40, true, s1, s2);
        CHECK(viaFloat.scalar_type() == torch::kFloat);
        REQUIRE(viaCodes.scalar_type() == torch::kChar);
        CHECK(viaCodes.sizes() == viaFloat.sizes());
        CHECK(viaCodes.to(torch::kInt).abs().max().item<int>() <= 127);
        const auto y1 =
            c::linearInt8(viaFloat, p2.packed, p2.colSums, p2.scales, b2, 10, hidden, false, s2, 0.0);
        const auto y2 =
            c::linearInt8(viaCodes, p2.packed, p2.colSums, p2.scales, b2, 10, hidden, false, s2, 0.0);
        CHECK(torch::equal(y1, y2));
        CHECK_THROWS_WITH(
            c::linearInt8(viaCodes, p2.packed, p2.colSums, p2.scales, b2, 10, hidden, false, 0.0, 0.0),
            Catch::Contains("int8 input needs its input_scale"));
    }
    // In a quantized MLP every layer but the last hands over int8.
    Trained t;
    core::Store store(t.db);
    core::Registry registry(t.db);
    core::QuantizeOptions o;
    o.mode = "static";
    const auto r = core::quantizeModel(registry, &store, core::parseModelRef("digits:1"), o).report;
    REQUIRE(r.layers.size() == 3);
    CHECK(r.layers[0].change.find("int8 output") != std::string::npos);
    CHECK(r.layers[1].change.find("int8 output") != std::string::npos);
    CHECK(r.layers[2].change.find("int8 output") == std::string::npos);
    CHECK(r.accuracy >= r.parentAccuracy - 0.015);
}

TEST_CASE("lathe::conv2d_int8 with a static input scale is exact against an integer convolution",
          "[compress][quantize][static]") {
    // Values on the int8 grid (x = code * 2^-4, weights = code * 2^-6 with a 127 in every output
    // channel), so quantization is lossless and the layer must equal the convolution of the codes
    // scaled by 2^-10, bit for bit: the gathering of receptive fields (padding, stride, dilation,
    // several channels, 3-wide and other kernels), int8 input, int8 output and the NaN fallback.
    namespace c = core::compression;
    torch::manual_seed(11);
    struct Shape {
        int64_t batch, in, out, h, w, kh, kw, sy, sx, py, px, dy, dx;
    };
    const Shape shapes[] = {
        {3, 1, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1},    // the digits CNN's first layer
        {2, 16, 32, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1},   // and its second
        {2, 3, 5, 9, 7, 3, 3, 2, 1, 0, 2, 1, 1},     // stride, uneven padding
        {1, 2, 17, 11, 10, 3, 3, 1, 2, 2, 1, 2, 1},  // dilation, a padded channel count
        {2, 4, 8, 6, 9, 2, 5, 1, 3, 1, 2, 1, 2},     // not 3 wide, dilated columns
        {1, 5, 3, 5, 5, 1, 1, 1, 1, 0, 0, 1, 1},     // 1 x 1
    };
    const double sx = 1.0 / 16, sw = 1.0 / 64;
    for (const auto& s : shapes) {
        INFO("batch " << s.batch << " " << s.in << "->" << s.out << " " << s.h << "x" << s.w << " kernel "
                      << s.kh << "x" << s.kw << " stride " << s.sy << "," << s.sx << " padding " << s.py
                      << "," << s.px << " dilation " << s.dy << "," << s.dx);
        const auto xc = torch::randint(-127, 128, {s.batch, s.in, s.h, s.w}, torch::kInt).to(torch::kFloat);
        auto wc = torch::randint(-126, 127, {s.out, s.in, s.kh, s.kw}, torch::kInt).to(torch::kFloat);
        wc.view({s.out, -1}).select(1, 0).fill_(127);  // every channel's scale is exactly 2^-6
        const auto bias = torch::randint(-64, 64, {s.out}, torch::kInt).to(torch::kFloat) / 8;
        const auto p = c::packLinear(wc * sw);
        const std::vector<int64_t> kernel{s.kh, s.kw}, stride{s.sy, s.sx}, padding{s.py, s.px},
            dilation{s.dy, s.dx};
        const auto expected =
            (torch::conv2d(xc.to(torch::kDouble), wc.to(torch::kDouble), {}, stride, padding, dilation) * sx *
                 sw +
             bias.to(torch::kDouble).view({1, -1, 1, 1}))
                .to(torch::kFloat);
        auto layer = [&](const torch::Tensor& x, bool relu, double in, double out) {
            return c::conv2dInt8(x, p.packed, p.colSums, p.scales, bias, s.out, s.in, kernel, stride, padding,
                                 dilation, relu, in, out);
        };
        const auto y = layer(xc * sx, false, sx, 0.0);
        REQUIRE(y.sizes() == expected.sizes());
        CHECK(torch::equal(y, expected));
        CHECK(torch::equal(layer(xc * sx, true, sx, 0.0), expected.clamp_min(0)));
        CHECK(torch::equal(layer(xc.to(torch::kChar), false, sx, 0.0), expected));  // codes in
        const double so = 0.25;  // codes out: the nearest code of y / so, clamped
        const auto codes = layer(xc * sx, false, sx, so);
        REQUIRE(codes.scalar_type() == torch::kChar);
        CHECK(torch::equal(codes, (expected / so).round().clamp(-127, 127).to(torch::kChar)));
        // The fp32 path (no input scale: each receptive field quantized on its own) agrees to
        // within its rounding.
        const double drift = (layer(xc * sx, false, 0.0, 0.0) - expected).abs().max().item<double>();
        CHECK(drift <= 0.01 * expected.abs().max().item<double>());
        // A NaN makes the outputs that see it NaN, as on the fp32 path, and no others.
        auto bad = xc * sx;
        bad.index_put_({0, 0, 0, 0}, std::nanf(""));
        const auto yn = layer(bad, false, sx, 0.0), yf = layer(bad, false, 0.0, 0.0);
        CHECK(yn.isnan().any().item<bool>());
        CHECK(torch::equal(yn.isnan(), yf.isnan()));
        CHECK(torch::equal(torch::where(yn.isnan(), expected, yn), expected));
    }
}

TEST_CASE("a version may name a parent of another model, which must exist", "[compress][registry]") {
    Trained t;
    core::Registry registry(t.db);
    const auto parent = registry.resolve({"digits", 1, {}});
    core::ModelVersion v = parent;
    v.name = "student";
    v.parentModel = "digits";
    v.parentVersion = 1;
    v.derivation = R"({"method":"distill"})";
    const auto added = registry.addVersion(v);
    CHECK(registry.resolve({"student", added.version, {}}).parentModel == "digits");
    v.parentVersion = 9;
    CHECK_THROWS_WITH(registry.addVersion(v), Catch::Contains("model digits has no version 9"));
    registry.setReport("student", 1, R"({"method":"distill"})");
    CHECK(core::CompressReport::fromJson(registry.resolve({"student", 1, {}}).report).method == "distill");
    CHECK_THROWS_AS(registry.setReport("student", 5, "{}"), core::NotFoundError);
}

TEST_CASE("lathectl compress quantize: a table, --json, exit 2 on bad input", "[compress][cli]") {
    Trained t;
    const auto cmd = test::binPath("lathectl") + " compress quantize --db " + t.db + " ";
    auto r = test::runShell(cmd + "digits:1 --json");
    REQUIRE(r.exitCode == 0);
    const auto j = nlohmann::json::parse(r.out);
    for (const char* key : {"model", "version", "accuracy", "parent_accuracy", "size_bytes",
                            "parent_size_bytes", "latency_ms_b1", "latency_ms_b32"})
        CHECK(j.contains(key));
    CHECK(j["version"] == 2);
    r = test::runShell(cmd + "digits:1");
    REQUIRE(r.exitCode == 0);
    CHECK(r.out.find("registered digits:3 from digits:1 (quantize dynamic)") != std::string::npos);
    CHECK(r.out.find("latency batch 32") != std::string::npos);
    r = test::runShell(cmd + "digits:1 --data synthetic:spirals");
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("has samples of shape [2]") != std::string::npos);
    r = test::runShell(cmd + "digits:1 --mode fancy");
    CHECK(r.exitCode == 2);
    r = test::runShell(cmd + "digits:1 --mode static --calib-batches 0");
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("--calib-batches must be 1..100000") != std::string::npos);
    // A run id: the run's model is registered once as run-N and reused.
    r = test::runShell(cmd + "1 --json");
    REQUIRE(r.exitCode == 0);
    CHECK(nlohmann::json::parse(r.out)["model"] == "run-1");
    r = test::runShell(cmd + "1 --json");
    REQUIRE(r.exitCode == 0);
    CHECK(nlohmann::json::parse(r.out)["version"] == 3);
    CHECK(versionCount(t.db, "run-1") == 3);
    r = test::runShell(cmd + "digits:1 --mode static --percentile 0");
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("percentile must be in (0, 100]") != std::string::npos);
    r = test::runShell(test::binPath("lathectl") + " models compare digits:1 digits:2 --db " + t.db);
    REQUIRE(r.exitCode == 0);
    CHECK(r.out.find("latency batch 1") != std::string::npos);
    CHECK(versionCount(t.db, "digits") == 3);
}
