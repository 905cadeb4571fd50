// The PPO agent (ppo.h): the actor-critic network, its file, acting and the PPO update.
#include "tuning/ppo.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <utility>

#include <torch/torch.h>

#include "durable_file.h"
#include "lathe/core/error.h"

namespace lathe::core::tuning {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kHidden = 64;
constexpr int64_t kFormat = 1;  // "format" in the file; bumped when the network changes
constexpr double kPi = 3.14159265358979323846;

// A dense layer that draws nothing: torch::nn::Linear initialises itself from torch's global
// generator, which would shift a run's random stream whenever a policy is created or loaded.
struct DenseImpl : torch::nn::Cloneable<DenseImpl> {
    DenseImpl(int64_t in, int64_t out) : in(in), out(out) { reset(); }
    void reset() override {
        weight = register_parameter("weight", torch::zeros({out, in}));
        bias = register_parameter("bias", torch::zeros({out}));
    }
    torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }
    int64_t in, out;
    torch::Tensor weight, bias;
};
TORCH_MODULE(Dense);

}  // namespace

// Separate actor and critic trunks: with a shared one the value loss's gradients (rewards of
// any scale) would pull on the features the policy uses.
struct PpoNet : torch::nn::Cloneable<PpoNet> {
    PpoNet() { reset(); }
    void reset() override {
        actor1 = register_module("actor1", Dense(kPpoStateSize, kHidden));
        actor2 = register_module("actor2", Dense(kHidden, kHidden));
        policy = register_module("policy", Dense(kHidden, kPpoActions));
        critic1 = register_module("critic1", Dense(kPpoStateSize, kHidden));
        critic2 = register_module("critic2", Dense(kHidden, kHidden));
        value = register_module("value", Dense(kHidden, 1));
    }
    // Logits [N, 9] and values [N] of states [N, 8].
    std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
        const auto a = torch::tanh(actor2(torch::tanh(actor1(x))));
        const auto c = torch::tanh(critic2(torch::tanh(critic1(x))));
        return {policy(a), value(c).squeeze(-1)};
    }
    Dense actor1{nullptr}, actor2{nullptr}, policy{nullptr};
    Dense critic1{nullptr}, critic2{nullptr}, value{nullptr};
};

namespace {

// 53 random bits in [0, 1): the same draws with any C++ library, unlike
// std::uniform_real_distribution (as search.cpp's samplers).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double gaussian(std::mt19937_64& rng) {
    const double u = 1.0 - uniform01(rng);  // in (0, 1]: the logarithm stays finite
    const double v = uniform01(rng);
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * kPi * v);
}

// A rows × cols matrix with orthonormal rows or columns (whichever are fewer), times `gain`: the
// Q of a Gaussian matrix's QR, its signs fixed by R's diagonal so Q is uniformly distributed.
torch::Tensor orthogonal(int64_t rows, int64_t cols, double gain, std::mt19937_64& rng) {
    const int64_t n = std::max(rows, cols), k = std::min(rows, cols);
    std::vector<double> draws(static_cast<size_t>(n * k));
    for (double& x : draws) x = gaussian(rng);
    const auto a = torch::from_blob(draws.data(), {n, k}, torch::kFloat64);
    auto [q, r] = torch::linalg_qr(a);
    q = q * torch::sign(torch::diagonal(r)).unsqueeze(0);
    if (rows < cols) q = q.t();
    return (q * gain).to(torch::kFloat32).contiguous();
}

