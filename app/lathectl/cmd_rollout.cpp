// lathectl rollout start | status | pause | resume | abort (and the hidden `run`, the detached
// controller that `start` and `resume` launch).
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "hosts_common.h"
#include "lathe/core/events.h"
#include "lathe/core/executable.h"
#include "lathe/core/rollout.h"

namespace lathe::cli {
namespace {

struct RolloutState {
    CommonOptions common;
    std::string model;
    int64_t candidate = 0;
    std::string steps = "5,25,50,100";
    std::string interval = "10m";
    std::string maxErrorRate = "1%";
    double maxP99Ms = 0;
    int64_t minRequests = 200;
    int threshold = 3;
    std::string userParameter;
    std::string reason;
    int64_t id = 0;
};

core::RolloutOptions optionsOf(const RolloutState& st) {
    core::RolloutOptions o;
    o.controllerProgram = core::executablePath();
    o.hostFor = inventoryHosts(st.common.db);
    if (!st.common.json) o.progress = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
    return o;
}

std::string pct(int32_t bp) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", bp / 100.0);
    return buf;
}

std::string stepsText(const std::vector<int32_t>& steps) {
    std::string s;
    for (auto bp : steps) s += (s.empty() ? "" : ",") + pct(bp);
    return s;
}

nlohmann::json rolloutJson(const core::Registry& registry, const core::Rollout& r, bool controller) {
    nlohmann::json decisions = nlohmann::json::array();
    for (const auto& d : registry.rolloutDecisions(r.id)) {
        nlohmann::json numbers = nlohmann::json::object();
        try {
            numbers = nlohmann::json::parse(d.numbers);
        } catch (...) {
        }
        decisions.push_back({{"t", d.t},
                             {"first_t", d.firstT},
                             {"kind", d.kind},
                             {"step", d.step + 1},
                             {"weight_bp", d.weightBp},
                             {"reason", d.reason},
                             {"numbers", numbers},
                             {"repeats", d.repeats},
                             {"actor", d.actor}});
    }
    return {{"id", r.id},
            {"model", r.model},
            {"baseline", r.baseline},
            {"candidate", r.candidate},
            {"state", r.state},
            {"step", r.step + 1},
            {"steps", r.stepsBp.size()},
            {"steps_bp", r.stepsBp},
            {"weight_bp", r.weightBp},
            {"bad_in_row", r.badInRow},
            {"interval_s", r.intervalS},
            {"max_error_rate", r.maxErrorRate},
            {"max_p99_ms", r.maxP99Ms},
            {"min_requests", r.minRequests},
            {"threshold", r.threshold},
            {"user_parameter", r.userParameter},
            {"actor", r.actor},
            {"started_at", r.startedAt},
            {"ended_at", r.endedAt > 0 ? nlohmann::json(r.endedAt) : nlohmann::json(nullptr)},
            {"end_reason", r.endReason},
            {"controller_running", controller},
            {"decisions", decisions}};
}

void printRollout(const core::Registry& registry, const core::Rollout& r, bool json) {
    const bool controller = r.active() && core::rolloutControllerRunning(registry, r.model);
    if (json) {
        std::printf("%s\n", rolloutJson(registry, r, controller).dump(2).c_str());
        return;
    }
    std::printf("rollout %lld of %s: v%lld beside v%lld, %s\n", static_cast<long long>(r.id), r.model.c_str(),
                static_cast<long long>(r.candidate), static_cast<long long>(r.baseline), r.state.c_str());
    std::printf("  weight %s, step %d of %zu (%s), every %s\n", pct(r.weightBp).c_str(), r.step + 1,
                r.stepsBp.size(), stepsText(r.stepsBp).c_str(), formatDuration(r.intervalS).c_str());
    std::printf(
        "  judged on: error rate <= %g%%, P99 %s, at least %lld requests per variant; rollback after %d "
        "unhealthy windows in a row (now %d)\n",
        100 * r.maxErrorRate,
        r.maxP99Ms > 0 ? ("<= " + formatValue(r.maxP99Ms) + " ms").c_str()
                       : "no worse than 1.5x the baseline's",
        static_cast<long long>(r.minRequests), r.threshold, r.badInRow);
    if (r.active())
        std::printf("  controller: %s\n", controller ? "running"
                                                     : ("not running: lathectl rollout resume " + r.model +
                                                        " starts it again from this step")
                                                           .c_str());
    else
        std::printf("  ended %s: %s\n", formatTime(r.endedAt).c_str(), r.endReason.c_str());
    std::printf("  decisions:\n");
    for (const auto& d : registry.rolloutDecisions(r.id)) {
        std::string times =
            d.repeats > 1 ? " x" + std::to_string(d.repeats) + " since " + formatTime(d.firstT) : "";
        std::printf("    %s  %-9s %6s  %s%s%s\n", formatTime(d.t).c_str(), d.kind.c_str(),
                    pct(d.weightBp).c_str(), d.reason.c_str(), times.c_str(),
                    d.actor == "auto" ? "" : (" [" + d.actor + "]").c_str());
    }
}

void addModelAndDb(CLI::App* c, RolloutState& st, bool withJson = true) {
    c->add_option("NAME", st.model, "model name")->required();
    addCommonOptions(c, st.common, withJson);
}

}  // namespace

