// lathectl runs list|show, lathectl metrics, lathectl info: reading the workspace.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>

#include "cli_common.h"
#include "lathe/core/datasets.h"
#include "lathe/core/studies.h"
#include "lathe/kernels/info.h"

namespace lathe::cli {
namespace {

nlohmann::json runJson(const core::RunRecord& r) {
    nlohmann::json j{{"id", r.id},
                     {"name", r.name},
                     {"experiment", r.experiment},
                     {"status", core::toString(r.status)},
                     {"model", r.model},
                     {"data", r.data},
                     {"host", r.host},
                     {"created_at", r.createdAt}};
    j["started_at"] = r.startedAt > 0 ? nlohmann::json(r.startedAt) : nlohmann::json();
    j["ended_at"] = r.endedAt > 0 ? nlohmann::json(r.endedAt) : nlohmann::json();
    j["error"] = r.error.empty() ? nlohmann::json() : nlohmann::json(r.error);
    return j;
}

core::RunRecord requireRun(const core::Store& store, int64_t id) {
    auto run = store.run(id);
    if (!run)
        throw UsageError("no run " + std::to_string(id) + " in " + store.path() +
                         " (see lathectl runs list)");
    return *run;
}

void listRuns(const CommonOptions& opts) {
    auto store = openStore(opts);
    const auto runs = store->listRuns();
    const auto valAccuracy = store->lastMetricOfRuns("val/accuracy");  // one query, not one per run
    auto accuracyOf = [&](int64_t id) {
        const auto it = valAccuracy.find(id);
        return it == valAccuracy.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
    };
    if (opts.json) {
        auto arr = nlohmann::json::array();
        for (const auto& r : runs) {
            auto j = runJson(r);
            j["val/accuracy"] = metricJson(accuracyOf(r.id));
            arr.push_back(j);
        }
        std::cout << arr.dump(2) << std::endl;
        return;
    }
    if (runs.empty()) {
        std::printf("no runs in %s yet (start one with lathectl train)\n", store->path().c_str());
        return;
    }
    std::printf("%-5s %-16s %-12s %-11s %-6s %-20s %-19s %-10s %s\n", "ID", "NAME", "EXPERIMENT", "STATUS",
                "MODEL", "DATA", "STARTED", "DURATION", "VAL_ACC");
    for (const auto& r : runs) {
        const double acc = accuracyOf(r.id);
        const double dur = r.endedAt > 0 && r.startedAt > 0 ? r.endedAt - r.startedAt : -1;
        std::printf("%-5lld %-16.16s %-12.12s %-11s %-6s %-20.20s %-19s %-10s %s\n",
                    static_cast<long long>(r.id), r.name.c_str(), r.experiment.c_str(),
                    core::toString(r.status), r.model.c_str(), r.data.c_str(),
                    formatTime(r.startedAt).c_str(), formatDuration(dur).c_str(),
                    std::isnan(acc) ? "-" : formatValue(acc).c_str());
    }
    std::vector<int64_t> interrupted;
    for (const auto& r : runs)
        if (r.status == core::RunStatus::Interrupted) interrupted.push_back(r.id);
    if (!interrupted.empty()) {
        std::string ids;
        for (auto id : interrupted) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
        std::printf("\ninterrupted: run %s: %s\n", ids.c_str(),
                    core::interruptedHint(interrupted.size() == 1 ? interrupted.front() : 0).c_str());
    }
}

void showRun(const CommonOptions& opts, int64_t id) {
    auto store = openStore(opts);
    const auto r = requireRun(*store, id);
    const auto params = store->params(id);
    const auto finals = store->lastMetrics(id);
    const auto artifacts = store->artifacts(id);
    const auto logs = store->logs(id);
    // A study's trial: which, and how it ended (a pruned trial's run is merely "stopped").
    std::optional<core::TrialRecord> trial;
    std::string studyName;
    if (const auto t = core::Studies(store->path()).trialOfRun(id)) {
        core::Studies studies(store->path());
        studyName = t->first;
        if (const auto st = studies.study(studyName))
            for (const auto& tr : studies.trials(st->id))
                if (tr.number == t->second) trial = tr;
    }
    if (opts.json) {
        auto j = runJson(r);
        if (trial) {
            j["study"] = {
                {"name", studyName}, {"trial", trial->number}, {"state", core::toString(trial->state)}};
            if (!trial->error.empty()) j["study"]["note"] = trial->error;
        }
        j["params"] = params;
        nlohmann::json m = nlohmann::json::object();
        for (const auto& [k, v] : finals) m[k] = metricJson(v);
        j["metrics"] = m;
        auto a = nlohmann::json::array();
        for (const auto& art : artifacts)
            a.push_back({{"kind", art.kind},
                         {"path", art.path},
                         {"sha256", art.sha256},
                         {"created_at", art.createdAt}});
        j["artifacts"] = a;
        auto l = nlohmann::json::array();
        for (const auto& log : logs)
            l.push_back({{"t", log.wallTime}, {"level", log.level}, {"msg", log.text}});
        j["logs"] = l;
        j["config"] = r.config;
        std::cout << j.dump(2) << std::endl;
        return;
    }
    std::printf("run %lld  %s  (experiment %s)\n", static_cast<long long>(r.id), r.name.c_str(),
                r.experiment.c_str());
    std::printf("  status    %s%s%s\n", core::toString(r.status), r.error.empty() ? "" : ": ",
                r.error.c_str());
    if (r.status == core::RunStatus::Interrupted)
        std::printf("            %s\n", core::interruptedHint(r.id).c_str());
    if (trial)
        std::printf("  study     %s, trial %lld: %s%s%s\n", studyName.c_str(),
                    static_cast<long long>(trial->number), core::toString(trial->state),
                    trial->error.empty() ? "" : " — ", trial->error.c_str());
    std::printf("  model     %s on %s, host %s\n", r.model.c_str(), r.data.c_str(), r.host.c_str());
    std::printf("  started   %s   ended %s   duration %s\n", formatTime(r.startedAt).c_str(),
                formatTime(r.endedAt).c_str(),
                formatDuration(r.endedAt > 0 && r.startedAt > 0 ? r.endedAt - r.startedAt : -1).c_str());
    std::printf("params\n");
    for (const auto& [k, v] : params) std::printf("  %-18s %s\n", k.c_str(), v.c_str());
    std::printf("final metrics\n");
    for (const auto& [k, v] : finals) std::printf("  %-20s %s\n", k.c_str(), formatValue(v).c_str());
    if (!artifacts.empty()) {
        std::printf("artifacts\n");
        for (const auto& a : artifacts)
            std::printf("  %-10s %s  sha256:%.12s…\n", a.kind.c_str(), a.path.c_str(), a.sha256.c_str());
    }
    if (!logs.empty()) {
        std::printf("log (last %zu of %zu)\n", std::min<size_t>(logs.size(), 10), logs.size());
        for (size_t i = logs.size() > 10 ? logs.size() - 10 : 0; i < logs.size(); ++i)
            std::printf("  %s %-5s %s\n", formatTime(logs[i].wallTime).c_str(), logs[i].level.c_str(),
                        logs[i].text.c_str());
    }
}

void printMetrics(const CommonOptions& opts, int64_t id, const std::string& key, bool csv) {
    auto store = openStore(opts);
    requireRun(*store, id);
    std::vector<std::string> keys = store->metricKeys(id);
    if (!key.empty()) {
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
            std::string all;
            for (const auto& k : keys) all += (all.empty() ? "" : ", ") + k;
            throw UsageError("run " + std::to_string(id) + " has no metric '" + key + "' (it has: " + all +
                             ")");
        }
        keys = {key};
    }
    if (csv) {
        std::printf("key,step,wall_time,value\n");
        for (const auto& k : keys)
            for (const auto& p : store->metrics(id, k))
                std::printf("%s,%lld,%.3f,%.9g\n", k.c_str(), static_cast<long long>(p.step), p.wallTime,
                            p.value);
        return;
    }
    if (opts.json) {
        nlohmann::json j = nlohmann::json::object();
        for (const auto& k : keys) {
            auto arr = nlohmann::json::array();
            for (const auto& p : store->metrics(id, k))
                arr.push_back({{"step", p.step}, {"t", p.wallTime}, {"value", metricJson(p.value)}});
            j[k] = arr;
        }
        std::cout << nlohmann::json{{"run_id", id}, {"metrics", j}}.dump() << std::endl;
        return;
    }
    if (key.empty()) {
        std::printf("%-22s %8s %10s %12s %12s %12s\n", "KEY", "POINTS", "LAST_STEP", "LAST", "MIN", "MAX");
        for (const auto& k : keys) {
            const auto pts = store->metrics(id, k);
            if (pts.empty()) continue;
            double lo = pts[0].value, hi = pts[0].value;
            for (const auto& p : pts) lo = std::min(lo, p.value), hi = std::max(hi, p.value);
            std::printf("%-22s %8zu %10lld %12s %12s %12s\n", k.c_str(), pts.size(),
                        static_cast<long long>(pts.back().step), formatValue(pts.back().value).c_str(),
                        formatValue(lo).c_str(), formatValue(hi).c_str());
        }
        return;
    }
    std::printf("%10s %12s\n", "STEP", key.c_str());
    for (const auto& p : store->metrics(id, key))
        std::printf("%10lld %12s\n", static_cast<long long>(p.step), formatValue(p.value).c_str());
}

}  // namespace

