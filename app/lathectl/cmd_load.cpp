// lathectl load: open-loop HTTP load against a KServe v2 server, with a latency report.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/loadgen.h"
#include "lathe/core/registry.h"

namespace lathe::cli {
namespace {

struct LoadState {
    CommonOptions common;
    core::LoadOptions load;
    std::string bodyFile;
    bool record = false;
};

std::string statusList(const std::map<std::string, int64_t>& byStatus) {
    std::string out;
    for (const auto& [k, n] : byStatus) out += (out.empty() ? "" : "  ") + k + ": " + std::to_string(n);
    return out.empty() ? "-" : out;
}

// HTTP answers of any status (transport failures have names, not numbers).
int64_t answered(const core::LoadReport& r) {
    int64_t n = 0;
    for (const auto& [k, c] : r.byStatus)
        if (!k.empty() && std::isdigit(static_cast<unsigned char>(k[0]))) n += c;
    return n;
}

nlohmann::json reportJson(const core::LoadOptions& o, const core::LoadReport& r) {
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [k, n] : r.byStatus) by[k] = n;
    const bool closed = o.connections > 0;
    return {{"url", o.url},
            {"model", o.model},
            {"mode", closed ? "closed" : "open"},
            {"rate", closed ? nlohmann::json(nullptr) : nlohmann::json(o.rate)},
            {"duration_s", o.durationS},
            {"users", closed ? o.connections : o.users},
            {"rows", o.rowsPerRequest},
            {"binary", o.binary},
            {"sent", r.sent},
            {"ok", r.ok},
            {"errors", r.errors},
            {"unsent", r.unsent},
            {"by_status", by},
            {"elapsed_s", r.elapsedS},
            {"qps", r.qps},
            {"p50_ms", r.p50Ms},
            {"p90_ms", r.p90Ms},
            {"p99_ms", r.p99Ms},
            {"p999_ms", r.p999Ms},
            {"max_ms", r.maxMs},
            {"mean_ms", r.meanMs},
            {"client_cpu_s", r.clientCpuS}};
}

void printReport(const core::LoadOptions& o, const core::LoadReport& r) {
    const bool closed = o.connections > 0;
    if (closed)
        std::printf("load: %s at %s, closed loop on %d connections for %g s, %lld row(s) per request%s\n",
                    o.model.c_str(), o.url.c_str(), o.connections, o.durationS,
                    static_cast<long long>(o.rowsPerRequest), o.binary ? ", binary tensor data" : "");
    else
        std::printf("load: %s at %s, %g req/s intended for %g s, %d users, %lld row(s) per request%s\n",
                    o.model.c_str(), o.url.c_str(), o.rate, o.durationS, o.users,
                    static_cast<long long>(o.rowsPerRequest), o.binary ? ", binary tensor data" : "");
    std::printf("  sent       %lld in %.1f s, %lld answered 2xx: %.1f req/s\n",
                static_cast<long long>(r.sent), r.elapsedS, static_cast<long long>(r.ok), r.qps);
    if (r.unsent > 0)
        std::printf(
            "  unsent     %lld (every connection was busy: the server cannot keep up with %g req/s "
            "on %d users)\n",
            static_cast<long long>(r.unsent), o.rate, o.users);
    std::printf(
        "  latency    p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  mean %.2f ms "
        "(from the %s)\n",
        r.p50Ms, r.p90Ms, r.p99Ms, r.p999Ms, r.maxMs, r.meanMs, closed ? "send" : "intended send time");
    if (r.clientCpuS > 0 && r.sent > 0)
        std::printf("  client CPU %.1f us per request (%.2f s on %d thread%s)\n", r.clientCpuS * 1e6 / r.sent,
                    r.clientCpuS, o.threads, o.threads == 1 ? "" : "s");
    std::printf("  errors     %lld\n", static_cast<long long>(r.errors));
    std::printf("  by status  %s\n", statusList(r.byStatus).c_str());
}

int runLoadCommand(LoadState& st) {
    if (!st.bodyFile.empty()) {
        std::ifstream in(st.bodyFile, std::ios::binary);
        if (!in) throw UsageError("--body-file: cannot read " + st.bodyFile);
        std::ostringstream ss;
        ss << in.rdbuf();
        st.load.body = ss.str();
        if (st.load.body.empty()) throw UsageError("--body-file " + st.bodyFile + " is empty");
    }
    // The workspace is opened before the run so a bad --db fails in a second, not after it.
    std::unique_ptr<core::Registry> registry;
    if (st.record) {
        try {
            registry = std::make_unique<core::Registry>(core::Store::resolvePath(st.common.db));
        } catch (const core::StoreError& ex) {
            throw UsageError(ex.what());
        }
    }

    const bool tty = isatty(fileno(stderr)) != 0;
    auto progress = [&](double t, const core::LoadReport& r) {
        std::fprintf(stderr, "%s%5.0f s  sent %lld  answered %lld  errors %lld  p99 %.2f ms%s",
                     tty ? "\r" : "", t, static_cast<long long>(r.sent), static_cast<long long>(answered(r)),
                     static_cast<long long>(r.errors), r.p99Ms, tty ? "\033[K" : "\n");
        std::fflush(stderr);
    };
    auto& stop = installStopHandler();
    core::LoadReport report;
    try {
        report = core::runLoad(st.load, &stop, progress);
    } catch (...) {
        removeStopHandler();
        if (tty) std::fprintf(stderr, "\r\033[K");
        throw;
    }
    removeStopHandler();
    if (tty) std::fprintf(stderr, "\r\033[K");

    if (registry) {
        const double now = core::nowSeconds();
        registry->appendServingMetrics(st.load.model, 0, now,
                                       {{"load/qps", report.qps},
                                        {"load/p50_ms", report.p50Ms},
                                        {"load/p99_ms", report.p99Ms},
                                        {"load/p999_ms", report.p999Ms},
                                        {"load/errors", static_cast<double>(report.errors)}});
    }
    if (st.common.json) {
        auto j = reportJson(st.load, report);
        j["interrupted"] = stop.load();
        if (registry) j["workspace"] = registry->workspacePath();
        std::cout << j.dump() << std::endl;
    } else {
        printReport(st.load, report);
        if (registry)
            std::printf("  recorded   load/* serving metrics of %s in %s\n", st.load.model.c_str(),
                        registry->workspacePath().c_str());
    }
    if (stop.load()) return kInterrupted;
    return report.errors > 0 ? kRunFailed : kOk;
}

}  // namespace

