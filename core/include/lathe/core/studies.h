#pragma once
// Hyper-parameter studies in the workspace (`lathectl tune`, `lathectl studies`, the Studies
// page): a study is a named group of runs — its trials — with the search space, the algorithm
// (sampler and pruner), the objective and the algorithm's state. Every trial is an ordinary run
// (curves, profile, checkpoints; it can be registered and deployed); the study adds the trial's
// parameters, its outcome (complete, pruned, failed) and, under ASHA, the value it had at each
// rung. Torch-free (workspace/studies.cpp).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lathe::core {

enum class TrialState { Running, Complete, Pruned, Failed };
const char* toString(TrialState s);  // "running", "complete", "pruned", "failed"
/// Throws ConfigError for another text.
TrialState parseTrialState(const std::string& text);

/// A trial's value at one ASHA rung (budget = the budget key's value there, e.g. epoch 3).
struct RungRecord {
    int rung = 0;
    double budget = 0;
    double value = 0;
    bool promoted = false;
};

struct TrialRecord {
    int64_t id = 0;
    int64_t studyId = 0;
    int64_t number = 0;  // 0, 1, 2, … in the order trials were started
    int64_t runId = 0;   // 0 until the trial's run exists
    TrialState state = TrialState::Running;
    std::map<std::string, std::string> params;  // run-spec key → value as the spec takes it
    std::optional<double> value;                // the objective (the last one a pruned trial reached)
    double prunedAt = 0;                        // the budget it was stopped at (pruned trials)
    std::string error;                          // failed: why; pruned: the rung's verdict
    std::string host;                           // where it ran ("localhost" or an inventory host)
    int64_t pid = 0;                            // the trial's process (local trials)
    double startedAt = 0, endedAt = 0;
    std::vector<RungRecord> rungs;
};

struct StudyRecord {
    int64_t id = 0;
    std::string name;
    std::string sampler = "tpe";  // random | tpe | ppo
    std::string pruner = "none";  // none | asha
    std::string objective = "val/accuracy";
    std::string direction = "max";   // max | min
    std::vector<std::string> space;  // "lr=loguniform(0.0001, 0.1)", as tuning::parseParam takes them
    std::string baseConfig;          // the base run spec, TOML
    /// JSON: {"trials": N, "parallel": P, "seed": S, "budget_key": "epochs", "min_budget": 1,
    /// "max_budget": 27, "eta": 3, "hosts": [...], "ppo_interval": 1}
    std::string settings = "{}";
    /// JSON: the algorithm's state (PPO: the policy file and how many updates it has had).
    std::string state = "{}";
    std::string status = "running";  // running | completed | stopped
    double createdAt = 0, updatedAt = 0;
    // Summary (filled by list() and study()):
    int64_t trialsTotal = 0, complete = 0, pruned = 0, failed = 0, running = 0;
    std::optional<double> bestValue;
    int64_t bestTrial = -1;  // number of the best trial
};

/// The workspace's studies. Opens (and migrates) the workspace as Store does; its own
/// connection, safe from one thread at a time.
class Studies {
public:
    explicit Studies(const std::string& workspacePath);
    ~Studies();
    Studies(const Studies&) = delete;
    Studies& operator=(const Studies&) = delete;

    /// Letters, digits, '-', '_' and '.', 1–64 characters; throws ConfigError otherwise.
    static void validateName(const std::string& name);

    /// Creates a study; returns its id. Throws ConfigError when the name is taken.
    int64_t create(const StudyRecord& study);
    std::optional<StudyRecord> study(const std::string& name) const;
    std::optional<StudyRecord> studyById(int64_t id) const;
    std::vector<StudyRecord> list() const;  // newest first
    void setStatus(int64_t studyId, const std::string& status);
    void setState(int64_t studyId, const std::string& stateJson);
    void setSettings(int64_t studyId, const std::string& settingsJson);

    /// A new running trial; returns its id. Throws ConfigError when the number is taken.
    int64_t addTrial(int64_t studyId, int64_t number, const std::map<std::string, std::string>& params,
                     const std::string& host);
    /// The trial's run and process, once the run exists (called by the trial's `lathectl train`).
    void attachRun(int64_t trialId, int64_t runId, int64_t pid);
    void finishTrial(int64_t trialId, TrialState state, std::optional<double> value, const std::string& error,
                     double prunedAt = 0);
    void addRung(int64_t trialId, const RungRecord& rung);
    /// The study's trials by number, with their rungs.
    std::vector<TrialRecord> trials(int64_t studyId) const;
    std::optional<TrialRecord> trial(int64_t trialId) const;
    /// The study and trial a run belongs to, if any.
    std::optional<std::pair<std::string, int64_t>> trialOfRun(int64_t runId) const;
    /// Removes the study and its trial records (the runs stay).
    bool remove(const std::string& name);

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

/// The better of two objective values under a study's direction ("max" | "min").
bool betterValue(double a, double b, const std::string& direction);

/// How much of the objective's variation each parameter explains, from the trials that have a
/// value (complete ones; pruned ones at their last rung are not comparable and are left out):
/// per parameter the share of the objective's variance between groups of trials with similar
/// values (quantile bins of numeric parameters on their log scale when log-distributed, one group
/// per choice), normalised to sum to 1 over the parameters. Sorted, most important first; empty
/// with fewer than 4 such trials (tuning/importance.cpp).
struct ParamImportance {
    std::string key;
    double importance = 0;
};
std::vector<ParamImportance> parameterImportance(const StudyRecord& study,
                                                 const std::vector<TrialRecord>& trials);

}  // namespace lathe::core
