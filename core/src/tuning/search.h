#pragma once
// Hyper-parameter search (torch-free): the search space of a study (`--space KEY=DIST(...)`),
// and the samplers that propose a trial's values from the finished trials — random, and TPE
// (the Tree-structured Parzen Estimator of Bergstra et al. 2011, as Optuna's default sampler
// does it: independent univariate Parzen estimators of the good and the other trials, the
// candidate with the best ratio l(x)/g(x)) — and ASHA's promotion rule (asynchronous successive
// halving, Li et al. 2020). Values are run-spec values: a trial is an ordinary run.
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace lathe::core::tuning {

/// One searched key and its distribution.
struct Param {
    enum class Kind { Uniform, LogUniform, Int, LogInt, Choice };
    std::string key;  // a run-spec key, e.g. "lr"
    Kind kind = Kind::Uniform;
    double lo = 0, hi = 1;             // numeric kinds (inclusive)
    std::vector<std::string> choices;  // Choice: the values as the spec takes them ("[64,64]" → "64,64")
    /// "loguniform(0.0001, 0.1)" — the form it was given in, normalised.
    std::string describe() const;
};

/// KEY=uniform(A,B) | loguniform(A,B) | int(A,B) | logint(A,B) | choice(V1,V2,...) where a choice
/// value may be a bracketed list ("choice([64],[128,128])"). The key must be a run-spec key and
/// every bound and choice a valid value of it (checkSpecValue); log ranges need A > 0. Throws
/// ConfigError naming what is wrong.
Param parseParam(const std::string& text);

struct SearchSpace {
    std::vector<Param> params;
    /// Throws ConfigError for a key given twice or an empty space.
    void check() const;
};

/// A trial's values, key → spec value text.
using Assignment = std::map<std::string, std::string>;

/// One finished (or running) trial as the samplers see it.
struct Observation {
    Assignment params;
    std::optional<double> value;  // the objective; none while running, or when failed/pruned early
    /// A pruned trial: the budget of the rung where it stopped (its value is the one there, a
    /// lower fidelity than a complete trial's). None for a complete trial.
    std::optional<double> prunedAt;
};

enum class Direction { Maximize, Minimize };

/// A value of `p` drawn uniformly (log-uniformly for log kinds). Deterministic for a given rng state.
std::string sampleUniform(const Param& p, std::mt19937_64& rng);
/// Every parameter drawn independently at random.
Assignment sampleRandom(const SearchSpace& space, std::mt19937_64& rng);

struct TpeOptions {
    int startupTrials = 10;  // random until this many trials have a value
    int candidates = 24;     // drawn from l(x); the best l/g is taken
    double priorWeight = 1.0;
};
/// TPE: with fewer than startupTrials observed values, random; else per parameter, the
/// observations ranked — complete trials by value, then pruned ones, those stopped at a later rung
/// first and by value within a rung (as Optuna: a value at 3 epochs is not comparable with one at
/// 81) — split into the best gamma(n) = min(ceil(0.1 n), 25) and the rest, a Parzen
/// estimator of each (truncated Gaussians on the encoded scale — log for log kinds — with
/// bandwidths from the neighbours' distances, plus a prior over the whole range; categorical:
/// smoothed counts), and of `candidates` draws from the good one, the one maximising
/// log l(x) - log g(x).
Assignment sampleTpe(const SearchSpace& space, const std::vector<Observation>& history, Direction direction,
                     std::mt19937_64& rng, const TpeOptions& options = {});

/// ASHA's rungs: budgets minBudget * eta^k up to maxBudget.
struct Asha {
    double minBudget = 1;
    double maxBudget = 27;
    double eta = 3;
    std::vector<double> rungs() const;
    /// Whether a trial that reached a rung with `value` continues, given the values every trial
    /// recorded at that rung so far (this one included): it does when it is among the best
    /// floor(n / eta) of them (by `direction`), or the best while fewer than eta have reached the
    /// rung — asynchronous: decided at once, never waiting for the rung to fill (as Optuna's
    /// SuccessiveHalvingPruner).
    static bool promote(double value, const std::vector<double>& atRung, Direction direction, double eta);
};

}  // namespace lathe::core::tuning
