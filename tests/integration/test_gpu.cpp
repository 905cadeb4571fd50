// The CUDA paths of training, profiling and serving. Each test needs a CUDA GPU that LibTorch can
// use and reports itself skipped elsewhere (the development and CI machines have none); run them
// on a GPU machine with packaging/device-check.sh --full.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "lathe/core/http_client.h"
#include "lathe/core/profile_analysis.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "run_process.h"
#include "serving_fixture.h"
#include "skip.h"
#include "temp_dir.h"

using namespace lathe;
using nlohmann::json;

namespace {

std::string lathectl(const std::string& args) { return test::binPath("lathectl") + " " + args; }

std::vector<double> values(const core::Store& s, int64_t run, const std::string& key) {
    std::vector<double> out;
    for (const auto& p : s.metrics(run, key)) out.push_back(p.value);
    return out;
}

}  // namespace

TEST_CASE(
    "fp16 on a CUDA GPU: a step is skipped exactly when its gradient is non-finite, the loss scale "
    "follows GradScaler's rule and the model learns",
    "[gpu][amp]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    test::TempDir dir;
    core::Store store(dir.file("lathe.db"));
    core::RunSpec spec;
    spec.device = "cuda";
    spec.precision = "fp16";
    spec.epochs = 5;  // 115 steps on digits
    spec.lossScale = "dynamic";
    spec.lossScaleInit = 1024;
    spec.lossScaleGrowthInterval = 4;  // the scale doubles every 4 clean steps until fp16 overflows
    spec.injectNonfinite = {2, 9, 10, 40};
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    const auto scales = values(store, rec.runId, "amp/loss_scale");
    const auto skipped = values(store, rec.runId, "amp/skipped");
    // The gradient norm of every step, skipped ones included, taken after unscaling: non-finite
    // exactly when a gradient is.
    const auto norms = values(store, rec.runId, "train/grad_norm");
    REQUIRE(scales.size() == skipped.size());
    REQUIRE(norms.size() == skipped.size());
    REQUIRE(scales.size() >= 60);
    // Injected steps back off; so does a genuine fp16 overflow once the scale has grown. What
    // decides is the gradient, not the recorded skip: a step is skipped if and only if its
    // gradient is non-finite, and the scale follows GradScaler's update of those gradients, so a
    // spurious skip (or a missed one) fails here.
    const std::set<int64_t> inject(spec.injectNonfinite.begin(), spec.injectNonfinite.end());
    double scale = 1024;
    int tracker = 0, genuine = 0;
    for (size_t i = 0; i < scales.size(); ++i) {
        const bool nonFinite = !std::isfinite(norms[i]);
        const bool injected = inject.count(static_cast<int64_t>(i + 1)) > 0;
        INFO("step " << i + 1 << ": grad norm " << norms[i] << (injected ? " (injected)" : ""));
        if (injected) CHECK(nonFinite);  // the injected inf reaches the unscaled gradients
        CHECK((skipped[i] == 0.0 || skipped[i] == 1.0));
        CHECK((skipped[i] == 1.0) == nonFinite);
        CHECK(scales[i] == scale);
        if (nonFinite) {
            if (!injected) ++genuine;
            scale *= 0.5;
            tracker = 0;
        } else if (++tracker == 4) {
            scale *= 2;
            tracker = 0;
        }
    }
    INFO(genuine << " steps overflowed fp16 without injection");
    CHECK(rec.result.finalMetrics.at("val/accuracy") > 0.85);
}

TEST_CASE("fp16 on a CUDA GPU: at a scale that never grows, exactly the injected steps are skipped",
          "[gpu][amp]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    test::TempDir dir;
    core::Store store(dir.file("lathe.db"));
    core::RunSpec spec;
    spec.device = "cuda";
    spec.precision = "fp16";
    spec.epochs = 2;  // 46 steps on digits
    spec.lossScale = "dynamic";
    spec.lossScaleInit = 1024;
    spec.lossScaleGrowthInterval = 2000;  // never reached: the scale only backs off, from 1024 down
    spec.injectNonfinite = {1, 7, 8, 30};
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    const auto scales = values(store, rec.runId, "amp/loss_scale");
    const auto skipped = values(store, rec.runId, "amp/skipped");
    const auto norms = values(store, rec.runId, "train/grad_norm");
    REQUIRE(scales.size() == 46);
    REQUIRE(skipped.size() == 46);
    REQUIRE(norms.size() == 46);
    // Scaled by 1024 at most, the digits MLP's fp16 gradients are far from fp16's 65504: the
    // injected steps, known in advance, are the only non-finite ones, so they and only they are
    // skipped, and the scale halves after each.
    const std::set<int64_t> inject(spec.injectNonfinite.begin(), spec.injectNonfinite.end());
    double scale = 1024;
    for (int64_t step = 1; step <= 46; ++step) {
        const size_t i = static_cast<size_t>(step - 1);
        const bool injected = inject.count(step) > 0;
        INFO("step " << step << ": grad norm " << norms[i] << (injected ? " (injected)" : ""));
        CHECK(skipped[i] == (injected ? 1.0 : 0.0));
        CHECK(std::isfinite(norms[i]) == !injected);
        CHECK(scales[i] == scale);
        if (injected) scale *= 0.5;
    }
    CHECK(scale == 64);
}

