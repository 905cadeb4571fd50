// Ties a training run to the workspace: the store records every event of the stream.
#include <filesystem>
#include <fstream>
#include <optional>
#include <istream>

#include "lathe/core/checkpoint.h"
#include "lathe/core/distributed.h"
#include "lathe/core/error.h"
#include "lathe/core/store.h"
#include "lathe/core/training.h"

namespace lathe::core {

void recordEvent(Store& store, int64_t runId, const Event& e) {
    switch (e.type) {
        case Event::Type::Run: break;  // consumed by ingestEventStream, which creates the run
        case Event::Type::Span: store.appendSpan(runId, e.span); break;
        case Event::Type::Metric: store.appendMetric(runId, e.key, e.step, e.wallTime, e.value); break;
        case Event::Type::Log: store.appendLog(runId, e.wallTime, e.level.empty() ? "info" : e.level, e.text); break;
        case Event::Type::Status: store.setRunStatus(runId, e.text); break;
        case Event::Type::Error:
            store.appendLog(runId, e.wallTime, "error", e.text);
            store.setRunStatus(runId, "failed", e.text);
            break;
        case Event::Type::Checkpoint:
            store.addArtifact(runId, "checkpoint", e.text, e.sha256);
            store.appendLog(runId, e.wallTime, "info",
                            "checkpoint after epoch " + std::to_string(static_cast<int64_t>(e.value)) + " (step " +
                                std::to_string(e.step) + "): " + e.text);
            break;
    }
}

namespace {

// spec.nproc ranks as local worker processes; their merged stream is recorded like an
// in-process run's.
TrainResult trainInWorkers(Store& store, int64_t runId, const RunSpec& spec, const TrainOptions& topts,
                           const RecordOptions& options, const EventSink& sink) {
    std::error_code ec;
    std::filesystem::create_directories(topts.checkpointDir, ec);
    if (ec) throw Error("cannot create " + topts.checkpointDir + ": " + ec.message());
    const std::string config = topts.checkpointDir + "/config.toml";
    {
        std::ofstream out(config, std::ios::binary | std::ios::trunc);
        out << toToml(spec);
        if (!out) throw Error("cannot write " + config);
    }
    LaunchOptions lo;
    lo.nproc = static_cast<int>(spec.nproc);
    lo.program = options.workerProgram;
    lo.configPath = config;
    lo.checkpointDir = topts.checkpointDir;
    lo.resumeFrom = topts.resumeFrom;
    lo.stop = options.stop;
    sink(Event::log("info", "starting " + std::to_string(spec.nproc) + " worker processes"));
    const auto launched = launchLocal(lo, sink);
    TrainResult r;
    r.status = launched.status;
    r.error = launched.error;
    if (r.status == "failed" && !r.error.empty()) sink(Event::error(r.error));
    store.flush();
    const auto lastMetrics = store.lastMetrics(runId);
    if (auto it = lastMetrics.find("train/epoch"); it != lastMetrics.end()) r.epochsDone = static_cast<int64_t>(it->second);
    const auto epochs = store.metrics(runId, "train/epoch");
    if (!epochs.empty()) r.steps = epochs.back().step;
    return r;
}

}  // namespace

RecordedRun trainAndRecord(Store& store, const RunSpec& spec, const RecordOptions& options, const EventSink& observer) {
    checkRunnable(spec);  // a spec this machine cannot run is a usage error, not a failed run
    RecordedRun rec;
    TrainOptions topts;
    int64_t resumeStep = -1;
    std::string previousStatus, previousError;
    topts.stop = options.stop;
    if (options.resumeRunId > 0) {
        const auto run = store.run(options.resumeRunId);
        if (!run) throw ConfigError("cannot resume: no run " + std::to_string(options.resumeRunId) + " in " + store.path());
        std::optional<ArtifactRecord> ckpt;
        for (const auto& a : store.artifacts(run->id))
            if (a.kind == "checkpoint") ckpt = a;
        if (!ckpt)
            throw ConfigError("cannot resume run " + std::to_string(run->id) +
                              ": it has no checkpoint (it stopped before its first epoch ended)");
        // Verify before touching the run: a corrupt checkpoint must not cost the recorded history.
        const auto info = readCheckpointInfo(ckpt->path);
        if (info.sha256 != ckpt->sha256)
            throw CheckpointError("checkpoint " + ckpt->path + " is not the one run " + std::to_string(run->id) +
                                  " recorded (checksum differs); was it overwritten?");
        rec.runId = run->id;
        topts.resumeFrom = ckpt->path;
        resumeStep = info.step;
        previousStatus = run->status;
        previousError = run->error;
        // The run's status changes only once the trainer has loaded the checkpoint and says
        // "running" (recordEvent), so a resume that cannot start leaves the run as it was.
    } else {
        rec.runId = store.createRun(spec.experiment, spec.name, spec.model, spec.data, toToml(spec), specParams(spec),
                                    options.host);
        store.setRunStatus(rec.runId, "running");
    }
    topts.checkpointDir = store.artifactDir(rec.runId);
    if (options.onRunCreated) options.onRunCreated(rec.runId);

    const EventSink sink = [&](const Event& e) {
        // Points after the checkpoint are replayed by the resumed run: drop the old ones once
        // the trainer has loaded the checkpoint (it then reports "running"), not before, so a
        // resume that fails early loses nothing.
        if (resumeStep >= 0 && e.type == Event::Type::Status && e.text == "running") {
            store.dropMetricsAfter(rec.runId, resumeStep);
            store.updateRunConfig(rec.runId, toToml(spec), specParams(spec));  // e.g. a new --epochs
            resumeStep = -1;
        }
        recordEvent(store, rec.runId, e);
        if (observer) observer(e);
    };
    auto fail = [&](const std::string& message) {
        rec.result.status = "failed";
        rec.result.error = message;
        sink(Event::error(message));
    };
    try {
        if (spec.nproc > 1)
            rec.result = trainInWorkers(store, rec.runId, spec, topts, options, sink);
        else
            rec.result = train(spec, topts, sink);
    } catch (const Error& ex) {
        if (resumeStep >= 0) {
            // The resume never started (model or data do not fit the checkpoint): keep the
            // run's recorded state, note the attempt, and let the caller report the error.
            store.appendLog(rec.runId, nowSeconds(), "warn", std::string("resume failed: ") + ex.what());
            store.setRunStatus(rec.runId, previousStatus, previousError);
            store.flush();
            throw;
        }
        fail(ex.what());
    } catch (const std::exception& ex) {
        fail(std::string("internal error: ") + ex.what());
    }
    store.setRunStatus(rec.runId, rec.result.status, rec.result.error);
    store.flush();
    // A resumed run's final metrics include those recorded before it was interrupted.
    for (const auto& [k, v] : store.lastMetrics(rec.runId)) rec.result.finalMetrics.emplace(k, v);
    return rec;
}

IngestResult ingestEventStream(Store& store, std::istream& in, const EventSink& observer) {
    IngestResult res;
    std::string line;
    int64_t lineNo = 0;
    auto fail = [&](const std::string& why) {
        res.status = "failed";
        res.error = why;
        store.appendLog(res.runId, nowSeconds(), "error", why);
        store.setRunStatus(res.runId, "failed", why);
    };
    while (std::getline(in, line)) {
        ++lineNo;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        Event e;
        try {
            e = decodeEvent(line);
        } catch (const EventStreamError& ex) {
            const std::string why = "event stream line " + std::to_string(lineNo) + ": " + ex.what();
            if (res.runId == 0) throw EventStreamError(why);
            fail(why);
            store.flush();
            return res;
        }
        if (res.runId == 0) {
            if (e.type != Event::Type::Run)
                throw EventStreamError("event stream line " + std::to_string(lineNo) +
                                       ": expected a \"run\" record first (is this the output of lathectl worker?)");
            RunSpec spec;
            try {
                spec = parseRunSpec(e.text, "event stream run record");
            } catch (const ConfigError& ex) {
                throw EventStreamError(ex.what());
            }
            res.runId = store.createRun(spec.experiment, spec.name, spec.model, spec.data, toToml(spec),
                                        specParams(spec), e.level);
            store.setRunStatus(res.runId, "running");
            if (observer) observer(e);
            continue;
        }
        if (e.type == Event::Type::Status) res.status = e.text;
        if (e.type == Event::Type::Error) res.error = e.text;
        recordEvent(store, res.runId, e);
        if (observer) observer(e);
    }
    if (res.runId == 0) throw EventStreamError("event stream is empty (no run record)");
    if (res.status != "completed" && res.status != "failed" && res.status != "stopped")
        fail("event stream ended before the run finished (worker killed or connection lost) after line " +
             std::to_string(lineNo));
    store.flush();
    return res;
}

}  // namespace lathe::core
