// Ties a training run to the workspace: the store records every event of the stream.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <istream>
#include <optional>
#include <set>
#include <thread>

#include "lathe/core/checkpoint.h"
#include "lathe/core/data_versions.h"
#include "lathe/core/error.h"
#include "lathe/core/launcher.h"
#include "lathe/core/record.h"

#include "lathe/core/data_versions.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "workspace/file_lock.h"

namespace lathe::core {

void recordEvent(Store& store, int64_t runId, const Event& e) {
    switch (e.type) {
        case Event::Type::Run:
            break;  // consumed by ingestEventStream, which creates the run
        case Event::Type::Span:
            store.appendSpan(runId, e.span);
            break;
        case Event::Type::Metric:
            store.appendMetric(runId, e.key, e.step, e.wallTime, e.value);
            break;
        case Event::Type::Log:
            store.appendLog(runId, e.wallTime, e.level.empty() ? "info" : e.level, e.text);
            break;
        case Event::Type::Status:
            // decodeEvent admits only the statuses a worker reports.
            store.setRunStatus(runId, runStatusFromString(e.text).value_or(RunStatus::Failed));
            break;
        case Event::Type::Error:
            store.appendLog(runId, e.wallTime, "error", e.text);
            store.setRunStatus(runId, RunStatus::Failed, e.text);
            break;
        case Event::Type::Checkpoint:
            store.addArtifact(runId, "checkpoint", e.text, e.sha256);
            store.appendLog(runId, e.wallTime, "info",
                            "checkpoint after epoch " + std::to_string(static_cast<int64_t>(e.value)) +
                                " (step " + std::to_string(e.step) + "): " + e.text);
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
    lo.owner = topts.owner;
    lo.dataCacheDir = topts.dataCacheDir;
    lo.dataVersion = topts.dataVersion;
    if (!spec.ppoPolicy.empty()) lo.inputFiles["ppo_policy"] = spec.ppoPolicy;
    if (!spec.teacher.empty() && std::filesystem::is_regular_file(spec.teacher, ec))
        lo.inputFiles["teacher"] = spec.teacher;
    lo.stop = options.stop;
    LaunchResult launched;
    if (options.launch) {
        sink(Event::log("info", "starting " + std::to_string(spec.nproc) + " ranks on " + options.placement));
        try {
            launched = options.launch(lo, sink);
        } catch (const ConfigError& ex) {  // a host failed its check: nothing was started
            launched.status = RunStatus::Failed;
            launched.error = ex.what();
        }
    } else {
        sink(Event::log("info", "starting " + std::to_string(spec.nproc) + " worker processes"));
        launched = launchLocal(lo, sink);
    }
    TrainResult r;
    r.status = launched.status;
    r.error = launched.error;
    if (r.status == RunStatus::Failed && !r.error.empty()) sink(Event::error(r.error));
    store.flush();
    const auto lastMetrics = store.lastMetrics(runId);
    if (auto it = lastMetrics.find("train/epoch"); it != lastMetrics.end())
        r.epochsDone = static_cast<int64_t>(it->second);
    const auto epochs = store.metrics(runId, "train/epoch");
    if (!epochs.empty()) r.steps = epochs.back().step;
    return r;
}

// Settings a resume may change: how long, where and how it runs, what it records, and the
// stability levers one reaches for after a divergence (precision, loss scaling, gradient
// clipping; the scaler's checkpointed state follows a change of mode). Everything else shapes
// the trajectory the checkpoint is a point of (model, data, optimizer, learning rate and
// schedule, batch, seed, ranks, gradient exchange) and must stay as recorded.
bool mayChangeOnResume(const std::string& key) {
    static const std::set<std::string> keys{"epochs",
                                            "name",
                                            "experiment",
                                            "log_every",
                                            "checkpoint_every",
                                            "threads",
                                            "device",
                                            "backend",
                                            "bucket_mb",
                                            "micro_batches",
                                            "pipeline_schedule",
                                            "balance",
                                            "activation_checkpointing",
                                            "inject_nonfinite",
                                            "profile",
                                            "profile_wait",
                                            "profile_warmup",
                                            "profile_active",
                                            "profile_repeat",
                                            "precision",
                                            "loss_scale",
                                            "loss_scale_init",
                                            "loss_scale_growth",
                                            "loss_scale_backoff",
                                            "loss_scale_growth_interval",
                                            "clip_grad_norm"};
    return keys.count(key) > 0;
}

// One process trains a run at a time: a second `--resume` of a run still training (the GUI and a
// terminal) would drop the live run's points and write the same steps and checkpoint twice.
// The lock also tells readers that the run is live: a "running" run whose lock is free is shown
// as interrupted (Store::run). Their probe holds a shared lock for an instant, so a taken lock is
// tried a few more times before it counts as another recorder's.
void lockRun(std::optional<FileLock>& lock, const Store& store, int64_t runId) {
    // A probe is an instant, but on a loaded machine the prober can be descheduled while it holds
    // the lock (a `runs list` polled ten times a second beside busy workers once took it for
    // longer than the 100 ms this used to wait). A real trainer holds it for minutes: waiting up to
    // 3 s before calling it one costs a refused second resume those seconds and nothing else.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (int attempt = 0;; ++attempt) {
        lock.emplace(store.runLockPath(runId), false);
        if (lock->held() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 20 ? 5 : 50));
    }
    if (!lock->held())
        throw ConfigError("run " + std::to_string(runId) + " is being trained by another process" +
                          (lock->holder().empty() ? std::string() : " (pid " + lock->holder() + ")") +
                          "; stop it first, or wait for it to end");
}

}  // namespace

