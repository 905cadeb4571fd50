// LibTorch before Catch2 (glog's CHECK): the AdamW test reads the parameters a run saved.
#include <torch/torch.h>

#include "data/raw.h"
#include "training/checkpoint_io.h"
#include "training/zoo.h"

#include <sqlite3.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "lathe/core/checkpoint.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

// The workspace's size in pages as another connection sees it (WAL included).
int64_t pageCount(const std::string& path) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, "PRAGMA page_count", -1, &st, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(st) == SQLITE_ROW);
    const int64_t pages = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return pages;
}

std::vector<double> values(const Store& s, int64_t run, const std::string& key) {
    std::vector<double> out;
    for (const auto& p : s.metrics(run, key)) out.push_back(p.value);
    return out;
}

// The learning rate of step n (1-based) of a run of `total` steps, n in epoch `epoch` (0-based),
// from the schedule's definition (the run configuration's lr, schedule, warmup_steps, step_epochs,
// gamma, min_lr), written out here independently of the trainer:
//  - constant: lr; step: lr * gamma^k after k whole periods of step_epochs epochs;
//  - cosine: from lr at the first step after warm-up (step W + 1) down towards min_lr, half a
//    cosine period over the T - W steps after warm-up, each step 1 / (T - W) of the way;
//  - warm-up: the first W steps ramp linearly, step n at n / W of the schedule's value.
double scheduledLr(const RunSpec& spec, int64_t n, int64_t epoch, int64_t total) {
    const int64_t w = spec.warmupSteps;
    double lr = spec.lr;
    if (spec.schedule == "step") {
        for (int64_t k = 0; k < epoch / spec.stepEpochs; ++k) lr *= spec.gamma;
    } else if (spec.schedule == "cosine") {
        const double t =
            n <= w ? 0.0 : std::min(1.0, static_cast<double>(n - 1 - w) / static_cast<double>(total - w));
        lr = spec.minLr + (spec.lr - spec.minLr) * (1.0 + std::cos(t * M_PI)) / 2.0;
    }
    if (n <= w) lr = lr * static_cast<double>(n) / static_cast<double>(w);
    return lr;
}

// The parameters a run saved in its last checkpoint, in model order.
std::vector<torch::Tensor> savedParameters(const Store& store, int64_t runId, const RunSpec& spec) {
    const auto split = data::loadSplit(spec);
    auto model = makeModel(spec, split.train.shape, static_cast<int64_t>(split.train.classNames.size()));
    const auto arts = store.artifacts(runId);
    REQUIRE_FALSE(arts.empty());
    loadModelWeights(arts.back().path, *model);
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
}

}  // namespace

TEST_CASE("the default MLP learns digits to at least 95% validation accuracy", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    std::vector<Event> events;
    const auto rec = trainAndRecord(store, RunSpec{}, {}, [&](const Event& e) { events.push_back(e); });
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    CHECK(rec.result.epochsDone == 20);
    CHECK(rec.result.finalMetrics.at("val/accuracy") >= 0.95);
    for (const char* key :
         {"train/loss", "train/accuracy", "val/loss", "val/accuracy", "perf/samples_per_s", "perf/step_ms"})
        CHECK(store.metrics(rec.runId, key).size() >= 20);
    const auto loss = values(store, rec.runId, "val/loss");
    CHECK(loss.back() < loss.front() / 5);
    const auto run = store.run(rec.runId);
    CHECK(run->status == lathe::core::RunStatus::Completed);
    // The observer saw the same stream the store recorded, starting with "running".
    REQUIRE_FALSE(events.empty());
    CHECK(events.front().type == Event::Type::Status);
    CHECK(events.front().text == "running");
    CHECK(events.front().value == 20 * 23);  // total steps for the progress bar
    const auto arts = store.artifacts(rec.runId);
    REQUIRE_FALSE(arts.empty());
    CHECK(readCheckpointInfo(arts.back().path).epoch == 20);
}

