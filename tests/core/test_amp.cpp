// Mixed precision, the loss scaler and activation checkpointing, through the trainer.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>

#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

std::vector<double> values(const Store& s, int64_t run, const std::string& key) {
    std::vector<double> out;
    for (const auto& p : s.metrics(run, key)) out.push_back(p.value);
    return out;
}

RunSpec small() {
    RunSpec spec;
    spec.epochs = 1;
    spec.threads = 1;
    return spec;
}

uint64_t bitsOf(double v) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// Run b recorded `key` at the same steps as run a, with the same doubles bit for bit; `count`
// points each (so that an empty series cannot pass).
void checkBitForBit(const Store& s, int64_t a, int64_t b, const std::string& key, size_t count) {
    const auto pa = s.metrics(a, key), pb = s.metrics(b, key);
    INFO(key);
    REQUIRE(pa.size() == count);
    REQUIRE(pb.size() == count);
    for (size_t i = 0; i < count; ++i) {
        INFO("step " << pa[i].step << ": " << pa[i].value << " vs " << pb[i].value);
        CHECK(pb[i].step == pa[i].step);
        CHECK(bitsOf(pb[i].value) == bitsOf(pa[i].value));
    }
}

}  // namespace

TEST_CASE("the dynamic loss scale follows GradScaler's rule step by step", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.epochs = 2;  // 46 steps
    spec.lossScale = "dynamic";
    spec.lossScaleInit = 1024;
    spec.lossScaleGrowthInterval = 3;
    spec.injectNonfinite = {2, 5, 6, 12, 30};
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);

    const auto scales = values(store, rec.runId, "amp/loss_scale");
    const auto skipped = values(store, rec.runId, "amp/skipped");
    REQUIRE(scales.size() == 46);
    REQUIRE(skipped.size() == 46);
    // The rule of torch.cuda.amp.GradScaler.update(), written out independently.
    double scale = 1024;
    int tracker = 0;
    const std::set<int> inject(spec.injectNonfinite.begin(), spec.injectNonfinite.end());
    for (int step = 1; step <= 46; ++step) {
        INFO("step " << step);
        CHECK(scales[step - 1] == scale);
        const bool found = inject.count(step) > 0;
        CHECK(skipped[step - 1] == (found ? 1.0 : 0.0));
        if (found) {
            scale *= 0.5;
            tracker = 0;
        } else if (++tracker == 3) {
            scale *= 2;
            tracker = 0;
        }
    }
    // A skipped step's gradient norm is the injected inf; the others are finite.
    const auto norms = values(store, rec.runId, "train/grad_norm");
    CHECK(std::isinf(norms[1]));
    CHECK(std::isfinite(norms[2]));
}

TEST_CASE("a static loss scale stays put and still skips non-finite steps", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.lossScale = "static:128";
    spec.injectNonfinite = {4};
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    for (double s : values(store, rec.runId, "amp/loss_scale")) CHECK(s == 128);
    const auto skipped = values(store, rec.runId, "amp/skipped");
    CHECK(skipped[3] == 1.0);
    CHECK(std::accumulate(skipped.begin(), skipped.end(), 0.0) == 1.0);
}

TEST_CASE("unscaled gradients equal the fp32 gradients", "[amp]") {
    // Scaling by a power of two and unscaling once is exact, so a dynamically scaled fp32 run
    // must match an unscaled one bit for bit: same gradient norms, same losses.
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec plain = small();
    RunSpec scaled = plain;
    scaled.lossScale = "dynamic";
    scaled.lossScaleGrowthInterval = 5;  // the scale changes along the way
    const auto a = trainAndRecord(store, plain, {});
    const auto b = trainAndRecord(store, scaled, {});
    CHECK(values(store, a.runId, "train/grad_norm") == values(store, b.runId, "train/grad_norm"));
    CHECK(values(store, a.runId, "train/loss") == values(store, b.runId, "train/loss"));
    CHECK(values(store, a.runId, "val/loss") == values(store, b.runId, "val/loss"));
    const auto scales = values(store, b.runId, "amp/loss_scale");
    CHECK(scales.back() > scales.front());
}

TEST_CASE("a skipped step leaves parameters and optimizer state unchanged", "[amp]") {
    // One step per epoch (the batch holds the whole training split). Run A skips its first
    // step and then takes one real step; run B takes that one real step. If the skipped step
    // changed nothing, both end at the same parameters and so the same validation loss.
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec a = small();
    a.batch = 4096;
    a.epochs = 2;
    a.lossScale = "dynamic";
    a.injectNonfinite = {1};
    RunSpec b = a;
    b.epochs = 1;
    b.injectNonfinite.clear();
    const auto ra = trainAndRecord(store, a, {});
    const auto rb = trainAndRecord(store, b, {});
    REQUIRE(values(store, ra.runId, "amp/skipped") == std::vector<double>{1.0, 0.0});
    const auto lossA = values(store, ra.runId, "val/loss");
    const auto lossB = values(store, rb.runId, "val/loss");
    // Epoch 1 of A is the untouched initial model; its epoch 2 equals B's one step (the batch
    // order differs, so the sum order may differ in the last bits).
    CHECK(lossA[1] == Approx(lossB[0]).epsilon(1e-6));
    CHECK(lossA[0] != Approx(lossB[0]).epsilon(1e-3));
}