void registerRuns(CLI::App& app, int& exitCode) {
    (void)exitCode;
    auto* runs = app.add_subcommand("runs", "list and inspect recorded runs");
    runs->require_subcommand(1);
    {
        auto opts = std::make_shared<CommonOptions>();
        auto* list = runs->add_subcommand("list", "all runs in the workspace, newest first");
        addCommonOptions(list, *opts);
        list->callback([opts] { listRuns(*opts); });
    }
    {
        auto opts = std::make_shared<CommonOptions>();
        auto id = std::make_shared<int64_t>(0);
        auto* show = runs->add_subcommand("show", "one run: status, params, final metrics, artifacts, log");
        show->add_option("ID", *id, "run id")->required();
        addCommonOptions(show, *opts);
        show->callback([opts, id] { showRun(*opts, *id); });
    }
    {
        struct M {
            CommonOptions opts;
            int64_t id = 0;
            std::string key;
            bool csv = false;
        };
        auto m = std::make_shared<M>();
        auto* cmd = app.add_subcommand("metrics", "a run's metric series (summary, one key, CSV or JSON)");
        cmd->add_option("ID", m->id, "run id")->required();
        cmd->add_option("--key", m->key, "only this metric, e.g. val/accuracy");
        cmd->add_flag("--csv", m->csv, "print key,step,wall_time,value rows");
        addCommonOptions(cmd, m->opts);
        cmd->callback([m] { printMetrics(m->opts, m->id, m->key, m->csv); });
    }
}

void registerInfo(CLI::App& app, int& exitCode) {
    (void)exitCode;
    struct I {
        CommonOptions opts;
    };
    auto st = std::make_shared<I>();
    auto* cmd = app.add_subcommand("info", "versions, workspace location, CPU features and CUDA devices");
    addCommonOptions(cmd, st->opts);
    cmd->callback([st] {
        const std::string db = core::Store::resolvePath(st->opts.db);
        nlohmann::json j{{"version", kVersion},
                         {"workspace", db},
                         {"schema_version", core::Store::kSchemaVersion},
                         {"cpu_features", kernels::cpuFeatures()},
                         {"cuda_compiled", kernels::cudaCompiled()},
                         {"cuda_devices", kernels::cudaDeviceCount()}};
        if (st->opts.json) {
            std::cout << j.dump(2) << std::endl;
            return;
        }
        for (auto it = j.begin(); it != j.end(); ++it)
            std::printf("%-16s %s\n", it.key().c_str(),
                        it->is_string() ? it->get<std::string>().c_str() : it->dump().c_str());
    });
}

}  // namespace lathe::cli
