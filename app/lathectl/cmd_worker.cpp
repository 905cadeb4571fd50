// lathectl worker: one run whose event stream goes to stdout (what the SSH and multi-process
// executors read); lathectl ingest: records such a stream into the workspace.
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/launcher.h"
#include "lathe/core/record.h"
#include "lathe/core/trainer.h"

namespace lathe::cli {
namespace {

struct WorkerState {
    SpecFlags spec;
    std::string checkpointDir;
    std::string resume;
    std::string owner;  // WORKSPACE_ID:RUN, written into the checkpoints
};

// "WORKSPACE_ID:RUN" as the launcher passes it (lathe::core::LaunchOptions::owner).
core::CheckpointOwner parseOwner(const std::string& text) {
    const auto colon = text.rfind(':');
    core::CheckpointOwner o;
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
        throw UsageError("--owner must be WORKSPACE_ID:RUN (got '" + text + "')");
    o.workspaceId = text.substr(0, colon);
    try {
        size_t used = 0;
        o.runId = std::stoll(text.substr(colon + 1), &used);
        if (used != text.size() - colon - 1 || o.runId <= 0) throw std::invalid_argument("run");
    } catch (const std::exception&) {
        throw UsageError("--owner must be WORKSPACE_ID:RUN with a positive run id (got '" + text + "')");
    }
    return o;
}

int runWorker(const WorkerState& st) {
    const core::RunSpec spec = buildSpec(st.spec);
    const core::DistEnv dist = core::distEnvFromEnvironment();
    if (spec.nproc > 1 && !dist.distributed())
        throw UsageError("this run asks for nproc = " + std::to_string(spec.nproc) +
                         ": start it with lathectl train, or start each rank with the torchrun environment "
                         "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    // One line per event, flushed at once so a reader sees the run live; tagged with the rank.
    const core::EventSink out = [rank = dist.rank](const core::Event& e) {
        if (rank == 0) {
            std::cout << core::encodeEvent(e) << std::endl;
            return;
        }
        core::Event tagged = e;
        tagged.rank = rank;
        std::cout << core::encodeEvent(tagged) << std::endl;
    };
    out(core::Event::run(core::toToml(spec), host));
    core::TrainOptions opts;
    // Absolute, since the path travels in the event stream and is recorded as an artifact.
    opts.checkpointDir =
        st.checkpointDir.empty() ? std::string() : std::filesystem::absolute(st.checkpointDir).string();
    opts.resumeFrom = st.resume;
    if (!st.owner.empty()) opts.owner = parseOwner(st.owner);
    opts.stop = &installStopHandler();
    opts.dist = dist;
    core::TrainResult result;
    try {
        result = core::train(spec, opts, out);
    } catch (const core::Error& ex) {
        out(core::Event::error(ex.what()));
        out(core::Event::status(core::RunStatus::Failed));
        result.status = core::RunStatus::Failed;
    } catch (const std::exception& ex) {
        out(core::Event::error(std::string("internal error: ") + ex.what()));
        out(core::Event::status(core::RunStatus::Failed));
        result.status = core::RunStatus::Failed;
    }
    removeStopHandler();
    if (result.status == core::RunStatus::Completed) return kOk;
    if (result.status == core::RunStatus::Stopped) return kInterrupted;
    return kRunFailed;
}

struct IngestState {
    CommonOptions common;
    std::string file = "-";
};

int runIngest(const IngestState& st) {
    auto store = openStore(st.common);
    std::ifstream file;
    std::istream* in = &std::cin;
    if (st.file != "-") {
        file.open(st.file, std::ios::binary);
        if (!file) throw UsageError("cannot read event stream " + st.file);
        in = &file;
    }
    // In `lathectl worker | lathectl ingest`, Ctrl+C reaches both: the worker stops cleanly
    // and ends its stream with "stopped", so ingest keeps reading to the end instead of dying.
    std::signal(SIGINT, SIG_IGN);
    core::IngestResult res;
    try {
        res = core::ingestEventStream(*store, *in);
    } catch (const core::EventStreamError& ex) {
        std::signal(SIGINT, SIG_DFL);
        throw UsageError(ex.what());
    }
    std::signal(SIGINT, SIG_DFL);
    if (st.common.json) {
        nlohmann::json j{
            {"run_id", res.runId}, {"status", core::toString(res.status)}, {"workspace", store->path()}};
        if (!res.error.empty()) j["error"] = res.error;
        for (const auto& [k, v] : store->lastMetrics(res.runId)) j[k] = metricJson(v);
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("recorded run %lld (%s)%s%s\n", static_cast<long long>(res.runId),
                    core::toString(res.status), res.error.empty() ? "" : ": ", res.error.c_str());
    }
    if (res.status == core::RunStatus::Completed) return kOk;
    return res.status == core::RunStatus::Stopped ? kInterrupted : kRunFailed;
}

}  // namespace

void registerWorker(CLI::App& app, int& exitCode) {
    {
        auto st = std::make_shared<WorkerState>();
        auto* cmd = app.add_subcommand(
            "worker",
            "run training and write its event stream (newline-delimited JSON) to stdout; no workspace");
        addSpecFlags(cmd, st->spec);
        cmd->add_option("--checkpoint-dir", st->checkpointDir, "write checkpoints here (default: none)");
        cmd->add_option("--resume", st->resume, "continue from this checkpoint file");
        cmd->add_option("--owner", st->owner,
                        "WORKSPACE_ID:RUN written into checkpoints (set by lathectl train)");
        cmd->callback([st, &exitCode] { exitCode = runWorker(*st); });
    }
    {
        auto st = std::make_shared<IngestState>();
        auto* cmd =
            app.add_subcommand("ingest", "record an event stream (a file, or - for stdin) as a new run");
        cmd->add_option("FILE", st->file, "event stream from lathectl worker; - reads stdin");
        addCommonOptions(cmd, st->common);
        cmd->callback([st, &exitCode] { exitCode = runIngest(*st); });
    }
}

}  // namespace lathe::cli
