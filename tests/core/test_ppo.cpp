// The PPO agent of `lathectl tune` (core/src/tuning/ppo.h): its file, its update's checks, and
// that it learns a contextual bandit.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "tuning/ppo.h"

using namespace lathe::core;
using namespace lathe::core::tuning;
using lathe::test::TempDir;

namespace {

// One intra-op thread for these tiny matrices (faster, and the same sums on any machine); the
// process's setting comes back afterwards for the other tests.
struct OneThread {
    int before = torch::get_num_threads();
    OneThread() { torch::set_num_threads(1); }
    ~OneThread() { torch::set_num_threads(before); }
};

// The bandit's context: state[0] = +1 or -1 at random, state[1] = 1, the rest 0.
std::vector<float> banditState(std::mt19937_64& rng) {
    std::vector<float> s(kPpoStateSize, 0.0f);
    s[0] = (rng() >> 63) ? 1.0f : -1.0f;
    s[1] = 1.0f;
    return s;
}

// 1 for doubling both lr and batch (action 8) when state[0] > 0, for halving both (action 0)
// when state[0] < 0; 0 for anything else.
float banditReward(const std::vector<float>& s, int action) {
    return action == (s[0] > 0 ? 8 : 0) ? 1.0f : 0.0f;
}

std::vector<PpoEpisode> playBandit(const PpoPolicy& policy, std::mt19937_64& rng, int episodes, int steps) {
    std::vector<PpoEpisode> out(episodes);
    for (auto& episode : out) {
        for (int t = 0; t < steps; ++t) {
            auto s = banditState(rng);
            const auto d = policy.act(s, rng);
            const float r = banditReward(s, d.action);
            episode.steps.push_back({std::move(s), d.action, d.logProb, d.value, r});
        }
    }
    return out;
}

double meanSampledReward(const PpoPolicy& policy, std::mt19937_64& rng, int n) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        const auto s = banditState(rng);
        sum += banditReward(s, policy.act(s, rng).action);
    }
    return sum / n;
}

std::vector<float> someState(float x) {
    std::vector<float> s(kPpoStateSize);
    for (int i = 0; i < kPpoStateSize; ++i) s[i] = x * static_cast<float>(i - 3) / 4;
    return s;
}

}  // namespace

TEST_CASE("PPO actions scale lr and batch by 0.5, 1 or 2", "[ppo]") {
    CHECK(ppoAction(0).lrFactor == 0.5);
    CHECK(ppoAction(0).batchFactor == 0.5);
    CHECK(ppoAction(4).lrFactor == 1.0);
    CHECK(ppoAction(4).batchFactor == 1.0);
    CHECK(ppoAction(5).lrFactor == 1.0);
    CHECK(ppoAction(5).batchFactor == 2.0);
    CHECK(ppoAction(8).lrFactor == 2.0);
    CHECK(ppoAction(8).batchFactor == 2.0);
    CHECK_THROWS_AS(ppoAction(9), Error);
    CHECK_THROWS_AS(ppoAction(-1), Error);
}

TEST_CASE("a new PPO policy is near uniform and acts deterministically for an rng state", "[ppo]") {
    OneThread oneThread;
    const auto policy = PpoPolicy::create(5);
    CHECK(policy.updates() == 0);
    std::mt19937_64 rng(1);
    const auto d = policy.act(someState(1), rng);
    CHECK(d.logProb == Approx(-std::log(9.0)).margin(0.05));
    std::vector<int> counts(kPpoActions);
    std::mt19937_64 a(42), b(42);
    for (int i = 0; i < 900; ++i) {
        const auto da = policy.act(someState(0.5f), a);
        const auto db = policy.act(someState(0.5f), b);
        REQUIRE(da.action == db.action);
        ++counts[da.action];
    }
    for (int c : counts) CHECK(c > 50);  // 100 expected each
    // The same seed gives the same weights.
    std::mt19937_64 r1(3), r2(3);
    const auto other = PpoPolicy::create(5);
    CHECK(other.act(someState(1), r1).logProb == policy.act(someState(1), r2).logProb);
    CHECK_THROWS_AS(policy.act(std::vector<float>(kPpoStateSize - 1), rng), Error);
}