TEST_CASE("the cnn and the other optimizers and schedules train", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 3;
    SECTION("cnn") { spec.model = "cnn"; }
    SECTION("sgd with step decay and clipping") {
        spec.optimizer = "sgd";
        spec.lr = 0.05;
        spec.schedule = "step";
        spec.stepEpochs = 1;
        spec.gamma = 0.5;
        spec.clipGradNorm = 1.0;
    }
    SECTION("adamw with warm-up and cosine") {
        spec.optimizer = "adamw";
        spec.weightDecay = 0.01;
        spec.schedule = "cosine";
        spec.warmupSteps = 10;
        spec.minLr = 1e-5;
    }
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    const auto loss = values(store, rec.runId, "val/loss");
    REQUIRE(loss.size() == 3);
    CHECK(loss.back() < loss.front());
    const auto lr = values(store, rec.runId, "train/lr");
    if (spec.schedule == "step") CHECK(lr == std::vector<double>{0.05, 0.025, 0.0125});
    if (spec.schedule == "cosine") CHECK(lr.back() < lr.front());
}

TEST_CASE("the recorded learning rate follows the schedule's formula: warm-up, step and cosine",
          "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.threads = 1;
    spec.lr = 0.01;
    // 23 steps an epoch (digits' training split in batches of 64, as the first test counts).
    // train/lr is recorded once an epoch, at its last step: the rate that step ran with.
    // Warm-up longer than an epoch puts a recorded step inside the ramp.
    SECTION("constant with warm-up") {
        spec.epochs = 3;
        spec.warmupSteps = 30;
    }
    SECTION("step decay every 2 epochs with warm-up") {
        spec.epochs = 5;
        spec.schedule = "step";
        spec.stepEpochs = 2;
        spec.gamma = 0.3;
        spec.warmupSteps = 30;
    }
    SECTION("cosine to a floor with warm-up") {
        spec.epochs = 4;
        spec.schedule = "cosine";
        spec.minLr = 1e-4;
        spec.warmupSteps = 50;
    }
    SECTION("cosine without warm-up reaches the floor's neighbourhood") {
        spec.epochs = 3;
        spec.schedule = "cosine";
        spec.minLr = 2e-3;
    }
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    const int64_t perEpoch = 23;
    const int64_t total = perEpoch * spec.epochs;
    REQUIRE(rec.result.steps == total);
    const auto points = store.metrics(rec.runId, "train/lr");
    REQUIRE(points.size() == static_cast<size_t>(spec.epochs));
    for (int64_t e = 0; e < spec.epochs; ++e) {
        const auto& p = points[static_cast<size_t>(e)];
        const double want = scheduledLr(spec, p.step, e, total);
        INFO("epoch " << e + 1 << ", step " << p.step << ": recorded " << p.value << ", the formula "
                      << want);
        CHECK(p.step == (e + 1) * perEpoch);
        CHECK(p.value == Approx(want).epsilon(1e-12).margin(0));
    }
    // Spot checks by hand, so that the formula above cannot drift with the trainer's.
    if (spec.schedule == "constant") CHECK(points[0].value == Approx(0.01 * 23 / 30).epsilon(1e-12));
    if (spec.schedule == "step") {
        CHECK(points[0].value == Approx(0.01 * 23 / 30).epsilon(1e-12));  // in the ramp
        CHECK(points[1].value == Approx(0.01).epsilon(1e-12));
        CHECK(points[2].value == Approx(0.003).epsilon(1e-12));
        CHECK(points[4].value == Approx(0.0009).epsilon(1e-12));
    }
    if (spec.schedule == "cosine" && spec.warmupSteps == 50) {
        CHECK(points[0].value == Approx(0.01 * 23 / 50).epsilon(1e-12));
        CHECK(points[1].value == Approx(0.01 * 46 / 50).epsilon(1e-12));
        // Step 69 is 18 of the 42 steps after warm-up into the half period.
        CHECK(points[2].value ==
              Approx(1e-4 + (0.01 - 1e-4) * (1 + std::cos(M_PI * 18 / 42)) / 2).epsilon(1e-12));
    }
    if (spec.schedule == "cosine" && spec.warmupSteps == 0) {
        // Step 69 of 69 is 68/69 of the way: just above the floor.
        CHECK(points[2].value == Approx(2e-3 + 8e-3 * (1 + std::cos(M_PI * 68 / 69)) / 2).epsilon(1e-12));
        CHECK(points[2].value > 2e-3);
        CHECK(points[2].value < 2e-3 + 1e-5);
    }
}