void registerLoad(CLI::App& app, int& exitCode) {
    auto st = std::make_shared<LoadState>();
    auto* cmd = app.add_subcommand(
        "load",
        "HTTP load against a KServe v2 server, open loop (--rate) or closed loop (--connections, like wrk): "
        "QPS, latency percentiles, errors by status");
    cmd->add_option("--url", st->load.url, "server base URL")->capture_default_str();
    cmd->add_option("--model", st->load.model, "model name served at /v2/models/NAME")->required();
    auto* rate =
        cmd->add_option("--rate", st->load.rate,
                        "open loop: intended requests per second on a fixed schedule, latency from each "
                        "request's intended send time (a server that falls behind shows it)")
            ->check(CLI::PositiveNumber);
    auto* conns = cmd->add_option("--connections", st->load.connections,
                                  "closed loop, like wrk: N connections, each sending its next request as "
                                  "soon as the last is answered (the server's saturated throughput)")
                      ->check(CLI::Range(1, 10000));
    auto* mode = cmd->add_option_group("mode");
    mode->add_option(rate);
    mode->add_option(conns);
    mode->require_option(1);
    cmd->add_option("--duration", st->load.durationS, "seconds to send for")
        ->required()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--users", st->load.users, "open loop: concurrent keep-alive connections")
        ->capture_default_str()
        ->check(CLI::Range(1, 10000));
    cmd->add_option("--rows", st->load.rowsPerRequest, "rows (batch dimension) per request")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    cmd->add_option("--timeout", st->load.timeoutS,
                    "seconds a request may take before it counts as a timeout")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--threads", st->load.threads, "client I/O threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 16));
    cmd->add_option(
        "--body-file", st->bodyFile,
        "send this JSON request body (default: random FP32 input shaped by the model's metadata)");
    cmd->add_flag(
        "--binary", st->load.binary,
        "send the input and take the output as binary tensor data (Triton's extension, as tritonclient "
        "does by default) instead of JSON numbers");
    cmd->add_flag("--record", st->record,
                  "store QPS, p50/p99/p99.9 and errors as load/* serving metrics of the model");
    addCommonOptions(cmd, st->common);
    cmd->callback([st, &exitCode] { exitCode = runLoadCommand(*st); });
}

}  // namespace lathe::cli