void initialise(PpoNet& net, uint64_t seed) {
    std::mt19937_64 rng(seed);
    torch::NoGradGuard noGrad;
    const auto set = [&](Dense& layer, double gain) {
        layer->weight.copy_(orthogonal(layer->out, layer->in, gain, rng));
        layer->bias.zero_();
    };
    const double trunk = std::sqrt(2.0);
    set(net.actor1, trunk);
    set(net.actor2, trunk);
    set(net.policy, 0.01);  // near-equal logits: the first trials explore every action
    set(net.critic1, trunk);
    set(net.critic2, trunk);
    set(net.value, 1.0);
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Replaces the policy file whole: a crash leaves the old policy or the new one, never half.
void writeAtomically(const std::string& path, const std::string& data) {
    if (const auto failed = writeFileDurably(path, {data}); !failed.empty())
        throw Error("PPO policy: " + failed);
}

void checkState(const std::vector<float>& state, const std::string& where) {
    if (state.size() != static_cast<size_t>(kPpoStateSize))
        throw Error(where + "state has " + std::to_string(state.size()) + " values, expected " +
                    std::to_string(kPpoStateSize));
    for (size_t i = 0; i < state.size(); ++i)
        if (!std::isfinite(state[i]))
            throw Error(where + "state value " + std::to_string(i) + " is not finite");
}

void checkOptions(const PpoOptions& o) {
    const auto fail = [](const std::string& what) { throw Error("PPO options: " + what); };
    if (!(o.gamma >= 0 && o.gamma <= 1)) fail("gamma must be in [0, 1]");
    if (!(o.lambda >= 0 && o.lambda <= 1)) fail("lambda must be in [0, 1]");
    if (!(o.clip > 0 && o.clip < 1)) fail("clip must be in (0, 1)");
    if (o.epochs < 1) fail("epochs must be at least 1");
    if (o.minibatch < 1) fail("minibatch must be at least 1");
    if (!(o.lr > 0 && std::isfinite(o.lr))) fail("lr must be > 0");
    if (!(o.valueCoef >= 0 && std::isfinite(o.valueCoef))) fail("valueCoef must be >= 0");
    if (!std::isfinite(o.entropyCoef)) fail("entropyCoef must be finite");
    if (std::isnan(o.maxGradNorm)) fail("maxGradNorm must be a number");
}

// Orders `order` at random with Fisher-Yates on 53-bit draws (std::shuffle's order differs
// between C++ libraries).
void shuffle(std::vector<int64_t>& order, std::mt19937_64& rng) {
    for (size_t i = order.size(); i > 1; --i) {
        const auto j = static_cast<size_t>(uniform01(rng) * static_cast<double>(i));
        std::swap(order[i - 1], order[std::min(j, i - 1)]);
    }
}

}  // namespace

PpoPolicy::PpoPolicy(std::shared_ptr<PpoNet> net, int64_t updates)
    : m_net(std::move(net)), m_updates(updates) {}

PpoPolicy::PpoPolicy(const PpoPolicy& other)
    : m_net(std::dynamic_pointer_cast<PpoNet>(other.m_net->clone())), m_updates(other.m_updates) {}

PpoPolicy& PpoPolicy::operator=(const PpoPolicy& other) {
    if (this != &other) *this = PpoPolicy(other);
    return *this;
}

PpoPolicy::PpoPolicy(PpoPolicy&&) noexcept = default;
PpoPolicy& PpoPolicy::operator=(PpoPolicy&&) noexcept = default;
PpoPolicy::~PpoPolicy() = default;

PpoPolicy PpoPolicy::create(uint64_t seed) {
    auto net = std::make_shared<PpoNet>();
    initialise(*net, seed);
    return PpoPolicy(std::move(net), 0);
}

PpoPolicy PpoPolicy::load(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw Error("PPO policy " + path + " does not exist");
    auto net = std::make_shared<PpoNet>();
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : net->parameters()) shapes.push_back(p.sizes().vec());
    c10::IValue format, updates;
    try {
        torch::serialize::InputArchive archive;
        archive.load_from(path);
        if (!archive.try_read("format", format) || !format.isInt())
            throw Error("PPO policy " + path + " is not a PPO policy (no format)");
        if (format.toInt() > kFormat)
            throw Error("PPO policy " + path + " has format " + std::to_string(format.toInt()) +
                        ", newer than this build's " + std::to_string(kFormat));
        net->load(archive);
        archive.read("updates", updates);
    } catch (const Error&) {
        throw;
    } catch (const c10::Error& ex) {
        throw Error("PPO policy " + path + " is damaged: " + firstLine(ex.what_without_backtrace()));
    } catch (const std::exception& ex) {
        throw Error("PPO policy " + path + " is damaged: " + firstLine(ex.what()));
    }
    // Module::load takes a stored tensor's shape as it comes; a policy of another shape is refused
    // here rather than failing later inside a matrix product.
    const auto params = net->named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i].value();
        if (p.sizes().vec() != shapes[i] || p.scalar_type() != torch::kFloat32 ||
            !torch::isfinite(p).all().item<bool>())
            throw Error("PPO policy " + path + " does not fit this network (" + params[i].key() + ")");
    }
    if (!updates.isInt() || updates.toInt() < 0)
        throw Error("PPO policy " + path + " is damaged: bad update count");
    return PpoPolicy(std::move(net), updates.toInt());
}