TEST_CASE("a PPO policy survives save and load and a damaged file is refused by name", "[ppo]") {
    OneThread oneThread;
    TempDir dir;
    auto policy = PpoPolicy::create(7);
    std::mt19937_64 play(1);
    PpoOptions options;
    options.epochs = 2;
    policy.update(playBandit(policy, play, 4, 4), options);
    REQUIRE(policy.updates() == 1);

    const std::string path = dir.file("study/policy.pt");
    policy.save(path);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    const auto loaded = PpoPolicy::load(path);
    CHECK(loaded.updates() == 1);
    for (int i = 0; i < 20; ++i) {
        const auto s = someState(0.3f * static_cast<float>(i - 10));
        std::mt19937_64 r1(100 + i), r2(100 + i);
        const auto a = policy.act(s, r1);
        const auto b = loaded.act(s, r2);
        CHECK(a.action == b.action);
        CHECK(a.logProb == b.logProb);
        CHECK(a.value == b.value);
        CHECK(policy.act(s, r1, true).action == loaded.act(s, r2, true).action);
    }

    // A copy is deep: updating it leaves the original alone.
    auto copy = policy;
    copy.update(playBandit(copy, play, 4, 4), options);
    CHECK(copy.updates() == 2);
    CHECK(policy.updates() == 1);
    std::mt19937_64 r1(9), r2(9);
    CHECK(policy.act(someState(1), r1).logProb == loaded.act(someState(1), r2).logProb);

    CHECK_THROWS_WITH(PpoPolicy::load(dir.file("missing.pt")), Catch::Contains(dir.file("missing.pt")));
    std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
    CHECK_THROWS_AS(PpoPolicy::load(path), Error);
    CHECK_THROWS_WITH(PpoPolicy::load(path), Catch::Contains(path));
    lathe::test::writeFile(path, "not a policy");
    CHECK_THROWS_WITH(PpoPolicy::load(path), Catch::Contains(path));
}

TEST_CASE("PPO's update refuses bad steps and leaves the policy unchanged", "[ppo]") {
    OneThread oneThread;
    auto policy = PpoPolicy::create(1);
    std::mt19937_64 play(2);
    auto episodes = playBandit(policy, play, 2, 4);
    std::mt19937_64 r1(5);
    const auto before = policy.act(someState(1), r1);

    auto badAction = episodes;
    badAction[1].steps[2].action = 9;
    CHECK_THROWS_WITH(policy.update(badAction, {}), Catch::Contains("action 9"));
    badAction[1].steps[2].action = -1;
    CHECK_THROWS_AS(policy.update(badAction, {}), Error);
    auto badState = episodes;
    badState[0].steps[0].state.pop_back();
    CHECK_THROWS_WITH(policy.update(badState, {}), Catch::Contains("7 values"));
    auto badReward = episodes;
    badReward[0].steps[1].reward = std::nanf("");
    CHECK_THROWS_AS(policy.update(badReward, {}), Error);
    PpoOptions badOptions;
    badOptions.minibatch = 0;
    CHECK_THROWS_AS(policy.update(episodes, badOptions), Error);

    const auto none = policy.update({}, {});
    CHECK(none.samples == 0);
    CHECK(none.policyLoss == 0);
    CHECK(policy.update({PpoEpisode{}, PpoEpisode{}}, {}).samples == 0);

    CHECK(policy.updates() == 0);
    std::mt19937_64 r2(5);
    const auto after = policy.act(someState(1), r2);
    CHECK(after.logProb == before.logProb);
    CHECK(after.value == before.value);
}

TEST_CASE("PPO learns a contextual bandit", "[ppo]") {
    OneThread oneThread;
    auto policy = PpoPolicy::create(3);
    std::mt19937_64 rng(11);
    // Near uniform at first: 1/9 of the sampled actions earn the reward.
    CHECK(meanSampledReward(policy, rng, 1000) < 0.2);

    PpoOptions options;
    PpoUpdateStats first, last;
    for (int update = 0; update < 40; ++update) {
        options.seed = static_cast<uint64_t>(update);
        last = policy.update(playBandit(policy, rng, 16, 4), options);
        if (update == 0) first = last;
    }
    CHECK(policy.updates() == 40);
    CHECK(first.samples == 64);
    CHECK(first.entropy > 2.0);  // ln 9 = 2.197
    CHECK(last.entropy < first.entropy);

    std::vector<float> plus(kPpoStateSize, 0.0f), minus(kPpoStateSize, 0.0f);
    plus[0] = 1, plus[1] = 1;
    minus[0] = -1, minus[1] = 1;
    CHECK(policy.act(plus, rng, true).action == 8);
    CHECK(policy.act(minus, rng, true).action == 0);
    const double reward = meanSampledReward(policy, rng, 1000);
    INFO("mean sampled reward " << reward);
    CHECK(reward > 0.8);

    // The same episodes and options give the same policy.
    auto a = PpoPolicy::create(4), b = PpoPolicy::create(4);
    std::mt19937_64 play(6);
    const auto episodes = playBandit(a, play, 8, 4);
    const auto sa = a.update(episodes, options);
    const auto sb = b.update(episodes, options);
    CHECK(sa.policyLoss == sb.policyLoss);
    std::mt19937_64 r1(1), r2(1);
    CHECK(a.act(plus, r1).logProb == b.act(plus, r2).logProb);
}
