// lathectl tune and lathectl studies: hyper-parameter studies of many runs (core/tuner.h).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/executable.h"
#include "lathe/core/studies.h"
#include "lathe/core/tuner.h"

namespace lathe::cli {
namespace {

struct TuneState {
    CommonOptions common;
    SpecFlags spec;
    std::vector<std::string> space;
    std::string objective = "val/accuracy";
    std::string direction = "max";
    int64_t trials = 20;
    int parallel = 1;
    std::string algo = "tpe";
    std::string pruner;  // empty: by --algo (asha: random + ASHA)
    std::string budgetKey = "epochs";
    double minBudget = 1;
    double eta = 3;
    std::string study;
    std::string resume;
    int64_t seed = 0;
    int startupTrials = 10;
    std::string hosts;
    double timeout = 0;
    std::optional<double> stopAt;
    bool quiet = false;
};

std::unique_ptr<core::Studies> openStudies(const CommonOptions& opts) {
    try {
        return std::make_unique<core::Studies>(core::Store::resolvePath(opts.db));
    } catch (const core::StoreError& e) {
        throw UsageError(e.what());
    }
}

nlohmann::json valueJson(const std::optional<double>& v) { return v ? metricJson(*v) : nlohmann::json(); }

nlohmann::json studyJson(const core::StudyRecord& s, const std::vector<core::TrialRecord>& trials) {
    nlohmann::json j{{"name", s.name},           {"sampler", s.sampler},      {"pruner", s.pruner},
                     {"objective", s.objective}, {"direction", s.direction},  {"status", s.status},
                     {"space", s.space},         {"created_at", s.createdAt}, {"updated_at", s.updatedAt},
                     {"complete", s.complete},   {"pruned", s.pruned},        {"failed", s.failed},
                     {"running", s.running}};
    try {
        j["settings"] = nlohmann::json::parse(s.settings);
        j["state"] = nlohmann::json::parse(s.state);
    } catch (const std::exception&) {
    }
    j["best_value"] = valueJson(s.bestValue);
    j["best_trial"] = s.bestTrial >= 0 ? nlohmann::json(s.bestTrial) : nlohmann::json();
    j["best_params"] = nlohmann::json();
    j["best_run_id"] = nlohmann::json();
    double first = 0, last = 0;
    auto arr = nlohmann::json::array();
    for (const auto& t : trials) {
        nlohmann::json tj{{"number", t.number}, {"state", core::toString(t.state)},
                          {"params", t.params}, {"value", valueJson(t.value)},
                          {"host", t.host},     {"started_at", t.startedAt},
                          {"pid", t.pid}};
        tj["run_id"] = t.runId > 0 ? nlohmann::json(t.runId) : nlohmann::json();
        tj["ended_at"] = t.endedAt > 0 ? nlohmann::json(t.endedAt) : nlohmann::json();
        tj["pruned_at"] = t.state == core::TrialState::Pruned ? nlohmann::json(t.prunedAt) : nlohmann::json();
        tj["error"] = t.error.empty() ? nlohmann::json() : nlohmann::json(t.error);
        auto rungs = nlohmann::json::array();
        for (const auto& g : t.rungs)
            rungs.push_back(
                {{"rung", g.rung}, {"budget", g.budget}, {"value", g.value}, {"promoted", g.promoted}});
        tj["rungs"] = rungs;
        if (t.number == s.bestTrial) {
            j["best_params"] = t.params;
            j["best_run_id"] = tj["run_id"];
        }
        if (first == 0 || t.startedAt < first) first = t.startedAt;
        last = std::max(last, t.endedAt);
        arr.push_back(std::move(tj));
    }
    j["seconds"] = first > 0 && last > first ? last - first : 0.0;
    j["trials"] = std::move(arr);
    return j;
}

std::string shellQuote(const std::string& v) {
    for (char c : v)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != ',' && c != '-' && c != '_' &&
            c != '/')
            return "'" + v + "'";
    return v;
}

void printStudy(const std::string& workspace, const core::StudyRecord& s,
                const std::vector<core::TrialRecord>& trials) {
    std::printf("study %s: %s%s, %s %s, %s\n", s.name.c_str(), s.sampler.c_str(),
                s.pruner == "none" ? "" : (" + " + s.pruner).c_str(),
                s.direction == "max" ? "maximize" : "minimize", s.objective.c_str(), s.status.c_str());
    std::printf("trials: %lld complete, %lld pruned, %lld failed, %lld running\n",
                static_cast<long long>(s.complete), static_cast<long long>(s.pruned),
                static_cast<long long>(s.failed), static_cast<long long>(s.running));
    for (const auto& p : s.space) std::printf("  space  %s\n", p.c_str());
    const core::TrialRecord* best = nullptr;
    for (const auto& t : trials)
        if (t.number == s.bestTrial) best = &t;
    if (best) {
        // The study's base config (kept beside the workspace) plus the trial's values and the
        // thread count it ran with: the same run again.
        std::string params;
        for (const auto& [k, v] : best->params) params += " --" + k + " " + shellQuote(v);
        if (best->runId > 0 && !best->params.count("threads")) {
            const auto recorded = core::Store(workspace).params(best->runId);
            if (const auto t = recorded.find("threads"); t != recorded.end())
                params += " --threads " + t->second;
        }
        const auto base = core::Store::filesDirFor(workspace) + "/studies/" + s.name + "/base.toml";
        std::printf("best: trial %lld, %s %s (run %lld)\n  reproduce: lathectl train %s%s\n",
                    static_cast<long long>(best->number), s.objective.c_str(),
                    formatValue(*best->value).c_str(), static_cast<long long>(best->runId), base.c_str(),
                    params.c_str());
    }
    if (trials.empty()) return;
    std::printf("\n%-5s %-9s %-10s %-6s %-9s %s\n", "TRIAL", "STATE", "VALUE", "RUN", "DURATION",
                "PARAMS / NOTE");
    for (const auto& t : trials) {
        std::string params;
        for (const auto& [k, v] : t.params) params += (params.empty() ? "" : " ") + k + "=" + v;
        const double dur = t.endedAt > 0 ? t.endedAt - t.startedAt : core::nowSeconds() - t.startedAt;
        std::printf("%-5lld %-9s %-10s %-6s %-9s %s\n", static_cast<long long>(t.number),
                    core::toString(t.state), t.value ? formatValue(*t.value).c_str() : "-",
                    t.runId > 0 ? std::to_string(t.runId).c_str() : "-", formatDuration(dur).c_str(),
                    params.c_str());
        if (t.state == core::TrialState::Pruned || t.state == core::TrialState::Failed)
            std::printf("%-43s %s\n", "", t.error.c_str());
    }
}

int runTune(TuneState& st) {
    if (st.timeout < 0) throw UsageError("--timeout must be a number of seconds >= 0 (0: no limit)");
    if (st.stopAt && !std::isfinite(*st.stopAt)) throw UsageError("--stop-at must be a finite number");
    std::optional<double> pollSeconds;
    // How often the study looks at its running trials when nothing wakes it (a trial's end and a
    // trial at an ASHA rung do): a diagnostic, which the tests use to show that the wakes work.
    if (const char* v = std::getenv("LATHE_STUDY_POLL_SECONDS")) {
        char* end = nullptr;
        const double secs = std::strtod(v, &end);
        if (end == v || *end != '\0' || !(secs >= 0.001 && secs <= 3600))
            throw UsageError(std::string("LATHE_STUDY_POLL_SECONDS: '") + v +
                             "' is not a number of seconds from 0.001 to 3600");
        pollSeconds = secs;
    }
    const std::string ws = core::Store::resolvePath(st.common.db);
    {
        auto store = openStore(st.common);  // creates / migrates the workspace; a bad file is exit 2
    }
    auto studies = openStudies(st.common);
    std::string name = st.resume;
    if (!st.resume.empty()) {
        if (!st.space.empty() || !st.spec.config.empty())
            throw UsageError(
                "--resume continues a study with its recorded space and base config; give neither "
                "--space nor a CONFIG file");
        if (!studies->study(st.resume))
            throw UsageError("no study '" + st.resume + "' in " + ws + " (lathectl studies list)");
    } else {
        core::StudyRecord s;
        s.name = st.study.empty() ? "study-" + std::to_string(static_cast<long long>(core::nowSeconds()))
                                  : st.study;
        s.objective = st.objective;
        s.direction = st.direction == "maximize" ? "max" : st.direction == "minimize" ? "min" : st.direction;
        if (st.algo == "random" || st.algo == "tpe" || st.algo == "ppo") {
            s.sampler = st.algo == "ppo" ? "ppo" : st.algo;
            s.pruner = st.pruner.empty() ? "none" : st.pruner;
        } else if (st.algo == "asha") {
            s.sampler = "random";
            s.pruner = st.pruner.empty() ? "asha" : st.pruner;
            if (s.pruner != "asha") throw UsageError("--algo asha is random search with --pruner asha");
        } else {
            throw UsageError("--algo must be random, tpe, asha or ppo (got '" + st.algo + "')");
        }
        const auto base = buildSpec(st.spec);
        if (!base.ppoPolicy.empty())
            throw UsageError("ppo_policy is the study's own (--algo ppo makes and trains it); leave it out");
        s.baseConfig = core::toToml(base);
        for (const auto& text : st.space) s.space.push_back(text);
        nlohmann::json settings{{"trials", st.trials},
                                {"parallel", st.parallel},
                                {"seed", st.seed},
                                {"budget_key", st.budgetKey},
                                {"min_budget", st.minBudget},
                                {"max_budget", static_cast<double>(base.epochs)},
                                {"eta", st.eta},
                                {"ppo_interval", base.ppoInterval},
                                {"startup_trials", st.startupTrials}};
        if (!st.hosts.empty()) settings["hosts"] = splitList(st.hosts);
        s.settings = settings.dump();
        core::checkStudy(s, base);
        if (!st.hosts.empty()) {
            auto store = openStore(st.common);
            for (const auto& h : splitList(st.hosts)) {
                const auto hostName = h.substr(0, h.rfind(':'));
                const auto rec = store->host(hostName);
                if (!rec)
                    throw UsageError("--hosts: no host '" + hostName + "' in " + ws +
                                     " (lathectl hosts add " + hostName + " --address ADDRESS)");
                const auto colon = h.rfind(':');
                const int slots = colon == std::string::npos ? static_cast<int>(rec->slots)
                                                             : std::atoi(h.c_str() + colon + 1);
                if (slots < 1) throw UsageError("--hosts " + h + ": a trial needs at least 1 slot (NAME:1)");
                // The agent steers one process: its decisions are not shared across ranks.
                if (s.sampler == "ppo" && slots != 1)
                    throw UsageError("--hosts " + h +
                                     ": --algo ppo trials are single-process runs; give each host 1 slot (" +
                                     hostName + ":1)");
            }
        }
        studies->create(s);
        name = s.name;
    }

    core::TuneOptions o;
    o.lathectl = core::siblingProgram("lathectl");
    if (!st.resume.empty() && st.parallel > 0) o.parallel = st.parallel;
    if (!st.resume.empty() && !st.hosts.empty()) o.hosts = splitList(st.hosts);
    o.timeoutSeconds = st.timeout;
    o.stopAt = st.stopAt;
    if (pollSeconds) o.pollSeconds = *pollSeconds;
    o.stop = &installStopHandler();
    const bool humanOut = !st.common.json;
    if (!st.quiet)
        o.progress = [humanOut](const std::string& line) {
            std::fprintf(humanOut ? stdout : stderr, "%s\n", line.c_str());
            std::fflush(humanOut ? stdout : stderr);
        };
    if (!st.quiet && humanOut) std::printf("study %s in %s\n", name.c_str(), ws.c_str());
    const auto outcome = core::runStudy(ws, name, o);
    removeStopHandler();

    const auto s = studies->study(name);
    const auto trials = studies->trials(s->id);
    static const char* const kEnded[] = {"trials", "timeout", "target", "interrupted"};
    if (st.common.json) {
        auto j = studyJson(*s, trials);
        j["ended"] = kEnded[static_cast<int>(outcome.ended)];  // why this call ended
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("\n");
        printStudy(ws, *s, trials);
    }
    return outcome.stopped ? kInterrupted : kOk;
}

}  // namespace