void PpoPolicy::save(const std::string& path) const {
    std::ostringstream buf;
    try {
        torch::serialize::OutputArchive archive;
        m_net->save(archive);
        archive.write("format", c10::IValue(kFormat));
        archive.write("updates", c10::IValue(m_updates));
        archive.save_to(buf);
    } catch (const c10::Error& ex) {
        throw Error("cannot write PPO policy " + path + ": " + firstLine(ex.what_without_backtrace()));
    }
    writeAtomically(path, buf.str());
}

PpoPolicy::Decision PpoPolicy::act(const std::vector<float>& state, std::mt19937_64& rng, bool greedy) const {
    checkState(state, "PPO ");
    torch::NoGradGuard noGrad;
    const auto x = torch::tensor(state, torch::kFloat32).view({1, kPpoStateSize});
    const auto [logits, value] = m_net->forward(x);
    const auto logp = torch::log_softmax(logits, -1).contiguous();
    const float* lp = logp.data_ptr<float>();
    int action = kPpoActions - 1;  // where rounding leaves the cumulative sum just short of 1
    if (greedy) {
        action = static_cast<int>(std::max_element(lp, lp + kPpoActions) - lp);
    } else {
        const double u = uniform01(rng);
        double cumulative = 0;
        for (int i = 0; i < kPpoActions; ++i) {
            cumulative += std::exp(static_cast<double>(lp[i]));
            if (u < cumulative) {
                action = i;
                break;
            }
        }
    }
    return {action, lp[action], value.item<float>()};
}