TEST_CASE("bf16 on a CUDA GPU trains to the fp32 accuracy", "[gpu][amp]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    test::TempDir dir;
    core::Store store(dir.file("lathe.db"));
    core::RunSpec spec;
    spec.device = "cuda";
    spec.precision = "bf16";
    spec.epochs = 5;
    const auto bf16 = core::trainAndRecord(store, spec, {});
    REQUIRE(bf16.result.status == lathe::core::RunStatus::Completed);
    spec.precision = "fp32";
    const auto fp32 = core::trainAndRecord(store, spec, {});
    REQUIRE(fp32.result.status == lathe::core::RunStatus::Completed);
    CHECK(bf16.result.finalMetrics.at("val/accuracy") > 0.85);
    CHECK(bf16.result.finalMetrics.at("val/accuracy") ==
          Approx(fp32.result.finalMetrics.at("val/accuracy")).margin(0.05));
}

TEST_CASE("a profiled CUDA run times its phases and ops on the device", "[gpu][profile]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    test::TempDir dir;
    core::Store store(dir.file("lathe.db"));
    core::RunSpec spec;
    spec.device = "cuda";
    spec.epochs = 1;
    spec.profile = true;
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    store.flush();
    int phases = 0, timed = 0;
    for (const auto& s : store.profileSpans(rec.runId)) {
        if (s.kind != core::ProfileSpan::Kind::Phase) continue;
        ++phases;
        if (s.cudaNs >= 0) ++timed;
    }
    CHECK(phases > 0);
    CHECK(timed == phases);
    // Ops on CUDA tensors carry their device time; the matrix products among them.
    const auto spans = store.profileSpans(rec.runId);
    const auto ops = core::topOps(spans);
    bool addmm = false;
    for (const auto& o : ops)
        if (o.name == "aten::addmm") {
            addmm = true;
            CHECK(o.cudaTotalNs > 0);
            CHECK(o.cudaSelfNs >= 0);
        }
    CHECK(addmm);
}

TEST_CASE("a model served on the GPU answers as the CPU server does", "[gpu][serving]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    // The workspace's run trains on the GPU (device auto): registering it exports a checkpoint of
    // CUDA tensors into a CPU model, which must read them onto the CPU.
    test::ServingWorkspace ws;
    core::ServeOptions cpu, gpu;
    cpu.device = "cpu";
    gpu.device = "cuda";
    gpu.instances = 2;
    const auto a = ws.serve(cpu);
    const auto b = ws.serve(gpu);
    for (int r = 0; r < 8; ++r) {
        json data = json::array();
        for (int i = 0; i < 64; ++i) data.push_back(0.01f * static_cast<float>((i * 7 + r * 13) % 100));
        const auto body =
            json{{"inputs",
                  {{{"name", "input"}, {"shape", {1, 1, 8, 8}}, {"datatype", "FP32"}, {"data", data}}}}}
                .dump();
        const auto x = test::httpRequest(a->port(), "POST", "/v2/models/digits/infer", body);
        const auto y = test::httpRequest(b->port(), "POST", "/v2/models/digits/infer", body);
        REQUIRE(x.status == 200);
        REQUIRE(y.status == 200);
        const auto ox = json::parse(x.body)["outputs"][0]["data"],
                   oy = json::parse(y.body)["outputs"][0]["data"];
        REQUIRE(ox.size() == oy.size());
        for (size_t k = 0; k < ox.size(); ++k)
            CHECK(oy[k].get<double>() == Approx(ox[k].get<double>()).margin(1e-3));
    }
    // GPU utilisation and memory are exported where a GPU is.
    const auto metrics = test::httpGet(b->port(), "/metrics").body;
    CHECK(metrics.find("lathe_gpu_memory_used_bytes") != std::string::npos);
}

