// Activation checkpointing's recompute, directly on a Sequential (the trainer-level tests in
// test_amp.cpp use the zoo's models, which draw no random numbers, and compare what the runs
// record: gradient norms and losses, fp32 and bf16).
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "training/amp.h"
#include "training/zoo.h"

using namespace lathe::core;

TEST_CASE("activation checkpointing replays dropout's random numbers in the recompute",
          "[amp][checkpointing]") {
    namespace nn = torch::nn;
    torch::manual_seed(1);
    nn::Sequential model(nn::Linear(16, 32), nn::ReLU(), nn::Dropout(0.5), nn::Linear(32, 32), nn::ReLU(),
                         nn::Dropout(0.5), nn::Linear(32, 32), nn::ReLU(), nn::Dropout(0.5),
                         nn::Linear(32, 32), nn::ReLU(), nn::Linear(32, 4));
    model->train();
    const auto x = torch::randn({8, 16});
    // Gradients of one step from a fixed generator state, and the generator's next draw after it.
    auto step = [&](bool checkpoint) {
        model->zero_grad();
        torch::manual_seed(42);
        ForwardOptions o;
        o.checkpoint = checkpoint;
        forwardModel(model, x, o).pow(2).sum().backward();
        std::vector<torch::Tensor> g;
        for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
        g.push_back(torch::rand({4}));  // backward left the generator where forward had taken it
        return g;
    };
    const auto plain = step(false), recomputed = step(true);
    REQUIRE(plain.size() == recomputed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
        INFO("tensor " << i);
        CHECK(torch::equal(plain[i], recomputed[i]));
    }
    CHECK_FALSE(x.grad().defined());
}

TEST_CASE("under bf16 autocast, the recompute gives the same loss and gradients bit for bit",
          "[amp][checkpointing]") {
    namespace nn = torch::nn;
    torch::manual_seed(3);
    // Four blocks (one per ReLU): two segments, the first of them recomputed in backward.
    nn::Sequential model(nn::Linear(16, 64), nn::ReLU(), nn::Linear(64, 64), nn::ReLU(), nn::Linear(64, 64),
                         nn::ReLU(), nn::Linear(64, 64), nn::ReLU(), nn::Linear(64, 4));
    model->train();
    const auto x = torch::randn({32, 16});
    // As the trainer does: forward under autocast (the recompute under the same one), the loss
    // in FP32 outside it. The loss first, then every parameter's gradient.
    auto step = [&](bool checkpoint) {
        model->zero_grad();
        ForwardOptions o;
        o.checkpoint = checkpoint;
        o.autocast = torch::kBFloat16;
        o.device = c10::DeviceType::CPU;
        torch::Tensor out;
        {
            AutocastGuard cast(c10::DeviceType::CPU, torch::kBFloat16);
            out = forwardModel(model, x, o);
        }
        REQUIRE(out.scalar_type() == torch::kBFloat16);  // the products did run in bf16
        const auto loss = out.to(torch::kFloat).pow(2).mean();
        loss.backward();
        std::vector<torch::Tensor> g{loss.detach().clone()};
        for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
        return g;
    };
    const auto plain = step(false), recomputed = step(true);
    REQUIRE(plain.size() == recomputed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
        INFO((i == 0 ? "loss" : "gradient of parameter " + std::to_string(i - 1)));
        CHECK(torch::equal(plain[i], recomputed[i]));
    }
}
