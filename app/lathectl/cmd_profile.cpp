// lathectl profile: the heaviest ops of a profiled run, its step phases, or a Chrome trace.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli_common.h"
#include "lathe/core/profile_analysis.h"

namespace lathe::cli {
namespace {

struct ProfileState {
    CommonOptions common;
    int64_t id = 0;
    int top = 20;
    std::string chromeTrace;
};

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

void runProfile(const ProfileState& st) {
    auto store = openStore(st.common);
    const auto run = store->run(st.id);
    if (!run)
        throw UsageError("no run " + std::to_string(st.id) + " in " + store->path() +
                         " (see lathectl runs list)");
    const auto spans = store->profileSpans(st.id);
    if (spans.empty())
        throw UsageError(
            "run " + std::to_string(st.id) +
            " has no profile; train with --profile (schedule: --profile-wait/-warmup/-active/-repeat)");

    if (!st.chromeTrace.empty()) {
        const std::string tmp = st.chromeTrace + ".tmp";
        {
            std::ofstream out(tmp, std::ios::binary);
            if (!out) throw UsageError("cannot write " + st.chromeTrace);
            core::writeChromeTrace(spans, out, "lathe run " + std::to_string(st.id) + " (" + run->name + ")");
            if (!out) throw UsageError("writing " + st.chromeTrace + " failed");
        }
        if (std::rename(tmp.c_str(), st.chromeTrace.c_str()) != 0)
            throw UsageError("cannot write " + st.chromeTrace);
        if (st.common.json)
            std::cout << nlohmann::json{{"run_id", st.id},
                                        {"chrome_trace", st.chromeTrace},
                                        {"spans", spans.size()}}
                             .dump()
                      << std::endl;
        else
            std::printf(
                "wrote %zu spans of run %lld to %s (open it in https://ui.perfetto.dev or "
                "chrome://tracing)\n",
                spans.size(), static_cast<long long>(st.id), st.chromeTrace.c_str());
        return;
    }

    const auto ops = core::topOps(spans, st.top);
    const auto phases = core::phasesByStep(spans);
    // Mean time per profiled step of each phase, in the order phases occur.
    std::vector<std::pair<std::string, double>> phaseMeans;
    for (const auto& ps : phases)
        for (const auto& [name, ns] : ps.phases) {
            auto it = std::find_if(phaseMeans.begin(), phaseMeans.end(),
                                   [&](const auto& p) { return p.first == name; });
            if (it == phaseMeans.end())
                phaseMeans.emplace_back(name, ms(ns));
            else
                it->second += ms(ns);
        }
    for (auto& p : phaseMeans) p.second /= static_cast<double>(std::max<size_t>(1, phases.size()));

    if (st.common.json) {
        auto arr = nlohmann::json::array();
        for (const auto& o : ops) {
            nlohmann::json j{{"name", o.name},
                             {"calls", o.calls},
                             {"self_ms", ms(o.selfNs)},
                             {"total_ms", ms(o.totalNs)},
                             {"share", o.share}};
            if (o.cudaTotalNs >= 0) {
                j["cuda_self_ms"] = ms(o.cudaSelfNs);
                j["cuda_total_ms"] = ms(o.cudaTotalNs);
            }
            arr.push_back(std::move(j));
        }
        nlohmann::json ph = nlohmann::json::object();
        for (const auto& [name, mean] : phaseMeans) ph[name] = mean;
        std::cout << nlohmann::json{{"run_id", st.id},
                                    {"profiled_steps", phases.size()},
                                    {"spans", spans.size()},
                                    {"ops", arr},
                                    {"phase_ms_per_step", ph}}
                         .dump()
                  << std::endl;
        return;
    }
    std::printf("run %lld: %zu profiled steps, %zu spans\n\n", static_cast<long long>(st.id), phases.size(),
                spans.size());
    // A run on a GPU has device times too: two more columns.
    const bool cuda =
        std::any_of(ops.begin(), ops.end(), [](const core::OpSummary& o) { return o.cudaTotalNs >= 0; });
    std::printf("%-44s %8s %11s %11s %7s", "OP", "CALLS", "SELF_MS", "TOTAL_MS", "SHARE");
    if (cuda) std::printf(" %13s %14s", "CUDA_SELF_MS", "CUDA_TOTAL_MS");
    std::printf("\n");
    for (const auto& o : ops) {
        std::printf("%-44.44s %8lld %11.3f %11.3f %6.1f%%", o.name.c_str(), static_cast<long long>(o.calls),
                    ms(o.selfNs), ms(o.totalNs), 100.0 * o.share);
        if (cuda && o.cudaTotalNs >= 0)
            std::printf(" %13.3f %14.3f", ms(o.cudaSelfNs), ms(o.cudaTotalNs));
        else if (cuda)
            std::printf(" %13s %14s", "-", "-");
        std::printf("\n");
    }
    std::printf("\nstep phases (mean ms per profiled step)\n");
    for (const auto& [name, mean] : phaseMeans) std::printf("  %-14s %9.3f\n", name.c_str(), mean);
}

}  // namespace

void registerProfile(CLI::App& app, int& exitCode) {
    (void)exitCode;
    auto st = std::make_shared<ProfileState>();
    auto* cmd =
        app.add_subcommand("profile", "a profiled run's heaviest ops and step phases, or its Chrome trace");
    cmd->add_option("RUN", st->id, "run id")->required();
    cmd->add_option("--top", st->top, "how many ops to list (by self time; 0 = all)")
        ->check(CLI::Range(0, 100000));
    cmd->add_option("--chrome-trace", st->chromeTrace,
                    "write a Chrome trace-event JSON file (Perfetto, chrome://tracing)");
    addCommonOptions(cmd, st->common);
    cmd->callback([st] { runProfile(*st); });
}

}  // namespace lathe::cli