TEST_CASE("adamw decays weights decoupled from the gradient, unlike adam's L2 term", "[trainer]") {
    // One step a run (the batch holds the whole training split), from the same initial weights
    // and the same gradient. AdamW's step is p * (1 - lr * wd) - lr * u and Adam's p - lr * u,
    // with the same Adam direction u, so their difference is -lr * wd * p0 exactly (but for
    // rounding). Adam with weight decay adds wd * p to the gradient instead: the direction
    // changes and the difference is not proportional to the weight.
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.threads = 1;
    spec.epochs = 1;
    spec.batch = 4096;
    spec.lr = 0.01;
    const double wd = 0.5;
    auto trained = [&](const std::string& optimizer, double lr, double weightDecay) {
        RunSpec s = spec;
        s.optimizer = optimizer;
        s.lr = lr;
        s.weightDecay = weightDecay;
        const auto rec = trainAndRecord(store, s, {});
        REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
        REQUIRE(rec.result.steps == 1);
        return savedParameters(store, rec.runId, s);
    };
    // The initial weights, within a part in 1e8: a step of 1e-10 moves none by more than that.
    const auto p0 = trained("adam", 1e-10, 0);
    const auto adam = trained("adam", spec.lr, 0);
    const auto adamw = trained("adamw", spec.lr, wd);
    const auto adamL2 = trained("adam", spec.lr, wd);
    REQUIRE(p0.size() == adam.size());
    REQUIRE(adamw.size() == adam.size());
    REQUIRE(adamL2.size() == adam.size());
    // Every parameter tensor moved (the step is not a no-op), and under adamw every weight by
    // Adam's step plus exactly the decoupled decay.
    size_t decoupled = 0, l2 = 0;
    for (size_t i = 0; i < p0.size(); ++i) {
        INFO("parameter " << i);
        CHECK_FALSE(torch::equal(adam[i], p0[i]));
        const auto expected = -spec.lr * wd * p0[i];
        // Rounding: a few float ulps (1.5e-8 each for weights of 0.125..0.25), and the float
        // 1 - lr * wd.
        const auto tolerance = 2e-7 + 1e-2 * expected.abs();
        const auto errW = ((adamw[i] - adam[i]) - expected).abs();
        const auto errL2 = ((adamL2[i] - adam[i]) - expected).abs();
        INFO("worst adamw error " << errW.max().item<double>() << " for a decay of up to "
                                  << expected.abs().max().item<double>());
        CHECK((errW <= tolerance).all().item<bool>());
        decoupled += static_cast<size_t>((errW <= tolerance).sum().item<int64_t>());
        l2 += static_cast<size_t>((errL2 <= tolerance).sum().item<int64_t>());
    }
    // The check above tells the two apart: Adam with an L2 term fails it for most weights.
    INFO(decoupled << " weights match decoupled decay under adamw, " << l2 << " under adam with L2");
    CHECK(l2 < decoupled / 2);
}

TEST_CASE("training is reproducible from its seed", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 3;
    spec.threads = 1;
    const auto a = trainAndRecord(store, spec, {});
    const auto b = trainAndRecord(store, spec, {});
    CHECK(values(store, a.runId, "train/loss") == values(store, b.runId, "train/loss"));
    CHECK(values(store, a.runId, "val/accuracy") == values(store, b.runId, "val/accuracy"));
    spec.seed = 7;
    const auto c = trainAndRecord(store, spec, {});
    CHECK(values(store, a.runId, "train/loss") != values(store, c.runId, "train/loss"));
}

TEST_CASE("resuming from a checkpoint continues exactly where the run stopped", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 6;
    spec.threads = 1;
    const auto straight = trainAndRecord(store, spec, {});
    REQUIRE(straight.result.status == lathe::core::RunStatus::Completed);

    // Stop after the third epoch's checkpoint, then resume the same run.
    std::atomic<bool> stop{false};
    RecordOptions first;
    first.stop = &stop;
    const auto partial = trainAndRecord(store, spec, first, [&](const Event& e) {
        if (e.type == Event::Type::Checkpoint && e.value == 3) stop = true;
    });
    REQUIRE(partial.result.status == lathe::core::RunStatus::Stopped);
    CHECK(store.run(partial.runId)->status == lathe::core::RunStatus::Stopped);
    RecordOptions again;
    again.resumeRunId = partial.runId;
    const auto resumed = trainAndRecord(store, spec, again);
    REQUIRE(resumed.runId == partial.runId);
    REQUIRE(resumed.result.status == lathe::core::RunStatus::Completed);
    CHECK(resumed.result.epochsDone == 6);

    for (const char* key : {"train/loss", "val/loss", "val/accuracy", "train/accuracy"}) {
        const auto a = values(store, straight.runId, key);
        const auto b = values(store, resumed.runId, key);
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == Approx(a[i]).epsilon(1e-6));
    }
}