std::vector<std::string> splitList(const std::string& text) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        const auto comma = text.find(',', pos);
        const auto item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (!item.empty()) out.push_back(item);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return out;
}

void registerTune(CLI::App& app, int& exitCode) {
    auto st = std::make_shared<TuneState>();
    auto* cmd = app.add_subcommand(
        "tune", "search hyper-parameters: a study of many runs with random search, TPE, ASHA or a PPO agent");
    addSpecFlags(cmd, st->spec);
    addCommonOptions(cmd, st->common);
    cmd->add_option("--space", st->space,
                    "a searched key: KEY=uniform(A,B) | loguniform(A,B) | int(A,B) | logint(A,B) | "
                    "choice(V1,V2,...) (repeat for each key; e.g. 'hidden=choice([64],[128,128])')")
        ->allow_extra_args(false);
    std::string objectives;
    for (const auto& k : core::objectiveMetrics()) objectives += (objectives.empty() ? "" : "|") + k;
    cmd->add_option("--objective", st->objective, "the metric to optimise (default val/accuracy)")
        ->type_name(objectives);
    cmd->add_option("--direction", st->direction, "max or min (default max)")->type_name("max|min");
    cmd->add_option("--trials", st->trials, "trials in the study (default 20)");
    cmd->add_option("--parallel", st->parallel, "trials at a time, each its own process (default 1)");
    cmd->add_option(
           "--algo", st->algo,
           "random | tpe (default) | asha (random search with ASHA) | ppo (TPE for the static keys, the "
           "PPO agent changes lr and batch during each run)")
        ->type_name("random|tpe|asha|ppo");
    cmd->add_option("--pruner", st->pruner,
                    "none | asha: stop trials early at ASHA's rungs (with any --algo)")
        ->type_name("none|asha");
    cmd->add_option("--startup-trials", st->startupTrials,
                    "TPE: random trials before the model takes over (default 10, as Optuna)");
    cmd->add_option("--budget-key", st->budgetKey, "ASHA's budget (default epochs)");
    cmd->add_option("--min-budget", st->minBudget, "ASHA: the first rung (default 1 epoch)");
    cmd->add_option("--eta", st->eta, "ASHA: keep the best 1/eta at each rung (default 3)");
    cmd->add_option("--study", st->study, "the study's name (default study-<time>)");
    cmd->add_option("--resume", st->resume,
                    "continue study NAME after Ctrl+C or a crash; finished trials are kept");
    cmd->add_option("--study-seed", st->seed,
                    "the sampler's seed (default 0; the runs' own --seed is the base config's)");
    cmd->add_option(
        "--hosts", st->hosts,
        "run each trial on a host of the inventory over SSH: NAME:SLOTS[,NAME:SLOTS...], one trial at a "
        "time per entry");
    cmd->add_option("--timeout", st->timeout,
                    "start no trial after SECONDS; the running ones finish (--resume runs the rest)")
        ->type_name("SECONDS");
    cmd->add_option("--stop-at", st->stopAt,
                    "start no trial once a complete trial's objective reaches VALUE (>= for max, <= for "
                    "min); the running ones finish")
        ->type_name("VALUE");
    cmd->add_flag("--quiet,-q", st->quiet, "no progress lines");
    cmd->callback([st, &exitCode] { exitCode = runTune(*st); });

    auto* studies = app.add_subcommand("studies", "hyper-parameter studies in the workspace");
    studies->require_subcommand(1);
    auto listOpts = std::make_shared<CommonOptions>();
    auto* list = studies->add_subcommand("list", "every study: algorithm, objective, trials, best value");
    addCommonOptions(list, *listOpts);
    list->callback([listOpts] {
        auto s = openStudies(*listOpts);
        const auto all = s->list();
        if (listOpts->json) {
            auto arr = nlohmann::json::array();
            for (const auto& st : all) {
                auto j = studyJson(st, {});
                j.erase("trials");
                j.erase("seconds");
                arr.push_back(j);
            }
            std::cout << arr.dump(2) << std::endl;
            return;
        }
        if (all.empty()) {
            std::printf(
                "no studies yet (start one with lathectl tune --space 'lr=loguniform(1e-4,1e-1)' ...)\n");
            return;
        }
        std::printf("%-20s %-12s %-14s %-9s %-8s %-10s %s\n", "NAME", "ALGO", "OBJECTIVE", "DIRECTION",
                    "TRIALS", "BEST", "STATUS");
        for (const auto& st : all) {
            const std::string algo = st.sampler + (st.pruner == "none" ? "" : "+" + st.pruner);
            std::printf("%-20s %-12s %-14s %-9s %-8lld %-10s %s\n", st.name.c_str(), algo.c_str(),
                        st.objective.c_str(), st.direction.c_str(), static_cast<long long>(st.trialsTotal),
                        st.bestValue ? formatValue(*st.bestValue).c_str() : "-", st.status.c_str());
        }
    });
    auto showOpts = std::make_shared<CommonOptions>();
    auto showName = std::make_shared<std::string>();
    auto* show =
        studies->add_subcommand("show", "a study: its best trial and every trial's parameters and result");
    show->add_option("name", *showName, "the study")->required();
    addCommonOptions(show, *showOpts);
    show->callback([showOpts, showName] {
        auto s = openStudies(*showOpts);
        const auto st = s->study(*showName);
        if (!st) throw UsageError("no study '" + *showName + "' (lathectl studies list)");
        const auto trials = s->trials(st->id);
        if (showOpts->json)
            std::cout << studyJson(*st, trials).dump(2) << std::endl;
        else
            printStudy(core::Store::resolvePath(showOpts->db), *st, trials);
    });
    auto rmOpts = std::make_shared<CommonOptions>();
    auto rmName = std::make_shared<std::string>();
    auto* rm = studies->add_subcommand("remove", "forget a study's records (its runs stay)");
    rm->add_option("name", *rmName, "the study")->required();
    addCommonOptions(rm, *rmOpts, false);
    rm->callback([rmOpts, rmName] {
        auto s = openStudies(*rmOpts);
        if (!s->remove(*rmName)) throw UsageError("no study '" + *rmName + "' (lathectl studies list)");
        std::printf("removed study %s (its runs stay)\n", rmName->c_str());
    });
}

}  // namespace lathe::cli