namespace {

// 2 ranks x 32 on the GPU(s) against 1 rank x 64 on the GPU: the averaged gradient of every step
// is the single process's (GPU reductions in another order: 1e-4).
void checkRanksFollow(const std::string& twoRankFlags) {
    test::TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    const auto one = test::runShell(lathectl("train --device cuda --epochs 1 --batch 64 -q --json" + db));
    REQUIRE(one.exitCode == 0);
    const auto two = test::runShell(
        lathectl("train --device cuda --epochs 1 --batch 32 --nproc 2 -q --json " + twoRankFlags + db));
    INFO(test::said(two));
    REQUIRE(two.exitCode == 0);
    const auto a = json::parse(one.out), b = json::parse(two.out);
    core::Store store(dir.file("l.db"));
    const auto ga = values(store, a.at("run_id").get<int64_t>(), "train/grad_norm");
    const auto gb = values(store, b.at("run_id").get<int64_t>(), "train/grad_norm");
    REQUIRE(ga.size() == gb.size());
    for (size_t i = 0; i < ga.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(gb[i] == Approx(ga[i]).epsilon(1e-4));
    }
}

}  // namespace

TEST_CASE("2 ranks sharing one GPU over Gloo follow 1 rank step by step", "[gpu][distributed]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    // Gloo stages the CUDA gradients through host memory; every strategy goes the same way.
    const std::string strategy = GENERATE(as<std::string>{}, "ring", "hierarchical --ranks-per-host 1", "ps");
    INFO("strategy " << strategy);
    checkRanksFollow("--backend gloo --strategy " + strategy);
}

TEST_CASE("NCCL with a GPU per rank follows 1 rank, and compresses on the GPU", "[gpu][distributed]") {
    if (core::cudaDeviceCount() < 2) LATHE_SKIP("NCCL needs a GPU per rank: two CUDA devices");
    checkRanksFollow("--backend nccl --strategy ring");
    checkRanksFollow("--backend nccl --strategy ps");
    // int8 with error feedback through kernels/' CUDA versions, on digits: within a point of fp32.
    test::TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    const auto plain =
        test::runShell(lathectl("train --device cuda --epochs 8 --nproc 2 --backend nccl -q --json" + db));
    const auto int8 = test::runShell(
        lathectl("train --device cuda --epochs 8 --nproc 2 --backend nccl --compress int8 -q --json" + db));
    REQUIRE(plain.exitCode == 0);
    REQUIRE(int8.exitCode == 0);
    CHECK(json::parse(int8.out).at("val/accuracy").get<double>() >=
          json::parse(plain.out).at("val/accuracy").get<double>() - 0.01);
}

TEST_CASE(
    "an image-folder run on a CUDA GPU takes its batches through pinned memory and learns as on the CPU",
    "[gpu][data-pipeline]") {
    if (core::cudaDeviceCount() == 0) LATHE_SKIP("no CUDA device");
    test::TempDir dir;
    REQUIRE(
        test::runShell(lathectl("data example " + dir.file("img") + " --per-class 60 --side 32")).exitCode ==
        0);
    core::Store store(dir.file("lathe.db"));
    core::RunSpec spec;
    spec.data = "images:" + dir.file("img");
    spec.model = "cnn";
    spec.crop = 28;
    spec.epochs = 12;  // 68% validation accuracy on the CPU (2026-12-03)
    spec.batch = 32;
    spec.lr = 0.003;
    spec.device = "cuda";
    const auto gpu = core::trainAndRecord(store, spec, {});
    REQUIRE(gpu.result.status == lathe::core::RunStatus::Completed);
    spec.device = "cpu";
    const auto cpu = core::trainAndRecord(store, spec, {});
    REQUIRE(cpu.result.status == lathe::core::RunStatus::Completed);
    CHECK(gpu.result.finalMetrics.at("data/hit_memory") == 1.0);
    CHECK(gpu.result.finalMetrics.count("data/wait_ms") == 1);
    CHECK(gpu.result.finalMetrics.at("val/accuracy") > 0.5);
    CHECK(gpu.result.finalMetrics.at("val/accuracy") ==
          Approx(cpu.result.finalMetrics.at("val/accuracy")).margin(0.1));
    store.flush();
    bool pinned = false;
    for (const auto& l : store.logs(gpu.runId)) pinned |= l.text.find("pinned memory") != std::string::npos;
    CHECK(pinned);
}
