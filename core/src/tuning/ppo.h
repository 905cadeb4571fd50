#pragma once
// The PPO agent of `lathectl tune` (liblathe_torch; the types it records are torch-free, in
// ppo_types.h). During a trial it observes a state built from the run's recent metrics at each
// epoch and picks one of 9 actions that scale the learning rate and the batch size; each run is an
// episode. Between trials the tuning driver updates the policy from the finished episodes with
// PPO (Schulman et al. 2017: GAE advantages, the clipped surrogate objective, a value loss and an
// entropy bonus) and saves it with the study.
//
// The network is a small actor-critic MLP with separate trunks: state 8 → 64 tanh → 64 tanh →
// 9 logits, and 8 → 64 tanh → 64 tanh → 1 value. Its weights are orthogonal (gain √2 in the
// trunks, 1 for the value, 0.01 for the logits so a new policy is near uniform), drawn from the
// seed with the policy's own generator: creating or loading a policy never touches torch's
// global random stream, so a run's own draws do not depend on whether an agent rides along.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tuning/ppo_types.h"

namespace lathe::core::tuning {

struct PpoOptions {
    double gamma = 0.99;     // discount
    double lambda = 0.95;    // GAE's lambda
    double clip = 0.2;       // the surrogate's ratio clip (1 ± clip)
    int epochs = 8;          // passes over the samples per update
    int minibatch = 64;      // samples per gradient step (the last of a pass may be smaller)
    double lr = 3e-4;        // Adam's step size
    double valueCoef = 0.5;  // weight of the value loss
    double entropyCoef = 0.01;
    double maxGradNorm = 0.5;  // global gradient-norm clip; <= 0 turns it off
    uint64_t seed = 0;         // the minibatch shuffles
};

/// Averages over every minibatch of the update, weighted by its size, measured before its step.

struct PpoNet;  // the network (ppo.cpp)

class PpoPolicy {
public:
    struct Decision {
        int action = 0;
        float logProb = 0;  // log pi(action | state)
        float value = 0;    // the critic's estimate of the state
    };

    /// A fresh near-uniform policy; the same seed gives the same weights.
    static PpoPolicy create(uint64_t seed);
    /// Throws Error naming the file when it is missing, damaged, or not a policy of this shape.
    static PpoPolicy load(const std::string& path);
    /// A LibTorch archive of the named parameters, "format" and "updates" (int64). Atomic: written
    /// to path + ".tmp", synced, then renamed over `path`. Throws Error naming the file.
    void save(const std::string& path) const;

    PpoPolicy(const PpoPolicy& other);  // deep: the copy's weights are its own
    PpoPolicy& operator=(const PpoPolicy& other);
    PpoPolicy(PpoPolicy&&) noexcept;
    PpoPolicy& operator=(PpoPolicy&&) noexcept;
    ~PpoPolicy();

    /// Samples an action from the policy with one draw of `rng` (53 bits, so the same rng state
    /// gives the same action with any C++ library), or takes the most likely one without drawing
    /// when `greedy`. No autograd. Throws Error unless the state has kPpoStateSize finite values.
    Decision act(const std::vector<float>& state, std::mt19937_64& rng, bool greedy = false) const;

    /// One PPO update from finished episodes, whose steps carry the log-probabilities and values
    /// recorded when acting (the old policy): GAE(lambda) advantages (the value after an episode's
    /// last step is 0), returns = advantages + values, advantages normalised over the batch, then
    /// `epochs` passes of shuffled minibatches minimising
    ///   -min(r A, clip(r, 1 ± clip) A) + valueCoef (V - R)² - entropyCoef H,   r = pi / pi_old
    /// with Adam and gradient-norm clipping. Deterministic for given options (the shuffle draws from
    /// options.seed; torch's global generator is not used). Counts one update. Throws Error — and
    /// changes nothing — for a state of the wrong size, an action outside 0..8, a non-finite
    /// number or invalid options; no steps at all give zero stats and change nothing.
    PpoUpdateStats update(const std::vector<PpoEpisode>& episodes, const PpoOptions& options);

    /// Updates applied since the policy was created (kept in its file).
    int64_t updates() const { return m_updates; }

private:
    PpoPolicy(std::shared_ptr<PpoNet> net, int64_t updates);

    std::shared_ptr<PpoNet> m_net;
    int64_t m_updates = 0;
};

}  // namespace lathe::core::tuning
