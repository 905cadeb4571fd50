#pragma once
// Running a hyper-parameter study (`lathectl tune`; tuning/study_runner.cpp): every trial is a
// `lathectl train` process of its own (a trainer's seeds and thread settings are process-wide),
// forked from a server that loaded LibTorch once (fork_server.h) or started afresh,
// `parallel` at a time on this machine, or one per host placement over SSH. The sampler (random,
// TPE, or TPE for the static parameters with the PPO agent steering lr and batch inside each run)
// proposes each trial's values from the trials finished so far; ASHA stops trials whose objective
// at a rung of the budget key is not in the best 1/eta of the trials that reached that rung.
// Everything is recorded as it happens, so a study stopped by Ctrl+C or killed resumes where it
// was: finished trials are kept, interrupted ones continue from their checkpoints.
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/run_spec.h"
#include "lathe/core/studies.h"

namespace lathe::core {

/// The metrics every run records once per epoch that a study can optimise.
const std::vector<std::string>& objectiveMetrics();

/// Checks a new study before anything starts: name, sampler (random | tpe | ppo), pruner
/// (none | asha), direction (max | min), objective (one of objectiveMetrics()), a non-empty space
/// of valid parameters (tuning::parseParam) none of which is the budget key under ASHA, the base
/// spec with every parameter at its bounds (core::validate), trials >= 1, parallel >= 1, ASHA's
/// min budget and eta. Throws ConfigError naming the problem.
void checkStudy(const StudyRecord& study, const RunSpec& base);

struct TuneOptions {
    std::string lathectl;            // the program each trial runs (`lathectl train …`)
    int parallel = 0;                // 0: the study's setting
    std::vector<std::string> hosts;  // remote placements, one trial at a time on each ("gpu-a:2")
    const std::atomic<bool>* stop = nullptr;
    /// One line per event (trial started, pruned, finished, failed), for a terminal.
    std::function<void(const std::string&)> progress;
    double pollSeconds = 0.05;  // ASHA's watch of running trials; a trial's end is seen at once
    /// No new trials once this many seconds have passed since the call began (0: no limit); the
    /// running ones finish (as Optuna's optimize(timeout=)).
    double timeoutSeconds = 0;
    /// No new trials once a complete trial's objective reaches this (>= when maximising, <= when
    /// minimising); the running ones finish.
    std::optional<double> stopAt;
};

struct TuneOutcome {
    enum class Ended { Trials, Timeout, Target, Interrupted };
    bool stopped = false;  // stop was set: running trials were stopped and will resume
    int started = 0;       // trials started (or continued) by this call
    Ended ended = Ended::Trials;
};

/// Runs study `name` of the workspace until it has its number of trials in a final state, `stop`
/// is set, or the timeout or target of `options` ends it early (the study is then "stopped", and
/// resuming it runs the trials it has left). Throws ConfigError for an unknown study, Error when a trial
/// cannot be started.
TuneOutcome runStudy(const std::string& workspacePath, const std::string& name, const TuneOptions& options);

}  // namespace lathe::core
