// The PPO tuning agent as a TrainingHook (ppo_hook.h).
#include "tuning/ppo_hook.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "lathe/core/error.h"
#include "torch_backend.h"
#include "tuning/ppo.h"

namespace lathe::core::tuning {

namespace {

// The reward of a decision, over the interval it governed: the validation accuracy gained
// (x10: a point of accuracy is worth 0.1) plus a little for throughput against the run's first
// interval (log ratio x0.1), so that a faster schedule wins between equally accurate ones.
constexpr double kAccuracyWeight = 10.0;
constexpr double kSpeedWeight = 0.1;
constexpr double kMaxLrScale = 64.0;  // the agent moves lr within [1/64, 64] x the schedule's
constexpr int64_t kMinBatch = 8;
constexpr int64_t kMaxBatch = 4096;

double clip(double v, double lo, double hi) { return std::isfinite(v) ? std::clamp(v, lo, hi) : 0.0; }

class PpoHook : public TrainingHook {
public:
    explicit PpoHook(const RunSpec& spec)
        : m_policy(PpoPolicy::load(spec.ppoPolicy)),
          m_interval(std::max<int64_t>(1, spec.ppoInterval)),
          m_epochs(spec.epochs),
          m_rng(static_cast<uint64_t>(spec.seed) * 0x9E3779B97F4A7C15ULL + 0x5050),
          m_batch0(spec.batch) {}

    void afterPhase(TrainingLoop& loop, TrainingPhase phase) override {
        if (phase == TrainingPhase::Resume) {
            // A resumed run continues with the lr and batch the agent had chosen.
            if (m_restoreScale > 0) loop.setLrScale(m_restoreScale);
            if (m_restoreBatch > 0) loop.setBatchSize(m_restoreBatch);
            m_savedScale = loop.lrScale();
            m_savedBatch = loop.batchSize();
            return;
        }
        if (phase != TrainingPhase::Evaluation || loop.rank() != 0) return;
        const double epochDone = loop.lastMetric("train/epoch");
        const double valAcc = loop.lastMetric("val/accuracy");
        const double sps = loop.lastMetric("perf/samples_per_s");
        const double loss = loop.lastMetric("train/loss");
        const double gradNorm = loop.lastMetric("train/grad_norm");
        if (!std::isfinite(epochDone)) return;
        if (m_firstSps <= 0 && std::isfinite(sps) && sps > 0) m_firstSps = sps;

        // The schedule this epoch ran with.
        loop.recordMetric("ppo/lr", loop.lastMetric("train/lr"));
        loop.recordMetric("ppo/batch", static_cast<double>(loop.batchSize()));

        if (m_pending) {
            const double gain = std::isfinite(valAcc) && std::isfinite(m_lastAcc) ? valAcc - m_lastAcc : 0.0;
            const double speed =
                m_firstSps > 0 && std::isfinite(sps) && sps > 0 ? std::log(sps / m_firstSps) : 0.0;
            loop.recordMetric("ppo/reward", kAccuracyWeight * gain + kSpeedWeight * speed);
            m_pending = false;
        }
        const int64_t e = static_cast<int64_t>(epochDone);
        if (e < m_epochs && e % m_interval == 0) {
            std::vector<float> state(kPpoStateSize, 0.0f);
            state[0] = static_cast<float>(
                std::isfinite(m_lastLoss) ? clip((loss - m_lastLoss) / (std::abs(m_lastLoss) + 1e-8), -1, 1)
                                          : 0.0);
            state[1] = static_cast<float>(gradNorm > 0 ? clip(std::log10(gradNorm) / 3.0, -2, 2) : 0.0);
            state[2] =
                static_cast<float>(m_firstSps > 0 && sps > 0 ? clip(std::log(sps / m_firstSps), -2, 2) : 0.0);
            state[3] = static_cast<float>(std::isfinite(valAcc) ? valAcc : 0.0);
            state[4] = static_cast<float>(std::isfinite(valAcc) && std::isfinite(m_lastAcc)
                                              ? clip(10.0 * (valAcc - m_lastAcc), -1, 1)
                                              : 0.0);
            state[5] = static_cast<float>(std::log2(loop.lrScale()) / 6.0);
            state[6] = static_cast<float>(
                std::log2(static_cast<double>(loop.batchSize()) / static_cast<double>(m_batch0)) / 6.0);
            state[7] = static_cast<float>(static_cast<double>(e) / static_cast<double>(m_epochs));
            const auto d = m_policy.act(state, m_rng);
            for (int i = 0; i < kPpoStateSize; ++i) loop.recordMetric("ppo/s" + std::to_string(i), state[i]);
            loop.recordMetric("ppo/action", d.action);
            loop.recordMetric("ppo/logp", d.logProb);
            loop.recordMetric("ppo/value", d.value);
            const auto a = ppoAction(d.action);
            loop.setLrScale(std::clamp(loop.lrScale() * a.lrFactor, 1.0 / kMaxLrScale, kMaxLrScale));
            const int64_t cap = std::max<int64_t>(1, std::min(kMaxBatch, loop.trainSamplesPerEpoch()));
            const auto batch =
                static_cast<int64_t>(std::llround(static_cast<double>(loop.batchSize()) * a.batchFactor));
            loop.setBatchSize(std::clamp<int64_t>(batch, std::min(kMinBatch, cap), cap));
            m_pending = true;
        }
        m_lastAcc = valAcc;
        m_lastLoss = loss;
        m_savedScale = loop.lrScale();
        m_savedBatch = loop.batchSize();
    }

    // In checkpoints: the lr scale and batch chosen so far, for a resumed run.
    void saveState(std::map<std::string, torch::Tensor>& out) const override {
        out["ppo.lr_scale"] = torch::tensor({m_savedScale}, torch::kDouble);
        out["ppo.batch"] = torch::tensor({static_cast<double>(m_savedBatch)}, torch::kDouble);
    }
    void restoreState(const std::map<std::string, torch::Tensor>& in) override {
        const auto s = in.find("ppo.lr_scale");
        const auto b = in.find("ppo.batch");
        if (s != in.end()) m_restoreScale = s->second.item<double>();
        if (b != in.end()) m_restoreBatch = static_cast<int64_t>(b->second.item<double>());
    }

private:
    PpoPolicy m_policy;
    int64_t m_interval, m_epochs;
    std::mt19937_64 m_rng;
    int64_t m_batch0;
    double m_firstSps = 0;
    double m_lastAcc = std::numeric_limits<double>::quiet_NaN();
    double m_lastLoss = std::numeric_limits<double>::quiet_NaN();
    bool m_pending = false;
    double m_savedScale = 1.0;
    int64_t m_savedBatch = 0;
    double m_restoreScale = 0;
    int64_t m_restoreBatch = 0;
};

}  // namespace

std::shared_ptr<TrainingHook> makePpoHook(const RunSpec& spec) { return std::make_shared<PpoHook>(spec); }

}  // namespace lathe::core::tuning

namespace lathe::core::torch_impl {

void ppoCreatePolicy(const std::string& path, uint64_t seed) { tuning::PpoPolicy::create(seed).save(path); }

tuning::PpoUpdateStats ppoUpdatePolicy(const std::string& path,
                                       const std::vector<tuning::PpoEpisode>& episodes, uint64_t seed) {
    auto policy = tuning::PpoPolicy::load(path);
    tuning::PpoOptions o;
    o.seed = seed;
    const auto stats = policy.update(episodes, o);
    policy.save(path);
    return stats;
}

}  // namespace lathe::core::torch_impl