PpoUpdateStats PpoPolicy::update(const std::vector<PpoEpisode>& episodes, const PpoOptions& o) {
    checkOptions(o);
    size_t n = 0;
    for (size_t e = 0; e < episodes.size(); ++e) {
        for (size_t t = 0; t < episodes[e].steps.size(); ++t) {
            const PpoStep& s = episodes[e].steps[t];
            const std::string where =
                "PPO episode " + std::to_string(e) + ", step " + std::to_string(t) + ": ";
            checkState(s.state, where);
            if (s.action < 0 || s.action >= kPpoActions)
                throw Error(where + "action " + std::to_string(s.action) + " is outside 0.." +
                            std::to_string(kPpoActions - 1));
            if (!std::isfinite(s.logProb) || s.logProb > 0 || !std::isfinite(s.value) ||
                !std::isfinite(s.reward))
                throw Error(where +
                            "log-probability, value and reward must be finite (log-probability <= 0)");
            ++n;
        }
    }
    PpoUpdateStats stats;
    if (n == 0) return stats;

    // GAE(lambda) per episode, backwards from its end, where the next value is 0.
    std::vector<float> states, oldLogProbs, returns;
    std::vector<int64_t> actions;
    std::vector<double> advantages;
    states.reserve(n * kPpoStateSize);
    for (const auto& episode : episodes) {
        const auto& steps = episode.steps;
        std::vector<double> adv(steps.size());
        double gae = 0;
        for (size_t t = steps.size(); t-- > 0;) {
            const double next = t + 1 < steps.size() ? steps[t + 1].value : 0.0;
            const double delta = steps[t].reward + o.gamma * next - steps[t].value;
            gae = delta + o.gamma * o.lambda * gae;
            adv[t] = gae;
        }
        for (size_t t = 0; t < steps.size(); ++t) {
            states.insert(states.end(), steps[t].state.begin(), steps[t].state.end());
            actions.push_back(steps[t].action);
            oldLogProbs.push_back(steps[t].logProb);
            returns.push_back(static_cast<float>(adv[t] + steps[t].value));
            advantages.push_back(adv[t]);
        }
    }
    const double count = static_cast<double>(n);
    stats.samples = static_cast<int64_t>(n);
    stats.meanReturn = std::accumulate(returns.begin(), returns.end(), 0.0) / count;
    const double mean = std::accumulate(advantages.begin(), advantages.end(), 0.0) / count;
    double var = 0;
    for (double a : advantages) var += (a - mean) * (a - mean);
    const double sd = std::sqrt(var / count);
    std::vector<float> normalised;
    normalised.reserve(n);
    for (double a : advantages) normalised.push_back(static_cast<float>((a - mean) / (sd + 1e-8)));

    const auto n64 = static_cast<int64_t>(n);
    const auto allStates = torch::tensor(states, torch::kFloat32).view({n64, kPpoStateSize});
    const auto allActions = torch::tensor(actions, torch::kInt64);
    const auto allOld = torch::tensor(oldLogProbs, torch::kFloat32);
    const auto allReturns = torch::tensor(returns, torch::kFloat32);
    const auto allAdv = torch::tensor(normalised, torch::kFloat32);

    torch::AutoGradMode enableGrad(true);  // callers may hold a NoGradGuard
    // A fresh Adam each update: its moments are kept neither between updates nor in the file.
    // Updates are rare (between trials) and each makes epochs × n / minibatch steps, so the moments
    // warm up within an update; keeping them would tie the file format to the optimizer's.
    const auto params = m_net->parameters();
    torch::optim::Adam adam(params, torch::optim::AdamOptions(o.lr).eps(1e-5));
    std::mt19937_64 rng(o.seed);
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const int64_t minibatch = std::min<int64_t>(o.minibatch, n64);
    double policyLoss = 0, valueLoss = 0, entropy = 0, approxKl = 0, clipFraction = 0, weight = 0;
    for (int epoch = 0; epoch < o.epochs; ++epoch) {
        shuffle(order, rng);
        for (int64_t start = 0; start < n64; start += minibatch) {
            const int64_t len = std::min(minibatch, n64 - start);
            const auto idx = torch::tensor(
                std::vector<int64_t>(order.begin() + start, order.begin() + start + len), torch::kInt64);
            const auto adv = allAdv.index_select(0, idx);
            const auto old = allOld.index_select(0, idx);
            const auto [logits, values] = m_net->forward(allStates.index_select(0, idx));
            const auto logpAll = torch::log_softmax(logits, -1);
            const auto logp = logpAll.gather(1, allActions.index_select(0, idx).unsqueeze(1)).squeeze(1);
            const auto logRatio = logp - old;
            const auto ratio = torch::exp(logRatio);
            const auto surrogate =
                torch::min(ratio * adv, torch::clamp(ratio, 1.0 - o.clip, 1.0 + o.clip) * adv);
            const auto pLoss = -surrogate.mean();
            const auto vLoss = (values - allReturns.index_select(0, idx)).pow(2).mean();
            const auto ent = -(logpAll.exp() * logpAll).sum(-1).mean();
            const auto loss = pLoss + o.valueCoef * vLoss - o.entropyCoef * ent;
            adam.zero_grad();
            loss.backward();
            if (o.maxGradNorm > 0) torch::nn::utils::clip_grad_norm_(params, o.maxGradNorm);
            adam.step();

            torch::NoGradGuard noGrad;
            const double w = static_cast<double>(len);
            policyLoss += w * pLoss.item<double>();
            valueLoss += w * vLoss.item<double>();
            entropy += w * ent.item<double>();
            approxKl += w * ((ratio - 1) - logRatio).mean().item<double>();
            clipFraction += w * ((ratio - 1).abs() > o.clip).to(torch::kFloat64).mean().item<double>();
            weight += w;
        }
    }
    stats.policyLoss = policyLoss / weight;
    stats.valueLoss = valueLoss / weight;
    stats.entropy = entropy / weight;
    stats.approxKl = approxKl / weight;
    stats.clipFraction = clipFraction / weight;
    ++m_updates;
    return stats;
}

}  // namespace lathe::core::tuning