TEST_CASE("a corrupt checkpoint is refused and the run's history is kept", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 2;
    const auto rec = trainAndRecord(store, spec, {});
    const auto ckpt = store.artifacts(rec.runId).back().path;
    const auto pointsBefore = store.metrics(rec.runId, "train/loss").size();
    {
        std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-10, std::ios::end);
        f.put('\x42');
    }
    CHECK_THROWS_WITH(readCheckpointInfo(ckpt), Catch::Contains("checksum"));
    RecordOptions again;
    again.resumeRunId = rec.runId;
    CHECK_THROWS_AS(trainAndRecord(store, spec, again), CheckpointError);
    CHECK(store.metrics(rec.runId, "train/loss").size() == pointsBefore);
    CHECK(store.run(rec.runId)->status ==
          lathe::core::RunStatus::Completed);  // the failed resume changed nothing
    // Truncation is named as such.
    std::filesystem::resize_file(ckpt, std::filesystem::file_size(ckpt) / 2);
    CHECK_THROWS_WITH(readCheckpointInfo(ckpt), Catch::Contains("truncated"));
    lathe::test::writeFile(ckpt, "hello");
    CHECK_THROWS_WITH(readCheckpointInfo(ckpt), Catch::Contains("not a Lathe checkpoint"));
}

TEST_CASE("a run that cannot start is recorded as failed with its error", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.data = "csv:" + dir.file("missing.csv");
    const auto rec = trainAndRecord(store, spec, {});
    CHECK(rec.result.status == lathe::core::RunStatus::Failed);
    CHECK_THAT(rec.result.error, Catch::Contains("does not exist"));
    const auto run = store.run(rec.runId);
    CHECK(run->status == lathe::core::RunStatus::Failed);
    CHECK_THAT(run->error, Catch::Contains("missing.csv"));
    // An invalid spec is refused before any run is created.
    spec = RunSpec{};
    spec.batch = 0;
    CHECK_THROWS_AS(trainAndRecord(store, spec, {}), ConfigError);
    CHECK(store.listRuns().size() == 1);
}

TEST_CASE("a resume that does not fit the checkpoint leaves the run as it was", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 2;
    const auto rec = trainAndRecord(store, spec, {});
    const auto before = store.metrics(rec.runId, "train/loss").size();
    RunSpec other = spec;
    other.hidden = {32};  // a different model
    other.epochs = 4;
    RecordOptions again;
    again.resumeRunId = rec.runId;
    CHECK_THROWS_WITH(trainAndRecord(store, other, again), Catch::Contains("does not fit"));
    CHECK(store.run(rec.runId)->status == lathe::core::RunStatus::Completed);
    CHECK(store.metrics(rec.runId, "train/loss").size() == before);
    CHECK_THAT(store.logs(rec.runId).back().text, Catch::Contains("resume failed"));
    // Settings that shape the trajectory are named and refused even where the tensors would fit.
    other = spec;
    other.epochs = 4;
    other.lr = 0.5;
    other.batch = 16;
    CHECK_THROWS_WITH(trainAndRecord(store, other, again), Catch::Contains("`batch` 64 -> 16") &&
                                                               Catch::Contains("`lr`") &&
                                                               Catch::Contains("Start a new run"));
    CHECK(store.run(rec.runId)->status == lathe::core::RunStatus::Completed);
    CHECK(store.metrics(rec.runId, "train/loss").size() == before);

    // A resume with more epochs records the new config.
    spec.epochs = 3;
    const auto resumed = trainAndRecord(store, spec, again);
    CHECK(resumed.result.status == lathe::core::RunStatus::Completed);
    CHECK(store.params(rec.runId).at("epochs") == "3");
    CHECK(parseRunSpec(store.run(rec.runId)->config).epochs == 3);
}

TEST_CASE("a checkpoint whose header was edited fails its checksum", "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 1;
    const auto rec = trainAndRecord(store, spec, {});
    const auto ckpt = store.artifacts(rec.runId).back().path;
    auto bytes = lathe::test::readFile(ckpt);
    const auto pos = bytes.find("\nepoch 1\n");
    REQUIRE(pos != std::string::npos);
    bytes[pos + 7] = '7';
    lathe::test::writeFile(ckpt, bytes);
    CHECK_THROWS_WITH(readCheckpointInfo(ckpt), Catch::Contains("checksum"));
    // A header promising more bytes than the file holds is refused before any allocation.
    auto big = lathe::test::readFile(ckpt);
    const auto sizePos = big.find("\nsize ");
    big.replace(sizePos, big.find('\n', sizePos + 1) - sizePos, "\nsize 99999999999");
    lathe::test::writeFile(ckpt, big);
    CHECK_THROWS_WITH(readCheckpointInfo(ckpt), Catch::Contains("truncated"));
}