RecordedRun trainAndRecord(Store& store, const RunSpec& givenSpec, const RecordOptions& options,
                           const EventSink& observer) {
    const RunSpec given = withParallelDefaults(givenSpec);
    checkRunnable(given);  // a spec this machine cannot run is a usage error, not a failed run
    // data = "dataset:NAME[:V]": the run records the exact version (`spec`) and trains on where
    // its files are (`bound.used`); a data set whose folder changed is refused here, before a run.
    const BoundData bound = bindDataSet(given, store.path(), options.verifyData);
    const RunSpec& spec = bound.recorded;
    RecordedRun rec;
    TrainOptions topts;
    int64_t resumeStep = -1;
    RunStatus previousStatus = RunStatus::Created;
    std::string previousError;
    std::optional<FileLock> lock;
    topts.stop = options.stop;
    if (options.resumeRunId > 0) {
        const auto run = store.run(options.resumeRunId);
        if (!run)
            throw ConfigError("cannot resume: no run " + std::to_string(options.resumeRunId) + " in " +
                              store.path());
        lockRun(lock, store, run->id);
        // Refused before anything is touched, naming each setting (and logged with the run).
        {
            const auto was =
                specParams(parseRunSpec(run->config, "run " + std::to_string(run->id) + " config", false));
            std::string changed;
            for (const auto& [key, value] : specParams(spec)) {
                const auto it = was.find(key);
                if (mayChangeOnResume(key) || it == was.end() || it->second == value) continue;
                changed += (changed.empty() ? "" : ", ") + ("`" + key + "` " + it->second + " -> " + value);
            }
            if (!changed.empty()) {
                const std::string msg = "cannot resume run " + std::to_string(run->id) +
                                        ": its checkpoint does not fit the changed settings (" + changed +
                                        "); a resume may change epochs, device, precision and loss scaling, "
                                        "clipping, logging, checkpointing and profiling. Start a new run for "
                                        "other settings";
                store.appendLog(run->id, nowSeconds(), "warn", "resume failed: " + msg);
                store.flush();
                throw ConfigError(msg);
            }
        }
        std::optional<ArtifactRecord> ckpt;
        for (const auto& a : store.artifacts(run->id))
            if (a.kind == "checkpoint") ckpt = a;
        if (!ckpt)
            throw ConfigError("cannot resume run " + std::to_string(run->id) +
                              ": it has no checkpoint (it stopped before its first epoch ended)");
        // Verify before touching the run: a corrupt checkpoint must not cost the recorded history.
        const auto info = readCheckpointInfo(ckpt->path);
        // A checkpoint names its owner: one of another workspace (a neighbouring workspace file
        // that once shared the folder's files) or of another run is never resumed from.
        if (!info.workspaceId.empty() && (info.workspaceId != store.workspaceId() || info.runId != run->id))
            throw CheckpointError("checkpoint " + ckpt->path + " belongs to run " +
                                  std::to_string(info.runId) +
                                  (info.workspaceId == store.workspaceId()
                                       ? " of this workspace"
                                       : " of another workspace (id " + info.workspaceId + ")") +
                                  ", not to run " + std::to_string(run->id) + " of " + store.path() +
                                  " (id " + store.workspaceId() + "); refusing to resume from it");
        if (info.sha256 != ckpt->sha256) {
            // The file checks out on its own but is not the recorded one. Only one cause is
            // forgiven: the run wrote a newer checkpoint into its own directory and was killed
            // before the workspace recorded it. A file elsewhere (a copied workspace pointing at
            // the original's artifacts) is refused as before.
            std::error_code ec;
            const auto own = std::filesystem::weakly_canonical(store.artifactDir(run->id) + "/last.ckpt", ec);
            // Only an owned checkpoint (format 2) can prove it is this run's: an older file that
            // differs from the record may have been written by another workspace's run.
            if (ec || info.workspaceId.empty() || std::filesystem::weakly_canonical(ckpt->path, ec) != own)
                throw CheckpointError("checkpoint " + ckpt->path + " is not the one run " +
                                      std::to_string(run->id) +
                                      " recorded (checksum differs) and is not in the run's own directory " +
                                      store.artifactDir(run->id) + "; was it overwritten?");
            store.appendLog(run->id, nowSeconds(), "warn",
                            "checkpoint " + ckpt->path + " is newer than the one recorded (epoch " +
                                std::to_string(info.epoch) + ", step " + std::to_string(info.step) +
                                "; the run ended before recording it): resuming from it");
        }
        rec.runId = run->id;
        topts.resumeFrom = ckpt->path;
        resumeStep = info.step;
        // As recorded: an interrupted run is recorded as running (its lock tells the rest).
        previousStatus = run->status == RunStatus::Interrupted ? RunStatus::Running : run->status;
        previousError = run->error;
        // The run's status changes only once the trainer has loaded the checkpoint and says
        // "running" (recordEvent), so a resume that cannot start leaves the run as it was.
    } else {
        rec.runId = store.createRun(spec.experiment, spec.name, spec.model, spec.data, toToml(spec),
                                    specParams(spec), options.host);
        lockRun(lock, store, rec.runId);
        store.setRunStatus(rec.runId, RunStatus::Running);
    }
    if (bound.version) {
        DataSets(store.path()).recordRunData(rec.runId, bound.version->id);
        store.appendLog(rec.runId, nowSeconds(), "info", "data: " + bound.note);
    }
    topts.checkpointDir = store.artifactDir(rec.runId);
    topts.owner = {store.workspaceId(), rec.runId};
    // The workspace owns its caches (<workspace>-files/cache); a version's root hash keys them.
    topts.dataCacheDir = store.filesDir() + "/cache/data";
    if (bound.version) topts.dataVersion = bound.version->rootHash;
    if (options.onRunCreated) options.onRunCreated(rec.runId);

    const EventSink sink = [&](const Event& e) {
        // The store gave up a batch (disk full): stop training now, failing the run with the
        // store's error, rather than go on producing what cannot be recorded.
        if (store.writeFailed()) store.flush();
        // Points after the checkpoint are replayed by the resumed run: drop the old ones once
        // the trainer has loaded the checkpoint (it then reports "running"), not before, so a
        // resume that fails early loses nothing.
        if (resumeStep >= 0 && e.type == Event::Type::Status && e.text == toString(RunStatus::Running)) {
            store.dropMetricsAfter(rec.runId, resumeStep);
            store.updateRunConfig(rec.runId, toToml(spec), specParams(spec));  // e.g. a new --epochs
            resumeStep = -1;
        }
        // Before "running" a resume has changed nothing: its failure (worker processes report
        // one as an error event) must not be written over the run's recorded state.
        if (resumeStep >= 0 && (e.type == Event::Type::Error || e.type == Event::Type::Status)) return;
        recordEvent(store, rec.runId, e);
        if (observer) observer(e);
    };
    auto fail = [&](const std::string& message) {
        rec.result.status = RunStatus::Failed;
        rec.result.error = message;
        sink(Event::error(message));
    };
    try {
        // A launcher given (other hosts) runs even one rank through it.
        if (spec.nproc > 1 || options.launch)
            rec.result = trainInWorkers(store, rec.runId, bound.used, topts, options, sink);
        else
            rec.result = train(bound.used, topts, sink);
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
    if (resumeStep >= 0) {
        // The resume never reached "running" (e.g. a worker could not load the checkpoint):
        // the run keeps its recorded state, as an in-process failure above does.
        store.setRunStatus(rec.runId, previousStatus, previousError);
        if (rec.result.status == RunStatus::Failed) {
            store.appendLog(rec.runId, nowSeconds(), "warn", "resume failed: " + rec.result.error);
            store.flush();
            throw Error(rec.result.error.empty() ? "the resume failed before training started"
                                                 : rec.result.error);
        }
    } else {
        store.setRunStatus(rec.runId, rec.result.status, rec.result.error);
    }
    store.flush();
    // A resumed run's final metrics include those recorded before it was interrupted.
    for (const auto& [k, v] : store.lastMetrics(rec.runId)) rec.result.finalMetrics.emplace(k, v);
    return rec;
}

IngestResult ingestEventStream(Store& store, std::istream& in, const EventSink& observer) {
    IngestResult res;
    std::optional<FileLock> lock;
    std::string line;
    int64_t lineNo = 0;
    auto fail = [&](const std::string& why) {
        res.status = RunStatus::Failed;
        res.error = why;
        store.appendLog(res.runId, nowSeconds(), "error", why);
        store.setRunStatus(res.runId, RunStatus::Failed, why);
    };
    for (;;) {
        try {
            if (!readEventLine(in, line)) break;
        } catch (const EventStreamError& ex) {
            const std::string why = "event stream line " + std::to_string(lineNo + 1) + ": " + ex.what();
            if (res.runId == 0) throw EventStreamError(why);
            fail(why);
            store.flush();
            return res;
        }
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
        if (res.runId != 0 && (e.type == Event::Type::Run || isFinal(res.status))) {
            // One stream, one run: a second run record, or anything after the final status, is
            // another stream glued on (`cat a b`), which must not be merged into this run.
            fail("event stream line " + std::to_string(lineNo) +
                 (e.type == Event::Type::Run
                      ? ": a second run record"
                      : ": events after the run's final status '" + std::string(toString(res.status)) + "'") +
                 " (two streams concatenated?); the rest is not recorded");
            store.flush();
            return res;
        }
        if (res.runId == 0) {
            if (e.type != Event::Type::Run)
                throw EventStreamError(
                    "event stream line " + std::to_string(lineNo) +
                    ": expected a \"run\" record first (is this the output of lathectl worker?)");
            RunSpec spec;
            try {
                spec = parseRunSpec(e.text, "event stream run record");
            } catch (const ConfigError& ex) {
                throw EventStreamError(ex.what());
            }
            res.runId = store.createRun(spec.experiment, spec.name, spec.model, spec.data, toToml(spec),
                                        specParams(spec), e.level);
            lockRun(lock, store, res.runId);  // live while the stream lasts, interrupted if we are killed
            store.setRunStatus(res.runId, RunStatus::Running);
            if (observer) observer(e);
            continue;
        }
        if (e.type == Event::Type::Status)
            res.status = runStatusFromString(e.text).value_or(RunStatus::Failed);
        if (e.type == Event::Type::Error) res.error = e.text;
        if (store.writeFailed()) {
            try {
                store.flush();
            } catch (const Error& ex) {
                fail(ex.what());  // tried once more; if the disk is still full, the caller hears of it
                store.flush();
                return res;
            }
        }
        recordEvent(store, res.runId, e);
        if (observer) observer(e);
    }
    if (res.runId == 0) throw EventStreamError("event stream is empty (no run record)");
    if (!isFinal(res.status))
        fail("event stream ended before the run finished (worker killed or connection lost) after line " +
             std::to_string(lineNo));
    else  // the final status event carries no message: the error event's must stay with the run
        store.setRunStatus(res.runId, res.status,
                           res.status == RunStatus::Failed ? res.error : std::string());
    store.flush();
    return res;
}

}  // namespace lathe::core
