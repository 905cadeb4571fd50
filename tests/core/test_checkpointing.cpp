// Activation checkpointing's recompute, directly on a Sequential (the trainer-level tests in
// test_amp.cpp use the zoo's models, which draw no random numbers).
#include <torch/torch.h>

#include <catch2/catch.hpp>

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
