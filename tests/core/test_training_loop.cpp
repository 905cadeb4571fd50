// The training loop's phases and its extension points (core/src/training/training_loop.h).
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include "training/training_loop.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

// Records every phase and step the loop reports, and can add a constant to the loss.
struct Recorder : TrainingHook {
    std::vector<std::string> phases;
    std::vector<int64_t> steps;
    double lossOffset = 0;
    double lossFactor = 1;
    void afterPhase(TrainingLoop&, TrainingPhase phase) override { phases.emplace_back(toString(phase)); }
    torch::Tensor loss(TrainingLoop&, const Batch& batch, const torch::Tensor& logits,
                       torch::Tensor loss) override {
        CHECK(batch.x.size(0) == logits.size(0));
        if (lossFactor != 1) loss = loss * lossFactor;
        return lossOffset != 0 ? loss + lossOffset : loss;
    }
    void afterStep(TrainingLoop& loop, int64_t step) override {
        CHECK(loop.step() == step);
        steps.push_back(step);
    }
};

RunSpec smallSpec() {
    RunSpec spec;
    spec.epochs = 2;
    spec.logEvery = 1;  // train/loss at every step
    return spec;
}

std::vector<double> values(const std::vector<Event>& events, const std::string& key) {
    std::vector<double> out;
    for (const auto& e : events)
        if (e.type == Event::Type::Metric && e.key == key) out.push_back(e.value);
    return out;
}

}  // namespace

TEST_CASE("the loop runs its phases in order, and a resumed run starts with resume", "[trainer][loop]") {
    TempDir dir;
    TrainOptions options;
    options.checkpointDir = dir.path();
    auto rec = std::make_shared<Recorder>();
    TrainingLoop loop(smallSpec(), options, {});
    loop.addHook(rec);
    const auto result = loop.run();
    REQUIRE(result.status == RunStatus::Completed);
    CHECK(rec->phases == std::vector<std::string>{"set-up", "epoch", "evaluation", "checkpoint", "epoch",
                                                  "evaluation", "checkpoint"});
    REQUIRE(rec->steps.size() == static_cast<size_t>(result.steps));
    CHECK(rec->steps.front() == 1);
    CHECK(rec->steps.back() == result.steps);

    RunSpec longer = smallSpec();
    longer.epochs = 3;
    TrainOptions again = options;
    again.resumeFrom = dir.file("last.ckpt");
    auto rec2 = std::make_shared<Recorder>();
    TrainingLoop resumed(longer, again, {});
    resumed.addHook(rec2);
    const auto r2 = resumed.run();
    REQUIRE(r2.status == RunStatus::Completed);
    CHECK(r2.epochsDone == 3);
    CHECK(rec2->phases == std::vector<std::string>{"set-up", "resume", "epoch", "evaluation", "checkpoint"});
    REQUIRE_FALSE(rec2->steps.empty());
    CHECK(rec2->steps.front() == result.steps + 1);  // continues the step count
}

TEST_CASE("a loss hook's terms reach the recorded loss, and through backward the gradients",
          "[trainer][loop]") {
    // A constant added to the loss changes its value but not its gradient: training follows the
    // plain run exactly while every recorded train/loss is larger by the constant.
    auto runWith = [](double offset, std::vector<Event>& events) {
        auto rec = std::make_shared<Recorder>();
        rec->lossOffset = offset;
        TrainingLoop loop(smallSpec(), {}, [&](const Event& e) { events.push_back(e); });
        loop.addHook(rec);
        return loop.run();
    };
    std::vector<Event> plain, shifted;
    REQUIRE(runWith(0, plain).status == RunStatus::Completed);
    REQUIRE(runWith(1.5, shifted).status == RunStatus::Completed);
    const auto a = values(plain, "train/loss"), b = values(shifted, "train/loss");
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() > 10);
    for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] - a[i] == Approx(1.5).margin(1e-4));
    CHECK(values(plain, "val/loss") == values(shifted, "val/loss"));

    // A term with a gradient reaches backward: twice the loss, twice every gradient (exactly, a
    // power of two) on the first step, whose parameters are the same in both runs.
    auto runScaled = [](double factor, std::vector<Event>& events) {
        auto rec = std::make_shared<Recorder>();
        rec->lossFactor = factor;
        TrainingLoop loop(smallSpec(), {}, [&](const Event& e) { events.push_back(e); });
        loop.addHook(rec);
        return loop.run();
    };
    std::vector<Event> doubled;
    REQUIRE(runScaled(2, doubled).status == RunStatus::Completed);
    const auto n1 = values(plain, "train/grad_norm"), n2 = values(doubled, "train/grad_norm");
    REQUIRE(!n1.empty());
    REQUIRE(n2.size() == n1.size());
    CHECK(n2[0] == Approx(2 * n1[0]).epsilon(1e-12));
    CHECK(values(doubled, "train/loss")[0] == Approx(2 * a[0]).epsilon(1e-6));
}

TEST_CASE("a stop request ends the loop after the current step with status stopped", "[trainer][loop]") {
    std::atomic<bool> stop{false};
    TrainOptions options;
    options.stop = &stop;
    struct StopAt : TrainingHook {
        std::atomic<bool>* flag;
        explicit StopAt(std::atomic<bool>* f) : flag(f) {}
        void afterStep(TrainingLoop&, int64_t step) override {
            if (step == 5) flag->store(true);
        }
    };
    TrainingLoop loop(smallSpec(), options, {});
    loop.addHook(std::make_shared<StopAt>(&stop));
    const auto result = loop.run();
    CHECK(result.status == RunStatus::Stopped);
    CHECK(result.steps == 5);
    CHECK(result.epochsDone == 0);
}
