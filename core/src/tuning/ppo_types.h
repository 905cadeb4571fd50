#pragma once
// The PPO agent's actions and experience as plain values (torch-free), so the tuning hook's
// bookkeeping, the study files and the GUI can use them without LibTorch. The policy and its
// update are in ppo.h (liblathe_torch).
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/error.h"

namespace lathe::core::tuning {

/// Values in the state the agent observes at each decision (the run's recent metrics).
inline constexpr int kPpoStateSize = 8;
/// Learning-rate multiplier {0.5, 1, 2} × batch-size multiplier {0.5, 1, 2}.
inline constexpr int kPpoActions = 9;

struct PpoAction {
    double lrFactor = 1;
    double batchFactor = 1;
};

/// Action `index` (0..8) is lr × {0.5, 1, 2}[index / 3] and batch × {0.5, 1, 2}[index % 3]: 0 halves
/// both, 4 keeps both, 8 doubles both. Throws Error outside 0..8.
inline PpoAction ppoAction(int index) {
    if (index < 0 || index >= kPpoActions)
        throw Error("PPO action " + std::to_string(index) + " is outside 0.." +
                    std::to_string(kPpoActions - 1));
    static constexpr double kFactors[3] = {0.5, 1.0, 2.0};
    return {kFactors[index / 3], kFactors[index % 3]};
}

/// One decision of a run: what the agent saw, chose, and how the policy rated it at the time
/// (the old log-probability and value PPO's update needs), and the reward it earned.
struct PpoStep {
    std::vector<float> state;  // kPpoStateSize values
    int action = 0;            // 0..kPpoActions-1
    float logProb = 0;         // log pi(action | state) when chosen
    float value = 0;           // the critic's estimate when chosen
    float reward = 0;
};

/// One run (trial): its decisions in order. The run's end is the episode's end (no bootstrap).
struct PpoEpisode {
    std::vector<PpoStep> steps;
};

/// What one PPO update did (PpoPolicy::update in ppo.h).
struct PpoUpdateStats {
    int64_t samples = 0;      // steps in the episodes (each used `epochs` times)
    double policyLoss = 0;    // the clipped surrogate's loss (-objective)
    double valueLoss = 0;     // mean squared error against the GAE returns
    double entropy = 0;       // of the policy, in nats (uniform: ln 9 = 2.197)
    double approxKl = 0;      // KL(old || new), estimated as mean((r - 1) - ln r)
    double clipFraction = 0;  // share of samples whose ratio was outside 1 ± clip
    double meanReturn = 0;    // mean of the value targets (advantage + recorded value)
};

}  // namespace lathe::core::tuning