TEST_CASE("a run is trained by one process at a time, and resumes from a checkpoint newer than its record",
          "[trainer]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 3;
    // While the run trains, a second resume of it is refused before it changes anything.
    std::atomic<bool> stop{false};
    RecordOptions first;
    first.stop = &stop;
    std::string refused;
    int64_t runId = 0;
    first.onRunCreated = [&](int64_t id) { runId = id; };
    const auto partial = trainAndRecord(store, spec, first, [&](const Event& e) {
        if (e.type != Event::Type::Checkpoint || !refused.empty()) return;
        RecordOptions second;
        second.resumeRunId = runId;
        try {
            trainAndRecord(store, spec, second);
        } catch (const ConfigError& ex) {
            refused = ex.what();
        }
        stop = true;
    });
    CHECK_THAT(refused, Catch::Contains("is being trained by another process"));
    REQUIRE(partial.result.status == lathe::core::RunStatus::Stopped);

    // Another run's checkpoint with the same settings in its place is not one of its own: refused.
    const auto other = trainAndRecord(store, spec, {});
    const auto ckpt = store.artifacts(partial.runId).back().path;
    const auto saved = lathe::test::readFile(ckpt);
    std::filesystem::copy_file(store.artifacts(other.runId).back().path, ckpt,
                               std::filesystem::copy_options::overwrite_existing);
    {
        RecordOptions again;
        again.resumeRunId = partial.runId;
        CHECK_THROWS_WITH(trainAndRecord(store, spec, again),
                          Catch::Contains("belongs to run " + std::to_string(other.runId)));
    }
    lathe::test::writeFile(ckpt, saved);
    // The process was killed after it wrote a newer checkpoint but before the workspace recorded
    // it: the run trained on from its checkpoint, its events recorded nowhere.
    {
        TrainOptions unrecorded;
        unrecorded.checkpointDir = store.artifactDir(partial.runId);
        unrecorded.resumeFrom = ckpt;
        unrecorded.owner = {store.workspaceId(), partial.runId};
        REQUIRE(train(spec, unrecorded, {}).status == lathe::core::RunStatus::Completed);
        REQUIRE(readCheckpointInfo(ckpt).epoch == 3);
    }
    RecordOptions again;
    again.resumeRunId = partial.runId;
    const auto resumed = trainAndRecord(store, spec, again);
    CHECK(resumed.result.status == lathe::core::RunStatus::Completed);
    bool noted = false;
    for (const auto& l : store.logs(partial.runId))
        noted |= l.text.find("newer than the one recorded") != std::string::npos;
    CHECK(noted);
}

TEST_CASE("a workspace that cannot be written stops the run with the store's error", "[trainer]") {
    TempDir dir;
    const auto path = dir.file("lathe.db");
    Store store(path);
    RunSpec spec;
    spec.epochs = 400;
    RecordOptions options;
    // Once the run exists, the disk is "full": the file may not grow by a single page.
    options.onRunCreated = [&](int64_t) {
        store.flush();
        store.setMaxPages(pageCount(path));
    };
    int64_t epochsSeen = 0;
    // Either the run is failed with the store's error (when the few records saying so still fit),
    // or, when not even those can be written, trainAndRecord throws it: never "completed".
    RunStatus status = RunStatus::Completed;
    std::string error;
    try {
        const auto rec = trainAndRecord(store, spec, options, [&](const Event& e) {
            if (e.type == Event::Type::Metric && e.key == "train/epoch") ++epochsSeen;
        });
        status = rec.result.status;
        error = rec.result.error;
    } catch (const StoreError& ex) {
        status = RunStatus::Failed;
        error = ex.what();
    }
    CHECK(status == RunStatus::Failed);
    CHECK_THAT(error, Catch::Contains("could not be written") && Catch::Contains("full"));
    // Training stopped soon after the writer gave up, instead of running all 400 epochs unrecorded.
    CHECK(epochsSeen < 400);
    store.setMaxPages(1 << 30);
    const auto runs = store.listRuns();
    REQUIRE(runs.size() == 1);
    CHECK(runs.front().status != lathe::core::RunStatus::Completed);
}