void registerRollout(CLI::App& app, int& exitCode) {
    (void)exitCode;
    auto* root = app.add_subcommand(
        "rollout", "progressive rollout of a candidate version beside the live one, with automatic rollback");
    root->require_subcommand(1);

    auto st = std::make_shared<RolloutState>();
    auto* s = root->add_subcommand(
        "start", "start NAME --candidate V: serve V beside the live version and step it up");
    addModelAndDb(s, *st);
    s->add_option("--candidate", st->candidate, "the version to roll out")->required();
    s->add_option("--steps", st->steps,
                  "the candidate's share at each step, percent, rising (default 5,25,50,100)");
    s->add_option("--interval", st->interval,
                  "how long each step is watched before it is judged: 30s, 10m, 72h (default 10m)");
    s->add_option("--max-error-rate", st->maxErrorRate,
                  "highest share of failed (5xx) answers the candidate may have (default 1%)");
    s->add_option(
        "--max-p99-ms", st->maxP99Ms,
        "highest P99 latency of the candidate in ms (default: none, only no slower than 1.5x the baseline)");
    s->add_option(
        "--min-requests", st->minRequests,
        "requests each variant must answer in a window before it is judged (default 200); fewer: hold");
    s->add_option("--threshold", st->threshold,
                  "unhealthy windows in a row before the automatic rollback (default 3)");
    s->add_option("--user-parameter", st->userParameter,
                  "request parameter naming the user for the sticky split (default: the X-User-Id header)");
    s->callback([st] {
        core::Rollout plan;
        plan.model = st->model;
        core::checkModelName(plan.model);
        plan.candidate = st->candidate;
        plan.stepsBp = core::parseRolloutSteps(st->steps);
        plan.intervalS = core::parseDurationSeconds(st->interval);
        plan.maxErrorRate = core::parseRate(st->maxErrorRate);
        if (!std::isfinite(st->maxP99Ms) || st->maxP99Ms < 0)
            throw UsageError("--max-p99-ms must be a number of milliseconds >= 0");
        plan.maxP99Ms = st->maxP99Ms;
        if (st->minRequests < 1) throw UsageError("--min-requests must be at least 1");
        plan.minRequests = st->minRequests;
        if (st->threshold < 1) throw UsageError("--threshold must be at least 1");
        plan.threshold = st->threshold;
        plan.userParameter = st->userParameter;
        auto registry = openRegistry(st->common);
        const auto r = core::startRollout(*registry, plan, optionsOf(*st));
        printRollout(*registry, r, st->common.json);
    });

    auto stat = std::make_shared<RolloutState>();
    auto* t = root->add_subcommand("status",
                                   "NAME's rollout under way (else its last): step, weight, every decision");
    addModelAndDb(t, *stat);
    t->add_option("--id", stat->id, "a rollout by its number (see --all)");
    auto all = std::make_shared<bool>(false);
    t->add_flag("--all", *all, "every rollout of NAME, newest first, without decisions");
    t->callback([stat, all] {
        core::checkModelName(stat->model);
        auto registry = openRegistry(stat->common);
        if (*all) {
            nlohmann::json list = nlohmann::json::array();
            for (const auto& r : registry->rollouts(stat->model)) {
                if (stat->common.json) {
                    auto j = rolloutJson(*registry, r, false);
                    j.erase("decisions");
                    list.push_back(j);
                } else {
                    std::printf("%4lld  v%lld beside v%lld  %-11s %6s  %s  %s\n",
                                static_cast<long long>(r.id), static_cast<long long>(r.candidate),
                                static_cast<long long>(r.baseline), r.state.c_str(), pct(r.weightBp).c_str(),
                                formatTime(r.startedAt).c_str(), r.endReason.c_str());
                }
            }
            if (stat->common.json) std::printf("%s\n", list.dump(2).c_str());
            return;
        }
        std::optional<core::Rollout> r;
        if (stat->id > 0) {
            r = registry->rollout(stat->id);
            if (r && r->model != stat->model) r.reset();
        } else {
            r = registry->activeRollout(stat->model);
            if (!r) {
                const auto list = registry->rollouts(stat->model);
                if (!list.empty()) r = list.front();
            }
        }
        if (!r)
            throw core::NotFoundError(stat->id > 0
                                          ? "no rollout " + std::to_string(stat->id) + " of " + stat->model
                                          : stat->model + " has had no rollout");
        printRollout(*registry, *r, stat->common.json);
    });

    auto simple = [&](const char* name, const char* help, auto fn) {
        auto state = std::make_shared<RolloutState>();
        auto* c = root->add_subcommand(name, help);
        addModelAndDb(c, *state);
        if (std::string(name) == "abort") c->add_option("--reason", state->reason, "why (recorded)");
        c->callback([state, fn] {
            core::checkModelName(state->model);
            auto registry = openRegistry(state->common);
            const auto r = fn(*registry, *state);
            printRollout(*registry, *registry->rollout(r.id), state->common.json);
        });
    };
    simple("pause", "stop judging and stepping NAME's rollout; the split stays",
           [](core::Registry& reg, const RolloutState& s) {
               return core::pauseRollout(reg, s.model, optionsOf(s));
           });
    simple("resume", "go on from the recorded step (and start the controller again when it is not running)",
           [](core::Registry& reg, const RolloutState& s) {
               return core::resumeRollout(reg, s.model, optionsOf(s));
           });
    simple("abort", "end NAME's rollout: the candidate's share goes to 0, the live version serves everything",
           [](core::Registry& reg, const RolloutState& s) {
               return core::abortRollout(reg, s.model, s.reason, optionsOf(s));
           });

    auto run = std::make_shared<RolloutState>();
    auto* r = root->add_subcommand("run", "the rollout's controller (start and resume launch it)");
    r->group("");
    addModelAndDb(r, *run, false);
    r->callback([run] {
        core::checkModelName(run->model);
        auto registry = openRegistry(run->common);
        auto& stop = installStopHandler();
        const bool ran = core::runRolloutController(*registry, run->model, stop, [](const std::string& line) {
            std::fprintf(stderr, "%s %s\n", formatTime(core::nowSeconds()).c_str(), line.c_str());
            std::fflush(stderr);
        });
        removeStopHandler();
        if (!ran) std::fprintf(stderr, "the rollout of %s has a controller already\n", run->model.c_str());
    });
}

}  // namespace lathe::cli
