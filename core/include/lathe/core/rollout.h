#pragma once
// Progressive rollouts with automatic rollback (`lathectl rollout`): a candidate version served
// beside a model's live one at a rising share of its traffic, judged at every interval against the
// live one on the same window, promoted after its last step or rolled back after `threshold`
// unhealthy windows in a row. Everything a rollout decides is recorded in the workspace (registry
// rollouts and decisions), so a controller that is restarted goes on from where it stood.
//
// The statistics (windows, tests, verdicts) are pure functions, unit-tested on their own; the
// controller and the commands do the I/O (the server's /metrics and rollout API, the workspace).
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/deploy.h"
#include "lathe/core/prometheus.h"
#include "lathe/core/registry.h"

namespace lathe::core {

// ---- parsing the command's values --------------------------------------------------------------
/// "5,25,50,100" (percent, each in 1..100, strictly increasing; decimals such as 2.5 allowed) into
/// basis points. Throws ConfigError naming the bad step.
std::vector<int32_t> parseRolloutSteps(const std::string& text);
/// "90s", "10m", "72h", "1d", "2.5s" or a bare number of seconds; > 0. Throws ConfigError.
double parseDurationSeconds(const std::string& text, const char* what = "--interval");
/// "1%", "0.5%" or a fraction "0.01"; in (0, 1]. Throws ConfigError.
double parseRate(const std::string& text, const char* what = "--max-error-rate");

// ---- one window's figures and the verdict ------------------------------------------------------
/// What one version of a model did in one window: the growth of its counters between two scrapes.
struct VariantWindow {
    int64_t version = 0;
    double requests = 0;  // answered
    double errors = 0;    // of which with status >= 500
    /// The latency histogram's growth: (upper bound in seconds, cumulative count), bounds
    /// ascending, +Inf last.
    std::vector<std::pair<double, double>> latency;
    double p99Ms() const;  // NaN without requests
    double p50Ms() const;
};

/// Each version's window between two scrapes of a server's /metrics. Empty when the server
/// restarted in between (a counter went down): that window cannot be judged.
std::map<int64_t, VariantWindow> variantWindows(const std::string& model,
                                                const std::vector<PromSample>& start,
                                                const std::vector<PromSample>& end);

/// One-sided two-proportion z-test: the p-value of "the first rate is higher than the second"
/// (errors e of n requests each). 1 when either side has no requests.
double twoProportionPValue(double e1, double n1, double e2, double n2);
/// One-sided Mann-Whitney U test on two latency histograms with the same bounds (ties within a
/// bucket counted half, the variance corrected for them): the p-value of "the first is slower".
/// 1 when either is empty.
double rankTestPValue(const VariantWindow& slower, const VariantWindow& than);

struct RolloutVerdict {
    std::string kind;    // "hold" | "healthy" | "unhealthy"
    std::string reason;  // one line, with the figures
    std::map<std::string, double> numbers;
    bool extendWindow = false;  // a hold for too small a sample: keep counting the same window
};
/// Judges one window. Too few candidate requests (or baseline requests, while the baseline still
/// serves some) is a hold, never a pass. Unhealthy: the candidate's error rate is above the plan's
/// limit and significantly above the baseline's (p < 0.05), or its P99 is above the limit (or,
/// without one, above 1.5x the baseline's) and the rank test finds it slower (p < 0.05). When the
/// baseline breaks the limit as badly, the candidate is not to blame: a hold that says so.
RolloutVerdict judgeRolloutWindow(const Rollout& plan, const VariantWindow& baseline,
                                  const VariantWindow& candidate);

// ---- commands --------------------------------------------------------------------------------
struct RolloutOptions {
    std::string actor = "user";
    std::string controllerProgram;  // lathectl, to start the detached controller
    ServerHostFor hostFor;          // a deployment on another host (the candidate is copied there)
    std::function<void(const std::string&)> progress;
};

/// Starts a rollout of `plan.candidate` beside `plan.model`'s live version at its first step:
/// checks the plan (ConfigError, nothing changed: unknown version, the candidate is the live one,
/// bad steps, a rollout already under way), loads the candidate into the live server at the first
/// weight, records it, and starts the controller. Returns the record.
Rollout startRollout(Registry& registry, Rollout plan, const RolloutOptions& options);
/// Stops judging and stepping; the split stays as it is. Throws ConfigError when none runs.
Rollout pauseRollout(Registry& registry, const std::string& model, const RolloutOptions& options);
/// Goes on from the recorded step, with a fresh window; (re)starts the controller when none
/// holds the rollout (after a reboot, or a controller that was killed).
Rollout resumeRollout(Registry& registry, const std::string& model, const RolloutOptions& options);
/// Ends the rollout: the candidate's weight goes to 0 and the baseline serves everything.
Rollout abortRollout(Registry& registry, const std::string& model, const std::string& reason,
                     const RolloutOptions& options);
/// Whether a controller process holds `model`'s rollout now.
bool rolloutControllerRunning(const Registry& registry, const std::string& model);
/// Starts the controller of `model`'s rollout under way when none holds it (it is gone with a
/// reboot, or was killed), as a deploy or rollback of that model does so that the rollout is
/// judged again: the controller puts the split back on a new server of the baseline, or ends the
/// rollout that another version replaced. Returns whether it started one.
bool ensureRolloutController(Registry& registry, const std::string& model, const RolloutOptions& options);

/// The controller: follows `model`'s active rollout until it ends or `stop` is raised; keeps the
/// server's split as recorded (after a server restart too), judges each window and records every
/// decision. Returns false at once when another controller holds this model. `log` gets one line
/// per decision and event.
bool runRolloutController(Registry& registry, const std::string& model, const std::atomic<bool>& stop,
                          const std::function<void(const std::string&)>& log);

}  // namespace lathe::core