TEST_CASE("the loss scaler's state survives a checkpoint and resume", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.epochs = 3;
    spec.lossScale = "dynamic";
    spec.lossScaleGrowthInterval = 10;
    spec.injectNonfinite = {3, 20, 30};
    const auto straight = trainAndRecord(store, spec, {});
    std::atomic<bool> stop{false};
    RecordOptions first;
    first.stop = &stop;
    const auto partial = trainAndRecord(store, spec, first, [&](const Event& e) {
        if (e.type == Event::Type::Checkpoint && e.value == 1) stop = true;
    });
    REQUIRE(partial.result.status == lathe::core::RunStatus::Stopped);
    RecordOptions again;
    again.resumeRunId = partial.runId;
    REQUIRE(trainAndRecord(store, spec, again).result.status == lathe::core::RunStatus::Completed);
    CHECK(values(store, partial.runId, "amp/loss_scale") == values(store, straight.runId, "amp/loss_scale"));
    CHECK(values(store, partial.runId, "amp/skipped") == values(store, straight.runId, "amp/skipped"));
}

TEST_CASE("bf16 autocast trains on the CPU, fp16 without a GPU is refused with a suggestion", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.epochs = 5;
    spec.precision = "bf16";
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    CHECK(rec.result.finalMetrics.at("val/accuracy") > 0.85);
    CHECK(rec.result.finalMetrics.count("amp/loss_scale") == 0);  // auto: no scaling for bf16
    // bf16 rounds activations: close to fp32, not equal.
    RunSpec fp32 = spec;
    fp32.precision = "fp32";
    const auto ref = trainAndRecord(store, fp32, {});
    const auto lb = values(store, rec.runId, "val/loss"), lf = values(store, ref.runId, "val/loss");
    CHECK(lb != lf);
    CHECK(lb.back() == Approx(lf.back()).epsilon(0.1));

    spec.precision = "fp16";
    if (cudaDeviceCount() == 0)  // with a GPU, fp16 runs: tests/integration/test_gpu.cpp
        CHECK_THROWS_WITH(trainAndRecord(store, spec, {}),
                          Catch::Contains("fp16 needs a CUDA GPU") && Catch::Contains("bf16"));
}

TEST_CASE("activation checkpointing gives the same gradients and saves activation memory", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.hidden = {256, 256, 256, 256, 256, 256, 256, 256, 256};
    spec.batch = 256;
    spec.epochs = 3;
    spec.logEvery = 1;  // train/loss of every step, not of windows
    // Recomputation is the same arithmetic: identical gradient norms, training losses (step by
    // step) and validation losses (epoch by epoch), bit for bit.
    auto checkSame = [&](const RecordedRun& plain, const RecordedRun& ckpt) {
        REQUIRE(plain.result.status == lathe::core::RunStatus::Completed);
        REQUIRE(ckpt.result.status == lathe::core::RunStatus::Completed);
        const auto steps = static_cast<size_t>(plain.result.steps);
        REQUIRE(steps >= 3);
        checkBitForBit(store, plain.runId, ckpt.runId, "train/grad_norm", steps);
        checkBitForBit(store, plain.runId, ckpt.runId, "train/loss", steps);
        checkBitForBit(store, plain.runId, ckpt.runId, "val/loss", 3);
    };
    for (const char* model : {"mlp", "cnn"}) {
        INFO(model);
        spec.model = model;
        spec.activationCheckpointing = false;
        // Against autograd's own step: a plain MLP otherwise takes the step by hand (mlp_step.h),
        // which sums in another order.
        const auto plain = [&] {
            struct Env {
                Env() { setenv("LATHE_AUTOGRAD_STEP", "1", 1); }
                ~Env() { unsetenv("LATHE_AUTOGRAD_STEP"); }
            } autogradStep;
            return trainAndRecord(store, spec, {});
        }();
        spec.activationCheckpointing = true;
        const auto ckpt = trainAndRecord(store, spec, {});
        checkSame(plain, ckpt);
        if (std::string(model) == "mlp") {
            // Measured on every epoch's first step (the training thread's tensor memory): compare
            // the steady-state epochs (the first also allocates gradients and optimizer state).
            const auto before = values(store, plain.runId, "perf/activation_mb");
            const auto after = values(store, ckpt.runId, "perf/activation_mb");
            REQUIRE(before.size() == static_cast<size_t>(spec.epochs));
            REQUIRE(after.size() == before.size());
            CHECK(before.back() > 0);
            CHECK(after.back() < 0.75 * before.back());
        }
    }
    spec.precision = "bf16";  // recomputation happens under the same autocast
    spec.model = "mlp";
    INFO("bf16 mlp");
    spec.activationCheckpointing = false;
    const auto plain = trainAndRecord(store, spec, {});
    spec.activationCheckpointing = true;
    const auto ckpt = trainAndRecord(store, spec, {});
    checkSame(plain, ckpt);
}

TEST_CASE("a scale saved without dynamic scaling does not become a dynamic run's scale", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    const auto first = trainAndRecord(store, spec, {});  // fp32, no scaling: checkpoint holds scale 1
    RunSpec resumed = spec;
    resumed.epochs = 2;
    resumed.lossScale = "dynamic";
    RecordOptions again;
    again.resumeRunId = first.runId;
    REQUIRE(trainAndRecord(store, resumed, again).result.status == lathe::core::RunStatus::Completed);
    const auto scales = values(store, first.runId, "amp/loss_scale");
    REQUIRE_FALSE(scales.empty());
    CHECK(scales.front() == 65536);
}

TEST_CASE("a static scale that overflows every step fails the run instead of skipping forever", "[amp]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec = small();
    spec.epochs = 6;
    spec.lossScale = "static:1024";
    for (int64_t step = 1; step <= 138; ++step) spec.injectNonfinite.push_back(step);  // every step overflows
    const auto rec = trainAndRecord(store, spec, {});
    CHECK(rec.result.status == lathe::core::RunStatus::Failed);
    CHECK_THAT(rec.result.error, Catch::Contains("100 steps in a row") && Catch::Contains("static"));
}
