// The loss scaler alone, against torch.cuda.amp.GradScaler's documented rule: back off on a step
// with non-finite gradients (and restart the count), grow after growth_interval clean steps in
// a row, never grow to infinity; unscale by the reciprocal taken in double and rounded to float.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include "training/loss_scaler.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

using namespace lathe::core;

namespace {

RunSpec dynamicSpec(double init, double growth, double backoff, int64_t interval) {
    RunSpec spec;
    spec.lossScale = "dynamic";
    spec.lossScaleInit = init;
    spec.lossScaleGrowth = growth;
    spec.lossScaleBackoff = backoff;
    spec.lossScaleGrowthInterval = interval;
    return spec;
}

torch::Tensor paramWithGrad(std::vector<float> grad) {
    auto p = torch::zeros({static_cast<int64_t>(grad.size())}, torch::requires_grad());
    p.mutable_grad() = torch::tensor(grad);
    return p;
}

}  // namespace

TEST_CASE("the dynamic scale follows GradScaler's rule step by step", "[amp][loss-scaler]") {
    LossScaler s(dynamicSpec(65536, 2, 0.5, 3), torch::kCPU);
    REQUIRE(s.enabled());
    REQUIRE_FALSE(s.isStatic());
    // (non-finite gradients this step?, the scale GradScaler holds after update())
    const std::vector<std::pair<bool, double>> steps = {
        {false, 65536}, {false, 65536}, {false, 131072},  // third clean step in a row: grow
        {true, 65536},                                    // back off, count restarts
        {false, 65536}, {false, 65536}, {true, 32768},    // two clean steps do not grow
        {false, 32768}, {false, 32768}, {false, 65536},   //
        {true, 32768},  {true, 16384},                    // each overflow backs off again
    };
    REQUIRE(steps.size() == 12);
    for (size_t i = 0; i < steps.size(); ++i) {
        INFO("step " << i + 1);
        s.update(steps[i].first);
        CHECK(s.scale() == steps[i].second);
    }
}

TEST_CASE("the scale never grows past the largest float", "[amp][loss-scaler]") {
    const double big = static_cast<double>(std::numeric_limits<float>::max()) / 1.5;
    LossScaler s(dynamicSpec(big, 2, 0.5, 1), torch::kCPU);
    const double start = s.scale();
    s.update(false);
    CHECK(std::isfinite(s.scale()));
    CHECK(s.scale() == start);
}

TEST_CASE("unscaling divides every gradient by the scale and reports inf and NaN", "[amp][loss-scaler]") {
    LossScaler s(dynamicSpec(1024, 2, 0.5, 2000), torch::kCPU);
    auto a = paramWithGrad({1024, -2048, 3});
    auto b = paramWithGrad({512});
    auto none = torch::zeros({2}, torch::requires_grad());  // no gradient: left alone
    CHECK_FALSE(s.unscaleAndCheck({a, b, none}));
    const float inv = static_cast<float>(1.0 / 1024.0);
    CHECK(a.grad()[0].item<float>() == 1.0f);
    CHECK(a.grad()[1].item<float>() == -2.0f);
    CHECK(a.grad()[2].item<float>() == 3.0f * inv);
    CHECK(b.grad()[0].item<float>() == 0.5f);
    CHECK_FALSE(none.grad().defined());

    auto inf = paramWithGrad({1, std::numeric_limits<float>::infinity()});
    CHECK(s.unscaleAndCheck({a, inf}));
    auto nan = paramWithGrad({std::numeric_limits<float>::quiet_NaN(), 1});
    CHECK(s.unscaleAndCheck({nan}));
}

TEST_CASE("a static scale scales and unscales but never moves", "[amp][loss-scaler]") {
    RunSpec spec;
    spec.lossScale = "static:128";
    LossScaler s(spec, torch::kCPU);
    REQUIRE(s.isStatic());
    CHECK(s.scale() == 128);
    CHECK(s.scaleLoss(torch::tensor(2.0f)).item<float>() == 256.0f);
    for (bool inf : {true, false, false, true}) s.update(inf);
    CHECK(s.scale() == 128);
}

TEST_CASE("off leaves the loss and the gradients as they are", "[amp][loss-scaler]") {
    RunSpec spec;
    spec.lossScale = "off";
    LossScaler s(spec, torch::kCPU);
    CHECK_FALSE(s.enabled());
    CHECK(s.scaleLoss(torch::tensor(3.0f)).item<float>() == 3.0f);
    auto a = paramWithGrad({std::numeric_limits<float>::infinity()});
    CHECK_FALSE(s.unscaleAndCheck({a}));  // nothing to skip without scaling
    CHECK(std::isinf(a.grad()[0].item<float>()));
}

TEST_CASE("a dynamic scaler's state survives a checkpoint, and a static one ignores it",
          "[amp][loss-scaler]") {
    LossScaler a(dynamicSpec(65536, 2, 0.5, 4), torch::kCPU);
    a.update(true);   // 32768
    a.update(false);  // tracker 1
    a.update(false);  // tracker 2
    LossScaler b(dynamicSpec(65536, 2, 0.5, 4), torch::kCPU);
    b.restore(a.state());
    CHECK(b.scale() == 32768);
    b.update(false);  // tracker 3
    CHECK(b.scale() == 32768);
    b.update(false);  // fourth clean step: grows, as `a` would
    CHECK(b.scale() == 65536);

    RunSpec spec;
    spec.lossScale = "static:8";
    LossScaler fixed(spec, torch::kCPU);
    fixed.restore(a.state());
    CHECK(fixed.scale() == 8);
    // A state saved without dynamic scaling (an fp32 run's scale of 1) is not taken either.
    RunSpec off;
    off.lossScale = "off";
    LossScaler c(dynamicSpec(65536, 2, 0.5, 4), torch::kCPU);
    c.restore(LossScaler(off, torch::kCPU).state());
    CHECK(c.scale() == 65536);
}
